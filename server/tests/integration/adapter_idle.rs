//! Idle adapters on a warm base (issue 18), against real PostgreSQL and the `local-sim` fleet:
//! with an adapter idle policy, an adapter without requests leaves the engines while its base's
//! graph keeps serving the others (a co-tenant's stream never stalls, the graph never sleeps);
//! requests for it are then held while one reload brings it back, however many requests and
//! gateway replicas ask, and each is billed once; a failed reload answers every held request 503
//! and bills nothing; admins set the policy by form and CLI, audited.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests may fail loudly

use crate::common;

use std::time::Duration;

use common::lifecycle::valid_adapter;
use common::sleepy::{
    call, entered, entity_entered, idle_policies, idle_policy_audits, long_stream, start_on,
    stream_gaps, Sleepy, SETTLE, WARM,
};
use common::{eventually, Tenant};
use sqlx::PgPool;
use tf_engine_sim::SimConfig;
use tokenfactory::fleet::sim_fleet::SimFleet;
use tokenfactory::usage::UsageStatus;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

const WARM_GRAPH: &str = "local-sim/warm-base";
const ADAPTER_IDLE_SECS: i32 = 2;

/// The harness with `pacing` and `load_delay` per adapter load, and the adapter idle policy set
/// on the always-on base.
async fn warm(pool: &PgPool, pacing: SimConfig, load_delay: Duration) -> Sleepy {
    let fleet = SimFleet::new(TaskTracker::new(), CancellationToken::new(), pacing)
        .with_adapter_load_delay(load_delay);
    let h = start_on(pool.clone(), fleet, 120_000).await;
    assert!(
        tf_core::db::sleep::set_adapter_idle_after(pool, WARM, Some(ADAPTER_IDLE_SECS))
            .await
            .unwrap()
    );
    h
}

/// Uploads `name` on the warm base for `tenant` and waits until it is ready.
async fn ready_adapter(h: &Sleepy, tenant: &Tenant, name: &str) {
    let (config, weights) = valid_adapter(WARM);
    let (status, body) = h.app.upload(tenant, name, WARM, &config, &weights).await;
    assert_eq!(status, 201, "{body}");
    h.app.manage(tenant, name, "start").await;
    eventually(SETTLE, "the adapter ready", || async {
        h.app.state_of(tenant, name).await == "ready"
    })
    .await;
}

/// (state, reloads, failed reloads, engine name) of an adapter.
async fn adapter(pool: &PgPool, name: &str) -> (String, i64, i64, String) {
    sqlx::query_as(
        "SELECT state, reloads, reload_failures, upstream_model FROM adapters WHERE name = $1",
    )
    .bind(name)
    .fetch_one(pool)
    .await
    .unwrap()
}

/// How many times the adapter entered `state` from another state.
async fn adapter_entered(pool: &PgPool, name: &str, state: &str) -> i64 {
    entity_entered(pool, "adapter", name, state).await
}

impl Sleepy {
    /// Waits until `name` is unloaded and no engine of the warm graph has it.
    async fn unloaded(&self, name: &str) {
        eventually(SETTLE, "the idle adapter unloaded", || async {
            let (state, .., engine_name) = adapter(&self.app.pool, name).await;
            state == "unloaded" && !self.fleet.has_adapter(WARM_GRAPH, &engine_name).await
        })
        .await;
    }
}

#[sqlx::test(migrator = "tf_core::db::MIGRATOR")]
async fn an_idle_adapter_leaves_a_busy_warm_base_and_held_requests_reload_it_once(pool: PgPool) {
    let pacing = SimConfig {
        decode_tokens_per_sec: 25,
        ..SimConfig::default()
    };
    let load = Duration::from_millis(1200);
    let h = warm(&pool, pacing, load).await;
    let (acme, globex) = (h.app.tenant("acme").await, h.app.tenant("globex").await);
    ready_adapter(&h, &acme, "quiet-bot").await;
    ready_adapter(&h, &globex, "busy-bot").await;

    // The co-tenant streams 150 tokens at 25/s (6 s) while the quiet adapter goes idle and is
    // unloaded: the stream never stalls, its adapter stays, the warm graph stays up.
    let r = long_stream(&h.replica, &globex, "busy-bot", 150).await;
    let ((gaps, tokens), ()) = tokio::join!(stream_gaps(r), h.unloaded("quiet-bot"));
    assert_eq!(tokens, 150);
    assert!(gaps < Duration::from_millis(750), "longest gap {gaps:?}");
    assert_eq!(adapter_entered(&pool, "busy-bot", "unloading").await, 0);
    let (_, _, _, busy_engine) = adapter(&pool, "busy-bot").await;
    assert!(
        h.fleet.has_adapter(WARM_GRAPH, &busy_engine).await,
        "the busy adapter is still loaded"
    );
    assert_eq!(entered(&pool, WARM_GRAPH, "asleep").await, 0);
    assert_eq!(h.fleet.replicas(WARM_GRAPH).await.len(), 1);
    // Its owner is told it is still served.
    let (_, shown) = h.app.manage(&acme, "quiet-bot", "get").await;
    assert_eq!(shown["state"], "unloaded");
    assert_eq!(
        shown["reason"], "idle for 2 s; the next request loads it again",
        "{shown}"
    );

    // Twenty requests on two replicas: held through one reload, none refused.
    let calls = (0..20).map(|i| {
        let app = if i % 2 == 0 { &h.app } else { &h.replica };
        call(app, &acme.key, "quiet-bot")
    });
    let results = futures::future::join_all(calls).await;
    for (status, _, _, body, took) in &results {
        assert_eq!(*status, 200, "{body}");
        assert!(*took >= load - Duration::from_millis(100), "{took:?}");
    }
    let (state, reloads, failures, engine) = adapter(&pool, "quiet-bot").await;
    assert_eq!((state.as_str(), reloads, failures), ("ready", 1, 0));
    assert_eq!(adapter_entered(&pool, "quiet-bot", "reloading").await, 1);
    assert!(h.fleet.has_adapter(WARM_GRAPH, &engine).await);
    assert_eq!(h.app.app.fleet_metrics.wakes(), 0, "no graph woke");
    assert_eq!(
        h.app.app.fleet_metrics.cold_requests() + h.replica.app.fleet_metrics.cold_requests(),
        20
    );

    // Each billed once, exactly what the engine produced.
    h.billed_once(WARM_GRAPH, results.iter().map(|r| &r.1))
        .await;
    let metrics = h.metrics().await;
    assert!(
        metrics.contains("tf_fleet_adapter_reloads_total 1"),
        "{metrics}"
    );
    assert!(metrics.contains("tf_fleet_adapter_reload_failures_total 0"));
}

#[sqlx::test(migrator = "tf_core::db::MIGRATOR")]
async fn a_failed_reload_answers_every_held_request_503_and_bills_nothing(pool: PgPool) {
    let h = warm(&pool, SimConfig::default(), Duration::ZERO).await;
    let acme = h.app.tenant("acme").await;
    ready_adapter(&h, &acme, "quiet-bot").await;
    h.unloaded("quiet-bot").await;
    h.fleet.fail_adapter_loads(true);

    let calls = (0..10).map(|i| {
        let app = if i % 2 == 0 { &h.app } else { &h.replica };
        call(app, &acme.key, "quiet-bot")
    });
    let results = futures::future::join_all(calls).await;
    for (status, _, retry, body, _) in &results {
        assert_eq!(*status, 503, "{body}");
        assert_eq!(body["error"]["code"], "model_wake_failed", "{body}");
        assert_eq!(body["error"]["type"], "service_unavailable");
        assert_eq!(retry.as_deref(), Some("10"));
    }
    let (state, reloads, failures, engine) = adapter(&pool, "quiet-bot").await;
    assert_eq!(state, "unloaded");
    assert!(
        reloads >= 1 && reloads == failures,
        "{reloads} reloads, {failures} failed"
    );
    assert!(!h.fleet.has_adapter(WARM_GRAPH, &engine).await);
    for (_, id, ..) in &results {
        let event = h.app.event(id).await;
        assert_eq!(event.status, UsageStatus::UpstreamError);
        assert_eq!((event.prompt_tokens, event.completion_tokens), (0, 0));
    }

    // Once loads work again, the next request reloads it.
    h.fleet.fail_adapter_loads(false);
    eventually(SETTLE, "served after the failure", || async {
        h.app.ask(&acme, "quiet-bot").await.0 == 200
    })
    .await;
    assert_eq!(adapter(&pool, "quiet-bot").await.0, "ready");
}

#[sqlx::test(migrator = "tf_core::db::MIGRATOR")]
async fn admins_set_the_adapter_idle_policy_by_form_and_cli(pool: PgPool) {
    use common::portal::{assert_redirect, ADMIN};
    let h = warm(&pool, SimConfig::default(), Duration::ZERO).await;
    let b = h.admin_browser().await;
    let html = b.html("/admin/fleet").await;
    for shown in [
        "unloaded after 2s idle",
        "always loaded",
        r#"name="scope" value="adapters""#,
        "Adapter reloads (all adapters)",
    ] {
        assert!(html.contains(shown), "{shown} on the page: {html}");
    }
    let policy = |base: &'static str| {
        let pool = pool.clone();
        async move { idle_policies(&pool, base).await }
    };
    let audited = |actor: &'static str| {
        let pool = pool.clone();
        async move { idle_policy_audits(&pool, actor, Some("adapters")).await }
    };

    // The adapters form changes the adapters' policy only, never the graph's.
    let token = common::portal::csrf(&html);
    let post = |policy: &'static str, after: &'static str| {
        let (b, token) = (&b, token.clone());
        async move {
            b.post(
                "/api/admin_set_idle_policy",
                &[
                    ("csrf", token.as_str()),
                    ("base", WARM),
                    ("scope", "adapters"),
                    ("policy", policy),
                    ("after", after),
                ],
            )
            .await
        }
    };
    assert_redirect(&post("idle-after", "soon").await, "/admin/fleet");
    assert_eq!(policy(WARM).await, (None, Some(ADAPTER_IDLE_SECS)));
    assert_redirect(&post("idle-after", "15m").await, "/admin/fleet");
    assert_eq!(policy(WARM).await, (None, Some(900)));
    let page = b.html("/admin/fleet").await;
    assert!(page.contains("unloaded after 15m idle"), "{page}");
    assert_redirect(&post("always-loaded", "").await, "/admin/fleet");
    assert_eq!(policy(WARM).await, (None, None));
    assert_eq!(audited(ADMIN).await, 2);

    // The CLI, through the same function.
    let said = common::portal::admin(
        &pool,
        &[
            "fleet",
            "idle",
            "--base",
            WARM,
            "--adapters",
            "--after",
            "90s",
        ],
    )
    .await;
    assert!(said.contains("90 s"), "{said}");
    assert_eq!(policy(WARM).await, (None, Some(90)));
    common::portal::admin(
        &pool,
        &["fleet", "idle", "--base", WARM, "--adapters", "--always-on"],
    )
    .await;
    assert_eq!(policy(WARM).await, (None, None));
    assert_eq!(audited("cli").await, 2);
}
