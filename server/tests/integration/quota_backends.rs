//! One contract, every quota backend: the same admission and settle semantics asserted against
//! Redis (shared limits, credit granted by Redis) and against the local fallback a replica uses
//! while Redis is down (its share set to the whole limit, so both must answer alike). Plus what
//! only the Redis backend has to promise: a SYNC that fails is sent again when Redis returns,
//! so its spend is exact at once, without the reconciler, and never counted twice.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
use crate::common;

use std::time::{Duration, Instant};

use common::chaos::ChaosProxy;
use common::eventually::wait_until;
use redis::aio::ConnectionManager;
use sqlx::PgPool;
use tokenfactory::fleet::{self, BaseRegistration};
use tokenfactory::quota::answer::RefusalKind;
use tokenfactory::quota::{AdmitRequest, Admitted, Quota, QuotaOptions, Refusal};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use uuid::Uuid;

/// Usage of `n` tokens, all fresh input (the spend these tests set is one micro per token).
fn tokens(n: i64) -> tf_core::money::Quantities {
    tf_core::money::Quantities {
        fresh: n,
        cached: 0,
        output: 0,
    }
}

const REDIS: &str = "redis://127.0.0.1:6379";

#[derive(Debug, Clone, Copy)]
enum Backend {
    Redis,
    Local,
}

/// A quota of one replica, and the tenant and key it is asked about.
struct Subject {
    quota: Quota,
    tenant: Uuid,
    key: Uuid,
    prefix: String,
    _stop: Stop,
}

struct Stop(CancellationToken, TaskTracker);

impl Drop for Stop {
    fn drop(&mut self) {
        self.0.cancel();
        self.1.close();
    }
}

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

/// A tenant with `limits` (tenant_limits columns and values), a base priced at 1 micro per token.
async fn subject(
    pool: &PgPool,
    redis: Option<ConnectionManager>,
    limits: &[(&str, i64)],
) -> Subject {
    let reg = BaseRegistration {
        name: "b".into(),
        graph: "g".into(),
        upstream_url: "http://127.0.0.1:9/v1".into(),
        upstream_model: "b".into(),
        continuous_usage: true,
        denied_fields: None,
        prompt_estimator: tokenfactory::engine_policy::PromptEstimator::SimWords,
        kind: tf_core::endpoint::ModelKind::Chat,
        nvext_allowed: None,
    };
    fleet::register_bases(pool, "static", &[reg]).await.unwrap();
    common::price_every_token(pool, 1).await;
    let t = tf_core::accounts::create_tenant(pool, "acme", "Acme")
        .await
        .unwrap();
    let (k, _) = tf_core::keys::issue(pool, t.id, "k").await.unwrap();
    sqlx::query("INSERT INTO tenant_limits (tenant_id) VALUES ($1)")
        .bind(t.id)
        .execute(pool)
        .await
        .unwrap();
    for (column, value) in limits {
        sqlx::query(&format!(
            "UPDATE tenant_limits SET {column} = $2 WHERE tenant_id = $1"
        ))
        .bind(t.id)
        .bind(value)
        .execute(pool)
        .await
        .unwrap();
    }
    let prefix = format!("tftest-{}:", Uuid::new_v4().simple());
    let options = QuotaOptions {
        local_limit_fraction: 1.0,
        quota_reconcile_ms: 3_600_000,
        ..QuotaOptions::default()
    };
    let (cancel, tracker) = (CancellationToken::new(), TaskTracker::new());
    let quota = Quota::start(
        pool.clone(),
        redis.into(),
        prefix.clone(),
        options,
        &tracker,
        cancel.clone(),
    )
    .await;
    Subject {
        quota,
        tenant: t.id,
        key: k.id,
        prefix,
        _stop: Stop(cancel, tracker),
    }
}

async fn backend(pool: &PgPool, backend: Backend, limits: &[(&str, i64)]) -> Subject {
    let redis = match backend {
        Backend::Redis => Some(redis_at(REDIS).await),
        Backend::Local => None,
    };
    subject(pool, redis, limits).await
}

impl Subject {
    /// One request: 4 prompt tokens and `max_tokens` 16, so 20 tokens and 20 micros estimated.
    async fn admit(&self) -> Result<Admitted, Refusal> {
        let req = AdmitRequest {
            request_id: Uuid::now_v7(),
            tenant: self.tenant,
            key: self.key,
            graph: "g",
            price_key: "b",
            own_price_key: None,
            max_tokens: Some(16),
            sequences: 1,
        };
        self.quota
            .admit(req, || 4)
            .await
            .map(|a| a.expect("limits apply"))
    }

    /// Admits within `deadline` (credit held elsewhere goes back within a fraction of a second).
    async fn admit_soon(&self, deadline: Duration) -> Admitted {
        let start = Instant::now();
        loop {
            match self.admit().await {
                Ok(a) => return a,
                Err(r) => assert!(start.elapsed() < deadline, "still refused: {:?}", r.kind),
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

fn kind(r: Result<Admitted, Refusal>) -> RefusalKind {
    match r {
        Ok(_) => panic!("admitted past the limit"),
        Err(r) => r.kind,
    }
}

async fn request_rate_admits_exactly_the_limit(pool: PgPool, b: Backend) {
    let s = backend(&pool, b, &[("requests_per_minute", 5)]).await;
    for i in 1..=5 {
        let a = s.admit().await.unwrap();
        let requests = a.rate_status().requests.expect("a request window");
        assert_eq!((requests.limit, requests.remaining), (5, 5 - i));
    }
    let r = s.admit().await.err().expect("the sixth is refused");
    assert_eq!(r.kind, RefusalKind::Requests);
    assert!(r.retry_after_s >= 1);
    assert_eq!(r.status.requests.map(|t| t.remaining), Some(0));
}

async fn in_flight_cap_holds_and_frees_on_drop(pool: PgPool, b: Backend) {
    let s = backend(&pool, b, &[("max_in_flight", 2)]).await;
    let first = s.admit().await.unwrap();
    let _second = s.admit().await.unwrap();
    assert_eq!(kind(s.admit().await), RefusalKind::InFlight);
    drop(first);
    let _third = s.admit().await.expect("a dropped request frees its slot");
    assert_eq!(kind(s.admit().await), RefusalKind::InFlight);
}

async fn tokens_are_corrected_at_settle(pool: PgPool, b: Backend) {
    let s = backend(&pool, b, &[("tokens_per_minute", 50)]).await;
    let (a1, a2) = (s.admit().await.unwrap(), s.admit().await.unwrap());
    assert_eq!(
        kind(s.admit().await),
        RefusalKind::Tokens,
        "20 + 20 + 20 > 50"
    );
    a1.settle(tokens(2)).await;
    a2.settle(tokens(2)).await;
    // 4 used: two more of 20 fit, a third does not.
    let _a3 = s.admit_soon(Duration::from_secs(2)).await;
    let _a4 = s.admit_soon(Duration::from_secs(2)).await;
    assert_eq!(
        kind(s.admit().await),
        RefusalKind::Tokens,
        "4 + 40 + 20 > 50"
    );
}

async fn spend_is_reserved_then_settled(pool: PgPool, b: Backend) {
    let s = backend(&pool, b, &[("spend_limit_micros", 50)]).await;
    let (a1, a2) = (s.admit().await.unwrap(), s.admit().await.unwrap());
    let r = s.admit().await.err().expect("reservations count");
    assert_eq!(r.kind, RefusalKind::Spend);
    assert!(
        r.retry_after_s > 60,
        "spend is refused until the period ends"
    );
    a1.settle(tokens(2)).await;
    a2.settle(tokens(2)).await;
    // 4 micros spent: two more reservations of 20 fit, a third does not.
    let _a3 = s.admit_soon(Duration::from_secs(2)).await;
    let _a4 = s.admit_soon(Duration::from_secs(2)).await;
    assert_eq!(
        kind(s.admit().await),
        RefusalKind::Spend,
        "4 + 40 + 20 > 50"
    );
}

/// The contract, once per backend.
macro_rules! for_each_backend {
    ($($case:ident),* $(,)?) => {
        mod on_redis {
            use super::*;
            $(
                #[sqlx::test(migrations = "../migrations")]
                async fn $case(pool: PgPool) {
                    super::$case(pool, Backend::Redis).await
                }
            )*
        }
        mod on_local_fallback {
            use super::*;
            $(
                #[sqlx::test(migrations = "../migrations")]
                async fn $case(pool: PgPool) {
                    super::$case(pool, Backend::Local).await
                }
            )*
        }
    };
}

for_each_backend!(
    request_rate_admits_exactly_the_limit,
    in_flight_cap_holds_and_frees_on_drop,
    tokens_are_corrected_at_settle,
    spend_is_reserved_then_settled,
);

/// A burst of one key sends one ACQUIRE per credit refill, not one per request: requests whose
/// credit ran out wait for the ACQUIRE already asking for it (each refill asks for more).
#[sqlx::test(migrations = "../migrations")]
async fn a_burst_of_one_key_shares_its_acquires(pool: PgPool) {
    const N: usize = 64;
    let limits = [
        ("requests_per_minute", 1_000_000),
        ("tokens_per_minute", 100_000_000),
    ];
    let s = backend(&pool, Backend::Redis, &limits).await;
    let admitted = futures::future::join_all((0..N).map(|_| s.admit())).await;
    assert!(admitted.iter().all(Result::is_ok), "every request fits");
    let calls = s.quota.acquire_calls();
    println!("{N} concurrent admissions of one key: {calls} ACQUIRE calls");
    assert!(calls >= 1, "the first request finds no credit");
    assert!(
        calls <= 8,
        "{calls} ACQUIREs for {N} requests: one per request, not per refill"
    );
    assert_eq!(s.quota.admissions(), (N as u64 - calls, calls));
}

#[sqlx::test(migrations = "../migrations")]
async fn a_failed_sync_is_sent_again_when_redis_returns(pool: PgPool) {
    let proxy = ChaosProxy::start("127.0.0.1:6379").await;
    let via_proxy = redis_at(&format!("redis://{}", proxy.addr)).await;
    let s = subject(&pool, Some(via_proxy), &[("spend_limit_micros", 1_000_000)]).await;
    let period = tokenfactory::quota::plan::period(time::OffsetDateTime::now_utc()).0;
    let spend_key = format!("{}q:s:t:{}:{period}", s.prefix, s.tenant);
    let direct = tokio::sync::Mutex::new(redis_at(REDIS).await);
    let counter = || async {
        redis::cmd("GET")
            .arg(&spend_key)
            .query_async::<Option<i64>>(&mut *direct.lock().await)
            .await
            .unwrap()
    };

    let a = s.admit().await.unwrap();
    proxy.cut();
    a.settle(tokens(100)).await;
    s.quota.spend_flushed().await; // the SYNC carrying the 100 micros fails
    assert_eq!(counter().await, Some(0), "Redis is cut off");
    proxy.restore();
    // No events reach PostgreSQL here, so the reconciler cannot repair a lost SYNC.
    let took = wait_until(
        Duration::from_secs(5),
        "the failed SYNC's spend never reached Redis",
        || async { counter().await == Some(100) },
    )
    .await;
    println!("failed SYNC applied {took:?} after Redis returned");

    // Exact from then on: the batch was applied once, later spend adds to it.
    let b = s.admit_soon(Duration::from_secs(2)).await;
    b.settle(tokens(50)).await;
    s.quota.spend_flushed().await;
    assert_eq!(counter().await, Some(150));
    tokio::time::sleep(Duration::from_millis(300)).await; // several syncer ticks
    assert_eq!(counter().await, Some(150), "a batch was applied twice");
}
