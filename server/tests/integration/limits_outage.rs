//! The limits cache through a PostgreSQL outage (a TCP proxy the test cuts): every caller keeps
//! getting an answer at once (the last one read, a known "no limits", or none for a key never
//! seen), while the replica asks PostgreSQL at most once a second instead of once per request.

#![allow(
    clippy::disallowed_methods,
    reason = "test load generators run until the test ends"
)]
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests may fail loudly

use crate::common;

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::chaos::ChaosProxy;
use common::eventually;
use sqlx::PgPool;
use tokenfactory::quota::limits::{LimitCache, Limits, FRESH_FOR, RETRY_EVERY};
use uuid::Uuid;

/// A tenant with a requests-per-minute limit, and its key.
async fn limited_tenant(pool: &PgPool, rpm: i64) -> (Uuid, Uuid) {
    let t = tf_core::accounts::create_tenant(pool, "limited", "Limited")
        .await
        .unwrap();
    let (key, _) = tf_core::keys::issue(pool, t.id, "k").await.unwrap();
    sqlx::query("INSERT INTO tenant_limits (tenant_id, requests_per_minute) VALUES ($1, $2)")
        .bind(t.id)
        .bind(rpm)
        .execute(pool)
        .await
        .unwrap();
    (t.id, key.id)
}

/// What each caller saw: answers, the slowest one, and whether every answer was the expected one.
#[derive(Default)]
struct Seen {
    answers: u64,
    slowest: Duration,
    wrong: u64,
}

#[sqlx::test(migrations = "../migrations")]
async fn a_postgres_outage_costs_one_lookup_a_second_and_refuses_nothing(pool: PgPool) {
    let (limited_tenant, limited_key) = limited_tenant(&pool, 60).await;
    let (free_tenant, free_key) = (Uuid::now_v7(), Uuid::now_v7());
    let proxy = ChaosProxy::start("127.0.0.1:5432").await;
    let db = pool.connect_options().get_database().unwrap().to_owned();
    let via_proxy = tf_core::db::connect(&format!("postgres://postgres@{}/{db}", proxy.addr), 4)
        .await
        .unwrap();
    let cache = Arc::new(LimitCache::new(via_proxy));

    // Warm: one key with a limit, one known to have none.
    let limited = cache.limits(limited_tenant, limited_key).await;
    assert_eq!(limited.tenant.requests_per_minute, Some(60));
    assert_eq!(cache.limits(free_tenant, free_key).await, Limits::default());
    assert_eq!(cache.lookups(), 2);

    proxy.cut();
    tokio::time::sleep(FRESH_FOR).await; // both answers are stale now
    let before = cache.lookups();
    let started = Instant::now();
    let outage = Duration::from_secs(4);
    let never_seen = (Uuid::now_v7(), Uuid::now_v7());
    let callers: Vec<_> = (0..60)
        .map(|i| {
            let cache = cache.clone();
            let limited = limited.clone();
            tokio::spawn(async move {
                let mut seen = Seen::default();
                while started.elapsed() < outage {
                    let t0 = Instant::now();
                    let (answer, expected) = match i % 3 {
                        0 => (
                            cache.limits(limited_tenant, limited_key).await,
                            limited.clone(),
                        ),
                        1 => (cache.limits(free_tenant, free_key).await, Limits::default()),
                        _ => (
                            cache.limits(never_seen.0, never_seen.1).await,
                            Limits::default(),
                        ),
                    };
                    seen.slowest = seen.slowest.max(t0.elapsed());
                    seen.answers += 1;
                    seen.wrong += u64::from(answer != expected);
                    tokio::task::yield_now().await;
                }
                seen
            })
        })
        .collect();
    let mut total = Seen::default();
    for c in callers {
        let s = c.await.unwrap();
        total.answers += s.answers;
        total.wrong += s.wrong;
        total.slowest = total.slowest.max(s.slowest);
    }
    let elapsed = started.elapsed();
    let lookups = cache.lookups() - before;
    let refused = proxy.refused.load(Ordering::SeqCst);
    println!(
        "outage {elapsed:?}: {} answers, {lookups} lookups, {refused} refused connections, slowest {:?}",
        total.answers, total.slowest
    );
    assert_eq!(total.wrong, 0, "every caller got the last known answer");
    assert!(total.answers > 1_000, "callers were served, not held");
    // The three keys went stale at once while PostgreSQL was not yet known to be down (one
    // lookup each), then one probe per RETRY_EVERY for the whole replica.
    let allowed = 3.0 + elapsed.as_secs_f64() / RETRY_EVERY.as_secs_f64();
    assert!(
        (lookups as f64) <= allowed.ceil(),
        "{lookups} lookups in {elapsed:?} (at most {allowed:.1})"
    );
    assert!(lookups >= 2, "the cache kept probing PostgreSQL");
    assert!(
        total.slowest < Duration::from_millis(500),
        "no caller waited beyond the lookup timeout: {:?}",
        total.slowest
    );

    // Back: a change made during the outage is read within a probe interval or so.
    sqlx::query("UPDATE tenant_limits SET requests_per_minute = 120 WHERE tenant_id = $1")
        .bind(limited_tenant)
        .execute(&pool)
        .await
        .unwrap();
    proxy.restore();
    eventually(Duration::from_secs(5), "the new limit read", || {
        let cache = cache.clone();
        async move {
            let l = cache.limits(limited_tenant, limited_key).await;
            l.tenant.requests_per_minute == Some(120)
        }
    })
    .await;
}
