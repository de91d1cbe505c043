//! The floor and idle-policy advisor and the cost attribution (issue 36) against a real
//! database: a generated 30-day trace of known shape (a steady base, a bursty base, a base
//! serving one long-tail adapter called three times a day) whose costs and cold starts under two
//! policies each are worked out by hand below; `admin economics advise --apply` changing the
//! policy with its audit rows; `admin economics attribution` adding up to the base's cost to
//! the micro, the idle floor landing on the tenant whose requests it waited for; a policy applied
//! through `operator::set_serving_policy` surviving the start-up template upsert; and
//! `/admin/economics` showing the advice, the frontier chart and the attribution, its Apply form
//! (CSRF, audited with the admin as actor), and the tenant page's gross margin, read like a
//! browser with JavaScript off.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests may fail loudly

use crate::common;

use serde_json::Value;
use sqlx::PgPool;
use tf_core::db::advisor::{self, Report};
use tf_core::db::economics::NewCost;
use tf_core::db::lifecycle::{offer_base, TemplateRow};
use tf_core::economics::advisor::{Budget, Outcome, Policy};
use tf_core::money::Rates;
use tf_core::operator::{self, Actor};
use tf_core::usage::{Provenance, UsageEvent, UsageStatus};
use time::macros::datetime;
use time::{Duration, OffsetDateTime};
use uuid::Uuid;

/// The advice is asked at noon on 2026-12-01: its 30 whole days are November.
const NOW: OffsetDateTime = datetime!(2026-12-01 12:00 UTC);
const NOV: OffsetDateTime = datetime!(2026-11-01 00:00 UTC);
const WINDOW_S: i64 = 30 * 86_400;

fn template(floor: i32, ceiling: i32, idle: Option<i32>) -> TemplateRow {
    TemplateRow {
        kind: "chat".to_owned(),
        model: "m".into(),
        image: String::new(),
        tensor_parallel_size: 1,
        quantization: None,
        max_loras: 8,
        max_lora_rank: 64,
        extra_args: vec![],
        gpus_per_replica: 1,
        replicas_min: floor,
        replicas_max: ceiling,
        env_from_secret: None,
        config_json: serde_json::json!({}),
        tokenizer_json: None,
        allow_dora: false,
        idle_after_secs: idle,
    }
}

/// A templated base at $3.60 per replica-hour (1,000 micros a second, so a cost reads as
/// seconds) and a peak of 1,000 tokens/s per replica; priced at $1 per million tokens.
async fn base(pool: &PgPool, name: &str, floor: i32, ceiling: i32, idle: Option<i32>) -> Uuid {
    let id = offer_base(
        pool,
        "static",
        name,
        name,
        true,
        "byte-bound",
        &template(floor, ceiling, idle),
    )
    .await
    .unwrap();
    operator::set_base_cost(
        pool,
        &Actor::CLI,
        &NewCost {
            base_model: name,
            effective_from: datetime!(2026-10-01 00:00 UTC),
            gpu_micros_per_hour: 3_600_000,
            gpus_per_replica: 1,
            peak_tokens_per_second: 1_000,
            created_by: "cli",
        },
    )
    .await
    .unwrap();
    let versions: i64 = sqlx::query_scalar("SELECT count(*) FROM price_versions")
        .fetch_one(pool)
        .await
        .unwrap();
    let rates = Rates {
        fresh_per_m: 1_000_000,
        cached_per_m: 1_000_000,
        output_per_m: 1_000_000,
    };
    let from = datetime!(2026-10-01 00:00 UTC) + Duration::seconds(versions);
    tf_core::db::billing::set_price(pool, from, name, "standard", rates, "test")
        .await
        .unwrap()
        .expect("a new price version");
    id
}

fn event(
    base: &str,
    adapter: Option<&str>,
    tenant: Uuid,
    at: OffsetDateTime,
    tokens: i64,
) -> UsageEvent {
    UsageEvent {
        request_id: Uuid::now_v7(),
        tenant_id: tenant,
        api_key_id: None,
        served_name: adapter.unwrap_or(base).into(),
        base_model: base.into(),
        adapter: adapter.map(Into::into),
        graph: base.into(),
        price_key: base.into(),
        prompt_tokens: tokens * 3 / 5,
        cached_tokens: 0,
        completion_tokens: tokens - tokens * 3 / 5,
        reasoning_tokens: 0,
        endpoint: tf_core::endpoint::Endpoint::Chat,
        provenance: Provenance::Engine,
        status: UsageStatus::Ok,
        stream: false,
        ttft_ms: None,
        duration_ms: 1,
        started_at: at,
    }
}

async fn store(pool: &PgPool, events: &[UsageEvent]) {
    for chunk in events.chunks(1_000) {
        tf_core::db::usage::insert_batch(pool, chunk).await.unwrap();
    }
}

/// Every day of November, at each of `offsets` (seconds after midnight).
fn daily(
    base: &str,
    adapter: Option<&str>,
    tenant: Uuid,
    offsets: &[i64],
    tokens: i64,
) -> Vec<UsageEvent> {
    (0..30)
        .flat_map(|d| offsets.iter().map(move |&s| (d, s)))
        .map(|(d, s)| {
            event(
                base,
                adapter,
                tenant,
                NOV + Duration::days(d) + Duration::seconds(s),
                tokens,
            )
        })
        .collect()
}

/// A wake as the controller records it: `waking` at `at`, `ready` `secs` later.
async fn wake(pool: &PgPool, id: Uuid, name: &str, at: OffsetDateTime, secs: i64) {
    for (state, t) in [("waking", at), ("ready", at + Duration::seconds(secs))] {
        sqlx::query(
            "INSERT INTO lifecycle_history (entity, entity_id, name, to_state, replicas, at)
             VALUES ('graph', $1, $2, $3, 1, $4)",
        )
        .bind(id)
        .bind(name)
        .bind(state)
        .bind(t)
        .execute(pool)
        .await
        .unwrap();
    }
}

async fn rate(pool: &PgPool) {
    let live = tf_core::db::billing::live_run(pool).await.unwrap();
    tf_core::db::billing::drain(pool, live, 10_000)
        .await
        .unwrap();
}

fn outcome(r: &Report, floor: i64, idle: Option<i64>) -> Outcome {
    let p = Policy {
        floor,
        idle_after_secs: idle,
    };
    *r.advice.outcomes.iter().find(|o| o.policy == p).unwrap()
}

fn recommended(r: &Report) -> Policy {
    r.advice.outcomes[r.advice.recommended.unwrap()].policy
}

#[sqlx::test(migrations = "../migrations")]
async fn a_steady_base_stays_warm_and_pays_for_a_scale_to_zero_in_wakes(pool: PgPool) {
    // A request every 10 minutes, all day, every day: 4,320 requests of 1,000 tokens.
    let id = base(&pool, "steady", 1, 2, None).await;
    let offsets: Vec<i64> = (0..144).map(|i| i * 600).collect();
    store(
        &pool,
        &daily("steady", None, Uuid::now_v7(), &offsets, 1_000),
    )
    .await;
    // Three measured wakes: 90 s, 100 s, 150 s; the median is 100 s.
    for (day, secs) in [(3, 90), (9, 150), (20, 100)] {
        wake(&pool, id, "steady", NOV + Duration::days(day), secs).await;
    }
    rate(&pool).await;
    let r = advisor::advise(
        &pool,
        "steady",
        30,
        NOW,
        Budget::MaxColdSharePpm(10_000),
        120_000,
    )
    .await
    .unwrap();
    assert_eq!(
        (r.cold_start_source, r.advice.template.cold_start_ms),
        ("measured", 100_000)
    );
    assert_eq!(r.advice.requests, 4_320);
    // $1 per million x 4.32M tokens.
    assert_eq!(r.advice.revenue_micros, 4_320_000);
    // 15 min: one wake at the first request (00:00 on the 1st; it waits 100 s), then a request
    // every 10 minutes keeps the graph awake to the window's end: all 2,592,000 s.
    let q = outcome(&r, 1, Some(900));
    assert_eq!(
        (q.cold_starts, q.waited_requests, q.added_wait_ms),
        (1, 1, 100_000)
    );
    assert_eq!(
        (q.awake_seconds, q.gpu_cost_micros),
        (WINDOW_S, 2_592_000_000)
    );
    // 5 min: every request finds it asleep (10 min gaps); each wake lasts 100 s + 300 s idle.
    let m5 = outcome(&r, 1, Some(300));
    assert_eq!((m5.cold_starts, m5.waited_requests), (4_320, 4_320));
    assert_eq!(
        (m5.awake_seconds, m5.gpu_cost_micros),
        (4_320 * 400, 1_728_000_000)
    );
    assert_eq!(m5.waited_share_ppm, 1_000_000);
    assert_eq!(m5.margin_micros, 4_320_000 - 1_728_000_000);
    // Always on costs what 15 min does, without the wake: the tie goes to fewer cold starts.
    assert_eq!(outcome(&r, 1, None).gpu_cost_micros, 2_592_000_000);
    assert_eq!(
        recommended(&r),
        Policy {
            floor: 1,
            idle_after_secs: None
        }
    );
}

#[sqlx::test(migrations = "../migrations")]
async fn a_bursty_base_pays_its_burst_above_the_floor(pool: PgPool) {
    // Each day at 09:00, 60 requests one second apart of 2,000 tokens: 120,000 tokens in one
    // minute, two replicas' worth (60,000 a minute each).
    base(&pool, "bursty", 1, 2, None).await;
    let offsets: Vec<i64> = (0..60).map(|s| 9 * 3_600 + s).collect();
    store(
        &pool,
        &daily("bursty", None, Uuid::now_v7(), &offsets, 2_000),
    )
    .await;
    // No wake in the history: the assumed 60 s.
    let r = advisor::advise(
        &pool,
        "bursty",
        30,
        NOW,
        Budget::MaxColdStartsPerDay(1),
        60_000,
    )
    .await
    .unwrap();
    assert_eq!(r.cold_start_source, "assumed");
    // 15 min: a wake a day at 09:00:00, ready 09:01:00, so all 60 wait (60 + 59 + ... + 1 =
    // 1,830 s); asleep at 09:16:00: 960 s a day. The burst's minute needs a second replica:
    // 60 s a day above the floor. (960 + 60) x 30 = 30,600 s.
    let q = outcome(&r, 1, Some(900));
    assert_eq!(
        (q.cold_starts, q.waited_requests, q.added_wait_ms),
        (30, 1_800, 30 * 1_830_000)
    );
    assert_eq!((q.awake_seconds, q.scaled_replica_seconds), (28_800, 1_800));
    assert_eq!(q.gpu_cost_micros, 30_600_000);
    // A floor of two: no scaling, twice the awake time: 57,600 s.
    let q2 = outcome(&r, 2, Some(900));
    assert_eq!(
        (q2.scaled_replica_seconds, q2.gpu_cost_micros),
        (0, 57_600_000)
    );
    // One wake a day allowed: 5 min is cheapest ((60 + 300) x 30 + 1,800 = 12,600 s).
    assert_eq!(outcome(&r, 1, Some(300)).gpu_cost_micros, 12_600_000);
    assert_eq!(
        recommended(&r),
        Policy {
            floor: 1,
            idle_after_secs: Some(300)
        }
    );
}

#[sqlx::test(migrations = "../migrations")]
async fn a_long_tail_adapter_is_advised_to_scale_to_zero_and_applying_it_is_audited(pool: PgPool) {
    // One adapter called at 03:00, 11:00 and 19:00 (relative to the days before today, so the
    // CLI's own clock sees them), on a base kept at two replicas, always on.
    base(&pool, "tail", 2, 2, None).await;
    let today = OffsetDateTime::now_utc().date().midnight().assume_utc();
    let tenant = Uuid::now_v7();
    let events: Vec<UsageEvent> = (1..=30)
        .flat_map(|d| [3, 11, 19].map(move |h| today - Duration::days(d) + Duration::hours(h)))
        .map(|at| event("tail", Some("tail-ft"), tenant, at, 100))
        .collect();
    store(&pool, &events).await;
    let json: Value = serde_json::from_str(
        &common::portal::admin(
            &pool,
            &[
                "economics",
                "advise",
                "--base",
                "tail",
                "--max-cold-starts-per-day",
                "3",
                "--cold-start-secs",
                "60",
                "--format",
                "json",
                "--apply",
            ],
        )
        .await,
    )
    .unwrap();
    assert_eq!(json["requests"], 90);
    let row = |floor: i64, idle: Value| {
        json["outcomes"]
            .as_array()
            .unwrap()
            .iter()
            .find(|o| o["policy"]["floor"] == floor && o["policy"]["idle_after_secs"] == idle)
            .unwrap()
            .clone()
    };
    // 1 h: every call (8 h apart) wakes the graph, which stays 60 s + 1 h: 90 x 3,660 s.
    let h1 = row(1, Value::from(3_600));
    assert_eq!(h1["cold_starts"], 90);
    assert_eq!(h1["gpu_cost_micros"], 90 * 3_660_000_i64);
    // The current policy (two replicas, always on): 2 x 30 days.
    let now = row(2, Value::Null);
    assert_eq!(now["gpu_cost_micros"], 2 * WINDOW_S * 1_000);
    assert_eq!(now["cold_starts"], 0);
    // Three wakes a day allowed: 5 min, 90 x 360 s.
    let rec = &json["outcomes"][usize::try_from(json["recommended"].as_u64().unwrap()).unwrap()];
    assert_eq!(rec["policy"]["floor"], 1);
    assert_eq!(rec["policy"]["idle_after_secs"], 300);
    assert_eq!(rec["gpu_cost_micros"], 90 * 360_000);
    assert_eq!(json["applied"]["idle_after_secs"], 300);

    // Applied: the template's floor and idle policy, and an audit row for each.
    let (floor, idle): (i32, Option<i32>) = sqlx::query_as(
        "SELECT t.replicas_min, t.idle_after_secs FROM base_templates t
           JOIN base_models b ON b.id = t.base_model_id WHERE b.name = 'tail'",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!((floor, idle), (1, Some(300)));
    let audit: Vec<(String, String, Value)> = sqlx::query_as(
        "SELECT action, actor, detail FROM audit_log
          WHERE target = 'tail' AND action LIKE 'fleet.%' ORDER BY id",
    )
    .fetch_all(&pool)
    .await
    .unwrap();
    assert_eq!(audit.len(), 2, "{audit:?}");
    assert_eq!(
        (audit[0].0.as_str(), audit[0].1.as_str()),
        ("fleet.floor", "cli")
    );
    assert_eq!(audit[0].2["was"], 2);
    assert_eq!(audit[0].2["floor"], 1);
    assert_eq!(audit[1].0, "fleet.idle_policy");
    assert_eq!(audit[1].2["idle_after_secs"], 300);

    // The text table marks the recommendation; a floor above the ceiling is refused.
    let text = common::portal::admin(
        &pool,
        &[
            "economics",
            "advise",
            "--base",
            "tail",
            "--max-cold-share",
            "0.01",
        ],
    )
    .await;
    assert!(text.contains("recommended: floor 1, always on"), "{text}");
    let refused = operator::set_serving_policy(&pool, &Actor::CLI, "tail", 3, None).await;
    assert!(refused.is_err());
}

#[sqlx::test(migrations = "../migrations")]
async fn attribution_adds_up_and_the_idle_floor_follows_the_waits(pool: PgPool) {
    // One replica warm all of 2026-11-10: $86.40. A busy tenant calls the bare base every minute
    // from 08:00 to 16:00 (481 requests of 1,000 tokens); a long-tail adapter of another tenant
    // is called at 03:00 and at 20:00 (1,000 tokens each).
    let id = base(&pool, "shared", 1, 1, None).await;
    sqlx::query(
        "INSERT INTO lifecycle_history (entity, entity_id, name, to_state, replicas, floor, at)
         VALUES ('graph', $1, 'shared', 'ready', 1, 1, '2026-11-09T00:00:00Z')",
    )
    .bind(id)
    .execute(&pool)
    .await
    .unwrap();
    let day = datetime!(2026-11-10 00:00 UTC);
    let (busy, tail) = (Uuid::from_u128(1), Uuid::from_u128(2));
    let mut events: Vec<UsageEvent> = (0..=480)
        .map(|m| {
            event(
                "shared",
                None,
                busy,
                day + Duration::hours(8) + Duration::minutes(m),
                1_000,
            )
        })
        .collect();
    for h in [3, 20] {
        events.push(event(
            "shared",
            Some("tail-ft"),
            tail,
            day + Duration::hours(h),
            1_000,
        ));
    }
    store(&pool, &events).await;
    rate(&pool).await;
    let a = tf_core::db::attribution::attribution(&pool, "shared", day.date(), NOW)
        .await
        .unwrap()
        .unwrap();
    // 86,400 s x 1,000 micros; load 483,000 of 86.4M tokens, so the idle floor is
    // 86.4M x (86,400,000 - 483,000) / 86,400,000 = 85,917,000 micros.
    assert_eq!(a.figures.gpu_cost_micros, 86_400_000);
    assert_eq!(a.figures.idle_floor_cost_micros, 85_917_000);
    let busy_share = a.shares.iter().find(|s| s.tenant_id == Some(busy)).unwrap();
    let tail_share = a.shares.iter().find(|s| s.tenant_id == Some(tail)).unwrap();
    // Used: 483,000 micros by load, 481 : 2.
    assert_eq!(
        (busy_share.used_cost_micros, tail_share.used_cost_micros),
        (481_000, 2_000)
    );
    // Waited for: the tail's 03:00 call (3 h since midnight) and 20:00 call (4 h since 16:00);
    // the busy tenant's 08:00 call (5 h since 03:00) and 480 one-minute gaps (8 h): 7 h : 13 h.
    assert_eq!(tail_share.waited_for_ms, 7 * 3_600_000);
    assert_eq!(busy_share.waited_for_ms, 13 * 3_600_000);
    // 85,917,000 x 7 / 20 = 30,070,950; x 13 / 20 = 55,846,050.
    assert_eq!(tail_share.idle_floor_cost_micros, 30_070_950);
    assert_eq!(busy_share.idle_floor_cost_micros, 55_846_050);
    assert_eq!(
        a.shares.iter().map(|s| s.cost_micros).sum::<i64>(),
        86_400_000
    );
    // Gross margins: revenue at $1 per million less the cost.
    let m = a.margins.iter().find(|m| m.tenant_id == tail).unwrap();
    assert_eq!((m.revenue_micros, m.cost_micros), (2_000, 30_072_950));
    assert_eq!(m.margin_micros, 2_000 - 30_072_950);

    let json: Value = serde_json::from_str(
        &common::portal::admin(
            &pool,
            &[
                "economics",
                "attribution",
                "--base",
                "shared",
                "--day",
                "2026-11-10",
                "--format",
                "json",
            ],
        )
        .await,
    )
    .unwrap();
    let total: i64 = json["shares"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["share"]["cost_micros"].as_i64().unwrap())
        .sum();
    assert_eq!(total, json["gpu_cost_micros"].as_i64().unwrap());
}

async fn policy_of(pool: &PgPool, base: &str) -> (i32, i32, Option<i32>) {
    sqlx::query_as(
        "SELECT t.replicas_min, t.replicas_max, t.idle_after_secs FROM base_templates t
           JOIN base_models b ON b.id = t.base_model_id WHERE b.name = $1",
    )
    .bind(base)
    .fetch_one(pool)
    .await
    .unwrap()
}

fn template_file(dir: &std::path::Path, replicas: i32, replicas_max: i32, idle: Option<i32>) {
    let idle = idle.map_or_else(String::new, |s| format!("idle_after_secs: {s}\n"));
    std::fs::write(
        dir.join("filed.yaml"),
        format!(
            "base: filed\nmodel: m/filed\nreplicas: {replicas}\nreplicas_max: {replicas_max}\n\
             {idle}config_json: {{hidden_size: 32, num_attention_heads: 2, \
             num_key_value_heads: 1, intermediate_size: 64, num_hidden_layers: 1}}\n"
        ),
    )
    .unwrap();
}

async fn start_up(pool: &PgPool, dir: &std::path::Path) {
    use tokenfactory::fleet::templates;
    templates::apply(pool, "local-sim", &templates::load(dir).unwrap())
        .await
        .unwrap();
}

#[sqlx::test(migrations = "../migrations")]
async fn an_applied_policy_survives_the_start_up_upsert(pool: PgPool) {
    // The demo's bases, as `serve --demo` offers them at every start.
    use tokenfactory::fleet::local_sim;
    local_sim::offer(&pool).await.unwrap();
    let demo = local_sim::DEMO_BASE;
    assert_eq!(policy_of(&pool, demo).await, (2, 2, None));
    operator::set_serving_policy(&pool, &Actor::CLI, demo, 1, Some(300))
        .await
        .unwrap();
    local_sim::offer(&pool).await.unwrap();
    assert_eq!(
        policy_of(&pool, demo).await,
        (1, 2, Some(300)),
        "a restart keeps the applied policy"
    );

    // Template files (`TF_BASE_TEMPLATES`): unchanged files keep an applied policy, an edited
    // file's policy wins, a lowered ceiling caps an applied floor.
    let dir = tempfile::tempdir().unwrap();
    template_file(dir.path(), 1, 3, Some(600));
    start_up(&pool, dir.path()).await;
    assert_eq!(policy_of(&pool, "filed").await, (1, 3, Some(600)));
    operator::set_serving_policy(&pool, &Actor::CLI, "filed", 3, None)
        .await
        .unwrap();
    start_up(&pool, dir.path()).await;
    assert_eq!(policy_of(&pool, "filed").await, (3, 3, None), "kept");
    template_file(dir.path(), 1, 2, Some(600));
    start_up(&pool, dir.path()).await;
    assert_eq!(
        policy_of(&pool, "filed").await,
        (2, 2, None),
        "the file's ceiling, the applied floor under it"
    );
    template_file(dir.path(), 2, 2, Some(900));
    start_up(&pool, dir.path()).await;
    assert_eq!(
        policy_of(&pool, "filed").await,
        (2, 2, Some(900)),
        "an edited file's policy is the newer word"
    );
    // The fleet page's sleep policy alone is kept too.
    operator::set_idle_policy(
        &pool,
        &Actor::CLI,
        "filed",
        operator::IdleScope::Graph,
        Some(120),
    )
    .await
    .unwrap();
    start_up(&pool, dir.path()).await;
    assert_eq!(policy_of(&pool, "filed").await, (2, 2, Some(120)));
}

async fn apply(
    b: &common::portal::Browser,
    form: Vec<(&'static str, String)>,
) -> reqwest::Response {
    let pairs: Vec<(&str, &str)> = form.iter().map(|(k, v)| (*k, v.as_str())).collect();
    b.post("/api/admin_apply_policy", &pairs).await
}

#[sqlx::test(migrations = "../migrations")]
async fn the_economics_page_advises_attributes_and_applies_with_csrf(pool: PgPool) {
    use common::portal::{assert_redirect, csrf, ADMIN, MEMBER, PASSWORD};
    use reqwest::StatusCode;

    let portal = common::TestApp::builder(pool)
        .shared_redis()
        .start_portal()
        .await;
    let pool = portal.pool.clone();
    let acme: Uuid = sqlx::query_scalar("SELECT id FROM tenants WHERE name = 'acme'")
        .fetch_one(&pool)
        .await
        .unwrap();
    // The long-tail base of the CLI test, on the portal's clock: two replicas always on (warm
    // since 31 days ago), one adapter of acme's called at 03:00, 11:00 and 19:00 each day.
    let id = base(&pool, "tail", 2, 2, None).await;
    let today = OffsetDateTime::now_utc().date().midnight().assume_utc();
    sqlx::query(
        "INSERT INTO lifecycle_history (entity, entity_id, name, to_state, replicas, floor, at)
         VALUES ('graph', $1, 'tail', 'ready', 2, 2, $2)",
    )
    .bind(id)
    .bind(today - Duration::days(31))
    .execute(&pool)
    .await
    .unwrap();
    let events: Vec<UsageEvent> = (1..=30)
        .flat_map(|d| [3, 11, 19].map(move |h| today - Duration::days(d) + Duration::hours(h)))
        .map(|at| event("tail", Some("tail-ft"), acme, at, 100))
        .collect();
    store(&pool, &events).await;
    rate(&pool).await;

    let b = portal.browser();
    assert_redirect(&b.login(ADMIN, PASSWORD).await, "/admin");
    let yesterday = (today - Duration::days(1)).date();
    let query = format!("/admin/economics?day={yesterday}&budget=starts&max_starts=3&days=30");
    let html = b.html(&query).await;
    // The advisor: three wakes a day allowed, 5 min idle on one replica is cheapest (as the CLI
    // says), and the frontier chart with its axes, marks and labels.
    assert!(html.contains(r#"id="advisor-tail""#), "{html}");
    assert!(
        html.contains("Recommended: floor 1 · 5m: GPU cost $37.80 over the 30 days"),
        "no wake measured: the assumed 120 s; 90 wakes x (120 + 300) s x $1 per 1,000 s: {html}"
    );
    assert!(html.contains("than the current floor 2 · always on"));
    assert!(html.contains(r#"<figure class="chart frontier">"#));
    assert!(html.contains("cold starts over the 30 days (count)"));
    assert!(html.contains("GPU cost over the 30 days (USD)"));
    assert!(
        html.contains("floor 1 · 5m (recommended)"),
        "the point is labelled"
    );
    assert!(html.contains("floor 2 · always on (current)"));
    assert!(html.contains(r#"class="mark recommended""#));
    assert!(html.contains(r#"class="mark current""#));
    assert!(html.contains("at most 3 cold starts a day on average"));
    // The weights and the attribution: yesterday's $172.80 (two replicas all day) is acme's.
    assert!(html.contains("fresh prompt token 1, cached prompt token 0.1, completion token 1"));
    assert!(
        html.contains("the largest remainder"),
        "the remainder rule is stated"
    );
    assert!(
        html.contains("GPU cost $172.80 of which idle floor"),
        "{html}"
    );
    assert!(html.contains(r#"href="/admin/tenants/acme""#));
    // The charts are scaled to the data: the duty cycle (0.0XX %) is labelled on its bar.
    assert!(html.contains(r#"class="value""#));

    // Apply: refused without the right token, then set and audited with the admin as actor.
    let token = csrf(&html);
    let form = |t: String, floor: &'static str| {
        vec![
            ("csrf", t),
            ("base", "tail".to_owned()),
            ("floor", floor.to_owned()),
            ("idle", "300".to_owned()),
            ("days", "30".to_owned()),
            ("budget", "starts".to_owned()),
            ("max_share", "0.01".to_owned()),
            ("max_starts", "3".to_owned()),
        ]
    };
    let refused = apply(&b, form("wrong".into(), "1")).await;
    assert!(refused.status().is_redirection() || refused.status() == StatusCode::FORBIDDEN);
    assert_eq!(policy_of(&pool, "tail").await, (2, 2, None));
    let back = "/admin/economics?days=30&budget=starts&max_share=0.01&max_starts=3#advisor-tail";
    let res = apply(&b, form(token.clone(), "1")).await;
    assert_redirect(&res, back);
    assert_eq!(policy_of(&pool, "tail").await, (1, 2, Some(300)));
    let audit: Vec<(String, String)> = sqlx::query_as(
        "SELECT action, actor FROM audit_log
          WHERE target = 'tail' AND action LIKE 'fleet.%' ORDER BY id",
    )
    .fetch_all(&pool)
    .await
    .unwrap();
    assert_eq!(
        audit,
        [
            ("fleet.floor".to_owned(), ADMIN.to_owned()),
            ("fleet.idle_policy".to_owned(), ADMIN.to_owned())
        ]
    );
    let after = b
        .html("/admin/economics?days=30&budget=starts&max_starts=3")
        .await;
    assert!(after.contains("Serving policy applied"), "flash");
    assert!(after.contains("(the current policy)"));
    // A floor above the ceiling changes nothing.
    let res = apply(&b, form(token, "3")).await;
    assert_redirect(&res, back);
    assert_eq!(policy_of(&pool, "tail").await, (1, 2, Some(300)));
    assert!(b
        .html("/admin/economics")
        .await
        .contains("nothing was changed"));

    // The tenant page: acme's gross margin on tail this month (revenue less attributed cost).
    let tenant = b.html("/admin/tenants/acme").await;
    assert!(tenant.contains("Gross margin in"), "{tenant}");
    assert!(tenant.contains(r#"data-base="tail""#), "{tenant}");

    // A tenant user gets 403 from the page and the form, and nothing changes.
    let m = portal.browser();
    assert_redirect(&m.login(MEMBER, PASSWORD).await, "/");
    let res = m.get("/admin/economics").await;
    assert_eq!(res.status(), StatusCode::FORBIDDEN);
    assert!(!res.text().await.unwrap().contains("advisor-tail"));
    let token = m.token_on("/keys").await;
    let pairs = [
        ("csrf", token.as_str()),
        ("base", "tail"),
        ("floor", "2"),
        ("idle", ""),
    ];
    let res = m.post("/api/admin_apply_policy", &pairs).await;
    assert_eq!(res.status(), StatusCode::FORBIDDEN);
    assert_eq!(policy_of(&pool, "tail").await, (1, 2, Some(300)));
}
