//! Limits shared by two gateway replicas through a real Redis (redis://127.0.0.1:6379, a fresh key
//! prefix per test): rates and spend hold under contention, a dead replica's slots come back
//! within the lease, serving continues on local limits while Redis is down and the counters
//! recover after.

#![allow(
    clippy::disallowed_methods,
    reason = "test scaffolding (fake engines, load generators) runs until the test ends; nothing waits for it at shutdown"
)]
// Helpers outside #[test] fns (and the shared harness in `common`) fail loudly by design.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
use crate::common;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::chaos::ChaosProxy;
use common::eventually::{wait_until, wait_until_every};
use common::*;
use redis::aio::ConnectionManager;
use serde_json::{json, Value};
use sqlx::PgPool;
use tokenfactory::app::App;
use tokenfactory::quota::QuotaOptions;

const REDIS: &str = "redis://127.0.0.1:6379";

async fn redis_at(url: &str) -> ConnectionManager {
    let config = redis::aio::ConnectionManagerConfig::new()
        .set_number_of_retries(1)
        .set_connection_timeout(Some(Duration::from_millis(200)))
        .set_response_timeout(Some(Duration::from_millis(500)));
    redis::Client::open(url)
        .unwrap()
        .get_connection_manager_with_config(config)
        .await
        .unwrap()
}

fn quota_args(lease_ms: u64) -> QuotaOptions {
    QuotaOptions {
        quota_lease_ms: lease_ms,
        quota_reconcile_ms: 200,
        ..QuotaOptions::default()
    }
}

fn fresh_prefix() -> String {
    format!("tftest-{}:", uuid::Uuid::new_v4().simple())
}

/// `clients` tasks per address, each sending `each` requests; returns (admitted, refused bodies).
async fn hammer(
    addrs: &[SocketAddr],
    key: &str,
    body: Value,
    clients: usize,
    each: usize,
) -> (usize, Vec<(reqwest::header::HeaderMap, Value)>) {
    let ok = Arc::new(AtomicUsize::new(0));
    let refused = Arc::new(std::sync::Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    for addr in addrs {
        let http = reqwest::Client::new();
        for _ in 0..clients {
            let (http, ok, refused, body, key) = (
                http.clone(),
                ok.clone(),
                refused.clone(),
                body.clone(),
                key.to_owned(),
            );
            let url = format!("http://{addr}/v1/chat/completions");
            tasks.push(tokio::spawn(async move {
                for _ in 0..each {
                    let r = http
                        .post(&url)
                        .bearer_auth(&key)
                        .json(&body)
                        .send()
                        .await
                        .unwrap();
                    match r.status().as_u16() {
                        200 => {
                            r.bytes().await.unwrap();
                            ok.fetch_add(1, Ordering::Relaxed);
                        }
                        429 => {
                            let h = r.headers().clone();
                            let body = r.json::<Value>().await.unwrap();
                            refused.lock().unwrap().push((h, body));
                        }
                        s => panic!("unexpected status {s}: {}", r.text().await.unwrap()),
                    }
                }
            }));
        }
    }
    for t in tasks {
        t.await.unwrap();
    }
    let refused = std::mem::take(&mut *refused.lock().unwrap());
    (ok.load(Ordering::Relaxed), refused)
}

async fn two_replicas(pool: PgPool, lease_ms: u64) -> (TestApp, SocketAddr, App, String) {
    let prefix = fresh_prefix();
    let a = TestApp::builder(pool.clone())
        .redis(redis_at(REDIS).await)
        .redis_prefix(&prefix)
        .quota(quota_args(lease_ms))
        .start()
        .await;
    // A second replica of the same deployment: same database, same Redis prefix.
    let b = TestApp::builder(pool)
        .replica_of(&a)
        .redis(redis_at(REDIS).await)
        .redis_prefix(&prefix)
        .quota(quota_args(lease_ms))
        .start()
        .await;
    (a, b.addr, b.app, prefix)
}

async fn billed(pool: &PgPool, status: &str) -> (i64, i64) {
    let r = sqlx::query!(
        r#"SELECT count(*) AS "requests!", COALESCE(SUM(prompt_tokens + completion_tokens), 0)::bigint AS "tokens!"
           FROM usage_events WHERE status = $1"#,
        status,
    )
    .fetch_one(pool)
    .await
    .unwrap();
    (r.requests, r.tokens)
}

#[sqlx::test(migrations = "../migrations")]
async fn request_rate_holds_across_two_replicas_under_contention(pool: PgPool) {
    let (a, b_addr, _b, _) = two_replicas(pool.clone(), 30_000).await;
    let acme = a.tenant("acme").await;
    let out = admin_limits(
        &pool,
        &["--key", &acme.key, "--rpm", "300", "--tpm", "1000000"],
    )
    .await;
    assert!(
        out.contains("requests per minute") && out.contains("300"),
        "{out}"
    );

    let (ok, refused) = hammer(
        &[a.addr, b_addr],
        &acme.key,
        chat(BASE, "hello world", 3),
        200,
        3,
    )
    .await;
    println!("requests per minute: limit 300, admitted {ok} of 1200");
    eprintln!(
        "admissions by replica: a {:?}, b {:?}",
        a.app.gateway.quota.admissions(),
        _b.gateway.quota.admissions()
    );
    assert!(ok <= 303, "admitted {ok} > limit 300 + 1%");
    assert!(ok >= 290, "admitted only {ok}: the limit should be reached");
    let (h, body) = &refused[0];
    assert_eq!(body["error"]["type"], "rate_limit_error");
    assert_eq!(body["error"]["code"], "rate_limit_exceeded");
    assert!(h["retry-after"].to_str().unwrap().parse::<u64>().unwrap() >= 1);
    assert_eq!(h["x-ratelimit-limit-requests"], "300");
    assert_eq!(h["x-ratelimit-remaining-requests"], "0");
    assert!(
        h.contains_key("x-ratelimit-reset-requests") && h.contains_key("x-ratelimit-limit-tokens")
    );

    // Refusals are in the request log with zero tokens; admitted ones billed normally.
    assert_eq!(
        billed(&pool, "rejected").await,
        (i64::try_from(refused.len()).unwrap(), 0)
    );
    assert_eq!(billed(&pool, "ok").await.0, i64::try_from(ok).unwrap());
}

#[sqlx::test(migrations = "../migrations")]
async fn token_rate_is_corrected_from_real_usage_and_holds(pool: PgPool) {
    let (a, b_addr, _b, _) = two_replicas(pool.clone(), 30_000).await;
    let acme = a.tenant("acme").await;
    admin_limits(&pool, &["--key", &acme.key, "--tpm", "3000"]).await;
    // Prompt 7 tokens + max_tokens 23 = 30 estimated; the engine writes 3, so 10 are used.
    let mut body = chat(BASE, "hello world", 23);
    body["sim"] = json!({"completion_tokens": 3});
    let r = a
        .post(&acme.key, "/v1/chat/completions", body.clone())
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(r.headers()["x-ratelimit-limit-tokens"], "3000");
    assert_eq!(
        r.headers()["x-ratelimit-remaining-tokens"],
        "2970",
        "estimate taken at admission"
    );

    let (ok, _) = hammer(&[a.addr, b_addr], &acme.key, body, 200, 2).await;
    let (n, tokens) = billed(&pool, "ok").await;
    println!("tokens per minute: limit 3000, admitted {n} requests using {tokens} tokens");
    assert!(tokens <= 3030, "{tokens} tokens > limit 3000 + 1%");
    assert!(
        ok + 1 > 100,
        "correction from real usage must admit more than limit / estimate"
    );
}

#[sqlx::test(migrations = "../migrations")]
async fn spend_overshoots_by_at_most_the_reservations_in_flight(pool: PgPool) {
    let (a, b_addr, _b, _) = two_replicas(pool.clone(), 30_000).await;
    let acme = a.tenant("acme").await;
    common::price_every_token(&pool, 1).await;
    admin_limits(&pool, &["--tenant", "acme", "--spend-limit", "0.002"]).await;
    let mut body = chat(BASE, "hello world", 23);
    body["sim"] = json!({"completion_tokens": 3});

    let (_, refused) = hammer(&[a.addr, b_addr], &acme.key, body, 200, 3).await;
    let (_, tokens) = billed(&pool, "ok").await;
    let spend = tokens; // 1000 micros per 1000 tokens: one micro per token
    let in_flight_reservations = 400 * 30;
    println!(
        "spend: limit 2000 micros, billed {spend} (bound {})",
        2000 + in_flight_reservations
    );
    assert!(spend <= 2000 + in_flight_reservations);
    assert!(
        spend <= 2000,
        "estimates bound real usage here, so spend never passes the limit"
    );
    assert!(spend >= 1500, "the budget should be used up, got {spend}");
    let (h, body) = refused.last().unwrap();
    assert_eq!(body["error"]["code"], "insufficient_quota");
    assert!(h.contains_key("retry-after"));
    let shown = admin_limits(&pool, &["--tenant", "acme"]).await;
    assert!(shown.contains(&format!("{spend}")), "{shown}");
}

#[sqlx::test(migrations = "../migrations")]
async fn a_dead_replicas_slots_come_back_within_the_lease(pool: PgPool) {
    let lease = Duration::from_millis(1000);
    let (a, b_addr, b, _) = two_replicas(pool.clone(), 1000).await;
    let acme = a.tenant("acme").await;
    admin_limits(&pool, &["--tenant", "acme", "--max-in-flight", "3"]).await;

    // Three long streams through replica B hold the tenant's three slots.
    let http = reqwest::Client::new();
    let mut streams = Vec::new();
    for _ in 0..3 {
        let mut body = chat(BASE, "long story", 200);
        body["stream"] = json!(true);
        body["sim"] = json!({"token_interval_ms": 100});
        let r = http
            .post(format!("http://{b_addr}/v1/chat/completions"))
            .bearer_auth(&acme.key)
            .json(&body)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200);
        streams.push(r);
    }
    let short = || {
        a.post(&acme.key, "/v1/chat/completions", chat(BASE, "hi", 1))
            .send()
    };
    let r = short().await.unwrap();
    assert_eq!(r.status(), 429);
    assert_eq!(
        r.json::<Value>().await.unwrap()["error"]["code"],
        "rate_limit_exceeded"
    );
    // Renewals keep live slots beyond the lease: refused all through one and a half leases.
    let held = Instant::now();
    while held.elapsed() < lease + lease / 2 {
        assert_eq!(
            short().await.unwrap().status(),
            429,
            "a live replica's slots must not expire"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    // B dies: no more renewals, no releases.
    b.gateway.quota.halt();
    let back = wait_until(
        lease + Duration::from_millis(500),
        "capacity not back within the lease",
        || async { short().await.unwrap().status() == 200 },
    )
    .await;
    println!("capacity back {back:?} after the replica died (lease {lease:?})");
    drop(streams);
}

#[sqlx::test(migrations = "../migrations")]
async fn slots_are_freed_on_every_path(pool: PgPool) {
    let (a, _, _b, _) = two_replicas(pool.clone(), 30_000).await;
    let acme = a.tenant("acme").await;
    admin_limits(&pool, &["--tenant", "acme", "--max-in-flight", "1"]).await;
    let send = |body: Value| a.post(&acme.key, "/v1/chat/completions", body).send();
    let admitted_soon = || {
        wait_until(Duration::from_secs(3), "slot never freed", || async {
            send(chat(BASE, "hi", 1)).await.unwrap().status() == 200
        })
    };
    // Completed, back to back: the slot is free before the response ends.
    for _ in 0..5 {
        assert_eq!(send(chat(BASE, "hi", 2)).await.unwrap().status(), 200);
    }
    // Upstream error.
    let mut failing = chat(BASE, "hi", 2);
    failing["sim"] = json!({"fail_status": 500});
    assert_eq!(send(failing).await.unwrap().status(), 500);
    assert_eq!(send(chat(BASE, "hi", 1)).await.unwrap().status(), 200);
    // Client hangs up mid-stream.
    let mut long = chat(BASE, "hi", 100);
    long["stream"] = json!(true);
    long["sim"] = json!({"token_interval_ms": 50});
    let r = send(long).await.unwrap();
    assert_eq!(read_events_then_hang_up(r, 2).await, 2);
    admitted_soon().await;
}

#[sqlx::test(migrations = "../migrations")]
async fn limit_changes_reach_every_replica_within_a_second(pool: PgPool) {
    let (a, b_addr, _b, _) = two_replicas(pool.clone(), 30_000).await;
    let acme = a.tenant("acme").await;
    let via_b = || {
        reqwest::Client::new()
            .post(format!("http://{b_addr}/v1/chat/completions"))
            .bearer_auth(&acme.key)
            .json(&chat(BASE, "hi", 1))
            .send()
    };
    assert_eq!(via_b().await.unwrap().status(), 200);
    assert!(
        !via_b()
            .await
            .unwrap()
            .headers()
            .contains_key("x-ratelimit-limit-requests"),
        "no limits, no headers"
    );
    admin_limits(&pool, &["--tenant", "acme", "--rpm", "0"]).await;
    wait_until(
        Duration::from_secs(1),
        "limit not applied within 1 s",
        || async { via_b().await.unwrap().status() == 429 },
    )
    .await;
    admin_limits(&pool, &["--tenant", "acme", "--rpm", "none"]).await;
    wait_until(
        Duration::from_secs(1),
        "limit not lifted within 1 s",
        || async { via_b().await.unwrap().status() == 200 },
    )
    .await;
}

#[sqlx::test(migrations = "../migrations")]
async fn serving_continues_on_local_limits_while_redis_is_down_and_counters_recover(pool: PgPool) {
    let proxy = ChaosProxy::start("127.0.0.1:6379").await;
    let prefix = fresh_prefix();
    let via_proxy = redis_at(&format!("redis://{}", proxy.addr)).await;
    let a = TestApp::builder(pool.clone())
        .redis(via_proxy)
        .redis_prefix(&prefix)
        .quota(quota_args(30_000))
        .start()
        .await;
    let acme = a.tenant("acme").await;
    common::price_every_token(&pool, 1).await;
    admin_limits(
        &pool,
        &["--tenant", "acme", "--rpm", "40", "--spend-limit", "1"],
    )
    .await;
    let send = || {
        a.post(
            &acme.key,
            "/v1/chat/completions",
            chat(BASE, "hello world", 3),
        )
        .send()
    };
    let count_ok = |n: usize| async move {
        let mut ok = 0;
        for _ in 0..n {
            if send().await.unwrap().status() == 200 {
                ok += 1;
            }
        }
        ok
    };
    assert_eq!(count_ok(10).await, 10);

    proxy.cut();
    // Window credit granted before the outage is still spendable until it lapses (it was counted
    // in Redis when granted); from then on only the local share admits.
    let credit_ttl = u64::try_from(tokenfactory::quota::credit::GRANT_TTL_MS).unwrap();
    // Time itself is the condition here (nothing outside the replica shows the credit lapse).
    tokio::time::sleep(Duration::from_millis(credit_ttl + 50)).await;
    let cut = Instant::now();
    let during = count_ok(40).await;
    println!(
        "Redis down: {during} of 40 admitted in {:?} (local share 0.5 x 40)",
        cut.elapsed()
    );
    assert_eq!(
        during, 20,
        "this replica enforces half of the limit on its own"
    );

    proxy.restore();
    let redis = redis_at(REDIS).await;
    let period = tokenfactory::quota::plan::period(time::OffsetDateTime::now_utc()).0;
    let spend_key = format!("{prefix}q:s:t:{}:{period}", acme.id);
    let redis = &tokio::sync::Mutex::new(redis);
    let rebuilt = wait_until_every(
        Duration::from_millis(100),
        Duration::from_secs(5),
        "spend counter never reconciled to the billed spend",
        || async {
            let (_, tokens) = billed(&pool, "ok").await;
            let counter: Option<i64> = redis::cmd("GET")
                .arg(&spend_key)
                .query_async(&mut *redis.lock().await)
                .await
                .unwrap();
            // The first request after the outage wakes the reconciler.
            let _ = send().await.unwrap();
            let (_, tokens_after) = billed(&pool, "ok").await;
            counter == Some(tokens) || counter == Some(tokens_after)
        },
    )
    .await;
    println!("spend counter rebuilt to the billed spend {rebuilt:?} after Redis returned");
    // Rates: the outage's local counts were merged, so the minute's limit holds overall.
    let (ok_total, _) = billed(&pool, "ok").await;
    let more = count_ok(20).await;
    println!(
        "after recovery: {} admitted in the minute (limit 40 + outage overshoot)",
        ok_total + i64::from(more)
    );
    assert!(
        ok_total + i64::from(more) <= 41,
        "local counts not merged back"
    );
}
