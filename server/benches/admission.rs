//! Admission benchmark, in one run: (1) the cost of one admission decision against Redis (every
//! limit kind set: two RPM windows, two TPM windows, two spend budgets, in-flight and long-prompt
//! caps), p50/p99 in microseconds; (2) gateway throughput for a tenant with limits vs one without,
//! on the same server, as a ratio. Targets: admission p99 <= 300 us; throughput >= 0.8 x.
//! (3) Many tenants near their limits on two replicas (two `Quota`s sharing Redis and
//! PostgreSQL): 200 tenants whose request, token and spend room is only a little more than the
//! run uses, so most admissions need a Redis call; one worker per tenant and replica admits, holds
//! the request for 2 ms and settles, `TF_BENCH_ROUNDS` times (default 100). Reported: admission
//! p50/p99 (every decision) and throughput as a ratio against the same workload on 200 tenants
//! without limits, run just before. The case a single tenant cannot show: replicas serving many
//! tenants' Redis calls at once.
//!
//! `cargo bench -p tokenfactory --bench admission` (needs PostgreSQL and Redis at
//! redis://127.0.0.1:6379; uses database `tokenfactory_bench_quota`, recreated each run). Env:
//! `TF_BENCH_SECONDS` (per throughput phase, default 5), `TF_BENCH_CONNECTIONS` (default 50),
//! `TF_BENCH_ADMISSIONS` (default 5000), `TF_BENCH_TENANTS` (default 200), `TF_BENCH_ROUNDS`.

#![allow(
    clippy::disallowed_methods,
    reason = "test scaffolding (fake engines, load generators) runs until the test ends; nothing waits for it at shutdown"
)]
#![allow(clippy::print_stdout, clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::json;
use tf_core::money::Quantities;
use tf_engine_sim::{EngineSim, SimConfig};
use tokenfactory::app::{self, AppOptions};
use tokenfactory::fleet::{self, BaseRegistration};
use tokenfactory::journal::{Durability, Journal};
use tokenfactory::quota::{AdmitRequest, Quota};

fn env(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(default)
}

fn pct(v: &mut [u64], p: f64) -> u64 {
    v.sort_unstable();
    v.get(((v.len().max(1) - 1) as f64 * p) as usize)
        .copied()
        .unwrap_or(0)
}

/// Requests per second of `conns` clients sending `body` for `dur`.
async fn throughput(url: &str, key: &str, conns: usize, dur: Duration) -> f64 {
    let body = Arc::new(serde_json::to_vec(&json!({"model": "bench-base", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1})).unwrap());
    let deadline = Instant::now() + dur;
    let start = Instant::now();
    let tasks: Vec<_> = (0..conns)
        .map(|_| {
            let (url, key, body) = (url.to_owned(), key.to_owned(), body.clone());
            tokio::spawn(async move {
                let client = reqwest::Client::builder()
                    .pool_max_idle_per_host(1)
                    .tcp_nodelay(true)
                    .build()
                    .unwrap();
                let mut n = 0u64;
                while Instant::now() < deadline {
                    let r = client
                        .post(&url)
                        .bearer_auth(&key)
                        .header("content-type", "application/json")
                        .body(body.to_vec())
                        .send()
                        .await
                        .unwrap();
                    assert!(r.status().is_success(), "{}", r.status());
                    r.bytes().await.unwrap();
                    n += 1;
                }
                n
            })
        })
        .collect();
    let mut total = 0;
    for t in tasks {
        total += t.await.unwrap();
    }
    total as f64 / start.elapsed().as_secs_f64()
}

fn main() {
    let secs = env("TF_BENCH_SECONDS", 5);
    let conns = usize::try_from(env("TF_BENCH_CONNECTIONS", 50)).unwrap();
    let admissions = env("TF_BENCH_ADMISSIONS", 5000);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async move {
        let sim = EngineSim::new(SimConfig { models: vec!["bench-base".into()], ..SimConfig::default() });
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let sim_addr = l.local_addr().unwrap();
        tokio::spawn(tf_engine_sim::serve(l, sim, std::future::pending()));

        let (pool, _) = common::fresh_database("tokenfactory_bench_quota", 16).await;
        let reg = BaseRegistration {
            name: "bench-base".into(),
            graph: "bench".into(),
            upstream_url: format!("http://{sim_addr}/v1"),
            upstream_model: "bench-base".into(),
            continuous_usage: true,
            denied_fields: Some(tokenfactory::engine_policy::EnginePolicy::denied_except(&["sim"])),
            prompt_estimator: tokenfactory::engine_policy::PromptEstimator::SimWords,
            kind: tf_core::endpoint::ModelKind::Chat,
            nvext_allowed: None,
        };
        fleet::register_bases(&pool, "static", &[reg]).await.unwrap();
        // 1 micro per request, estimated or used: 7 prompt tokens at 1/7 micro each (half-up to
        // 1), output free, so the spend checks run at the same cost as the rate checks.
        let rates = tf_core::money::Rates { fresh_per_m: 142_858, cached_per_m: 0, output_per_m: 0 };
        let from = time::OffsetDateTime::now_utc() - time::Duration::hours(1);
        tf_core::db::billing::set_price(&pool, from, "bench-base", "standard", rates, "bench").await.unwrap().unwrap();
        let free = tf_core::accounts::create_tenant(&pool, "free", "Free").await.unwrap();
        let (_, free_key) = tf_core::keys::issue(&pool, free.id, "bench").await.unwrap();
        let limited = tf_core::accounts::create_tenant(&pool, "limited", "Limited").await.unwrap();
        let (limited_key_row, limited_key) = tf_core::keys::issue(&pool, limited.id, "bench").await.unwrap();
        let big = 1_000_000_000_000i64;
        sqlx::query!("INSERT INTO tenant_limits (tenant_id, requests_per_minute, tokens_per_minute, spend_limit_micros, max_in_flight, max_long_prompts, long_prompt_tokens) VALUES ($1, $2, $2, $2, $2, $2, 1)", limited.id, big).execute(&pool).await.unwrap();
        sqlx::query!("INSERT INTO key_limits (api_key_id, tenant_id, requests_per_minute, tokens_per_minute, spend_limit_micros) VALUES ($1, $2, $3, $3, $3)", limited_key_row.id, limited.id, big)
            .execute(&pool)
            .await
            .unwrap();

        let redis = redis::Client::open("redis://127.0.0.1:6379").unwrap().get_connection_manager().await.unwrap();
        let dir = std::env::temp_dir().join(format!("tf-bench-quota-journal-{}", std::process::id()));
        let journal = Journal::open(&dir, Durability::Process, Duration::from_millis(5), Default::default()).unwrap();
        let options = AppOptions {
            redis: Some(redis).into(),
            redis_prefix: format!("tfbench-{}:", uuid::Uuid::new_v4().simple()),
            journal: Some(Arc::new(journal)),
            ..AppOptions::default()
        };
        let built = app::build(pool.clone(), options).await.unwrap();
        let quota = built.gateway.quota.clone();
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let gw: SocketAddr = l.local_addr().unwrap();
        let router = built.router.clone();
        tokio::spawn(tokenfactory::http_server::serve(l, router, Default::default(), Default::default(), std::future::pending()));

        // (1) One admission at a time: the decision's own cost (cache probe, estimate, and either
        // this replica's credit or one Redis script round trip that grants more credit). The
        // long-prompt threshold is 1 token so every check runs. Both kinds are reported apart.
        let mut lat = Vec::with_capacity(usize::try_from(admissions).unwrap());
        let mut redis_lat = Vec::new();
        for i in 0..admissions + 200 {
            let req = AdmitRequest {
                request_id: uuid::Uuid::now_v7(),
                tenant: limited.id,
                key: limited_key_row.id,
                graph: "bench",
                price_key: "bench-base",
                own_price_key: None,
                max_tokens: Some(16),
                sequences: 1,
            };
            let before = quota.admissions().1;
            let t0 = Instant::now();
            let admitted = quota.admit(req, || 7).await.unwrap().expect("limits apply");
            let us = t0.elapsed().as_micros() as u64;
            drop(admitted); // gives its slots and reservation back to this replica's credit
            if i >= 200 {
                lat.push(us);
                if quota.admissions().1 > before {
                    redis_lat.push(us);
                }
            }
        }
        let (p50, p99) = (pct(&mut lat, 0.5), pct(&mut lat, 0.99));
        println!("admission with Redis (8 checks): p50 {p50} us, p99 {p99} us over {admissions} (target p99 <= 300 us)");
        let (r50, r99) = (pct(&mut redis_lat, 0.5), pct(&mut redis_lat, 0.99));
        println!(
            "  of which {} called Redis (p50 {r50} us, p99 {r99} us), {} were decided on this replica's credit",
            redis_lat.len(),
            lat.len() - redis_lat.len()
        );

        // (2) Throughput through the gateway, limits off vs on, alternating to spread noise.
        let gw_url = format!("http://{gw}/v1/chat/completions");
        throughput(&gw_url, &free_key, 4, Duration::from_millis(300)).await;
        throughput(&gw_url, &limited_key, 4, Duration::from_millis(300)).await;
        let half = Duration::from_secs(secs) / 2;
        let off1 = throughput(&gw_url, &free_key, conns, half).await;
        let on1 = throughput(&gw_url, &limited_key, conns, half).await;
        let off2 = throughput(&gw_url, &free_key, conns, half).await;
        let on2 = throughput(&gw_url, &limited_key, conns, half).await;
        let off = (off1 + off2) / 2.0;
        let on = (on1 + on2) / 2.0;
        println!("gateway throughput, {conns} connections: limits off {off:.0} req/s, on {on:.0} req/s");
        println!("  ratio on/off: {:.2} (target >= 0.8)", on / off);
        let (credit, redis_calls) = quota.admissions();
        println!("  admissions so far: {credit} on credit, {redis_calls} by a Redis call");
        let _ = std::fs::remove_dir_all(&dir);

        // (3) Many tenants near their limits, two replicas.
        let tenants = usize::try_from(env("TF_BENCH_TENANTS", 200)).unwrap();
        let rounds = env("TF_BENCH_ROUNDS", 100);
        many_tenants(&pool, tenants, rounds).await;
    });
}

/// One worker's tally in the many-tenant case.
#[derive(Default)]
struct Tally {
    lat_us: Vec<u64>,
    admitted: u64,
    refused: u64,
    /// Refusals by limit.
    kinds: std::collections::BTreeMap<&'static str, u64>,
}

/// Case (3): `tenants` limited tenants (and as many unlimited ones for the baseline), two replicas.
async fn many_tenants(pool: &sqlx::PgPool, tenants: usize, rounds: u64) {
    let redis = redis::Client::open("redis://127.0.0.1:6379")
        .unwrap()
        .get_connection_manager()
        .await
        .unwrap();
    let prefix = format!("tfbench-many-{}:", uuid::Uuid::new_v4().simple());
    let tracker = tokio_util::task::TaskTracker::new();
    let cancel = tokio_util::sync::CancellationToken::new();
    let mut replicas = Vec::new();
    for _ in 0..2 {
        replicas.push(
            Quota::start(
                pool.clone(),
                Some(redis.clone()).into(),
                prefix.clone(),
                Default::default(),
                &tracker,
                cancel.clone(),
            )
            .await,
        );
    }
    // Per tenant and run: 2 x rounds requests of 23 tokens estimated (7 + max_tokens 16), 8 used,
    // 1 micro each. The room is what the run uses plus a margin, so grants (a sixteenth of the
    // room left) stay a few requests wide and shrink to one: near the limit all the way.
    let n = i64::try_from(2 * rounds).unwrap();
    let (rpm, tpm, spend) = (n + 60, 8 * n + 600, n + 60);
    let mut limited = Vec::new();
    let mut free = Vec::new();
    for i in 0..tenants {
        let t = tf_core::accounts::create_tenant(pool, &format!("many-{i}"), "Many")
            .await
            .unwrap();
        let (k, _) = tf_core::keys::issue(pool, t.id, "bench").await.unwrap();
        sqlx::query("INSERT INTO tenant_limits (tenant_id, requests_per_minute, tokens_per_minute, spend_limit_micros, max_in_flight, max_long_prompts, long_prompt_tokens) VALUES ($1, $2, $3, $4, 2, 2, 1)")
            .bind(t.id).bind(rpm).bind(tpm).bind(spend).execute(pool).await.unwrap();
        limited.push((t.id, k.id));
        let f = tf_core::accounts::create_tenant(pool, &format!("many-free-{i}"), "Free")
            .await
            .unwrap();
        let (fk, _) = tf_core::keys::issue(pool, f.id, "bench").await.unwrap();
        free.push((f.id, fk.id));
    }
    let run = |subjects: Vec<(uuid::Uuid, uuid::Uuid)>| {
        let replicas = replicas.clone();
        async move {
            // Limits and prices cached first (as on a replica in service), so the figures are
            // admission's, not 400 cold PostgreSQL lookups at once.
            for q in &replicas {
                for (tenant, key) in &subjects {
                    q.limits().limits(*tenant, *key).await;
                }
                q.limits().price(None, None, "bench-base").await;
            }
            let start = Instant::now();
            let mut tasks = Vec::new();
            for (tenant, key) in subjects {
                for q in &replicas {
                    let q = q.clone();
                    tasks.push(tokio::spawn(async move {
                        let mut tally = Tally::default();
                        for _ in 0..rounds {
                            let req = AdmitRequest {
                                request_id: uuid::Uuid::now_v7(),
                                tenant,
                                key,
                                graph: "bench",
                                price_key: "bench-base",
                                own_price_key: None,
                                max_tokens: Some(16),
                                sequences: 1,
                            };
                            let t0 = Instant::now();
                            let decided = q.admit(req, || 7).await;
                            tally.lat_us.push(t0.elapsed().as_micros() as u64);
                            tokio::time::sleep(Duration::from_millis(2)).await;
                            match decided {
                                Ok(Some(admitted)) => {
                                    tally.admitted += 1;
                                    admitted
                                        .settle(Quantities {
                                            fresh: 7,
                                            cached: 0,
                                            output: 1,
                                        })
                                        .await;
                                }
                                Ok(None) => tally.admitted += 1,
                                Err(r) => {
                                    tally.refused += 1;
                                    *tally.kinds.entry(r.metric_label()).or_default() += 1;
                                }
                            }
                        }
                        tally
                    }));
                }
            }
            let mut all = Tally::default();
            for t in tasks {
                let t = t.await.unwrap();
                all.lat_us.extend(t.lat_us);
                all.admitted += t.admitted;
                all.refused += t.refused;
                for (k, n) in t.kinds {
                    *all.kinds.entry(k).or_default() += n;
                }
            }
            let rate = (all.admitted + all.refused) as f64 / start.elapsed().as_secs_f64();
            (all, rate)
        }
    };
    // A short warm-up, then the baseline, then the limited run.
    let _ = run(free.iter().copied().take(4).collect()).await;
    let (_, base_rate) = run(free.clone()).await;
    let calls_before: u64 = replicas.iter().map(|q| q.admissions().1).sum();
    let (mut lim, rate) = run(limited.clone()).await;
    let calls: u64 = replicas.iter().map(|q| q.admissions().1).sum::<u64>() - calls_before;
    let (p50, p99) = (pct(&mut lim.lat_us, 0.5), pct(&mut lim.lat_us, 0.99));
    println!(
        "many tenants ({tenants} near their limits, 2 replicas, {} workers x {rounds}): admission p50 {p50} us, p99 {p99} us",
        2 * tenants
    );
    println!(
        "  decisions {rate:.0}/s vs {base_rate:.0}/s without limits: ratio {:.2}; {} admitted, {} refused {:?}, {calls} Redis calls",
        rate / base_rate,
        lim.admitted,
        lim.refused,
        lim.kinds
    );
    cancel.cancel();
    tracker.close();
    tracker.wait().await;
}
