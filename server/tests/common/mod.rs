//! Test harness: the real server on port 0 in front of an in-process engine simulator, on the
//! fresh database `#[sqlx::test]` made for the test.

#![allow(
    clippy::disallowed_methods,
    reason = "test scaffolding (fake engines, load generators) runs until the test ends; nothing waits for it at shutdown"
)]
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test harness: fails loudly

pub mod chaos;
pub mod client;
pub mod poll;
pub mod process;
pub mod raw_http;

use std::net::SocketAddr;
use std::time::Duration;

use futures::StreamExt;
use sqlx::PgPool;
use tf_engine_sim::{EngineSim, LedgerEntry, SimConfig};
use tokenfactory::app::{self, App, AppOptions};
use tokenfactory::fleet::{self, BaseRegistration};
use tokenfactory::usage::UsageEvent;
use tokenfactory::usage_store;
use uuid::Uuid;

pub const BASE: &str = "sim-base";

pub struct TestApp {
    pub addr: SocketAddr,
    pub pool: PgPool,
    pub sim: EngineSim,
    pub sim_addr: SocketAddr,
    pub app: App,
    pub http: reqwest::Client,
}

pub struct Tenant {
    pub id: Uuid,
    pub name: String,
    pub key: String,
}

impl TestApp {
    pub async fn spawn(pool: PgPool) -> Self {
        Self::spawn_with(pool, SimConfig::default(), AppOptions::default()).await
    }

    pub async fn spawn_with(pool: PgPool, mut sim_config: SimConfig, options: AppOptions) -> Self {
        if sim_config.models.is_empty() {
            sim_config.models = vec![BASE.to_owned()];
        }
        let sim = EngineSim::new(sim_config);
        let sim_listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let sim_addr = sim_listener.local_addr().unwrap();
        tokio::spawn(tf_engine_sim::serve(
            sim_listener,
            sim.clone(),
            std::future::pending(),
        ));
        fleet::register_bases(
            &pool,
            "static",
            &[BaseRegistration {
                name: BASE.into(),
                graph: "graph-a".into(),
                upstream_url: format!("http://{sim_addr}/v1"),
                upstream_model: BASE.into(),
                continuous_usage: true,
                denied_fields: Some(tokenfactory::engine_policy::EnginePolicy::denied_except(&[
                    "sim",
                ])),
                prompt_estimator: tokenfactory::engine_policy::PromptEstimator::SimWords,
            }],
        )
        .await
        .unwrap();
        let app = app::build(pool.clone(), options).await.unwrap();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(tokenfactory::http_server::serve(
            listener,
            app.router.clone(),
            Default::default(),
            app.http_metrics.clone(),
            std::future::pending(),
        ));
        Self {
            addr,
            pool,
            sim,
            sim_addr,
            app,
            http: reqwest::Client::new(),
        }
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://{}{}", self.addr, path)
    }

    pub async fn tenant(&self, name: &str) -> Tenant {
        let t = tf_core::accounts::create_tenant(&self.pool, name, name)
            .await
            .unwrap();
        let (_, key) = tf_core::keys::issue(&self.pool, t.id, "test")
            .await
            .unwrap();
        Tenant {
            id: t.id,
            name: name.into(),
            key,
        }
    }

    /// Registers an adapter for `tenant` on the base, loaded on the simulator.
    pub async fn adapter(&self, tenant: &Tenant, name: &str) -> String {
        let lora = format!("{}--{name}--v1", tenant.name);
        let r = self
            .http
            .post(format!("http://{}/v1/load_lora_adapter", self.sim_addr))
            .json(&serde_json::json!({"lora_name": lora, "lora_path": format!("/x/{lora}")}))
            .send()
            .await
            .unwrap();
        assert!(r.status().is_success(), "{}", r.text().await.unwrap());
        fleet::register_adapter(&self.pool, tenant.id, name, BASE, &lora)
            .await
            .unwrap();
        self.app.gateway.routes.reload().await.unwrap();
        lora
    }

    pub fn post(&self, key: &str, path: &str, body: serde_json::Value) -> reqwest::RequestBuilder {
        self.http.post(self.url(path)).bearer_auth(key).json(&body)
    }

    pub async fn events(&self) -> Vec<UsageEvent> {
        usage_store::query(&self.pool, None, None, None)
            .await
            .unwrap()
    }

    /// Waits (bounded) until the simulator's ledger has an entry for `request_id`.
    pub async fn ledger_entry(&self, request_id: &str) -> LedgerEntry {
        for _ in 0..500 {
            if let Some(e) = self
                .sim
                .ledger()
                .into_iter()
                .find(|e| e.request_id.as_deref() == Some(request_id))
            {
                return e;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        panic!("no ledger entry for {request_id}");
    }

    /// Waits (bounded) until the usage event for `request_id` is stored.
    pub async fn event(&self, request_id: &str) -> UsageEvent {
        let id: Uuid = request_id.parse().unwrap();
        for _ in 0..500 {
            if let Some(e) = self.events().await.into_iter().find(|e| e.request_id == id) {
                return e;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        panic!("no usage event for {request_id}");
    }
}

pub fn request_id(r: &reqwest::Response) -> String {
    r.headers()["x-request-id"].to_str().unwrap().to_owned()
}

/// Reads a whole SSE response into its `data:` payloads.
pub async fn sse_data(r: reqwest::Response) -> Vec<String> {
    let text = r.text().await.unwrap();
    text.split("\n\n")
        .filter_map(|e| e.strip_prefix("data: "))
        .map(str::to_owned)
        .collect()
}

/// Reads `n` SSE events, then drops the response (a client hanging up).
pub async fn read_events_then_hang_up(r: reqwest::Response, n: usize) -> usize {
    let mut body = r.bytes_stream();
    let mut buf = Vec::new();
    let mut seen = 0;
    while seen < n {
        match body.next().await {
            Some(Ok(b)) => {
                buf.extend_from_slice(&b);
                seen = buf.windows(2).filter(|w| w == b"\n\n").count();
            }
            _ => break,
        }
    }
    drop(body);
    seen
}

pub fn chat(model: &str, content: &str, max_tokens: u32) -> serde_json::Value {
    serde_json::json!({"model": model, "messages": [{"role": "user", "content": content}], "max_tokens": max_tokens})
}

/// Runs `tokenfactory admin limits ARGS` against the test database; returns what it prints.
pub async fn admin_limits(pool: &PgPool, args: &[&str]) -> String {
    use clap::Parser;
    use tokenfactory::cli::{AdminCommand, Cli, Command};
    let argv = ["tokenfactory", "admin", "limits"]
        .iter()
        .chain(args)
        .copied();
    let Some(Command::Admin(AdminCommand::Limits(a))) = Cli::try_parse_from(argv).unwrap().command
    else {
        panic!("not parsed as admin limits")
    };
    tokenfactory::admin::limits::run(pool, &a).await.unwrap()
}
