//! The one way tests start Token Factory: [`TestApp::builder`] on the fresh database
//! `#[sqlx::test]` made, then one of
//! - [`start`](TestAppBuilder::start): the whole server in-process on port 0, in front of an
//!   in-process engine simulator (or beside another replica's, with
//!   [`replica_of`](TestAppBuilder::replica_of));
//! - [`start_portal`](TestAppBuilder::start_portal): the portal router alone, with seeded logins;
//! - [`process`](TestAppBuilder::process): the `tokenfactory` binary as a child process the test
//!   can kill, in front of an in-process simulator.
//!
//! Every setting a test can change is a builder method, so a change to the server's options is
//! made here once, not in every test.

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;

use redis::aio::ConnectionManager;
use sqlx::PgPool;
use tf_core::redis_slot::RedisSlot;
use tf_engine_sim::{EngineSim, LedgerEntry, SimConfig};
use tokenfactory::app::{self, App, AppOptions};
use tokenfactory::fleet::{self, BaseRegistration};
use tokenfactory::gateway::GatewayOptions;
use tokenfactory::journal::Journal;
use tokenfactory::quota::QuotaOptions;
use tokenfactory::usage::UsageEvent;
use uuid::Uuid;

use super::eventually::eventually;
use super::portal::TestPortal;
use super::process::Deployment;
use super::sim::{self, Sim, BASE};

/// The Redis every test shares (keys under a fresh prefix per app).
pub const REDIS: &str = "redis://127.0.0.1:6379";

/// How long a test waits for a request's event or ledger entry.
const SETTLE: std::time::Duration = std::time::Duration::from_secs(5);

/// A running in-process server and the simulator behind it.
pub struct TestApp {
    pub addr: SocketAddr,
    /// The `/metrics` listener (as `--metrics-listen`).
    pub metrics_addr: SocketAddr,
    pub pool: PgPool,
    pub sim: EngineSim,
    pub sim_addr: SocketAddr,
    pub app: App,
    pub http: reqwest::Client,
    /// The Redis key prefix of this app's deployment.
    pub redis_prefix: String,
}

/// A tenant with one API key.
pub struct Tenant {
    pub id: Uuid,
    pub name: String,
    pub key: String,
    pub key_id: Uuid,
}

/// Which Redis the app uses.
enum Redis {
    None,
    /// [`REDIS`], connected at start.
    Shared,
    Slot(RedisSlot),
}

/// Settings of a test deployment; see the module doc.
pub struct TestAppBuilder {
    pool: PgPool,
    sim: SimConfig,
    replica_of: Option<Sim>,
    redis: Redis,
    redis_prefix: Option<String>,
    secure_cookies: bool,
    gateway: GatewayOptions,
    quota: QuotaOptions,
    journal: Option<Arc<Journal>>,
    database_via: Option<SocketAddr>,
    durability: &'static str,
    drain_seconds: u64,
    lifecycle: tokenfactory::lifecycle::LifecycleOptions,
    trusted_proxies: tf_app::ssr::client_addr::TrustedProxies,
    max_keys_per_tenant: u32,
    rater: bool,
    /// Extra environment of a [`process`](Self::process) deployment's gateway.
    process_env: Vec<(String, String)>,
}

impl TestApp {
    pub fn builder(pool: PgPool) -> TestAppBuilder {
        TestAppBuilder {
            pool,
            sim: SimConfig::default(),
            replica_of: None,
            redis: Redis::None,
            redis_prefix: None,
            secure_cookies: false,
            gateway: GatewayOptions::default(),
            quota: QuotaOptions::default(),
            journal: None,
            database_via: None,
            durability: "process",
            drain_seconds: 5,
            lifecycle: tokenfactory::lifecycle::LifecycleOptions::default(),
            trusted_proxies: Default::default(),
            max_keys_per_tenant: tf_core::keys::DEFAULT_MAX_KEYS_PER_TENANT,
            rater: true,
            process_env: Vec::new(),
        }
    }
}

impl TestAppBuilder {
    /// The simulator's configuration (it serves [`BASE`] unless it names models).
    pub fn sim(mut self, config: SimConfig) -> Self {
        self.sim = config;
        self
    }

    /// Another replica of `primary`'s deployment: same database and simulator; no simulator of
    /// its own, no base registered again. Give it the same Redis prefix to share limits.
    pub fn replica_of(mut self, primary: &TestApp) -> Self {
        self.replica_of = Some(Sim {
            sim: primary.sim.clone(),
            addr: primary.sim_addr,
        });
        self
    }

    /// Serves with `sim`, started by the test, as its simulator (no base registered for it):
    /// for a fleet backend that must know the simulator's address before the server starts.
    pub fn upstream_sim(mut self, sim: Sim) -> Self {
        self.replica_of = Some(sim);
        self
    }

    /// Adapter storage, limits, and the fleet backend the controller drives (default: none).
    pub fn lifecycle(mut self, lifecycle: tokenfactory::lifecycle::LifecycleOptions) -> Self {
        self.lifecycle = lifecycle;
        self
    }

    /// Redis at [`REDIS`] (default: none, limits count per replica).
    pub fn shared_redis(mut self) -> Self {
        self.redis = Redis::Shared;
        self
    }

    /// This Redis connection.
    pub fn redis(self, redis: ConnectionManager) -> Self {
        self.redis_slot(Some(redis).into())
    }

    /// This Redis slot (which may be empty now and filled later).
    pub fn redis_slot(mut self, slot: RedisSlot) -> Self {
        self.redis = Redis::Slot(slot);
        self
    }

    /// The Redis key prefix (default: a fresh one).
    pub fn redis_prefix(mut self, prefix: &str) -> Self {
        self.redis_prefix = Some(prefix.to_owned());
        self
    }

    /// The proxies whose `X-Forwarded-For` the portal believes (default: none), as CIDRs.
    pub fn trusted_proxies(mut self, cidrs: &str) -> Self {
        self.trusted_proxies = cidrs.parse().unwrap();
        self
    }

    /// Most working keys a tenant may have (default: the server's default).
    pub fn max_keys_per_tenant(mut self, cap: u32) -> Self {
        self.max_keys_per_tenant = cap;
        self
    }

    /// No billing rater in this app (usage waits in the rating queue until a test rates it).
    pub fn without_rater(mut self) -> Self {
        self.rater = false;
        self
    }

    pub fn secure_cookies(mut self) -> Self {
        self.secure_cookies = true;
        self
    }

    /// Gateway settings (body limits and timing).
    pub fn gateway(mut self, gateway: GatewayOptions) -> Self {
        self.gateway = gateway;
        self
    }

    /// Admission settings.
    pub fn quota(mut self, quota: QuotaOptions) -> Self {
        self.quota = quota;
        self
    }

    /// Usage goes through this journal (default: PostgreSQL directly).
    pub fn journal(mut self, journal: Arc<Journal>) -> Self {
        self.journal = Some(journal);
        self
    }

    /// A child process reaches PostgreSQL through this address (a proxy the test controls).
    pub fn database_via(mut self, addr: SocketAddr) -> Self {
        self.database_via = Some(addr);
        self
    }

    /// A child process' `TF_JOURNAL_DURABILITY` (default `process`).
    pub fn durability(mut self, durability: &'static str) -> Self {
        self.durability = durability;
        self
    }

    /// A child process' `TF_DRAIN_SECONDS` (default 5).
    /// Sets `key` in a process deployment's gateway environment (its flags' variables).
    pub fn process_env(mut self, key: &str, value: &str) -> Self {
        self.process_env.push((key.to_owned(), value.to_owned()));
        self
    }

    pub fn drain_seconds(mut self, seconds: u64) -> Self {
        self.drain_seconds = seconds;
        self
    }

    async fn redis_slot_now(&self) -> RedisSlot {
        match &self.redis {
            Redis::None => RedisSlot::empty(),
            Redis::Shared => {
                let client = redis::Client::open(REDIS).unwrap();
                Some(ConnectionManager::new(client).await.unwrap()).into()
            }
            Redis::Slot(slot) => slot.clone(),
        }
    }

    fn prefix(&self) -> String {
        self.redis_prefix
            .clone()
            .unwrap_or_else(|| format!("tftest-{}:", Uuid::new_v4().simple()))
    }

    /// Starts the whole server in-process on port 0; the simulator serves [`BASE`].
    pub async fn start(self) -> TestApp {
        let sim = match &self.replica_of {
            Some(sim) => sim.clone(),
            None => {
                let sim = sim::start(self.sim.clone()).await;
                register_sim_base(&self.pool, sim.addr).await;
                sim
            }
        };
        let redis_prefix = self.prefix();
        let options = AppOptions {
            redis: self.redis_slot_now().await,
            redis_prefix: redis_prefix.clone(),
            secure_cookies: self.secure_cookies,
            gateway: self.gateway,
            journal: self.journal,
            quota: self.quota,
            lifecycle: self.lifecycle,
            trusted_proxies: self.trusted_proxies,
            max_keys_per_tenant: self.max_keys_per_tenant,
            rater: if self.rater {
                AppOptions::default().rater
            } else {
                None
            },
            ..AppOptions::default()
        };
        let app = app::build(self.pool.clone(), options).await.unwrap();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(tokenfactory::http_server::serve(
            listener,
            app.router.clone(),
            Default::default(),
            app.http_metrics.clone(),
            std::future::pending(),
        ));
        let metrics_listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let metrics_addr = metrics_listener.local_addr().unwrap();
        let metrics_router = app.metrics_router.clone();
        tokio::spawn(async move { axum::serve(metrics_listener, metrics_router).await });
        TestApp {
            addr,
            metrics_addr,
            pool: self.pool,
            sim: sim.sim,
            sim_addr: sim.addr,
            app,
            http: reqwest::Client::new(),
            redis_prefix,
        }
    }

    /// Starts the portal router alone, with an `acme` tenant (member
    /// [`MEMBER`](super::portal::MEMBER)) and an admin ([`ADMIN`](super::portal::ADMIN)). Its
    /// operations panel shows a fixed journal snapshot (7 journaled, 5 shipped, 4242 bytes
    /// behind, 31 ms lag, 2 failures), so the page is checked against known numbers.
    pub async fn start_portal(self) -> TestPortal {
        use super::portal::{ADMIN, MEMBER, PASSWORD};
        use tf_core::accounts::{self, Role};
        let pool = self.pool.clone();
        let tenant = accounts::create_tenant(&pool, "acme", "Acme Corp")
            .await
            .unwrap();
        accounts::create_user(&pool, MEMBER, PASSWORD, Role::TenantMember, Some(tenant.id))
            .await
            .unwrap();
        accounts::create_user(&pool, ADMIN, PASSWORD, Role::Admin, None)
            .await
            .unwrap();
        let redis_prefix = self.prefix();
        let router = tokenfactory::portal::router(tf_app::ssr::PortalDeps {
            pool: pool.clone(),
            redis: self.redis_slot_now().await,
            redis_prefix: redis_prefix.clone(),
            secure_cookies: self.secure_cookies,
            trusted_proxies: self.trusted_proxies.clone(),
            max_keys_per_tenant: self.max_keys_per_tenant,
            ops: Some(Arc::new(|| tf_app::model::OpsSnapshot {
                journaled: 7,
                shipped: 5,
                backlog_bytes: 4242,
                ship_lag_ms: 31,
                ship_failures: 2,
            })),
            cold: None,
        })
        .await
        .unwrap();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(tokenfactory::http_server::serve(
            listener,
            router,
            Default::default(),
            Default::default(),
            std::future::pending(),
        ));
        TestPortal {
            base: format!("http://{addr}"),
            pool,
            redis_prefix,
        }
    }

    /// Starts a simulator and describes a `tokenfactory serve` child process in front of it,
    /// journaling under `dir`; [`Deployment::start`] runs (and re-runs) the process.
    pub async fn process(self, dir: &Path) -> Deployment {
        let sim = sim::start(self.sim.clone()).await;
        let embedding = self.sim.models.iter().any(|m| m == super::embed::EMBED);
        Deployment::new(
            sim,
            &self.pool,
            self.database_via,
            dir,
            self.durability,
            self.drain_seconds,
            embedding,
        )
        .with_env(self.process_env)
    }
}

/// Routes [`BASE`] to the simulator at `sim`. The tests drive the simulator through its `sim`
/// request block, which the default engine policy strips, so it is allowed here.
pub async fn register_sim_base(pool: &PgPool, sim: SocketAddr) {
    fleet::register_bases(
        pool,
        "static",
        &[BaseRegistration {
            name: BASE.into(),
            graph: "graph-a".into(),
            upstream_url: format!("http://{sim}/v1"),
            upstream_model: BASE.into(),
            continuous_usage: true,
            denied_fields: Some(tokenfactory::engine_policy::EnginePolicy::denied_except(&[
                "sim",
            ])),
            prompt_estimator: tokenfactory::engine_policy::PromptEstimator::SimWords,
            kind: tf_core::endpoint::ModelKind::Chat,
            nvext_allowed: None,
        }],
    )
    .await
    .unwrap();
}

impl TestApp {
    /// The scrape of the metrics listener.
    pub async fn metrics(&self) -> String {
        self.http
            .get(format!("http://{}/metrics", self.metrics_addr))
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap()
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://{}{}", self.addr, path)
    }

    pub async fn tenant(&self, name: &str) -> Tenant {
        let t = tf_core::accounts::create_tenant(&self.pool, name, name)
            .await
            .unwrap();
        let (row, key) = tf_core::keys::issue(&self.pool, t.id, "test")
            .await
            .unwrap();
        Tenant {
            id: t.id,
            name: name.into(),
            key,
            key_id: row.id,
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
        tokenfactory::usage_store::query(&self.pool, None, None, None)
            .await
            .unwrap()
    }

    /// Waits (bounded) until the simulator's ledger has an entry for `request_id`.
    pub async fn ledger_entry(&self, request_id: &str) -> LedgerEntry {
        eventually(
            SETTLE,
            &format!("a ledger entry for {request_id}"),
            || async {
                self.sim
                    .ledger()
                    .into_iter()
                    .find(|e| e.request_id.as_deref() == Some(request_id))
            },
        )
        .await
    }

    /// Waits (bounded) until the usage event for `request_id` is stored.
    pub async fn event(&self, request_id: &str) -> UsageEvent {
        let id: Uuid = request_id.parse().unwrap();
        eventually(
            SETTLE,
            &format!("the usage event of {request_id}"),
            || async { self.events().await.into_iter().find(|e| e.request_id == id) },
        )
        .await
    }
}
