//! Scale to zero (issue 18), against real PostgreSQL and the `local-sim` fleet with a start-up
//! delay: an idle graph goes to zero replicas; requests for it are held (not refused) while one
//! wake brings it back, however many requests and gateway replicas ask; a failed wake answers
//! every held request 503 and bills nothing; the hold limit is honoured; a hang-up while held is
//! recorded with zero tokens; a graph in use, and an always-on base beside a sleeping one, never
//! pause.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests may fail loudly

use crate::common;

use std::time::{Duration, Instant};

use common::lifecycle::valid_adapter;
use common::sleepy::{
    call, entered, graph, idle_policies, idle_policy_audits, long_stream, row_text, start,
    stream_gaps, GRAPH, IDLE_SECS, SETTLE, SLEEPY, WARM,
};
use common::{chat, eventually};
use sqlx::PgPool;
use tf_engine_sim::SimConfig;
use tokenfactory::usage::UsageStatus;

#[sqlx::test(migrator = "tf_core::db::MIGRATOR")]
async fn fifty_requests_on_two_replicas_wake_an_idle_graph_once_and_are_billed_once(pool: PgPool) {
    let startup = Duration::from_millis(1500);
    let h = start(pool.clone(), SimConfig::default(), startup, 120_000).await;
    let acme = h.app.tenant("acme").await;
    h.served(&acme, SLEEPY).await;
    let awake_at = Instant::now();
    let asleep_at = h.asleep().await;
    // Idle for IDLE_SECS, then the replicas stop after the grace.
    assert!(asleep_at - awake_at >= Duration::from_secs(IDLE_SECS as u64));
    assert_eq!(entered(&pool, GRAPH, "asleep").await, 1);

    let calls = (0..50).map(|i| {
        let app = if i % 2 == 0 { &h.app } else { &h.replica };
        call(app, &acme.key, SLEEPY)
    });
    let results = futures::future::join_all(calls).await;
    for (status, _, _, body, took) in &results {
        assert_eq!(*status, 200, "{body}");
        // Held through the cold start, not refused.
        assert!(*took >= startup - Duration::from_millis(100), "{took:?}");
    }
    let slowest = results.iter().map(|r| r.4).max().unwrap();
    println!("cold start {startup:?}: slowest of 50 held requests {slowest:?}");

    // One wake, whatever the number of requests and replicas.
    let (state, desired, wakes, failures) = graph(&pool, GRAPH).await;
    assert_eq!(
        (state.as_str(), desired, wakes, failures),
        ("ready", 1, 1, 0)
    );
    assert_eq!(entered(&pool, GRAPH, "waking").await, 1);
    assert_eq!(h.app.app.fleet_metrics.wakes(), 1);
    assert_eq!(
        h.app.app.fleet_metrics.cold_requests() + h.replica.app.fleet_metrics.cold_requests(),
        50
    );

    // Each billed once, exactly what the engine (the woken replica's ledger) produced.
    h.billed_once(GRAPH, results.iter().map(|r| &r.1)).await;
    let events = h.app.events().await;
    assert_eq!(
        events.iter().filter(|e| e.served_name == SLEEPY).count(),
        51,
        "the warm-up request and the 50, once each"
    );
    let metrics = h.metrics().await;
    assert!(metrics.contains("tf_fleet_wakes_total 1"), "{metrics}");
    assert!(
        metrics.contains("tf_gateway_cold_ttft_seconds_count 25"),
        "{metrics}"
    );
}

#[sqlx::test(migrator = "tf_core::db::MIGRATOR")]
async fn a_failed_wake_answers_every_held_request_503_and_bills_nothing(pool: PgPool) {
    let h = start(
        pool.clone(),
        SimConfig::default(),
        Duration::from_millis(300),
        120_000,
    )
    .await;
    let acme = h.app.tenant("acme").await;
    h.served(&acme, SLEEPY).await;
    h.asleep().await;
    h.fleet.fail_starts(true);

    let calls = (0..20).map(|i| {
        let app = if i % 2 == 0 { &h.app } else { &h.replica };
        call(app, &acme.key, SLEEPY)
    });
    let results = futures::future::join_all(calls).await;
    for (status, _, retry, body, _) in &results {
        assert_eq!(*status, 503, "{body}");
        assert_eq!(body["error"]["code"], "model_wake_failed", "{body}");
        assert_eq!(body["error"]["type"], "service_unavailable");
        assert_eq!(retry.as_deref(), Some("10"));
    }
    let (state, desired, wakes, failures) = graph(&pool, GRAPH).await;
    assert_eq!((state.as_str(), desired), ("asleep", 0));
    assert!(
        wakes >= 1 && wakes == failures,
        "{wakes} wakes, {failures} failed"
    );
    assert!(h.fleet.replicas(GRAPH).await.is_empty());
    // Recorded, billed nothing.
    for (_, id, ..) in &results {
        let event = h.app.event(id).await;
        assert_eq!(event.status, UsageStatus::UpstreamError);
        assert_eq!((event.prompt_tokens, event.completion_tokens), (0, 0));
    }

    // The next request, once starts work again, wakes it.
    h.fleet.fail_starts(false);
    h.served(&acme, SLEEPY).await;
    assert_eq!(graph(&pool, GRAPH).await.0, "ready");
}

#[sqlx::test(migrator = "tf_core::db::MIGRATOR")]
async fn the_hold_limit_is_honoured_and_a_hang_up_while_held_bills_nothing(pool: PgPool) {
    let startup = Duration::from_secs(3);
    let h = start(pool.clone(), SimConfig::default(), startup, 500).await;
    let acme = h.app.tenant("acme").await;
    h.served(&acme, SLEEPY).await;
    h.asleep().await;

    let (status, id, retry, body, took) = call(&h.app, &acme.key, SLEEPY).await;
    assert_eq!(status, 503, "{body}");
    assert_eq!(body["error"]["code"], "model_waking", "{body}");
    assert_eq!(retry.as_deref(), Some("10"));
    assert!(
        took >= Duration::from_millis(500) && took < Duration::from_millis(1500),
        "held {took:?} for a 500 ms limit"
    );
    let event = h.app.event(&id).await;
    assert_eq!((event.prompt_tokens, event.completion_tokens), (0, 0));

    // A client that gives up while held: recorded as an abort with zero tokens.
    let gave_up = h
        .replica
        .post(
            &acme.key,
            "/v1/chat/completions",
            chat(SLEEPY, "never mind", 4),
        )
        .timeout(Duration::from_millis(200))
        .send()
        .await;
    assert!(gave_up.is_err());
    let abort = eventually(SETTLE, "the hang-up recorded", || async {
        h.app
            .events()
            .await
            .into_iter()
            .find(|e| e.status == UsageStatus::ClientAbort)
    })
    .await;
    assert_eq!((abort.prompt_tokens, abort.completion_tokens), (0, 0));

    // The wake went on: retrying as told succeeds.
    h.served(&acme, SLEEPY).await;
    assert_eq!(graph(&pool, GRAPH).await.2, 1);
}

#[sqlx::test(migrator = "tf_core::db::MIGRATOR")]
async fn a_graph_in_use_never_sleeps_and_its_cotenants_adapter_wakes_it_later(pool: PgPool) {
    let pacing = SimConfig {
        decode_tokens_per_sec: 25,
        ..SimConfig::default()
    };
    let h = start(pool.clone(), pacing, Duration::from_millis(500), 120_000).await;
    let (acme, globex) = (h.app.tenant("acme").await, h.app.tenant("globex").await);
    h.served(&globex, SLEEPY).await;
    let (config, weights) = valid_adapter(SLEEPY);
    assert_eq!(
        h.app
            .upload(&acme, "quiet-bot", SLEEPY, &config, &weights)
            .await
            .0,
        201
    );
    h.app.manage(&acme, "quiet-bot", "start").await;
    eventually(SETTLE, "ready", || async {
        h.app.state_of(&acme, "quiet-bot").await == "ready"
    })
    .await;

    // One stream of 150 tokens at 25/s (6 s) outlasts the idle policy and the grace: the
    // graph stays up under it, and its tokens never stall.
    let r = long_stream(&h.replica, &globex, SLEEPY, 150).await;
    let (gaps, tokens) = stream_gaps(r).await;
    assert_eq!(tokens, 150);
    assert!(gaps < Duration::from_millis(750), "longest gap {gaps:?}");
    assert_eq!(
        entered(&pool, GRAPH, "asleep").await,
        0,
        "slept under a stream"
    );

    // Idle once it ended; the co-tenant's adapter, asked for, wakes the graph and is there.
    h.asleep().await;
    let (status, _, _, body, _) = call(&h.app, &acme.key, "quiet-bot").await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(graph(&pool, GRAPH).await.2, 1);
}

#[sqlx::test(migrator = "tf_core::db::MIGRATOR")]
async fn an_always_on_base_keeps_serving_while_its_neighbour_sleeps_and_wakes(pool: PgPool) {
    let pacing = SimConfig {
        decode_tokens_per_sec: 25,
        ..SimConfig::default()
    };
    let h = start(pool.clone(), pacing, Duration::from_millis(500), 120_000).await;
    let (acme, globex) = (h.app.tenant("acme").await, h.app.tenant("globex").await);
    h.served(&acme, SLEEPY).await;
    h.served(&globex, WARM).await;
    let warm_graph = "local-sim/warm-base";

    // The warm base streams while the sleepy one goes to sleep, and then is woken.
    let r = long_stream(&h.app, &globex, WARM, 200).await;
    let neighbour = async {
        h.asleep().await;
        let (status, ..) = call(&h.replica, &acme.key, SLEEPY).await;
        assert_eq!(status, 200);
    };
    let ((gaps, tokens), ()) = tokio::join!(stream_gaps(r), neighbour);
    assert_eq!(tokens, 200);
    assert!(gaps < Duration::from_millis(750), "longest gap {gaps:?}");
    assert_eq!(graph(&pool, GRAPH).await.2, 1, "the neighbour woke once");
    let (state, desired, wakes, _) = graph(&pool, warm_graph).await;
    assert_eq!((state.as_str(), desired, wakes), ("ready", 1, 0));
    assert_eq!(entered(&pool, warm_graph, "asleep").await, 0);
}

#[sqlx::test(migrator = "tf_core::db::MIGRATOR")]
async fn admins_set_the_idle_policy_and_see_the_cold_time_to_first_token(pool: PgPool) {
    use common::portal::{assert_redirect, ADMIN};
    // The engine answers the head at once and its first token 700 ms later: a cold request's
    // time to first token is the start-up delay plus that, not the start-up delay alone.
    let pacing = SimConfig {
        ttft_ms: 700,
        ..SimConfig::default()
    };
    let startup = Duration::from_millis(800);
    let h = start(pool.clone(), pacing, startup, 120_000).await;
    let acme = h.app.tenant("acme").await;
    h.served(&acme, SLEEPY).await;
    h.asleep().await;
    let mut body = chat(SLEEPY, "wake up and stream", 4);
    body["stream"] = true.into();
    let r = h
        .app
        .post(&acme.key, "/v1/chat/completions", body)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let (_, tokens) = stream_gaps(r).await;
    assert_eq!(tokens, 4);
    let cold = h.app.app.fleet_metrics.cold_summary();
    assert_eq!(cold.requests, 1);
    let ttft = cold.last_ms.unwrap();
    assert!(
        (1_500..5_000).contains(&ttft),
        "cold time to first token {ttft} ms: start-up 800 + first token 700"
    );
    println!("cold start 800 ms + ttft 700 ms: cold time to first token {ttft} ms");
    // The histogram's median and p99 bucket: <= 2 s.
    assert_eq!((cold.p50_le_ms, cold.p99_le_ms), (Some(2_000), Some(2_000)));

    // The fleet page shows the wake and the cold figures, and a sleep-policy form per base.
    let b = h.admin_browser().await;
    let html = b.html("/admin/fleet").await;
    assert_eq!(row_text(&html, "wakes"), "Wakes (all graphs)1");
    assert_eq!(
        row_text(&html, "cold-requests"),
        "Requests held for a wake or a reload (this server)1"
    );
    assert_eq!(
        row_text(&html, "cold-last"),
        format!(
            "Cold time to first token, last{}.{:03} s",
            ttft / 1000,
            ttft % 1000
        )
    );
    assert_eq!(
        row_text(&html, "cold-p99"),
        "Cold time to first token, p99≤ 2.000 s"
    );
    for shown in [
        "Cold starts",
        "idle after 2s",
        "always on",
        r#"action="/api/admin_set_idle_policy""#,
    ] {
        assert!(html.contains(shown), "{shown} on the page: {html}");
    }
    let policy = |base: &'static str| {
        let pool = pool.clone();
        async move { idle_policies(&pool, base).await.0 }
    };
    let audited = |actor: &'static str| {
        let pool = pool.clone();
        async move { idle_policy_audits(&pool, actor, None).await }
    };

    // The form: refused without the CSRF token; a bad duration changes nothing; then saved.
    let form = |csrf: String, policy: &'static str, after: &'static str| {
        vec![
            ("csrf", csrf),
            ("base", WARM.to_owned()),
            ("policy", policy.to_owned()),
            ("after", after.to_owned()),
        ]
    };
    let post = |f: Vec<(&'static str, String)>| {
        let b = &b;
        async move {
            let pairs: Vec<(&str, &str)> = f.iter().map(|(k, v)| (*k, v.as_str())).collect();
            b.post("/api/admin_set_idle_policy", &pairs).await
        }
    };
    let refused = post(form("wrong".into(), "idle-after", "10m")).await;
    assert!(refused.status().is_redirection() || refused.status() == 403);
    assert_eq!(policy(WARM).await, None);
    let token = common::portal::csrf(&html);
    assert_redirect(
        &post(form(token.clone(), "idle-after", "10x")).await,
        "/admin/fleet",
    );
    assert!(b.html("/admin/fleet").await.contains("nothing was saved"));
    assert_eq!(policy(WARM).await, None);
    assert_redirect(
        &post(form(token.clone(), "idle-after", "1h30m")).await,
        "/admin/fleet",
    );
    assert_eq!(policy(WARM).await, Some(5_400));
    let page = b.html("/admin/fleet").await;
    assert!(page.contains("Sleep policy saved"), "flash");
    assert!(page.contains("idle after 1h30m"), "{page}");
    assert_eq!(audited(ADMIN).await, 1);
    assert_redirect(&post(form(token, "always-on", "")).await, "/admin/fleet");
    assert_eq!(policy(WARM).await, None);
    assert_eq!(audited(ADMIN).await, 2);

    // The CLI, through the same function: audited as `cli`.
    let said =
        common::portal::admin(&pool, &["fleet", "idle", "--base", WARM, "--after", "10m"]).await;
    assert!(said.contains("600 s"), "{said}");
    assert_eq!(policy(WARM).await, Some(600));
    common::portal::admin(&pool, &["fleet", "idle", "--base", WARM, "--always-on"]).await;
    assert_eq!(policy(WARM).await, None);
    assert_eq!(audited("cli").await, 2);

    // Always on wakes a sleeping graph without waiting for a request.
    h.asleep().await;
    common::portal::admin(&pool, &["fleet", "idle", "--base", SLEEPY, "--always-on"]).await;
    eventually(SETTLE, "the sleeping graph woken by always-on", || async {
        graph(&pool, GRAPH).await.0 == "ready"
    })
    .await;
    assert_eq!(graph(&pool, GRAPH).await.2, 2, "the second wake");
}
