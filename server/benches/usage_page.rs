//! Usage page benchmark: (1) journal shipping rate into PostgreSQL without and with the
//! `usage_daily` rollup trigger (the trigger adds to every shipped batch), (2) 1,000,000 events for
//! one tenant over 90 days inserted through the real insert path (`db::usage::insert_batch`, in
//! the shipper's batches of 2,000), then (3) `/usage` and `/logs` rendered by the real portal over
//! HTTP, signed in as the tenant's member: p50/p99 over several runs, against the same aggregate
//! summed from the events without the rollup. Also prints the log query's plan (its index).
//!
//! `cargo bench -p tokenfactory --bench usage_page` (needs PostgreSQL; recreates databases
//! `tokenfactory_bench_usage*`). Env: `TF_BENCH_EVENTS` (default 1000000), `TF_BENCH_SHIP_EVENTS`
//! (default 100000), `TF_BENCH_RUNS` (default 30).

#![allow(
    clippy::disallowed_methods,
    reason = "test scaffolding (fake engines, load generators) runs until the test ends; nothing waits for it at shutdown"
)]
#![allow(clippy::print_stdout, clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use reqwest::redirect::Policy;
use tokenfactory::journal::{Durability, Journal, JournalMetrics, Shipper};
use tokenfactory::usage::{Provenance, UsageEvent, UsageStatus};
use uuid::Uuid;

const PASSWORD: &str = "bench password 1";
const MODELS: [&str; 3] = ["llama-3.1-8b-sim", "qwen-2.5-7b-sim", "support-bot"];

/// A small deterministic generator (xorshift), so every run builds the same data.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

fn event(
    tenant: Uuid,
    key: Option<Uuid>,
    served: &str,
    at: time::OffsetDateTime,
    rng: &mut Rng,
) -> UsageEvent {
    let prompt = 1 + rng.below(4_000) as i64;
    let base = if served == "support-bot" {
        MODELS[0]
    } else {
        served
    };
    UsageEvent {
        request_id: Uuid::now_v7(),
        tenant_id: tenant,
        api_key_id: key,
        served_name: served.into(),
        base_model: base.into(),
        adapter: None,
        graph: base.into(),
        price_key: base.into(),
        prompt_tokens: prompt,
        cached_tokens: rng.below(prompt as u64 + 1) as i64,
        completion_tokens: rng.below(1_000) as i64,
        reasoning_tokens: 0,
        endpoint: tokenfactory::endpoint::Endpoint::Chat,
        provenance: Provenance::Engine,
        status: if rng.below(50) == 0 {
            UsageStatus::ClientAbort
        } else {
            UsageStatus::Ok
        },
        stream: true,
        ttft_ms: Some(20 + rng.below(200) as i32),
        duration_ms: 100 + rng.below(5_000) as i32,
        started_at: at,
    }
}

fn pct(v: &mut [f64], p: f64) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v[((v.len() as f64 - 1.0) * p) as usize]
}

fn env(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(default)
}

/// Ships `n` events from 50 writers through the journal; events/s.
async fn ship_rate(name: &str, n: usize, rollup: bool) -> f64 {
    let (pool, _) = common::fresh_database(name, 8).await;
    if !rollup {
        sqlx::query("ALTER TABLE usage_events DISABLE TRIGGER usage_daily_add")
            .execute(&pool)
            .await
            .unwrap();
    }
    let tenant = tf_core::accounts::create_tenant(&pool, "bench", "Bench")
        .await
        .unwrap()
        .id;
    let dir = tempfile::tempdir().unwrap();
    let metrics = Arc::new(JournalMetrics::default());
    let journal = Arc::new(
        Journal::open(
            dir.path(),
            Durability::Process,
            Duration::from_millis(5),
            metrics.clone(),
        )
        .unwrap(),
    );
    let shipper = Arc::new(Shipper::new(
        dir.path().to_owned(),
        pool.clone(),
        metrics.clone(),
    ));
    let cancel = tokio_util::sync::CancellationToken::new();
    let per = n / 50;
    let t0 = Instant::now();
    let ship_task = tokio::spawn(shipper.clone().run(cancel.clone()));
    let writers: Vec<_> = (0..50u64)
        .map(|w| {
            let journal = journal.clone();
            tokio::spawn(async move {
                let mut rng = Rng(0x9E37_79B9_7F4A_7C15 ^ (w + 1));
                for i in 0..per {
                    let served = MODELS[i % 3];
                    let e = event(
                        tenant,
                        None,
                        served,
                        time::OffsetDateTime::now_utc(),
                        &mut rng,
                    );
                    journal.append(&e).await.unwrap();
                }
            })
        })
        .collect();
    for w in writers {
        w.await.unwrap();
    }
    while metrics.shipped.load(Ordering::Relaxed) < (per * 50) as u64 {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let rate = (per * 50) as f64 / t0.elapsed().as_secs_f64();
    cancel.cancel();
    ship_task.await.unwrap();
    journal.close();
    rate
}

/// A signed-in portal client: logs in through the login form as a browser without JS does.
async fn signed_in(base: &str, email: &str) -> reqwest::Client {
    let http = reqwest::Client::builder()
        .cookie_store(true)
        .redirect(Policy::none())
        .build()
        .unwrap();
    let html = http
        .get(format!("{base}/login"))
        .header("accept", "text/html")
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let marker = r#"name="csrf" value=""#;
    let start = html.find(marker).unwrap() + marker.len();
    let token = &html[start..start + html[start..].find('"').unwrap()];
    let res = http
        .post(format!("{base}/api/login"))
        .header("accept", "text/html")
        .header("content-type", "application/x-www-form-urlencoded")
        .body(format!(
            "csrf={token}&email={}&password={}",
            email.replace('@', "%40"),
            PASSWORD.replace(' ', "+")
        ))
        .send()
        .await
        .unwrap();
    assert!(res.status().is_redirection(), "login: {}", res.status());
    http
}

/// GETs `path` `runs` times; p50 and p99 in ms, and the last body.
async fn time_page(
    http: &reqwest::Client,
    base: &str,
    path: &str,
    runs: usize,
) -> (f64, f64, String) {
    let mut ms = Vec::with_capacity(runs);
    let mut body = String::new();
    for _ in 0..runs {
        let t0 = Instant::now();
        let res = http
            .get(format!("{base}{path}"))
            .header("accept", "text/html")
            .send()
            .await
            .unwrap();
        assert_eq!(res.status(), 200, "GET {path}");
        body = res.text().await.unwrap();
        ms.push(t0.elapsed().as_secs_f64() * 1e3);
    }
    (pct(&mut ms, 0.5), pct(&mut ms, 0.99), body)
}

fn main() {
    let n = env("TF_BENCH_EVENTS", 1_000_000);
    let ship_n = env("TF_BENCH_SHIP_EVENTS", 100_000);
    let runs = env("TF_BENCH_RUNS", 30);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async move {
        // (1) Shipping with and without the rollup (same data, fresh databases).
        let without = ship_rate("tokenfactory_bench_usage_ship_a", ship_n, false).await;
        let with = ship_rate("tokenfactory_bench_usage_ship_b", ship_n, true).await;
        println!("usage page benchmark");
        println!(
            "journal append + ship, {ship_n} events, 50 writers: without rollup {without:.0} events/s, with rollup {with:.0} events/s (ratio {:.2})",
            with / without
        );

        // (2) 1,000,000 events for one tenant over 90 days, through insert_batch.
        let (pool, _) = common::fresh_database("tokenfactory_bench_usage", 8).await;
        let tenant = tf_core::accounts::create_tenant(&pool, "bench", "Bench").await.unwrap();
        tf_core::accounts::create_user(&pool, "member@bench.test", PASSWORD, tf_core::Role::TenantMember, Some(tenant.id))
            .await
            .unwrap();
        let mut keys = Vec::new();
        for i in 0..4u8 {
            let key = tf_core::db::keys::insert(
                &pool,
                &tf_core::db::keys::NewKey { tenant_id: tenant.id, name: &format!("key {i}"), prefix: &format!("tf-bench000{i}"), sha256: &[i; 32] },
            )
            .await
            .unwrap();
            keys.push(key.id);
        }
        let bases: Vec<_> = MODELS[..2]
            .iter()
            .map(|name| tf_core::db::catalog::BaseUpsert {
                name,
                graph: name,
                upstream_url: "http://127.0.0.1:1/v1",
                upstream_model: name,
                continuous_usage: true,
                denied_fields: None,
                prompt_estimator: "byte-bound",
                kind: "chat",
                nvext_allowed: None,
            })
            .collect();
        tf_core::db::catalog::upsert_bases(&pool, "static", &bases).await.unwrap();
        let now = time::OffsetDateTime::now_utc();
        let rates = tf_core::money::Rates { fresh_per_m: 150_000, cached_per_m: 75_000, output_per_m: 600_000 };
        let prices: Vec<_> = MODELS.iter().map(|m| (*m, "standard", rates)).collect();
        tf_core::db::billing::set_prices(&pool, now - time::Duration::days(91), &prices, "bench").await.unwrap().unwrap();
        let span_ms = 90 * 86_400_000_i64 - 60_000;
        let mut rng = Rng(0x2545_F491_4F6C_DD1D);
        let t0 = Instant::now();
        let mut inserted = 0u64;
        let mut batch = Vec::with_capacity(2_000);
        for i in 0..n {
            let at = now - time::Duration::milliseconds(rng.below(span_ms as u64) as i64);
            let key = if i % 10 == 9 { None } else { Some(keys[i % 4]) };
            batch.push(event(tenant.id, key, MODELS[(i / 4) % 3], at, &mut rng));
            if batch.len() == 2_000 || i + 1 == n {
                inserted += tf_core::db::usage::insert_batch(&pool, &batch).await.unwrap();
                batch.clear();
            }
        }
        let load = t0.elapsed();
        sqlx::query("VACUUM ANALYZE usage_events").execute(&pool).await.unwrap();
        sqlx::query("VACUUM ANALYZE usage_daily").execute(&pool).await.unwrap();
        let rollup_rows: i64 = sqlx::query_scalar!(r#"SELECT count(*) AS "n!" FROM usage_daily"#).fetch_one(&pool).await.unwrap();
        println!(
            "inserted {inserted} events over 90 days via insert_batch (batches of 2000, one connection, random times): {:.1} s, {:.0} events/s; usage_daily rows {rollup_rows}",
            load.as_secs_f64(),
            inserted as f64 / load.as_secs_f64()
        );

        // The same figures summed from the events (what the page would do without the rollup).
        let from = (now.date() - time::Duration::days(89)).midnight().assume_utc();
        let mut ms = Vec::new();
        for _ in 0..5 {
            let t0 = Instant::now();
            let rows = sqlx::query!(
                r#"SELECT (e.started_at AT TIME ZONE 'UTC')::date AS day, e.served_name, count(*) AS "requests!",
                          SUM(e.prompt_tokens)::bigint AS "prompt!", SUM(e.cached_tokens)::bigint AS "cached!",
                          SUM(e.completion_tokens)::bigint AS "completion!",
                          COALESCE(SUM(charge_micros(e.tenant_id, e.price_key, e.started_at, e.prompt_tokens - e.cached_tokens,
                                                     e.cached_tokens, e.completion_tokens)), 0)::bigint AS "cost!"
                   FROM usage_events e
                   WHERE e.tenant_id = $1 AND e.started_at >= $2
                   GROUP BY 1, 2"#,
                tenant.id,
                from
            )
            .fetch_all(&pool)
            .await
            .unwrap();
            std::hint::black_box(rows);
            ms.push(t0.elapsed().as_secs_f64() * 1e3);
        }
        println!("  the 90-day aggregate summed from the events (no rollup): p50 {:.0} ms", pct(&mut ms, 0.5));
        let mut ms = Vec::new();
        for _ in 0..runs {
            let t0 = Instant::now();
            let rows = tf_core::db::reports::daily(&pool, tenant.id, from.date(), now.date(), None, None).await.unwrap();
            std::hint::black_box(rows);
            ms.push(t0.elapsed().as_secs_f64() * 1e3);
        }
        println!("  the same from usage_daily (db::reports::daily): p50 {:.2} ms p99 {:.2} ms", pct(&mut ms.clone(), 0.5), pct(&mut ms, 0.99));

        // (3) The pages, rendered by the portal over HTTP.
        let router = tokenfactory::portal::router(tf_app::ssr::PortalDeps {
            pool: pool.clone(),
            redis: tf_core::redis_slot::RedisSlot::empty(),
            redis_prefix: "tfbench:".into(),
            secure_cookies: false,
            trusted_proxies: Default::default(),
            max_keys_per_tenant: tf_core::keys::DEFAULT_MAX_KEYS_PER_TENANT,
            ops: None,
            cold: None,
        })
        .await
        .unwrap();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let base = format!("http://{}", listener.local_addr().unwrap());
        tokio::spawn(tokenfactory::http_server::serve(listener, router, Default::default(), Default::default(), std::future::pending()));
        let http = signed_in(&base, "member@bench.test").await;
        for (label, path) in [
            (&*format!("/usage, last 90 days ({n} events)"), "/usage?range=90".to_owned()),
            ("/usage, last 30 days", "/usage?range=30".to_owned()),
            ("/usage, 90 days, one key and model", format!("/usage?range=90&key={}&model=qwen-2.5-7b-sim", keys[1])),
            ("/logs, first page", "/logs".to_owned()),
            ("/logs, filtered by key and status", format!("/logs?key={}&status=client_abort", keys[2])),
        ] {
            let (p50, p99, body) = time_page(&http, &base, &path, runs).await;
            assert!(body.contains("<table"), "{path} rendered a table");
            println!("  {label}: p50 {p50:.1} ms p99 {p99:.1} ms ({} bytes){}", body.len(), if path.starts_with("/usage?range=90") && !path.contains("key") { " (target < 300 ms)" } else { "" });
        }
        // A page 45 days back: the cursor of an event in the middle of the range.
        let mid = now - time::Duration::days(45);
        let cursor = format!("{}_{}", mid.unix_timestamp_nanos(), Uuid::max().simple());
        let (p50, p99, _) = time_page(&http, &base, &format!("/logs?before={cursor}"), runs).await;
        println!("  /logs, a page 45 days (about half the events) back: p50 {p50:.1} ms p99 {p99:.1} ms");

        // The log statement's plan (same shape as db::reports::log_page).
        let plan: Vec<String> = sqlx::query_scalar(
            "EXPLAIN SELECT e.request_id FROM usage_events e
                  LEFT JOIN api_keys k ON k.id = e.api_key_id AND k.tenant_id = e.tenant_id
                  LEFT JOIN base_models b ON b.name = e.base_model
             WHERE e.tenant_id = $1 AND (e.started_at, e.request_id) < ($2, $3)
               AND ($4::text IS NULL OR e.served_name = $4) AND ($5::uuid IS NULL OR e.api_key_id = $5)
               AND ($6::text IS NULL OR e.status = $6) AND ($7::timestamptz IS NULL OR e.started_at >= $7)
               AND (NOT $9 OR e.api_key_id IS NULL)
             ORDER BY e.started_at DESC, e.request_id DESC LIMIT $8",
        )
        .bind(tenant.id)
        .bind(mid)
        .bind(Uuid::max())
        .bind(None::<String>)
        .bind(None::<Uuid>)
        .bind(None::<String>)
        .bind(None::<time::OffsetDateTime>)
        .bind(51_i64)
        .bind(false)
        .fetch_all(&pool)
        .await
        .unwrap();
        println!("  log query plan:\n    {}", plan.join("\n    "));
    });
}
