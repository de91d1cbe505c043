//! Assembling the server: state, routes and background workers, independent of how it is
//! started (the `serve` command, or a test binding port 0).

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use sqlx::PgPool;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::gateway::auth::KeyCache;
use crate::gateway::resolve::RouteTable;
use crate::gateway::{self, Gateway, GatewayInner, GatewayOptions};
use crate::http_server::ServerMetrics;
use crate::journal::{Journal, JournalSink, Shipper};
use crate::usage::{SpendBarrier, UsageSink};
use crate::usage_store::PgSink;

/// How often batched `last_used_at` updates are written.
const LAST_USED_FLUSH: Duration = Duration::from_secs(5);
/// How often expired portal sessions are deleted.
const SESSION_PURGE: Duration = Duration::from_secs(600);

/// The Redis key prefix when none is given (`--redis-prefix`).
pub const DEFAULT_REDIS_PREFIX: &str = "tf:";

/// What `build` needs besides the database.
#[derive(Clone)]
pub struct AppOptions {
    /// Redis for shared limits and login throttling; while empty, both count per replica.
    pub redis: tf_core::redis_slot::RedisSlot,
    pub redis_prefix: String,
    pub secure_cookies: bool,
    /// The proxies whose `X-Forwarded-For` names the client for the portal's login throttle.
    pub trusted_proxies: tf_app::ssr::client_addr::TrustedProxies,
    /// Most working keys a tenant may have.
    pub max_keys_per_tenant: u32,
    pub gateway: GatewayOptions,
    /// The local usage journal (the production sink) and its shipper; PostgreSQL directly when
    /// `None`.
    pub journal: Option<Arc<Journal>>,
    /// Admission settings (lease time, local fallback share, reconciler period).
    pub quota: crate::quota::QuotaOptions,
    /// How often this replica reports its figures for `/admin/ops`.
    pub replica_report_every: Duration,
    /// Adapter storage, upload limits and the fleet backend the controller drives.
    pub lifecycle: crate::lifecycle::LifecycleOptions,
    /// The billing rater (one leader per cluster); `None` leaves usage unrated.
    pub rater: Option<crate::billing::rater::RaterOptions>,
}

impl Default for AppOptions {
    fn default() -> Self {
        Self {
            redis: tf_core::redis_slot::RedisSlot::empty(),
            redis_prefix: DEFAULT_REDIS_PREFIX.into(),
            secure_cookies: false,
            trusted_proxies: Default::default(),
            max_keys_per_tenant: tf_core::keys::DEFAULT_MAX_KEYS_PER_TENANT,
            gateway: GatewayOptions::default(),
            journal: None,
            quota: crate::quota::QuotaOptions::default(),
            replica_report_every: crate::replica_report::REPORT_EVERY,
            lifecycle: crate::lifecycle::LifecycleOptions::default(),
            rater: Some(crate::billing::rater::RaterOptions::default()),
        }
    }
}

/// A built server: its router and the handles to stop it.
pub struct App {
    pub router: Router,
    /// `GET /metrics` alone, served on `--metrics-listen` (never the client port).
    pub metrics_router: Router,
    pub gateway: Gateway,
    /// Background workers and metering tasks.
    pub tracker: TaskTracker,
    /// Cancelled to stop the background workers.
    pub cancel: CancellationToken,
    /// Cancelled at the shutdown deadline to cut streams still running.
    pub cut: CancellationToken,
    /// Moves journal records to PostgreSQL (when there is a journal).
    pub shipper: Option<Arc<Shipper>>,
    /// Client connection counters, filled by `http_server::serve`.
    pub http_metrics: Arc<ServerMetrics>,
    /// This process among the replicas (`/admin/ops`, `replica_reports`).
    pub replica_id: uuid::Uuid,
    /// The model lifecycle service (API and portal share it).
    pub lifecycle: crate::lifecycle::Lifecycle,
    /// The fleet controller's counters (`tf_fleet_*`).
    pub fleet_metrics: Arc<crate::lifecycle::FleetMetrics>,
}

/// Builds state, loads the resolution table and starts the background workers.
pub async fn build(pool: PgPool, options: AppOptions) -> anyhow::Result<App> {
    let tracker = TaskTracker::new();
    let cancel = CancellationToken::new();
    let keys = Arc::new(KeyCache::new(pool.clone()).trusting(options.trusted_proxies.clone()));
    let routes = Arc::new(RouteTable::new(pool.clone(), options.gateway.upstream()));
    routes.reload().await?;
    let cut = CancellationToken::new();
    let quota = crate::quota::Quota::start(
        pool.clone(),
        options.redis.clone(),
        options.redis_prefix.clone(),
        options.quota.clone(),
        &tracker,
        cancel.clone(),
    )
    .await;
    // Every writer of usage to PostgreSQL waits for the quota's spend to reach Redis first.
    let spend = {
        let quota = quota.clone();
        SpendBarrier::new(move || {
            let quota = quota.clone();
            async move { quota.spend_flushed().await }
        })
    };
    let (sink, shipper): (Arc<dyn UsageSink>, _) = match &options.journal {
        Some(journal) => {
            let shipper = Arc::new(
                Shipper::new(journal.dir.clone(), pool.clone(), journal.metrics.clone())
                    .with_spend_barrier(spend.clone())
                    .waking_on(journal.appended.clone()),
            );
            tracker.spawn(shipper.clone().run(cancel.clone()));
            (
                Arc::new(JournalSink {
                    journal: journal.clone(),
                    pool: pool.clone(),
                    spend: Some(spend),
                }),
                Some(shipper),
            )
        }
        None => (
            Arc::new(PgSink::new(pool.clone()).with_spend_barrier(spend)),
            None,
        ),
    };
    let request_metrics = Arc::new(crate::telemetry::requests::RequestMetrics::default());
    // Every finished request's event passes the metrics on its way to the journal.
    let sink: Arc<dyn UsageSink> = Arc::new(crate::telemetry::sink::ObservedSink {
        inner: sink,
        metrics: request_metrics.clone(),
    });
    let limits = quota.limits().clone();
    let fleet_metrics = Arc::new(crate::lifecycle::FleetMetrics::default());
    tracker.spawn(crate::gateway::activity::flush(
        routes.activity().clone(),
        pool.clone(),
        cancel.clone(),
    ));
    let (bodies, body_queue) =
        crate::bodies::capture::BodyCapture::new(crate::bodies::capture::QUEUE_LEN);
    tracker.spawn(crate::bodies::writer::run(
        pool.clone(),
        body_queue,
        cancel.clone(),
    ));
    tracker.spawn(crate::bodies::retention::run(
        pool.clone(),
        crate::bodies::retention::EVERY,
        cancel.clone(),
    ));
    let gateway = Gateway::new(GatewayInner {
        keys: keys.clone(),
        routes: routes.clone(),
        sink,
        tracker: tracker.clone(),
        cut: cut.clone(),
        max_body_bytes: options.gateway.max_body_bytes,
        max_answer_bytes: options.gateway.max_answer_bytes,
        body_timing: options.gateway.body_timing(),
        quota,
        hold_limit: options.gateway.hold_limit(),
        fleet_metrics: fleet_metrics.clone(),
        metrics: request_metrics.clone(),
        bodies: bodies.clone(),
        inflight: options.journal.as_ref().map(|j| j.inflight.clone()),
        trust_traceparent_from: options.gateway.trust_traceparent_from.clone(),
    });

    let activity = routes.activity().clone();
    tracker.spawn(crate::notify::listen(
        pool.clone(),
        keys.clone(),
        routes,
        limits,
        cancel.clone(),
    ));
    let store = options.lifecycle.adapter_store()?;
    let lifecycle =
        crate::lifecycle::Lifecycle::new(pool.clone(), store.clone(), options.lifecycle.limits);
    if let Some(backend) = &options.lifecycle.backend {
        let controller = crate::lifecycle::Controller::new(
            pool.clone(),
            backend.clone(),
            fleet_metrics.clone(),
            options.lifecycle.controller,
        )
        .with_store(store)
        .with_start_timeout(options.lifecycle.adapter_start_timeout);
        tracker.spawn(controller.run(cancel.clone()));
    }
    let api = crate::api::router(crate::api::ApiState {
        keys: keys.clone(),
        lifecycle: lifecycle.clone(),
    });
    tracker.spawn(flush_last_used(keys, cancel.clone()));
    tracker.spawn(purge_sessions(pool.clone(), cancel.clone()));
    if let Some(rater) = options.rater {
        tracker.spawn(crate::billing::rater::run(
            pool.clone(),
            rater,
            cancel.clone(),
        ));
    }
    let http_metrics = Arc::new(ServerMetrics::default());
    let replica_id = uuid::Uuid::now_v7();
    let reporter = crate::replica_report::Reporter {
        pool: pool.clone(),
        replica_id,
        hostname: crate::replica_report::hostname(),
        started_at: time::OffsetDateTime::now_utc(),
        journal: options.journal.as_ref().map(|j| j.metrics.clone()),
        http: http_metrics.clone(),
    };
    tracker.spawn(reporter.run(options.replica_report_every, cancel.clone()));

    let rating = Arc::new(crate::billing::lag::RatingLag::new(pool.clone()));
    let health = crate::health::router(crate::health::Health::new(
        pool.clone(),
        options.redis.clone(),
    ));
    let portal = crate::portal::router_with_models(
        tf_app::ssr::PortalDeps {
            pool,
            redis: options.redis.clone(),
            redis_prefix: options.redis_prefix.clone(),
            secure_cookies: options.secure_cookies,
            trusted_proxies: options.trusted_proxies.clone(),
            max_keys_per_tenant: options.max_keys_per_tenant,
            ops: options.journal.as_ref().map(|j| {
                let m = j.metrics.clone();
                let read: Arc<dyn Fn() -> tf_app::model::OpsSnapshot + Send + Sync> =
                    Arc::new(move || m.snapshot());
                read
            }),
            cold: Some({
                let m = fleet_metrics.clone();
                let read: Arc<dyn Fn() -> tf_app::model::ColdSnapshot + Send + Sync> =
                    Arc::new(move || {
                        let c = m.cold_summary();
                        tf_app::model::ColdSnapshot {
                            requests: c.requests,
                            last_ms: c.last_ms,
                            p50_le_ms: c.p50_le_ms,
                            p99_le_ms: c.p99_le_ms,
                        }
                    });
                read
            }),
        },
        lifecycle.clone(),
    )
    .await?;
    let metrics_router = crate::metrics_scrape::router(crate::metrics_scrape::MetricsSources {
        requests: request_metrics,
        http: http_metrics.clone(),
        fleet: fleet_metrics.clone(),
        bodies,
        journal: options.journal.as_ref().map(|j| j.metrics.clone()),
        activity,
        rating,
    });
    // `/metrics` is not on this router: platform-wide counters are for the operator's listener.
    let router = gateway::router(gateway.clone())
        .merge(health)
        .merge(crate::body_bounds::bound(
            api.merge(portal),
            body_bounds(&options),
        ));
    Ok(App {
        router,
        metrics_router,
        gateway,
        tracker,
        cancel,
        cut,
        shipper,
        http_metrics,
        replica_id,
        lifecycle,
        fleet_metrics,
    })
}

/// Forms read whole within `/v1`'s body timing; uploads at its minimum rate, up to both files.
fn body_bounds(options: &AppOptions) -> crate::body_bounds::BodyBounds {
    use crate::body_bounds::{BodyBounds, Bound};
    let files = &options.lifecycle.limits;
    BodyBounds {
        form: Bound {
            max_bytes: options.gateway.max_form_bytes as u64,
            timing: options.gateway.body_timing(),
        },
        upload: Bound {
            // Both files plus the multipart framing and the name fields.
            max_bytes: files.config_bytes + files.weights_bytes + (1 << 20),
            timing: options.gateway.body_timing(),
        },
    }
}

async fn flush_last_used(keys: Arc<KeyCache>, cancel: CancellationToken) {
    let mut tick = tokio::time::interval(LAST_USED_FLUSH);
    loop {
        tokio::select! {
            () = cancel.cancelled() => break,
            _ = tick.tick() => {}
        }
        if let Err(e) = keys.flush_last_used().await {
            tracing::warn!(error = %e, "could not record key last-use times");
        }
    }
    let _ = keys.flush_last_used().await;
}

/// Expired portal sessions are not deleted by the store itself.
async fn purge_sessions(pool: PgPool, cancel: CancellationToken) {
    let mut tick = tokio::time::interval(SESSION_PURGE);
    loop {
        tokio::select! {
            () = cancel.cancelled() => break,
            _ = tick.tick() => {}
        }
        if let Err(e) = crate::portal::purge_expired_sessions(&pool).await {
            tracing::warn!(error = %e, "could not purge expired sessions");
        }
    }
}
