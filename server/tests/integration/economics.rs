//! Unit economics (issue 17) against a real database: a known graph history and known usage
//! whose every figure is worked out by hand below; a graph with traffic on some hours only; a
//! day with warm replicas and no traffic; and `/admin/economics` with its cost form (CSRF,
//! audited, append-only) and its what-if, read like a browser with JavaScript off. Revenue is
//! billing's: the usage is rated by the live rating run under price-book prices set here (fresh,
//! cached and output tokens at different rates), never the flat base price.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests may fail loudly

use crate::common;

use common::portal::{assert_redirect, csrf, ADMIN, MEMBER, PASSWORD};
use common::TestApp;
use reqwest::StatusCode;
use serde_json::Value;
use sqlx::PgPool;
use tf_core::db::catalog::{self, BaseUpsert};
use tf_core::db::economics::{self as econ, NewCost};
use tf_core::economics::Figures;
use tf_core::money::Rates;
use tf_core::operator::{self, Actor};
use tf_core::usage::{Provenance, UsageEvent, UsageStatus};
use time::macros::{date, datetime};
use time::{Date, OffsetDateTime};
use uuid::Uuid;

/// The day every test looks at (in the past, so it is a whole day).
const DAY: Date = date!(2026 - 11 - 10);

/// Prices `name` in the price book from 2026-11-01 on (each call a new version a second after the
/// last, since versions only go forward).
async fn price(pool: &PgPool, name: &str, rates: Rates) {
    let versions: i64 = sqlx::query_scalar("SELECT count(*) FROM price_versions")
        .fetch_one(pool)
        .await
        .unwrap();
    let from = datetime!(2026-11-01 00:00 UTC) + time::Duration::seconds(versions);
    tf_core::db::billing::set_price(pool, from, name, "standard", rates, "test")
        .await
        .unwrap()
        .expect("a new price version");
}

/// A base whose flat placeholder price and price-book price (one rate for every token) are
/// `micros_per_1k` per 1,000 tokens.
async fn base(pool: &PgPool, name: &str, micros_per_1k: i64) -> Uuid {
    catalog::upsert_bases(
        pool,
        "static",
        &[BaseUpsert {
            name,
            graph: name,
            upstream_url: "http://127.0.0.1:1/v1",
            upstream_model: name,
            continuous_usage: true,
            denied_fields: None,
            prompt_estimator: "byte-bound",
            kind: "chat",
            nvext_allowed: None,
        }],
    )
    .await
    .unwrap();
    sqlx::query("UPDATE base_models SET micros_per_1k_tokens = $2 WHERE name = $1")
        .bind(name)
        .bind(micros_per_1k)
        .execute(pool)
        .await
        .unwrap();
    if micros_per_1k > 0 {
        let per_m = micros_per_1k * 1_000;
        price(
            pool,
            name,
            Rates {
                fresh_per_m: per_m,
                cached_per_m: per_m,
                output_per_m: per_m,
            },
        )
        .await;
    }
    sqlx::query_scalar("SELECT id FROM base_models WHERE name = $1")
        .bind(name)
        .fetch_one(pool)
        .await
        .unwrap()
}

/// Runs the rater over everything stored (the server's rater does this continuously).
async fn rate(pool: &PgPool) {
    let live = tf_core::db::billing::live_run(pool).await.unwrap();
    tf_core::db::billing::drain(pool, live, 1_000)
        .await
        .unwrap();
}

async fn cost(
    pool: &PgPool,
    name: &str,
    from: OffsetDateTime,
    per_hour: i64,
    gpus: i32,
    peak: i64,
) {
    operator::set_base_cost(
        pool,
        &Actor::CLI,
        &NewCost {
            base_model: name,
            effective_from: from,
            gpu_micros_per_hour: per_hour,
            gpus_per_replica: gpus,
            peak_tokens_per_second: peak,
            created_by: "cli",
        },
    )
    .await
    .unwrap();
}

/// A graph history row as the controller writes it, at a chosen time.
async fn graph_row(
    pool: &PgPool,
    id: Uuid,
    name: &str,
    at: OffsetDateTime,
    state: &str,
    replicas: i32,
    floor: i32,
) {
    sqlx::query(
        "INSERT INTO lifecycle_history (entity, entity_id, name, to_state, replicas, floor, at)
         VALUES ('graph', $1, $2, $3, $4, $5, $6)",
    )
    .bind(id)
    .bind(name)
    .bind(state)
    .bind(replicas)
    .bind(floor)
    .bind(at)
    .execute(pool)
    .await
    .unwrap();
}

async fn usage(
    pool: &PgPool,
    name: &str,
    at: OffsetDateTime,
    prompt: i64,
    cached: i64,
    completion: i64,
) {
    let e = UsageEvent {
        request_id: Uuid::now_v7(),
        tenant_id: Uuid::now_v7(),
        api_key_id: None,
        served_name: name.into(),
        base_model: name.into(),
        adapter: None,
        graph: name.into(),
        price_key: name.into(),
        prompt_tokens: prompt,
        cached_tokens: cached,
        completion_tokens: completion,
        reasoning_tokens: 0,
        endpoint: tokenfactory::endpoint::Endpoint::Chat,
        provenance: Provenance::Engine,
        status: UsageStatus::Ok,
        stream: false,
        ttft_ms: None,
        duration_ms: 1,
        started_at: at,
    };
    tf_core::db::usage::insert_batch(pool, &[e]).await.unwrap();
}

async fn figures_of(pool: &PgPool, name: &str) -> Figures {
    rate(pool).await;
    let rows = econ::days(pool, DAY, 1, OffsetDateTime::now_utc())
        .await
        .unwrap();
    rows.into_iter()
        .find(|r| r.base == name)
        .unwrap_or_else(|| panic!("{name} not reported"))
        .figures
}

/// `alpha`: $2 per GPU-hour, 2 GPUs per replica, peak 1,000 tokens/s; a flat placeholder price
/// of $2 per million, but the price book's: $3 per million fresh input, $1 cached, $4 output.
/// Warm from the day before; 1 replica 00-12, 3 (floor 1) 12-18, 1 18-22, deleted at 22:00.
async fn alpha(pool: &PgPool) {
    let id = base(pool, "alpha", 2_000).await;
    price(
        pool,
        "alpha",
        Rates {
            fresh_per_m: 3_000_000,
            cached_per_m: 1_000_000,
            output_per_m: 4_000_000,
        },
    )
    .await;
    cost(
        pool,
        "alpha",
        datetime!(2026-11-01 00:00 UTC),
        2_000_000,
        2,
        1_000,
    )
    .await;
    graph_row(
        pool,
        id,
        "alpha",
        datetime!(2026-11-09 20:00 UTC),
        "pending",
        1,
        1,
    )
    .await;
    graph_row(
        pool,
        id,
        "alpha",
        datetime!(2026-11-09 20:10 UTC),
        "ready",
        1,
        1,
    )
    .await;
    graph_row(
        pool,
        id,
        "alpha",
        datetime!(2026-11-10 12:00 UTC),
        "ready",
        3,
        1,
    )
    .await;
    graph_row(
        pool,
        id,
        "alpha",
        datetime!(2026-11-10 18:00 UTC),
        "ready",
        1,
        1,
    )
    .await;
    graph_row(
        pool,
        id,
        "alpha",
        datetime!(2026-11-10 22:00 UTC),
        "deleted",
        0,
        1,
    )
    .await;
    usage(
        pool,
        "alpha",
        datetime!(2026-11-10 09:30 UTC),
        30_000_000,
        6_000_000,
        10_000_000,
    )
    .await;
    usage(
        pool,
        "alpha",
        datetime!(2026-11-10 13:00 UTC),
        5_000_000,
        0,
        4_600_000,
    )
    .await;
    // Other days: not counted.
    usage(
        pool,
        "alpha",
        datetime!(2026-11-09 23:59 UTC),
        1_000,
        0,
        1_000,
    )
    .await;
    usage(
        pool,
        "alpha",
        datetime!(2026-11-11 00:00 UTC),
        1_000,
        0,
        1_000,
    )
    .await;
}

#[sqlx::test(migrations = "../migrations")]
async fn every_figure_of_a_known_day_is_checked_by_hand(pool: PgPool) {
    alpha(&pool).await;
    let f = figures_of(&pool, "alpha").await;
    // Floor: 12 h + 6 h + 4 h = 22 replica-hours; scaled up: 2 replicas x 6 h = 12.
    assert_eq!(f.floor_replica_seconds, 22 * 3_600);
    assert_eq!(f.scaled_replica_seconds, 12 * 3_600);
    assert_eq!(f.uncosted_replica_seconds, 0);
    // 34 replica-hours x 3,600 s x 1,000 tokens/s.
    assert_eq!(f.capacity_tokens, 122_400_000);
    assert_eq!(
        (f.prompt_tokens, f.cached_tokens, f.completion_tokens),
        (35_000_000, 6_000_000, 14_600_000)
    );
    // 34 replica-hours x 2 GPUs x $2.
    assert_eq!(f.gpu_cost_micros, 136_000_000);
    // $136 / 122.4M tokens = $1.11111 per million.
    assert_eq!(f.full_load_cost_per_million_micros, Some(1_111_111));
    // The load weighs a cached prompt token 0.1 (issue 36): 29M fresh + 6M x 0.1 cached +
    // 14.6M completion = 44.2M; 44.2M / 122.4M = 36.1111 %.
    assert_eq!(f.load_tokens, 44_200_000);
    assert_eq!(f.duty_cycle_bp, Some(3_611));
    // $136 / 49.6M tokens = $2.741935 per million.
    assert_eq!(f.real_cost_per_million_micros, Some(2_741_935));
    // Rated by the price book, line by line: the 09:30 request, 24M fresh x $3 + 6M cached x $1
    // + 10M output x $4 = $72 + $6 + $40 = $118; the 13:00 one, 5M fresh x $3 + 4.6M output x
    // $4 = $15 + $18.40 = $33.40. $151.40 in all (the flat $2 would have made $99.20).
    assert_eq!(f.revenue_micros, 151_400_000);
    // $151.40 over 49.6M tokens: $3.0524194 per million.
    assert_eq!(f.price_per_million_micros, Some(3_052_419));
    assert_eq!(f.margin_micros, 151_400_000 - 136_000_000);
    // 15.4 / 151.4 = 10.1717 %.
    assert_eq!(f.margin_bp, Some(1_017));
    // Floor: 22 replica-hours x 2 GPUs x $2 = $88 for 79.2M tokens of capacity; the load fills
    // 44.2M of it, so 35 / 79.2 of $88 = $38.888889 idles.
    assert_eq!(f.floor_cost_micros, 88_000_000);
    assert_eq!(f.idle_floor_cost_micros, 38_888_889);

    // The CLI prints the same figures.
    let json: Value = serde_json::from_str(
        &common::portal::admin(
            &pool,
            &["economics", "--day", "2026-11-10", "--format", "json"],
        )
        .await,
    )
    .unwrap();
    let alpha = &json["bases"][0];
    assert_eq!(alpha["base"], "alpha");
    assert_eq!(alpha["figures"]["duty_cycle_bp"], 3_611);
    assert_eq!(alpha["figures"]["margin_micros"], 15_400_000);
    assert_eq!(alpha["figures"]["idle_floor_cost_micros"], 38_888_889);
    assert_eq!(alpha["cost"]["gpus_per_replica"], 2);
    let text = common::portal::admin(&pool, &["economics", "--day", "2026-11-10"]).await;
    assert!(text.contains("alpha on 2026-11-10"), "{text}");
    assert!(text.contains("duty cycle (bp): 3611"), "{text}");
}

#[sqlx::test(migrations = "../migrations")]
async fn traffic_on_some_hours_gets_the_duty_cycle_those_hours_imply(pool: PgPool) {
    // beta: one replica warm all day, peak 100 tokens/s; full load in hours 03 and 15 only.
    let beta = base(&pool, "beta", 1_000).await;
    cost(
        &pool,
        "beta",
        datetime!(2026-11-01 00:00 UTC),
        1_000_000,
        1,
        100,
    )
    .await;
    graph_row(
        &pool,
        beta,
        "beta",
        datetime!(2026-11-08 00:00 UTC),
        "ready",
        1,
        1,
    )
    .await;
    for hour in [
        datetime!(2026-11-10 03:00 UTC),
        datetime!(2026-11-10 15:00 UTC),
    ] {
        // An hour at peak: 360,000 tokens (in several requests).
        for _ in 0..4 {
            usage(&pool, "beta", hour, 60_000, 0, 30_000).await;
        }
    }
    let f = figures_of(&pool, "beta").await;
    assert_eq!(f.capacity_tokens, 8_640_000);
    // 2 busy hours of 24: 8.3333 %.
    assert_eq!(f.duty_cycle_bp, Some(833));
    // $24 a day over 720,000 tokens: $33.333333 per million, 12 times the full-load $2.777778.
    assert_eq!(f.full_load_cost_per_million_micros, Some(2_777_778));
    assert_eq!(f.real_cost_per_million_micros, Some(33_333_333));
    // 22 of 24 floor hours idle.
    assert_eq!(f.idle_floor_cost_micros, 22_000_000);

    // gamma: warm only 06:00-12:00, one busy hour: one sixth, the warm hours are what count.
    let gamma = base(&pool, "gamma", 1_000).await;
    cost(
        &pool,
        "gamma",
        datetime!(2026-11-01 00:00 UTC),
        1_000_000,
        1,
        100,
    )
    .await;
    graph_row(
        &pool,
        gamma,
        "gamma",
        datetime!(2026-11-10 06:00 UTC),
        "ready",
        1,
        1,
    )
    .await;
    graph_row(
        &pool,
        gamma,
        "gamma",
        datetime!(2026-11-10 12:00 UTC),
        "deleted",
        0,
        1,
    )
    .await;
    usage(
        &pool,
        "gamma",
        datetime!(2026-11-10 07:00 UTC),
        200_000,
        0,
        160_000,
    )
    .await;
    let g = figures_of(&pool, "gamma").await;
    assert_eq!(g.floor_replica_seconds, 6 * 3_600);
    assert_eq!(g.duty_cycle_bp, Some(1_667));
    assert_eq!(g.gpu_cost_micros, 6_000_000);
    assert_eq!(g.idle_floor_cost_micros, 5_000_000);
}

#[sqlx::test(migrations = "../migrations")]
async fn a_day_with_replicas_and_no_traffic_idles_the_whole_floor(pool: PgPool) {
    let id = base(&pool, "delta", 1_000).await;
    cost(
        &pool,
        "delta",
        datetime!(2026-11-01 00:00 UTC),
        1_000_000,
        1,
        500,
    )
    .await;
    graph_row(
        &pool,
        id,
        "delta",
        datetime!(2026-11-09 00:00 UTC),
        "ready",
        2,
        2,
    )
    .await;
    let f = figures_of(&pool, "delta").await;
    assert_eq!(f.floor_replica_seconds, 2 * 86_400);
    assert_eq!(f.gpu_cost_micros, 48_000_000);
    assert_eq!(f.floor_cost_micros, 48_000_000);
    assert_eq!(
        f.idle_floor_cost_micros, 48_000_000,
        "the whole floor idles"
    );
    assert_eq!(f.duty_cycle_bp, Some(0));
    assert_eq!(f.revenue_micros, 0);
    assert_eq!(f.margin_micros, -48_000_000);
    assert_eq!(f.margin_bp, None, "no revenue, no share");
    assert_eq!(f.real_cost_per_million_micros, None);
    assert_eq!(f.price_per_million_micros, None);
}

#[sqlx::test(migrations = "../migrations")]
async fn the_page_sets_costs_with_csrf_and_computes_the_what_if(pool: PgPool) {
    alpha(&pool).await;
    rate(&pool).await;
    base(&pool, "epsilon", 0).await;
    let portal = TestApp::builder(pool).shared_redis().start_portal().await;
    let b = portal.browser();
    assert_redirect(&b.login(ADMIN, PASSWORD).await, "/admin");

    let html = b.html("/admin/economics?day=2026-11-10").await;
    assert!(html.contains(r#"href="/admin/economics""#), "nav entry");
    assert!(html.contains(r#"data-base="alpha""#), "{html}");
    // The duty cycle and idle floor weigh cached prompt tokens 0.1 (issue 36; see above).
    for shown in [
        "36.11 %",
        "10.17 %",
        "$38.888889",
        "$1.111111",
        "$2.741935",
        "22.00 h",
    ] {
        assert!(html.contains(shown), "{shown} on the page");
    }
    assert!(html.contains("<svg"), "the chart is drawn on the server");
    // The what-if defaults to the day as measured: alpha, its blended price, its floor, its
    // tokens.
    assert!(html.contains(r#"name="price" value="3052419""#), "{html}");

    // What if alpha ran at $3 per million, floor 1, 43.2M tokens a day: one replica (2 GPUs x
    // $2 x 24 h = $96) for 86.4M tokens; break-even at 32M tokens, 37.04 %.
    let what = b
        .html("/admin/economics?day=2026-11-10&base=alpha&price=3000000&floor=1&tokens=43200000")
        .await;
    assert!(what.contains("37.04 %"), "break-even duty cycle: {what}");
    assert!(what.contains("32,000,000"), "break-even tokens");
    assert!(what.contains("50.00 %"), "the what-if's duty cycle");
    assert!(what.contains("$129.60"), "revenue per day");
    assert!(what.contains("$33.60"), "margin per day");

    // Setting a cost: refused without the CSRF token, then saved and audited.
    let token = csrf(&html);
    let form = |t: &'static str| {
        vec![
            ("csrf", t),
            ("base", "epsilon"),
            ("gpu_micros_per_hour", "2500000"),
            ("gpus_per_replica", "4"),
            ("peak_tokens_per_second", "2000"),
            ("effective_from", "2026-11-20T06:30"),
        ]
    };
    let refused = b.post("/api/admin_set_base_cost", &form("wrong")).await;
    assert!(refused.status().is_redirection() || refused.status() == StatusCode::FORBIDDEN);
    assert!(econ::costs(&portal.pool)
        .await
        .unwrap()
        .iter()
        .all(|c| c.base_model != "epsilon"));
    let token: &'static str = Box::leak(token.into_boxed_str());
    let res = b.post("/api/admin_set_base_cost", &form(token)).await;
    assert_redirect(&res, "/admin/economics");
    let saved = econ::costs(&portal.pool).await.unwrap();
    let eps = saved.iter().find(|c| c.base_model == "epsilon").unwrap();
    assert_eq!(eps.effective_from, datetime!(2026-11-20 06:30 UTC));
    assert_eq!(
        (
            eps.gpu_micros_per_hour,
            eps.gpus_per_replica,
            eps.peak_tokens_per_second
        ),
        (2_500_000, 4, 2_000)
    );
    assert_eq!(eps.created_by, ADMIN);
    let audited: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM audit_log WHERE action = 'economics.cost' AND target = 'epsilon' AND actor = $1",
    )
    .bind(ADMIN)
    .fetch_one(&portal.pool)
    .await
    .unwrap();
    assert_eq!(audited, 1);
    let page = b.html("/admin/economics").await;
    assert!(page.contains("Cost version saved"), "flash");
    // The same instant again is refused; a bad number changes nothing.
    let again = b.post("/api/admin_set_base_cost", &form(token)).await;
    assert_redirect(&again, "/admin/economics");
    assert!(b
        .html("/admin/economics")
        .await
        .contains("already has a cost version"));
    let mut bad = form(token);
    bad[3] = ("gpus_per_replica", "0");
    b.post("/api/admin_set_base_cost", &bad).await;
    assert_eq!(econ::costs(&portal.pool).await.unwrap().len(), 2);
    // Versions are append-only.
    let edit = sqlx::query("UPDATE base_costs SET gpu_micros_per_hour = 1")
        .execute(&portal.pool)
        .await;
    assert!(edit.is_err(), "cost versions are never edited");

    // A member gets 403 and nothing from the page or the form.
    let m = portal.browser();
    assert_redirect(&m.login(MEMBER, PASSWORD).await, "/");
    let res = m.get("/admin/economics").await;
    assert_eq!(res.status(), StatusCode::FORBIDDEN);
    assert!(!res.text().await.unwrap().contains("alpha"));
    let token = m.token_on("/keys").await;
    let res = m
        .post(
            "/api/admin_set_base_cost",
            &[
                ("csrf", &token),
                ("base", "alpha"),
                ("gpu_micros_per_hour", "1"),
                ("gpus_per_replica", "1"),
                ("peak_tokens_per_second", "1"),
            ],
        )
        .await;
    assert_eq!(res.status(), StatusCode::FORBIDDEN);
    assert_eq!(econ::costs(&portal.pool).await.unwrap().len(), 2);
}

#[sqlx::test(migrations = "../migrations")]
async fn measure_peak_loads_the_frontend_and_records_the_engines_own_count(pool: PgPool) {
    use common::sim::BASE;
    // The simulator: 200 tokens/s per request, no wait before the first: a 10-token answer
    // takes ~45 ms, so 4 requests in flight give some thousands of tokens per second.
    let app = TestApp::builder(pool.clone())
        .sim(tf_engine_sim::SimConfig {
            decode_tokens_per_sec: 200,
            ..tf_engine_sim::SimConfig::default()
        })
        .start()
        .await;
    let argv = [
        "economics",
        "measure-peak",
        "--base",
        BASE,
        "--concurrency",
        "4",
        "--seconds",
        "3",
        "--max-tokens",
        "10",
    ];
    // Without a cost in effect there is nothing to measure against: refused, nothing written.
    let refused = {
        use clap::Parser;
        use tokenfactory::cli::{Cli, Command};
        let all = ["tokenfactory", "admin"].iter().chain(&argv).copied();
        let Some(Command::Admin(cmd)) = Cli::try_parse_from(all).unwrap().command else {
            panic!("not an admin command")
        };
        tokenfactory::admin::run_on(&pool, cmd, &mut Vec::new()).await
    };
    let refused = refused.unwrap_err().to_string();
    assert!(refused.contains("no cost in effect"), "{refused}");
    assert!(econ::costs(&pool).await.unwrap().is_empty());

    cost(
        &pool,
        BASE,
        datetime!(2026-11-01 00:00 UTC),
        2_000_000,
        2,
        1_000,
    )
    .await;
    app.sim.clear_ledger();
    let said = common::portal::admin(&pool, &argv).await;
    println!("{said}");
    let versions = econ::costs(&pool).await.unwrap();
    assert_eq!(versions.len(), 2, "appended, the configured one kept");
    let (configured, measured) = (&versions[0], &versions[1]);
    assert!(configured.peak_measured.is_none());
    let how = measured.peak_measured.as_ref().expect("marked measured");
    // Same GPU cost, a new peak, effective now.
    assert_eq!(
        (measured.gpu_micros_per_hour, measured.gpus_per_replica),
        (2_000_000, 2)
    );
    assert!(OffsetDateTime::now_utc() - measured.effective_from < time::Duration::minutes(1));
    assert!(said.contains(&format!(
        "measured peak {} tokens/s per replica",
        measured.peak_tokens_per_second
    )));
    assert_eq!(how["replicas"], 1);
    assert_eq!(how["concurrency"], 4);
    assert!(how["metrics_url"]
        .as_str()
        .unwrap()
        .ends_with(&format!("{}/metrics", app.sim_addr)));

    // The engine's own count: the tokens its ledger shows over the whole run (warm-up included),
    // per second, agree with the counted window's rate.
    let ledger = app.sim.ledger();
    let ledger_tokens: u64 = ledger
        .iter()
        .map(|e| u64::from(e.prompt_tokens) + u64::from(e.completion_tokens))
        .sum();
    let ledger_rate = ledger_tokens / 3;
    let peak = u64::try_from(measured.peak_tokens_per_second).unwrap();
    assert!(
        peak * 10 >= ledger_rate * 7 && peak * 10 <= ledger_rate * 13,
        "measured {peak} tokens/s, the ledger's whole run {ledger_rate} tokens/s"
    );
    // The peak is the counted window's engine tokens over its length.
    let (tokens, ms) = (
        how["tokens"].as_u64().unwrap(),
        how["counted_ms"].as_u64().unwrap(),
    );
    assert_eq!(
        (tokens * 1000 + ms / 2) / ms,
        peak,
        "per replica = tokens x 1000 / ms on one replica, half-up"
    );
    let audited: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM audit_log WHERE action = 'economics.measured_peak' AND target = $1",
    )
    .bind(BASE)
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(audited, 1);
}

/// The what-if's floor defaults to the floor the base's template keeps now, not to a day's
/// average (a graph up for part of the day would round it down to 1).
#[sqlx::test(migrations = "../migrations")]
async fn the_what_if_floor_defaults_to_the_templates_floor(pool: PgPool) {
    use tokenfactory::fleet::local_sim;
    tf_core::db::lifecycle::offer_base(
        &pool,
        "local-sim",
        "gamma",
        "local-sim/gamma",
        true,
        tokenfactory::engine_policy::PromptEstimator::SimWords.as_str(),
        &local_sim::template("gamma", 3),
    )
    .await
    .unwrap();
    cost(
        &pool,
        "gamma",
        datetime!(2026-11-01 00:00 UTC),
        2_000_000,
        1,
        1_000,
    )
    .await;
    let portal = TestApp::builder(pool).shared_redis().start_portal().await;
    let b = portal.browser();
    assert_redirect(&b.login(ADMIN, PASSWORD).await, "/admin");
    let html = b.html("/admin/economics?base=gamma").await;
    assert!(html.contains(r#"name="floor" value="3""#), "{html}");
    // What the admin types still wins.
    let html = b.html("/admin/economics?base=gamma&floor=5").await;
    assert!(html.contains(r#"name="floor" value="5""#), "{html}");
}
