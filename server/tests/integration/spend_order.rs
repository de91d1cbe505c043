//! Settled spend reaches Redis before its usage event reaches PostgreSQL. A request does not wait
//! for Redis on its way out (its spend rides the next SYNC); the journal shipper waits for it
//! before each batch instead. The spend reconciler relies on the order: it only ever raises Redis
//! to what PostgreSQL billed, so PostgreSQL ahead of Redis would be counted twice.

#![allow(
    clippy::disallowed_methods,
    reason = "test scaffolding (fake engines, load generators) runs until the test ends; nothing waits for it at shutdown"
)]
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use crate::common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::*;
use sqlx::PgPool;
use tokenfactory::journal::{Durability, Journal};

const REDIS: &str = "redis://127.0.0.1:6379";

#[sqlx::test(migrations = "../migrations")]
async fn postgres_never_bills_more_than_redis_has_settled(pool: PgPool) {
    let prefix = format!("tftest-{}:", uuid::Uuid::new_v4().simple());
    let redis = redis::Client::open(REDIS)
        .unwrap()
        .get_connection_manager()
        .await
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let journal = Journal::open(
        dir.path(),
        Durability::Process,
        Duration::from_millis(2),
        Default::default(),
    )
    .unwrap();
    let t = Arc::new(
        TestApp::builder(pool.clone())
            .redis(redis.clone())
            .redis_prefix(&prefix)
            .journal(Arc::new(journal))
            .start()
            .await,
    );
    let acme = t.tenant("acme").await;
    // One micro per token, so billed spend is the token count.
    common::price_every_token(&pool, 1).await;
    admin_limits(&pool, &["--tenant", "acme", "--spend-limit", "1000"]).await;
    let period = tokenfactory::quota::plan::period(time::OffsetDateTime::now_utc()).0;
    let settled_key = format!("{prefix}q:s:t:{}:{period}", acme.id);

    let stop = Arc::new(AtomicBool::new(false));
    let clients: Vec<_> = (0..8)
        .map(|i| {
            let (t, key, stop) = (t.clone(), acme.key.clone(), stop.clone());
            tokio::spawn(async move {
                let mut n = 0;
                while !stop.load(Ordering::Relaxed) {
                    let r = t
                        .post(
                            &key,
                            "/v1/chat/completions",
                            chat(BASE, &format!("hi {i} {n}"), 4),
                        )
                        .send()
                        .await
                        .unwrap();
                    assert_eq!(r.status(), 200);
                    r.bytes().await.unwrap();
                    n += 1;
                }
                n
            })
        })
        .collect();

    let mut con = redis.clone();
    let (mut samples, mut billed_samples, mut last_billed) = (0, 0, 0i64);
    let deadline = tokio::time::Instant::now() + Duration::from_millis(2500);
    while tokio::time::Instant::now() < deadline {
        // PostgreSQL first: Redis only grows, so a later read can only be higher.
        let billed: i64 = sqlx::query_scalar!(
            r#"SELECT COALESCE(SUM(prompt_tokens + completion_tokens), 0)::bigint AS "billed!"
               FROM usage_events WHERE tenant_id = $1"#,
            acme.id,
        )
        .fetch_one(&pool)
        .await
        .unwrap();
        let settled: Option<i64> = redis::cmd("GET")
            .arg(&settled_key)
            .query_async(&mut con)
            .await
            .unwrap();
        let settled = settled.unwrap_or(0);
        assert!(
            billed <= settled,
            "PostgreSQL billed {billed} micros while Redis had settled {settled}"
        );
        samples += 1;
        if billed > 0 {
            billed_samples += 1;
        }
        last_billed = billed;
        tokio::time::sleep(Duration::from_millis(3)).await;
    }
    stop.store(true, Ordering::Relaxed);
    let mut requests = 0;
    for c in clients {
        requests += c.await.unwrap();
    }
    println!("{requests} requests, {samples} samples ({billed_samples} with spend billed), last billed {last_billed} micros");
    assert!(
        billed_samples >= 50,
        "too few samples saw billed spend to prove the order"
    );
}
