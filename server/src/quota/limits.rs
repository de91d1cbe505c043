//! Limits as configured in PostgreSQL (`tenant_limits`, `key_limits`, and the price book's prices
//! in effect now, by price key and tier), cached per replica. A cached answer is trusted for
//! [`FRESH_FOR`]; NOTIFY `tf_limits_changed` (also sent by a new price) drops the cache, so a
//! change reaches every replica within a second. When PostgreSQL is down, stale answers (a known
//! "no limits" too) keep serving for [`KEEP_STALE_FOR`] (fail-static), and a key never seen before
//! is admitted without limits (fail-open); no request waits for or is refused for want of limits.
//! A failed lookup is not repeated by every request: the replica asks again at most once per
//! [`RETRY_EVERY`] (one probe, whichever key asks), and each key has one refresh in flight while
//! its other requests use the stale answer. Failures are logged once per interval with a count.

use std::collections::HashMap;
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use sqlx::PgPool;
use tf_core::money::Rates;
use uuid::Uuid;

use super::warn_every::WarnEvery;

/// How long a cached row is trusted without asking PostgreSQL again.
pub const FRESH_FOR: Duration = Duration::from_secs(1);
/// How long a cached row keeps serving while PostgreSQL cannot be asked (an outage); older, the
/// key counts as never seen (no limits, fail-open) until PostgreSQL answers again.
pub const KEEP_STALE_FOR: Duration = Duration::from_secs(15 * 60);
/// After a failed lookup, how long this replica waits before it asks PostgreSQL again (for any
/// key, or the prices): at most one lookup per this interval while it is down.
pub const RETRY_EVERY: Duration = Duration::from_secs(1);
/// How long a refresh may hold a request before the stale (or empty) answer is used.
const LOOKUP_TIMEOUT: Duration = Duration::from_millis(250);
/// Bound on cached entries.
const MAX_ENTRIES: usize = 100_000;

/// Failed lookups, logged once per interval with their count.
static LOOKUP_FAILED: WarnEvery = WarnEvery::new(super::warn_every::EVERY);

/// Rate and spend limits of one subject (a tenant or a key); `None`: unlimited.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RateLimits {
    pub requests_per_minute: Option<i64>,
    pub tokens_per_minute: Option<i64>,
    pub spend_limit_micros: Option<i64>,
}

impl RateLimits {
    fn is_empty(&self) -> bool {
        *self == Self::default()
    }
}

/// A tenant's concurrency caps, each applied per graph.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Caps {
    pub max_in_flight: Option<i64>,
    pub max_long_prompts: Option<i64>,
    /// From how many prompt tokens a request is long (`None`: the server's default).
    pub long_prompt_tokens: Option<i64>,
}

/// Everything admission needs to know about one key: its own limits and its tenant's.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Limits {
    pub tenant: RateLimits,
    pub key: RateLimits,
    pub caps: Caps,
    /// The tenant's billing tier (which prices its spend counts at); `None`: the standard one.
    pub tier: Option<Arc<str>>,
}

impl Limits {
    /// No limit at all: admission does no work and no I/O.
    pub fn is_empty(&self) -> bool {
        self.tenant.is_empty()
            && self.key.is_empty()
            && self.caps.max_in_flight.is_none()
            && self.caps.max_long_prompts.is_none()
    }
}

/// Tier -> price key -> rates, of the price book's version in effect.
type Prices = Arc<HashMap<String, HashMap<String, Rates>>>;

/// The tier every tenant falls back to where its own tier has no price (as the rater does).
const STANDARD: &str = "standard";

struct Entry<T> {
    value: T,
    fetched: Instant,
    /// The cache epoch it was read in; an older epoch means "re-check before trusting".
    epoch: u64,
}

/// The per-replica cache of limits (by key id) and prices (by tier and price key).
pub struct LimitCache {
    pool: PgPool,
    by_key: RwLock<HashMap<Uuid, Entry<Limits>>>,
    prices: RwLock<Option<Entry<Prices>>>,
    epoch: std::sync::atomic::AtomicU64,
    /// One lookup at a time per key.
    fetching: std::sync::Mutex<HashMap<Uuid, Arc<tokio::sync::Mutex<()>>>>,
    price_gate: Arc<tokio::sync::Mutex<()>>,
    health: std::sync::Mutex<Health>,
    /// Lookups sent to PostgreSQL (limits and prices), for tests and diagnostics.
    lookups: std::sync::atomic::AtomicU64,
}

/// Whether PostgreSQL answered the last lookup; if not, when the next one may be tried.
#[derive(Debug, Clone, Copy)]
struct Health {
    failing: bool,
    next_try: Instant,
}

impl LimitCache {
    pub fn new(pool: PgPool) -> Self {
        Self {
            pool,
            by_key: RwLock::new(HashMap::new()),
            prices: RwLock::new(None),
            epoch: std::sync::atomic::AtomicU64::new(0),
            fetching: std::sync::Mutex::new(HashMap::new()),
            price_gate: Arc::new(tokio::sync::Mutex::new(())),
            health: std::sync::Mutex::new(Health {
                failing: false,
                next_try: Instant::now(),
            }),
            lookups: std::sync::atomic::AtomicU64::new(0),
        }
    }

    fn epoch(&self) -> u64 {
        self.epoch.load(std::sync::atomic::Ordering::Acquire)
    }

    fn fresh<T>(&self, e: &Entry<T>) -> bool {
        e.epoch == self.epoch() && e.fetched.elapsed() < FRESH_FOR
    }

    /// Lookups sent to PostgreSQL so far (limits and prices).
    pub fn lookups(&self) -> u64 {
        self.lookups.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Whether a lookup may go to PostgreSQL now: always while it answers; after a failure, one
    /// probe per [`RETRY_EVERY`] for the whole replica.
    // INVARIANT: at most one lookup per RETRY_EVERY while PostgreSQL is down (test:
    // limits_outage::a_postgres_outage_costs_one_lookup_a_second_and_refuses_nothing).
    fn may_look_up(&self) -> bool {
        let Ok(mut h) = self.health.lock() else {
            return false;
        };
        let now = Instant::now();
        if !h.failing {
            return true;
        }
        if now < h.next_try {
            return false;
        }
        h.next_try = now + RETRY_EVERY;
        true
    }

    /// Records a lookup's outcome (see [`Self::may_look_up`]).
    fn looked_up(&self, ok: bool) {
        if let Ok(mut h) = self.health.lock() {
            if ok {
                h.failing = false;
            } else {
                h.failing = true;
                h.next_try = h.next_try.max(Instant::now() + RETRY_EVERY);
            }
        }
    }

    fn count_lookup(&self) {
        self.lookups
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }

    /// Marks everything stale (on NOTIFY, or when the listener reconnects and may have missed
    /// one). Entries are re-read on next use, but kept: if PostgreSQL cannot answer then, the
    /// stale limits keep applying instead of failing open to "no limits".
    pub fn invalidate_all(&self) {
        self.epoch.fetch_add(1, std::sync::atomic::Ordering::AcqRel);
    }

    fn cached(&self, key: Uuid) -> Option<(Limits, bool)> {
        self.by_key.read().ok().and_then(|m| {
            m.get(&key)
                .filter(|e| e.fetched.elapsed() < KEEP_STALE_FOR)
                .map(|e| (e.value.clone(), self.fresh(e)))
        })
    }

    /// The limits of `key` (and its tenant). One lookup per key at a time: a request whose key
    /// has a stale answer uses it while another request refreshes it; one without waits (bounded)
    /// for the lookup instead of querying PostgreSQL itself (a herd of lookups on a cold replica
    /// timed out and failed open).
    pub async fn limits(&self, tenant: Uuid, key: Uuid) -> Limits {
        let cached = self.cached(key);
        if let Some((value, true)) = cached {
            return value;
        }
        let gate = {
            let Ok(mut f) = self.fetching.lock() else {
                return cached.map(|(v, _)| v).unwrap_or_default();
            };
            if f.len() >= MAX_ENTRIES {
                f.clear();
            }
            f.entry(key).or_default().clone()
        };
        let Some(_only_lookup) = Self::turn(gate, cached.is_some()).await else {
            return cached.map(|(v, _)| v).unwrap_or_default();
        };
        let cached = self.cached(key);
        if let Some((value, true)) = cached {
            return value;
        }
        if !self.may_look_up() {
            return cached.map(|(v, _)| v).unwrap_or_default();
        }
        self.count_lookup();
        let epoch = self.epoch();
        let fetched =
            tokio::time::timeout(LOOKUP_TIMEOUT, fetch_limits(&self.pool, tenant, key)).await;
        self.looked_up(matches!(fetched, Ok(Ok(_))));
        let value = match fetched {
            Ok(Ok(v)) => v,
            Ok(Err(e)) => {
                warn_failed("limits", Some(&e));
                return cached.map(|(v, _)| v).unwrap_or_default();
            }
            Err(_) => {
                warn_failed("limits", None);
                return cached.map(|(v, _)| v).unwrap_or_default();
            }
        };
        if let Ok(mut m) = self.by_key.write() {
            if m.len() >= MAX_ENTRIES {
                m.clear();
            }
            m.insert(
                key,
                Entry {
                    value: value.clone(),
                    fetched: Instant::now(),
                    epoch,
                },
            );
        }
        value
    }

    /// The right to look up behind `gate`: at once if free; if another request holds it, `None`
    /// when a stale answer exists (use that), else a bounded wait for it.
    async fn turn(
        gate: Arc<tokio::sync::Mutex<()>>,
        have_stale: bool,
    ) -> Option<tokio::sync::OwnedMutexGuard<()>> {
        match gate.clone().try_lock_owned() {
            Ok(g) => Some(g),
            Err(_) if have_stale => None,
            Err(_) => tokio::time::timeout(LOOKUP_TIMEOUT, gate.lock_owned())
                .await
                .ok(),
        }
    }

    /// The rates `tier` pays now for an adapter's own key `own_key`, else for `price_key`, each
    /// in the tier before the standard one (the order of the rater's `price_by_keys`); zero when
    /// unpriced, as the rater charges an unpriced event nothing.
    pub async fn price(&self, tier: Option<&str>, own_key: Option<&str>, price_key: &str) -> Rates {
        let of = |table: &Prices| {
            let find = |key: &str| {
                let at = |tier: &str| table.get(tier).and_then(|t| t.get(key)).copied();
                tier.and_then(at).or_else(|| at(STANDARD))
            };
            own_key
                .and_then(find)
                .or_else(|| find(price_key))
                .unwrap_or_default()
        };
        let cached = || {
            self.prices.read().ok().and_then(|p| {
                p.as_ref()
                    .filter(|e| e.fetched.elapsed() < KEEP_STALE_FOR)
                    .map(|e| (e.value.clone(), self.fresh(e)))
            })
        };
        let stale = match cached() {
            Some((t, true)) => return of(&t),
            stale => stale,
        };
        // One lookup at a time and one probe a second in an outage, as for `limits`.
        let Some(_only_lookup) = Self::turn(self.price_gate.clone(), stale.is_some()).await else {
            return stale.map(|(t, _)| of(&t)).unwrap_or_default();
        };
        let stale = match cached() {
            Some((t, true)) => return of(&t),
            stale => stale.map(|(t, _)| t),
        };
        if !self.may_look_up() {
            return stale.map(|t| of(&t)).unwrap_or_default();
        }
        self.count_lookup();
        let epoch = self.epoch();
        let fetched = tokio::time::timeout(LOOKUP_TIMEOUT, fetch_prices(&self.pool)).await;
        self.looked_up(matches!(fetched, Ok(Ok(_))));
        match fetched {
            Ok(Ok(t)) => {
                let table = Arc::new(t);
                if let Ok(mut p) = self.prices.write() {
                    *p = Some(Entry {
                        value: table.clone(),
                        fetched: Instant::now(),
                        epoch,
                    });
                }
                of(&table)
            }
            failed => {
                warn_failed("prices", failed.ok().and_then(|r| r.err()).as_ref());
                stale.map(|t| of(&t)).unwrap_or_default()
            }
        }
    }
}

/// Logs a failed lookup, once per interval with the count (a PostgreSQL outage fails them all).
fn warn_failed(what: &'static str, error: Option<&sqlx::Error>) {
    if let Some(failures) = LOOKUP_FAILED.hit() {
        match error {
            Some(e) => tracing::warn!(
                error = %e, what, failures,
                "limits lookups failing; serving the cached answers (fail-open where none)"
            ),
            None => tracing::warn!(
                what,
                failures,
                "limits lookups timing out; serving the cached answers (fail-open where none)"
            ),
        }
    }
}

async fn fetch_limits(pool: &PgPool, tenant: Uuid, key: Uuid) -> sqlx::Result<Limits> {
    let row = tf_core::db::limits::for_key(pool, tenant, key).await?;
    let rates = |r: tf_core::db::limits::RateRow| RateLimits {
        requests_per_minute: r.requests_per_minute,
        tokens_per_minute: r.tokens_per_minute,
        spend_limit_micros: r.spend_limit_micros,
    };
    Ok(Limits {
        tenant: rates(row.tenant),
        key: rates(row.key),
        caps: Caps {
            max_in_flight: row.caps.max_in_flight,
            max_long_prompts: row.caps.max_long_prompts,
            long_prompt_tokens: row.caps.long_prompt_tokens,
        },
        tier: row.tier.map(Arc::from),
    })
}

async fn fetch_prices(pool: &PgPool) -> sqlx::Result<HashMap<String, HashMap<String, Rates>>> {
    let mut table: HashMap<String, HashMap<String, Rates>> = HashMap::new();
    let now = time::OffsetDateTime::now_utc();
    if let Some((_, prices)) = tf_core::db::billing::prices_at(pool, now).await? {
        for p in prices {
            table
                .entry(p.tier)
                .or_default()
                .insert(p.price_key, p.rates);
        }
    }
    Ok(table)
}
