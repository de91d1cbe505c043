//! Admission: for each request after resolution, look up the limits (cached), estimate the
//! request (prompt tokens as the base's prompt estimator bounds them, erring high, plus
//! `max_tokens` or the configured default), build the
//! ordered plan and run it: on this replica's credit from Redis when it covers every check (no
//! I/O, see [`super::credit`]), else in one atomic Redis script that also grants new credit, or on
//! credit this replica grants itself from its share of the limits when Redis is unreachable or
//! slow (then Redis is skipped for [`REDIS_BACKOFF`]). A request with no limits costs one cache probe and no I/O. Admission never
//! blocks serving on Redis, and takes no lock across a Redis call: ACQUIREs of different tenants
//! (and the syncer's SYNCs) are in flight together, while requests of one key whose credit ran
//! out wait for the one ACQUIRE asking for it ([`super::flight`]).

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use sqlx::PgPool;
use tf_core::money::Rates;
use tf_core::redis_slot::RedisSlot;
use time::OffsetDateTime;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use uuid::Uuid;

use super::answer::{RateStatus, Refusal};
use super::config::QuotaOptions;
use super::credit::Grant;
use super::flight::Turn;
use super::limits::LimitCache;
use super::plan::{self, Check, Estimate, Target};
use super::scripts;
use super::settle::Admitted;
pub use super::state::REDIS_BACKOFF;
use super::state::{now_ms, Inner};

/// How often a request waits for another's ACQUIRE of the same keys before asking itself (a
/// burst doubles its credit each round, so a few rounds cover it).
const MAX_WAITS: u32 = 8;

/// The quota subsystem of one replica, cheap to clone.
#[derive(Clone)]
pub struct Quota(Arc<Inner>);

/// What admission needs to know about a request.
#[derive(Debug, Clone, Copy)]
pub struct AdmitRequest<'a> {
    pub request_id: Uuid,
    pub tenant: Uuid,
    pub key: Uuid,
    pub graph: &'a str,
    /// What the model is priced by (the usage event's price key).
    pub price_key: &'a str,
    /// An adapter's own price key, priced before `price_key` where the book holds it.
    pub own_price_key: Option<&'a str>,
    /// `max_tokens` (or `max_completion_tokens`) of the request, if it set one.
    pub max_tokens: Option<u64>,
    /// Sequences generated per request (`n`, or `best_of` when larger): each may use
    /// `max_tokens` completion tokens.
    pub sequences: u64,
}

impl Quota {
    /// Builds the subsystem, loads the scripts and starts the lease renewer and the reconciler.
    pub async fn start(
        pool: PgPool,
        redis: RedisSlot,
        prefix: String,
        cfg: QuotaOptions,
        tracker: &TaskTracker,
        cancel: CancellationToken,
    ) -> Self {
        let inner = Inner::new(LimitCache::new(pool.clone()), redis, prefix, cfg);
        if let Some(mut con) = inner.redis.get() {
            if let Err(e) =
                tokio::time::timeout(Duration::from_secs(2), inner.scripts.load(&mut con))
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
        let quota = Self(Arc::new(inner));
        tracker.spawn(super::sync::run(quota.0.clone(), cancel.clone()));
        tracker.spawn(super::reconciler::run(quota.0.clone(), pool, cancel));
        quota
    }

    /// Returns once Redis has every spend this replica settled so far (or Redis is given up on).
    /// Usage writers call it before an event reaches PostgreSQL (see reconciler.rs).
    pub async fn spend_flushed(&self) {
        super::sync::flushed(&self.0).await;
    }

    /// Completion tokens a request that sets no limit is capped at: the gateway sends it upstream
    /// as `max_tokens`, and admission reserves for it.
    pub fn default_max_tokens(&self) -> u64 {
        self.0.cfg.quota_default_max_tokens
    }

    /// Admissions decided so far on local credit and by a Redis call.
    pub fn admissions(&self) -> (u64, u64) {
        (
            self.0.from_credit.load(Ordering::Relaxed),
            self.0.from_redis.load(Ordering::Relaxed),
        )
    }

    /// ACQUIRE calls sent to Redis so far (admissions that found no credit, less those that
    /// waited for another's ACQUIRE of the same keys).
    pub fn acquire_calls(&self) -> u64 {
        self.0.acquires.load(Ordering::Relaxed)
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

    /// Decides whether a request may go ahead. `Ok(None)`: nothing to hold or count (no limits
    /// apply and Redis is unreachable).
    ///
    /// Spend is counted in Redis for every request, limited or not (see [`plan::uncounted`]): a
    /// spend limit set on a tenant or key that had none starts from the counter, not from zero,
    /// so it holds on every replica as soon as the limits cache sees it (NOTIFY, or within
    /// [`super::limits::FRESH_FOR`]), not at the reconciler's next pass. What that costs a
    /// request without limits: a price and a key-name cache probe here, and at completion one
    /// entry in the spend queue the syncer already sends every 50 ms (no I/O on the request).
    pub async fn admit(
        &self,
        req: AdmitRequest<'_>,
        prompt_tokens: impl FnOnce() -> u64,
    ) -> Result<Option<Admitted>, Refusal> {
        let inner = &self.0;
        let limits = inner.limits.limits(req.tenant, req.key).await;
        let rates = inner
            .limits
            .price(limits.tier.as_deref(), req.own_price_key, req.price_key)
            .await;
        let (period, period_left_s) = plan::period(OffsetDateTime::now_utc());
        let target = Target {
            tenant: req.tenant,
            key: req.key,
            graph: req.graph,
        };
        let names = inner.names.get(&inner.prefix, target, &period);
        let counted = plan::uncounted(&names, &limits);
        if limits.is_empty() {
            return Ok(self.counting(counted, rates));
        }
        let needs_tokens = limits.tenant.tokens_per_minute.is_some()
            || limits.key.tokens_per_minute.is_some()
            || limits.tenant.spend_limit_micros.is_some()
            || limits.key.spend_limit_micros.is_some()
            || limits.caps.max_long_prompts.is_some();
        let est = Estimate {
            prompt_tokens: if needs_tokens { prompt_tokens() } else { 0 },
            completion_tokens: req
                .max_tokens
                .unwrap_or(inner.cfg.quota_default_max_tokens)
                .saturating_mul(req.sequences.max(1)),
            rates,
        };
        let threshold = limits
            .caps
            .long_prompt_tokens
            .and_then(|t| u64::try_from(t).ok())
            .unwrap_or(inner.cfg.long_prompt_tokens);
        let mut checks = plan::build(&names, &limits, &est, est.prompt_tokens >= threshold);
        if checks.is_empty() {
            return Ok(self.counting(counted, rates));
        }
        let rates = est.rates;
        let mut now = now_ms();
        let mut counted = Some(counted);
        // Credit first; where it ran out, wait for an ACQUIRE already asking for the same keys
        // (a few times at most) before asking Redis ourselves.
        let (mut flight, mut ask, mut waits) = (None, false, 0);
        while inner.redis_ready(now) {
            checks = match self.on_credit(checks, now, period_left_s, rates, &mut counted) {
                Ok(decided) => return decided,
                Err(checks) => checks,
            };
            match inner.flights.join(inner.credits.uncovered(&checks, now)) {
                Turn::Wait(mut done) if waits < MAX_WAITS => {
                    waits += 1;
                    let ended = done.changed();
                    let _ = tokio::time::timeout(inner.cfg.redis_timeout() * 2, ended).await;
                    now = now_ms();
                }
                Turn::Wait(_) => {
                    ask = true;
                    break;
                }
                Turn::Lead(guard) => {
                    (flight, ask) = (Some(guard), true);
                    break;
                }
            }
        }
        if ask {
            let answer_by =
                now + i64::try_from(inner.cfg.redis_timeout().as_millis()).unwrap_or(250);
            let wants = inner.credits.wants(&checks, now, answer_by);
            if let Some((failed, retry_ms, grants)) =
                redis_acquire(inner, &checks, &wants, now).await
            {
                inner.from_redis.fetch_add(1, Ordering::Relaxed);
                let used_reset: Vec<(i64, i64)> =
                    grants.iter().map(|g| (g.used, g.reset_ms)).collect();
                let headers = RateStatus::from_answer(&checks, &used_reset, failed == 0);
                if let Some(i) = failed.checked_sub(1).filter(|i| *i < checks.len()) {
                    let used = grants.get(i).map_or(0, |g| g.used);
                    inner
                        .credits
                        .remember_refusal(&checks[i], used, retry_ms, headers, now);
                    return Err(refusal(&checks[i], retry_ms, period_left_s, headers));
                }
                let buckets = inner.credits.deposit(&checks, &grants, now);
                drop(flight);
                return Ok(Some(Admitted::new(
                    self.0.clone(),
                    checks,
                    buckets,
                    false,
                    rates,
                    headers,
                    counted.take().unwrap_or_default(),
                )));
            }
        }
        drop(flight);
        // Redis is unreachable or slow: this replica grants itself credit from its own share.
        let taken = inner.credits.take_own(&checks, now, inner.cfg.fraction());
        let used_reset = match &taken {
            Ok(t) => &t.used_reset,
            Err(short) => &short.used_reset,
        };
        let headers = RateStatus::from_answer(&checks, used_reset, taken.is_ok());
        match taken {
            Ok(t) => Ok(Some(Admitted::new(
                self.0.clone(),
                checks,
                t.buckets,
                true,
                rates,
                headers,
                Vec::new(),
            ))),
            Err(short) => {
                let check = &checks[short.failed];
                Err(refusal(check, short.retry_ms, period_left_s, headers))
            }
        }
    }
}

impl Quota {
    /// Decides without Redis when this replica's credit covers every check, or a recent
    /// refusal already answers; otherwise gives the checks back.
    fn on_credit(
        &self,
        checks: Vec<Check>,
        now: i64,
        period_left_s: u64,
        rates: Rates,
        counted: &mut Option<Vec<plan::Key>>,
    ) -> Result<Result<Option<Admitted>, Refusal>, Vec<Check>> {
        let inner = &self.0;
        if let Some((i, retry_ms, headers)) = inner.credits.refused(&checks, now) {
            return Ok(Err(refusal(&checks[i], retry_ms, period_left_s, headers)));
        }
        let Some(taken) = inner.credits.try_take(&checks, now) else {
            return Err(checks);
        };
        inner.from_credit.fetch_add(1, Ordering::Relaxed);
        let headers = RateStatus::from_answer(&checks, &taken.used_reset, true);
        Ok(Ok(Some(Admitted::new(
            self.0.clone(),
            checks,
            taken.buckets,
            false,
            rates,
            headers,
            counted.take().unwrap_or_default(),
        ))))
    }

    /// A request with nothing to check whose spend is still counted, while Redis answers (the
    /// reconciler brings counters up to PostgreSQL's after an outage, as for limited spend
    /// admitted on a replica's own credit).
    fn counting(&self, counted: Vec<plan::Key>, rates: Rates) -> Option<Admitted> {
        (!counted.is_empty() && self.0.redis_ready(now_ms())).then(|| {
            Admitted::new(
                self.0.clone(),
                Vec::new(),
                Vec::new(),
                false,
                rates,
                RateStatus::default(),
                counted,
            )
        })
    }
}

/// The refusal for a failed check: spend is refused until the period ends.
fn refusal(check: &Check, retry_ms: i64, period_left_s: u64, headers: RateStatus) -> Refusal {
    let retry_ms = match check {
        Check::Spend { .. } => i64::try_from(period_left_s).unwrap_or(i64::MAX / 1000) * 1000,
        _ => retry_ms,
    };
    Refusal::new(check, retry_ms, headers)
}

/// One ACQUIRE: `(failed_index, retry_ms, per check grant)`, or `None` (use own credit).
async fn redis_acquire(
    inner: &Inner,
    checks: &[Check],
    wants: &[i64],
    now: i64,
) -> Option<(usize, i64, Vec<Grant>)> {
    let lease = i64::try_from(inner.cfg.lease().as_millis()).unwrap_or(30_000);
    let mut inv = inner.scripts.acquire.prepare_invoke();
    scripts::acquire_args(
        &mut inv,
        checks,
        wants,
        now,
        &inner.rid,
        now + lease,
        lease * 2,
    );
    inner.acquires.fetch_add(1, Ordering::Relaxed);
    let out: Vec<i64> = inner.call(&inv).await?;
    if out.len() != 2 + 3 * checks.len() {
        tracing::error!(len = out.len(), "unexpected answer from the acquire script");
        return None;
    }
    let grants: Vec<Grant> = out[2..]
        .chunks(3)
        .map(|g| Grant {
            used: g[0],
            reset_ms: g[1],
            extra: g[2],
        })
        .collect();
    inner.credits.observe_spend(checks, &grants);
    Some((usize::try_from(out[0]).unwrap_or(0), out[1], grants))
}
