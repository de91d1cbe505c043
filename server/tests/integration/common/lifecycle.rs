//! Model lifecycle in tests: a server whose controller drives the `local-sim` backend, a base
//! offered on it, multipart uploads built by hand, and generated adapters.

use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::Value;
use sqlx::PgPool;
use tf_engine_sim::SimConfig;
use tokenfactory::adapter_check::config::BaseConfig;
use tokenfactory::fleet::local_sim;
use tokenfactory::fleet::sim_fleet::SimFleet;
use tokenfactory::lifecycle::{fixture, ControllerOptions, LifecycleOptions};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::{Tenant, TestApp};

/// The base the lifecycle tests offer (two replicas).
pub const LORA_BASE: &str = "lora-base";

/// A server with a lifecycle controller over a simulated fleet.
pub struct LifecycleApp {
    pub app: TestApp,
    pub fleet: Arc<SimFleet>,
    pub dir: tempfile::TempDir,
}

/// Offers `base` with `replicas` simulated replicas (offered: the bare base is callable).
pub async fn offer(pool: &PgPool, base: &str, replicas: i32, offered: bool) {
    tf_core::db::lifecycle::offer_base(
        pool,
        "local-sim",
        base,
        &format!("local-sim/{base}"),
        offered,
        "sim-words",
        &local_sim::template(base, replicas),
    )
    .await
    .unwrap();
}

/// Starts a server whose controller (ticking every 50 ms) drives a fresh simulated fleet paced
/// by `pacing`, with [`LORA_BASE`] offered on two replicas.
pub async fn start(pool: PgPool, pacing: SimConfig) -> LifecycleApp {
    offer(&pool, LORA_BASE, 2, true).await;
    let fleet = Arc::new(SimFleet::new(
        TaskTracker::new(),
        CancellationToken::new(),
        pacing,
    ));
    let dir = tempfile::tempdir().unwrap();
    let app = TestApp::builder(pool)
        .lifecycle(on_sim(&fleet, &dir))
        .start()
        .await;
    LifecycleApp { app, fleet, dir }
}

/// Lifecycle options whose controller (ticking every 50 ms) drives `fleet`, adapters stored in
/// `dir`.
pub fn on_sim(fleet: &Arc<SimFleet>, dir: &tempfile::TempDir) -> LifecycleOptions {
    LifecycleOptions {
        adapter_dir: dir.path().to_path_buf(),
        backend: Some(fleet.clone()),
        controller: ControllerOptions {
            tick: Duration::from_millis(50),
        },
        ..LifecycleOptions::default()
    }
}

/// The sim bases' dimensions.
pub fn base_config() -> BaseConfig {
    serde_json::from_value(local_sim::sim_base_config()).unwrap()
}

/// A valid adapter for `base` at rank 8: (adapter_config.json, weights).
pub fn valid_adapter(base: &str) -> (Vec<u8>, Vec<u8>) {
    let (config, weights) = fixture::valid(&local_sim::model_id(base), &base_config(), 8);
    (config.into_bytes(), weights)
}

/// A multipart/form-data body: text fields, then files (name, file name, bytes).
pub fn multipart(fields: &[(&str, &str)], files: &[(&str, &str, &[u8])]) -> (String, Vec<u8>) {
    let boundary = "tf-test-boundary-7d3c";
    let mut body = Vec::new();
    for (name, value) in fields {
        body.extend_from_slice(
            format!("--{boundary}\r\nContent-Disposition: form-data; name=\"{name}\"\r\n\r\n{value}\r\n")
                .as_bytes(),
        );
    }
    for (name, file, bytes) in files {
        body.extend_from_slice(
            format!(
                "--{boundary}\r\nContent-Disposition: form-data; name=\"{name}\"; filename=\"{file}\"\r\nContent-Type: application/octet-stream\r\n\r\n"
            )
            .as_bytes(),
        );
        body.extend_from_slice(bytes);
        body.extend_from_slice(b"\r\n");
    }
    body.extend_from_slice(format!("--{boundary}--\r\n").as_bytes());
    (format!("multipart/form-data; boundary={boundary}"), body)
}

impl TestApp {
    /// `POST /api/v1/adapters` with both files; returns (status, body).
    pub async fn upload(
        &self,
        tenant: &Tenant,
        name: &str,
        base: &str,
        config: &[u8],
        weights: &[u8],
    ) -> (u16, Value) {
        self.upload_named(
            tenant,
            name,
            base,
            config,
            weights,
            "adapter_model.safetensors",
        )
        .await
    }

    /// Same, with the weights part's file name given.
    pub async fn upload_named(
        &self,
        tenant: &Tenant,
        name: &str,
        base: &str,
        config: &[u8],
        weights: &[u8],
        weights_file: &str,
    ) -> (u16, Value) {
        let (ct, body) = multipart(
            &[("name", name), ("base", base)],
            &[
                ("adapter_config.json", "adapter_config.json", config),
                ("adapter_model.safetensors", weights_file, weights),
            ],
        );
        let r = self
            .http
            .post(self.url("/api/v1/adapters"))
            .bearer_auth(&tenant.key)
            .header("content-type", ct)
            .body(body)
            .send()
            .await
            .unwrap();
        (r.status().as_u16(), r.json().await.unwrap())
    }

    /// `POST /api/v1/adapters/{name}/{verb}` or `DELETE` (verb `delete`) or `GET` (verb `get`).
    pub async fn manage(&self, tenant: &Tenant, name: &str, verb: &str) -> (u16, Value) {
        let url = self.url(&format!("/api/v1/adapters/{name}"));
        let req = match verb {
            "get" => self.http.get(url),
            "delete" => self.http.delete(url),
            v => self.http.post(format!("{url}/{v}")),
        };
        let r = req.bearer_auth(&tenant.key).send().await.unwrap();
        (r.status().as_u16(), r.json().await.unwrap())
    }

    /// The adapter's state as the API reports it.
    pub async fn state_of(&self, tenant: &Tenant, name: &str) -> String {
        let (_, body) = self.manage(tenant, name, "get").await;
        body["state"].as_str().unwrap_or("absent").to_owned()
    }

    /// One chat completion as `tenant`; returns (status, retry-after, body).
    pub async fn ask(&self, tenant: &Tenant, model: &str) -> (u16, Option<String>, Value) {
        let r = self
            .post(
                &tenant.key,
                "/v1/chat/completions",
                super::chat(model, "hello there", 4),
            )
            .send()
            .await
            .unwrap();
        let status = r.status().as_u16();
        let retry = r
            .headers()
            .get("retry-after")
            .map(|v| v.to_str().unwrap().to_owned());
        (status, retry, r.json().await.unwrap_or(Value::Null))
    }
}

/// Reads a streamed chat answer on a task of its own, stamping when each content chunk arrived;
/// resolves to the stamps and whether `[DONE]` came.
pub fn stamp_tokens(r: reqwest::Response) -> tokio::task::JoinHandle<(Vec<Instant>, bool)> {
    use futures::StreamExt;
    tokio::spawn(async move {
        let mut stream = r.bytes_stream();
        let (mut buf, mut stamps, mut done) = (String::new(), Vec::new(), false);
        while let Some(chunk) = stream.next().await {
            buf.push_str(&String::from_utf8_lossy(&chunk.unwrap()));
            while let Some(end) = buf.find("\n\n") {
                let event: String = buf.drain(..end + 2).collect();
                if event.contains("[DONE]") {
                    done = true;
                } else if event.contains("\"content\"") && !event.contains("\"content\":\"\"") {
                    stamps.push(Instant::now());
                }
            }
        }
        (stamps, done)
    })
}

/// The stream kept flowing through every marked operation: it ended after each, a token came
/// within 500 ms after each, and no gap between tokens reached 750 ms (a loaded machine's slack
/// over the 40 ms a token of a 25 tokens/s stream takes).
pub fn assert_flowed_through(stamps: &[Instant], marks: &[(&str, Instant)]) {
    let last = *stamps.last().unwrap();
    for (what, at) in marks {
        assert!(*at < last, "the stream was still flowing when {what}");
        assert!(
            stamps
                .iter()
                .any(|s| *s > *at && *s < *at + Duration::from_millis(500)),
            "a token within 500 ms after {what}"
        );
    }
    let worst = stamps.windows(2).map(|w| w[1] - w[0]).max().unwrap();
    assert!(
        worst < Duration::from_millis(750),
        "longest gap between tokens {worst:?}"
    );
}
