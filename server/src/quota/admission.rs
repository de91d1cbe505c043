//! Admission: for each request after resolution, look up the limits (cached), estimate the
//! request (prompt by the base's tokenizer, plus `max_tokens` or the configured default), build the
//! ordered plan and run it in one atomic Redis script, or on the local limiter when Redis is
//! unreachable or slow (then Redis is skipped for [`REDIS_BACKOFF`]). A request with no limits
//! costs one cache probe and no I/O. Admission never blocks serving on Redis.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use redis::aio::ConnectionManager;
use redis::{FromRedisValue, ScriptInvocation};
use serde_json::{Map, Value};
use sqlx::PgPool;
use time::OffsetDateTime;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use uuid::Uuid;

use super::config::QuotaArgs;
use super::headers::{RateHeaders, Refusal};
use super::limits::LimitCache;
use super::local::LocalLimiter;
use super::plan::{self, Check, Estimate, Target};
use super::scripts::{self, Scripts};
use super::settle::{Admitted, Backend};

/// How long Redis is skipped after a failed or slow call.
pub const REDIS_BACKOFF: Duration = Duration::from_secs(1);

/// The quota subsystem of one replica, cheap to clone.
#[derive(Clone)]
pub struct Quota(pub(super) Arc<Inner>);

pub(super) struct Inner {
    pub(super) limits: Arc<LimitCache>,
    pub(super) redis: Option<ConnectionManager>,
    pub(super) scripts: Scripts,
    pub(super) local: LocalLimiter,
    pub(super) prefix: String,
    pub(super) cfg: QuotaArgs,
    down_until_ms: AtomicI64,
    was_down: AtomicBool,
    /// Set by [`Quota::halt`]: this replica writes nothing more to Redis, as if it had crashed.
    pub(super) halted: AtomicBool,
    /// Live Redis leases of this replica: request id -> lease sets, renewed in the background.
    pub(super) leases: Mutex<HashMap<String, Vec<String>>>,
    pub(super) tracker: TaskTracker,
    /// Wakes the reconciler when Redis comes back.
    pub(super) recovered: Notify,
}

/// What admission needs to know about a request.
#[derive(Debug, Clone, Copy)]
pub struct AdmitRequest<'a> {
    pub request_id: Uuid,
    pub tenant: Uuid,
    pub key: Uuid,
    pub graph: &'a str,
    pub base: &'a str,
    /// `max_tokens` (or `max_completion_tokens`) of the request, if it set one.
    pub max_tokens: Option<u64>,
}

/// `max_tokens` or `max_completion_tokens` of an OpenAI request body.
pub fn requested_max_tokens(body: &Map<String, Value>) -> Option<u64> {
    body.get("max_completion_tokens")
        .or_else(|| body.get("max_tokens"))
        .and_then(Value::as_u64)
}

/// Milliseconds since the Unix epoch (Redis scores and buckets use wall-clock time, shared by
/// every replica).
pub(super) fn now_ms() -> i64 {
    i64::try_from(OffsetDateTime::now_utc().unix_timestamp_nanos() / 1_000_000).unwrap_or(i64::MAX)
}

impl Quota {
    /// Builds the subsystem, loads the scripts and starts the lease renewer and the reconciler.
    pub async fn start(
        pool: PgPool,
        redis: Option<ConnectionManager>,
        prefix: String,
        cfg: QuotaArgs,
        tracker: &TaskTracker,
        cancel: CancellationToken,
    ) -> Self {
        let scripts = Scripts::default();
        if let Some(con) = &redis {
            let mut con = con.clone();
            if let Err(e) = tokio::time::timeout(Duration::from_secs(2), scripts.load(&mut con))
                .await
                .unwrap_or_else(|_| {
                    Err(redis::RedisError::from(std::io::Error::from(
                        std::io::ErrorKind::TimedOut,
                    )))
                })
            {
                tracing::warn!(error = %e, "quota scripts not loaded at start-up; they load on first use");
            }
        }
        let quota = Self(Arc::new(Inner {
            limits: Arc::new(LimitCache::new(pool.clone())),
            redis,
            scripts,
            local: LocalLimiter::default(),
            prefix,
            cfg,
            down_until_ms: AtomicI64::new(0),
            was_down: AtomicBool::new(false),
            halted: AtomicBool::new(false),
            leases: Mutex::new(HashMap::new()),
            tracker: tracker.clone(),
            recovered: Notify::new(),
        }));
        tracker.spawn(super::settle::renew_leases(quota.0.clone(), cancel.clone()));
        tracker.spawn(super::reconciler::run(quota.0.clone(), pool, cancel));
        quota
    }

    /// The limits cache (dropped on NOTIFY by the change listener).
    pub fn limits(&self) -> &Arc<LimitCache> {
        &self.0.limits
    }

    /// Stops every Redis write of this replica (renewals, releases, settles), as a crash would.
    /// For tests of lease expiry, and as an operator's last resort on a misbehaving replica.
    pub fn halt(&self) {
        self.0.halted.store(true, Ordering::SeqCst);
    }

    /// Runs one reconciliation pass now, leader or not (passes are idempotent and only raise).
    pub async fn reconcile_now(&self, pool: &PgPool) -> anyhow::Result<usize> {
        super::reconciler::reconcile_once(&self.0, pool).await
    }

    /// Decides whether a request may go ahead. `Ok(None)`: no limits apply.
    pub async fn admit(
        &self,
        req: AdmitRequest<'_>,
        prompt_tokens: impl FnOnce() -> u64,
    ) -> Result<Option<Admitted>, Refusal> {
        let inner = &self.0;
        let limits = inner.limits.limits(req.tenant, req.key).await;
        if limits.is_empty() {
            return Ok(None);
        }
        let needs_tokens = limits.tenant.tokens_per_minute.is_some()
            || limits.key.tokens_per_minute.is_some()
            || limits.tenant.spend_limit_micros.is_some()
            || limits.key.spend_limit_micros.is_some()
            || limits.caps.max_long_prompts.is_some();
        let needs_price =
            limits.tenant.spend_limit_micros.is_some() || limits.key.spend_limit_micros.is_some();
        let est = Estimate {
            prompt_tokens: if needs_tokens { prompt_tokens() } else { 0 },
            completion_tokens: req.max_tokens.unwrap_or(inner.cfg.quota_default_max_tokens),
            micros_per_1k: if needs_price {
                inner.limits.price(req.base).await
            } else {
                0
            },
        };
        let threshold = limits
            .caps
            .long_prompt_tokens
            .and_then(|t| u64::try_from(t).ok())
            .unwrap_or(inner.cfg.long_prompt_tokens);
        let (period, period_left_s) = plan::period(OffsetDateTime::now_utc());
        let target = Target {
            tenant: req.tenant,
            key: req.key,
            graph: req.graph,
        };
        let checks = plan::build(
            &inner.prefix,
            &limits,
            target,
            &est,
            &period,
            est.prompt_tokens >= threshold,
        );
        if checks.is_empty() {
            return Ok(None);
        }
        let member = req.request_id.to_string();
        let now = now_ms();
        let (backend, failed, retry_ms, used_reset) =
            match inner.redis_admit(&checks, &member, now).await {
                Some((failed, retry, used_reset)) => (Backend::Redis, failed, retry, used_reset),
                None => {
                    let a = inner
                        .local
                        .admit(&checks, &member, now, inner.cfg.fraction());
                    (Backend::Local, a.failed, a.retry_ms, a.used_reset)
                }
            };
        let headers = RateHeaders::from_answer(&checks, &used_reset, failed == 0);
        if let Some(check) = failed.checked_sub(1).and_then(|i| checks.get(i)) {
            let retry_ms = match check {
                Check::Spend { .. } => {
                    i64::try_from(period_left_s).unwrap_or(i64::MAX / 1000) * 1000
                }
                _ => retry_ms,
            };
            return Err(Refusal::new(check, retry_ms, headers));
        }
        if backend == Backend::Redis {
            let keys: Vec<String> = checks
                .iter()
                .flat_map(|c| c.lease_keys())
                .map(str::to_owned)
                .collect();
            if !keys.is_empty() {
                if let Ok(mut l) = inner.leases.lock() {
                    l.insert(member.clone(), keys);
                }
            }
        }
        Ok(Some(Admitted::new(
            self.0.clone(),
            member,
            checks,
            now,
            backend,
            est.micros_per_1k,
            headers,
        )))
    }
}

impl Inner {
    /// Runs a script unless Redis is absent, halted or in back-off; `None` means "use local".
    pub(super) async fn call<T: FromRedisValue>(&self, inv: &ScriptInvocation<'_>) -> Option<T> {
        let con = self.redis.as_ref()?;
        if self.halted.load(Ordering::Relaxed)
            || now_ms() < self.down_until_ms.load(Ordering::Relaxed)
        {
            return None;
        }
        let mut con = con.clone();
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

    async fn redis_admit(
        &self,
        checks: &[Check],
        member: &str,
        now: i64,
    ) -> Option<(usize, i64, Vec<(i64, i64)>)> {
        let lease = i64::try_from(self.cfg.lease().as_millis()).unwrap_or(30_000);
        let mut inv = self.scripts.admit.prepare_invoke();
        scripts::admit_args(&mut inv, checks, now, member, now + lease, lease * 2);
        let out: Vec<i64> = self.call(&inv).await?;
        if out.len() != 2 + 2 * checks.len() {
            tracing::error!(len = out.len(), "unexpected answer from the admit script");
            return None;
        }
        let used_reset: Vec<(i64, i64)> = out[2..].chunks(2).map(|p| (p[0], p[1])).collect();
        for (c, (used, _)) in checks.iter().zip(&used_reset) {
            if let Check::Spend { settled, .. } = c {
                self.local.observe_spend(settled, *used);
            }
        }
        Some((usize::try_from(out[0]).unwrap_or(0), out[1], used_reset))
    }

    /// Redis answered again after failing: merge what was counted locally, wake the reconciler.
    async fn on_recovered(&self) {
        tracing::info!("Redis reachable again: merging local counts, reconciling spend");
        self.recovered.notify_one();
        let buckets = self.local.drain_windows(now_ms());
        if buckets.is_empty() {
            return;
        }
        let mut inv = self.scripts.merge.prepare_invoke();
        inv.arg(now_ms());
        for (key, sec, count) in &buckets {
            inv.key(key).arg(*sec).arg(*count);
        }
        let Some(con) = &self.redis else { return };
        let mut con = con.clone();
        let merged =
            tokio::time::timeout(self.cfg.redis_timeout(), inv.invoke_async::<i64>(&mut con)).await;
        if !matches!(merged, Ok(Ok(_))) {
            tracing::warn!("could not merge local counts into Redis");
        }
    }
}

/// Records a refused request as a usage event (status `rejected`, zero tokens) so it appears in
/// the tenant's request log. A sink failure is logged; the refusal stands either way.
pub async fn record_refusal(
    sink: &dyn crate::metering::usage::UsageSink,
    mut event: crate::metering::usage::UsageEvent,
    started: std::time::Instant,
) {
    event.status = crate::metering::usage::UsageStatus::Rejected;
    event.duration_ms = i32::try_from(started.elapsed().as_millis()).unwrap_or(i32::MAX);
    if let Err(e) = sink.record(&event).await {
        tracing::warn!(request_id = %event.request_id, error = %e, "refused request not recorded");
    }
}
