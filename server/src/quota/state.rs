//! The state one replica's quota parts share (admission, settling, the syncer, the reconciler),
//! and the one way they call Redis: [`Inner::call`], which gives up at once while Redis is absent,
//! halted or in back-off, and turns a failure or a slow answer into [`REDIS_BACKOFF`] of credit
//! the replica grants itself. It imports only data types of its siblings, never their logic, so the files of this
//! module depend on each other one way.

use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use redis::{FromRedisValue, ScriptInvocation};
use tf_core::redis_slot::RedisSlot;
use time::OffsetDateTime;
use tokio::sync::Notify;

use super::config::QuotaOptions;
use super::credit::Credits;
use super::flight::Flights;
use super::limits::LimitCache;
use super::plan::{self, Key};
use super::queue::SpendQueue;
use super::scripts::Scripts;

/// How long Redis is skipped after a failed or slow call.
pub const REDIS_BACKOFF: Duration = Duration::from_secs(1);

/// Milliseconds since the Unix epoch (Redis scores and buckets use wall-clock time, shared by
/// every replica).
pub(super) fn now_ms() -> i64 {
    i64::try_from(OffsetDateTime::now_utc().unix_timestamp_nanos() / 1_000_000).unwrap_or(i64::MAX)
}

pub(super) struct Inner {
    pub limits: Arc<LimitCache>,
    /// Empty until Redis was reached once (possibly long after start-up).
    pub redis: RedisSlot,
    pub scripts: Scripts,
    pub prefix: String,
    /// The Redis keys of each (tenant, key, graph), formatted once.
    pub names: plan::NameCache,
    pub cfg: QuotaOptions,
    down_until_ms: AtomicI64,
    was_down: AtomicBool,
    /// Set by `Quota::halt`: this replica writes nothing more to Redis, as if it had crashed.
    pub halted: AtomicBool,
    /// This replica's name in Redis holdings (a new one per process: a restart never inherits).
    pub rid: String,
    /// Where Redis remembers which of this replica's SYNC batches it applied.
    pub seq_key: Key,
    /// Credit granted by Redis (or by this replica while Redis is down), spent locally.
    pub credits: Credits,
    /// The ACQUIREs in flight, by key, so a burst of one key sends one.
    pub flights: Flights,
    /// What this replica owes Redis.
    pub queue: SpendQueue,
    /// Admissions decided on credit / by a Redis call (for the benchmark and `/metrics`).
    pub from_credit: AtomicU64,
    pub from_redis: AtomicU64,
    /// ACQUIRE calls sent.
    pub acquires: AtomicU64,
    /// Wakes the reconciler when Redis comes back.
    pub recovered: Notify,
}

impl Inner {
    pub fn new(limits: LimitCache, redis: RedisSlot, prefix: String, cfg: QuotaOptions) -> Self {
        // Not connected yet: the first answer once the slot is filled counts as a recovery
        // (self-granted counts merged, the reconciler woken).
        let not_connected = !redis.is_filled();
        let rid = uuid::Uuid::new_v4().simple().to_string();
        Self {
            limits: Arc::new(limits),
            redis,
            scripts: Scripts::default(),
            seq_key: format!("{prefix}q:sync:{rid}").into(),
            prefix,
            names: plan::NameCache::default(),
            cfg,
            down_until_ms: AtomicI64::new(0),
            was_down: AtomicBool::new(not_connected),
            halted: AtomicBool::new(false),
            rid,
            credits: Credits::default(),
            flights: Flights::default(),
            queue: SpendQueue::default(),
            from_credit: AtomicU64::new(0),
            from_redis: AtomicU64::new(0),
            acquires: AtomicU64::new(0),
            recovered: Notify::new(),
        }
    }

    /// Whether Redis may be asked now (present, not halted, not in back-off).
    pub fn redis_ready(&self, now: i64) -> bool {
        self.redis.is_filled()
            && !self.halted.load(Ordering::Relaxed)
            && now >= self.down_until_ms.load(Ordering::Relaxed)
    }

    /// Runs a script unless Redis is absent, halted or in back-off; `None` means "use own credit".
    pub async fn call<T: FromRedisValue>(&self, inv: &ScriptInvocation<'_>) -> Option<T> {
        if !self.redis_ready(now_ms()) {
            return None;
        }
        let mut con = self.redis.get()?;
        match tokio::time::timeout(self.cfg.redis_timeout(), inv.invoke_async::<T>(&mut con)).await
        {
            Ok(Ok(v)) => {
                if self.was_down.swap(false, Ordering::SeqCst) {
                    self.on_recovered().await;
                }
                Some(v)
            }
            failed => {
                let backoff = i64::try_from(REDIS_BACKOFF.as_millis()).unwrap_or(1000);
                self.down_until_ms
                    .store(now_ms() + backoff, Ordering::Relaxed);
                self.credits.forget_windows();
                if !self.was_down.swap(true, Ordering::SeqCst) {
                    match failed {
                        Ok(Err(e)) => {
                            tracing::warn!(error = %e, "Redis unavailable: enforcing local limits")
                        }
                        _ => tracing::warn!("Redis too slow: enforcing local limits"),
                    }
                }
                None
            }
        }
    }

    /// Redis answered again after failing: merge the window credit this replica granted itself,
    /// wake the reconciler (which brings spend up to what PostgreSQL billed meanwhile).
    async fn on_recovered(&self) {
        tracing::info!("Redis reachable again: merging local counts, reconciling spend");
        self.recovered.notify_one();
        let buckets = self.credits.unmerged(now_ms());
        if buckets.is_empty() {
            return;
        }
        let mut inv = self.scripts.merge.prepare_invoke();
        inv.arg(now_ms());
        for (key, sec, count) in &buckets {
            inv.key(&**key).arg(*sec).arg(*count);
        }
        let Some(mut con) = self.redis.get() else {
            return;
        };
        let merged =
            tokio::time::timeout(self.cfg.redis_timeout(), inv.invoke_async::<i64>(&mut con)).await;
        if !matches!(merged, Ok(Ok(_))) {
            tracing::warn!("could not merge local counts into Redis");
        }
    }
}
