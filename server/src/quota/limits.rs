//! Limits as configured in PostgreSQL (`tenant_limits`, `key_limits`, and the price book's prices
//! in effect now, by price key and tier), cached per replica. A cached answer is trusted for
//! [`FRESH_FOR`]; NOTIFY `tf_limits_changed` (also sent by a new price) drops the cache, so a
//! change reaches every replica within a second. When PostgreSQL is down, stale answers keep
//! serving (fail-static), and a key never seen before is admitted without limits (fail-open) while
//! the database is unreachable; both are logged.

use std::collections::HashMap;
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use sqlx::PgPool;
use tf_core::money::Rates;
use uuid::Uuid;

/// How long a cached row is trusted without asking PostgreSQL again.
pub const FRESH_FOR: Duration = Duration::from_secs(1);
/// How long a refresh may hold a request before the stale (or empty) answer is used.
const LOOKUP_TIMEOUT: Duration = Duration::from_millis(250);
/// Bound on cached entries.
const MAX_ENTRIES: usize = 100_000;

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
    price_gate: tokio::sync::Mutex<()>,
}

impl LimitCache {
    pub fn new(pool: PgPool) -> Self {
        Self {
            pool,
            by_key: RwLock::new(HashMap::new()),
            prices: RwLock::new(None),
            epoch: std::sync::atomic::AtomicU64::new(0),
            fetching: std::sync::Mutex::new(HashMap::new()),
            price_gate: tokio::sync::Mutex::new(()),
        }
    }

    fn epoch(&self) -> u64 {
        self.epoch.load(std::sync::atomic::Ordering::Acquire)
    }

    fn fresh<T>(&self, e: &Entry<T>) -> bool {
        e.epoch == self.epoch() && e.fetched.elapsed() < FRESH_FOR
    }

    /// Marks everything stale (on NOTIFY, or when the listener reconnects and may have missed
    /// one). Entries are re-read on next use, but kept: if PostgreSQL cannot answer then, the
    /// stale limits keep applying instead of failing open to "no limits".
    pub fn invalidate_all(&self) {
        self.epoch.fetch_add(1, std::sync::atomic::Ordering::AcqRel);
    }

    fn cached(&self, key: Uuid) -> Option<(Limits, bool)> {
        self.by_key
            .read()
            .ok()
            .and_then(|m| m.get(&key).map(|e| (e.value.clone(), self.fresh(e))))
    }

    /// The limits of `key` (and its tenant). One lookup per key at a time: concurrent requests
    /// of a key whose entry expired wait for it instead of each querying PostgreSQL (a herd of
    /// lookups on a cold replica timed out and failed open).
    pub async fn limits(&self, tenant: Uuid, key: Uuid) -> Limits {
        if let Some((value, true)) = self.cached(key) {
            return value;
        }
        let gate = {
            let Ok(mut f) = self.fetching.lock() else {
                return self.cached(key).map(|(v, _)| v).unwrap_or_default();
            };
            if f.len() >= MAX_ENTRIES {
                f.clear();
            }
            f.entry(key).or_default().clone()
        };
        let waited = tokio::time::timeout(LOOKUP_TIMEOUT, gate.lock()).await;
        let cached = self.cached(key);
        if let Some((value, true)) = cached {
            return value;
        }
        let Ok(_only_lookup) = waited else {
            tracing::warn!("limits lookup timed out; serving the cached answer");
            return cached.map(|(v, _)| v).unwrap_or_default();
        };
        let epoch = self.epoch();
        let fetched =
            tokio::time::timeout(LOOKUP_TIMEOUT, fetch_limits(&self.pool, tenant, key)).await;
        let value = match fetched {
            Ok(Ok(v)) => v,
            failed => {
                match failed {
                    Ok(Err(e)) => {
                        tracing::warn!(error = %e, "limits lookup failed; serving the cached answer")
                    }
                    _ => tracing::warn!("limits lookup timed out; serving the cached answer"),
                }
                // Not cached: the next request asks PostgreSQL again.
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

    /// The rates `tier` pays for `price_key` now (the standard tier's where the tier has none;
    /// zero when unpriced, as the rater charges an unpriced event nothing).
    pub async fn price(&self, tier: Option<&str>, price_key: &str) -> Rates {
        let cached = || {
            self.prices
                .read()
                .ok()
                .and_then(|p| p.as_ref().map(|e| (e.value.clone(), self.fresh(e))))
        };
        let table = match cached() {
            Some((t, true)) => t,
            _ => {
                // One lookup at a time (see `limits`); a failed one is not cached.
                let waited = tokio::time::timeout(LOOKUP_TIMEOUT, self.price_gate.lock()).await;
                match (cached(), waited) {
                    (Some((t, true)), _) => t,
                    (stale, Ok(_only_lookup)) => {
                        let epoch = self.epoch();
                        match tokio::time::timeout(LOOKUP_TIMEOUT, fetch_prices(&self.pool)).await {
                            Ok(Ok(t)) => {
                                let table = Arc::new(t);
                                if let Ok(mut p) = self.prices.write() {
                                    *p = Some(Entry {
                                        value: table.clone(),
                                        fetched: Instant::now(),
                                        epoch,
                                    });
                                }
                                table
                            }
                            _ => {
                                tracing::warn!("price lookup failed; serving the cached prices");
                                stale.map(|(t, _)| t).unwrap_or_default()
                            }
                        }
                    }
                    (stale, Err(_)) => {
                        tracing::warn!("price lookup timed out; serving the cached prices");
                        stale.map(|(t, _)| t).unwrap_or_default()
                    }
                }
            }
        };
        let of = |tier: &str| table.get(tier).and_then(|t| t.get(price_key)).copied();
        tier.and_then(of)
            .or_else(|| of(STANDARD))
            .unwrap_or_default()
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
