//! Scale-to-zero harness: a sleepy base (idle policy) beside an always-on one, served by two
//! gateway replicas (the first runs the controller) over one simulated fleet.

use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt;
use sqlx::PgPool;
use tf_engine_sim::SimConfig;
use tokenfactory::fleet::sim_fleet::SimFleet;
use tokenfactory::gateway::GatewayOptions;
use tokenfactory::usage::UsageStatus;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::lifecycle;
use super::portal::{assert_redirect, Browser, TestPortal, ADMIN, PASSWORD};
use super::{chat, eventually, request_id, Tenant, TestApp};

/// The base with an idle policy.
pub const SLEEPY: &str = "sleepy-base";
pub const GRAPH: &str = "local-sim/sleepy-base";
/// Always on, beside it.
pub const WARM: &str = "warm-base";
pub const IDLE_SECS: i32 = 2;
pub const SETTLE: Duration = Duration::from_secs(20);

/// Two gateway replicas (the first runs the controller) over one simulated fleet.
pub struct Sleepy {
    pub app: TestApp,
    pub replica: TestApp,
    pub fleet: Arc<SimFleet>,
    _dir: tempfile::TempDir,
}

pub async fn start(pool: PgPool, pacing: SimConfig, startup: Duration, hold_ms: u64) -> Sleepy {
    let fleet = SimFleet::new(TaskTracker::new(), CancellationToken::new(), pacing)
        .with_startup_delay(startup);
    start_on(pool, fleet, hold_ms).await
}

/// [`start`] on a fleet the test configured.
pub async fn start_on(pool: PgPool, fleet: SimFleet, hold_ms: u64) -> Sleepy {
    lifecycle::offer(&pool, SLEEPY, 1, true).await;
    lifecycle::offer(&pool, WARM, 1, true).await;
    assert!(
        tf_core::db::sleep::set_idle_after(&pool, SLEEPY, Some(IDLE_SECS))
            .await
            .unwrap()
    );
    let fleet = Arc::new(fleet);
    let dir = tempfile::tempdir().unwrap();
    let gateway = GatewayOptions {
        hold_limit_ms: hold_ms,
        ..GatewayOptions::default()
    };
    let app = TestApp::builder(pool.clone())
        .gateway(gateway.clone())
        .lifecycle(lifecycle::on_sim(&fleet, &dir))
        .start()
        .await;
    let replica = TestApp::builder(pool)
        .gateway(gateway)
        .replica_of(&app)
        .start()
        .await;
    Sleepy {
        app,
        replica,
        fleet,
        _dir: dir,
    }
}

/// (state, replicas desired, wakes, failed wakes) of the sleepy graph.
pub async fn graph(pool: &PgPool, name: &str) -> (String, i32, i64, i64) {
    sqlx::query_as(
        "SELECT state, replicas_desired, wakes, wake_failures FROM graphs WHERE name = $1",
    )
    .bind(name)
    .fetch_one(pool)
    .await
    .unwrap()
}

/// How many times the graph entered `state` from another state.
pub async fn entered(pool: &PgPool, name: &str, state: &str) -> i64 {
    entity_entered(pool, "graph", name, state).await
}

/// How many times the graph or adapter (`entity`) `name` entered `state` from another state.
pub async fn entity_entered(pool: &PgPool, entity: &str, name: &str, state: &str) -> i64 {
    sqlx::query_scalar(
        "SELECT count(*) FROM lifecycle_history WHERE entity = $1 AND name = $2 AND to_state = $3
             AND from_state IS DISTINCT FROM to_state",
    )
    .bind(entity)
    .bind(name)
    .bind(state)
    .fetch_one(pool)
    .await
    .unwrap()
}

impl Sleepy {
    /// Waits until the sleepy graph is asleep with no replica left; returns when it was seen.
    pub async fn asleep(&self) -> Instant {
        eventually(SETTLE, "the idle graph asleep at zero replicas", || async {
            let (state, desired, ..) = graph(&self.app.pool, GRAPH).await;
            state == "asleep" && desired == 0 && self.fleet.replicas(GRAPH).await.is_empty()
        })
        .await;
        Instant::now()
    }

    /// Waits until `tenant` is served `model`.
    pub async fn served(&self, tenant: &Tenant, model: &str) {
        eventually(SETTLE, "served", || async {
            self.app.ask(tenant, model).await.0 == 200
        })
        .await;
    }
}

/// One chat completion: (status, request id, retry-after, body, time taken).
pub async fn call(
    app: &TestApp,
    key: &str,
    model: &str,
) -> (u16, String, Option<String>, serde_json::Value, Duration) {
    let t = Instant::now();
    let r = app
        .post(
            key,
            "/v1/chat/completions",
            chat(model, "wake up please", 4),
        )
        .send()
        .await
        .unwrap();
    let status = r.status().as_u16();
    let id = request_id(&r);
    let retry = r
        .headers()
        .get("retry-after")
        .map(|v| v.to_str().unwrap().to_owned());
    let body = r.json().await.unwrap_or(serde_json::Value::Null);
    (status, id, retry, body, t.elapsed())
}

/// The text of the table row with `class`, tags removed.
pub fn row_text(html: &str, class: &str) -> String {
    let marker = format!(r#"<tr class="{class}">"#);
    let start = html
        .find(&marker)
        .unwrap_or_else(|| panic!("no row {class}: {html}"));
    let row = &html[start..];
    let row = &row[..row.find("</tr>").unwrap()];
    let mut out = String::new();
    let mut in_tag = false;
    for c in row.chars() {
        match c {
            '<' => in_tag = true,
            '>' => in_tag = false,
            c if !in_tag => out.push(c),
            _ => {}
        }
    }
    out
}

/// A streamed chat of `tokens` tokens to `model` through `via`, as `tenant`: at the 25 tokens/s
/// these tests pace the sim to, 150 tokens run 6 s, past an idle policy and its grace.
pub async fn long_stream(
    via: &TestApp,
    tenant: &Tenant,
    model: &str,
    tokens: u32,
) -> reqwest::Response {
    let mut body = chat(model, "a long story please", tokens);
    body["stream"] = true.into();
    let r = via
        .post(&tenant.key, "/v1/chat/completions", body)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    r
}

/// Reads an SSE stream to its end: (longest gap between content chunks, content chunks).
pub async fn stream_gaps(r: reqwest::Response) -> (Duration, usize) {
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
    assert!(done, "the stream ended normally");
    let gap = stamps
        .windows(2)
        .map(|w| w[1] - w[0])
        .max()
        .unwrap_or_default();
    (gap, stamps.len())
}

impl Sleepy {
    /// Asserts each request reached `graph`'s engines once and was billed, once, exactly what
    /// the engine's ledger says it produced.
    pub async fn billed_once(&self, graph: &str, request_ids: impl IntoIterator<Item = &String>) {
        let ledger: Vec<_> = self
            .fleet
            .replicas(graph)
            .await
            .iter()
            .flat_map(|r| r.sim.ledger())
            .collect();
        for id in request_ids {
            let entries: Vec<_> = ledger
                .iter()
                .filter(|e| e.request_id.as_deref() == Some(id.as_str()))
                .collect();
            assert_eq!(entries.len(), 1, "{id} reached the engine once");
            let event = self.app.event(id).await;
            assert_eq!(event.status, UsageStatus::Ok);
            assert_eq!(event.prompt_tokens, i64::from(entries[0].prompt_tokens));
            assert_eq!(
                event.completion_tokens,
                i64::from(entries[0].completion_tokens)
            );
        }
    }

    /// The first replica's `/metrics` text.
    pub async fn metrics(&self) -> String {
        self.app.metrics().await
    }
}

/// (graph, adapters) idle policy of `base`, in seconds (`None`: always on / always loaded).
pub async fn idle_policies(pool: &PgPool, base: &str) -> (Option<i32>, Option<i32>) {
    sqlx::query_as(
        "SELECT t.idle_after_secs, t.adapter_idle_after_secs FROM base_templates t
         JOIN base_models b ON b.id = t.base_model_id WHERE b.name = $1",
    )
    .bind(base)
    .fetch_one(pool)
    .await
    .unwrap()
}

/// Audited idle-policy changes by `actor` (of one `scope`, `graph` or `adapters`, if given).
pub async fn idle_policy_audits(pool: &PgPool, actor: &str, scope: Option<&str>) -> i64 {
    sqlx::query_scalar(
        "SELECT count(*) FROM audit_log WHERE action = 'fleet.idle_policy' AND actor = $1
           AND ($2::text IS NULL OR detail->>'scope' = $2)",
    )
    .bind(actor)
    .bind(scope)
    .fetch_one(pool)
    .await
    .unwrap()
}

impl Sleepy {
    /// A browser signed in as a platform admin (created here) on the first replica.
    pub async fn admin_browser(&self) -> Browser {
        tf_core::accounts::create_user(
            &self.app.pool,
            ADMIN,
            PASSWORD,
            tf_core::accounts::Role::Admin,
            None,
        )
        .await
        .unwrap();
        let portal = TestPortal {
            base: self.app.url(""),
            pool: self.app.pool.clone(),
            redis_prefix: String::new(),
        };
        let b = portal.browser();
        assert_redirect(&b.login(ADMIN, PASSWORD).await, "/admin");
        b
    }
}
