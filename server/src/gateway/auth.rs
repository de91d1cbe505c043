//! API key authentication. Keys are looked up by SHA-256 through an in-memory cache: a hit costs
//! no I/O; an entry older than [`FRESH_FOR`] is re-read, and every entry is marked stale when
//! PostgreSQL notifies `tf_auth_changed`, so a revoked key or a suspended tenant is refused within
//! a second on every replica even if a notification is missed. When PostgreSQL is down, stale
//! entries keep serving (fail-static): a known good key keeps working through a database outage.
//!
//! Bad keys cost little: known keys and unknown ones live in separate bounded caches (a flood of
//! random keys evicts only other unknown keys, never a good one), one lookup per key runs at a
//! time, and an address whose unknown keys pass [`FAILURES_PER_WINDOW`] gets 429 instead of 401
//! for the rest of the window, its lookups one at a time. A key is always looked up before the
//! address is judged, so a key that exists is never refused for its neighbours' failures (an
//! office or a NAT shares one address), not even by a replica whose cache is empty. Behind a
//! trusted proxy the address is the client the proxy names in `X-Forwarded-For`, as the portal's
//! login throttle counts it; IPv6 clients count per /64.
//!
//! A rotated key carries the end of its grace period in its cache entry and is refused from that
//! instant on by the cache itself, with no notification needed. `last_used_at` is kept cheaply: a
//! key is marked at most once per [`LAST_USED_EVERY`] per replica (a map lookup on the request
//! path, no I/O), and a background task writes the marked keys in one statement.

use std::net::IpAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::http::HeaderMap;
use quick_cache::sync::Cache;
use sqlx::PgPool;
use tf_core::accounts::TenantStatus;
use time::OffsetDateTime;
use uuid::Uuid;

use tf_app::ssr::client_addr::TrustedProxies;

use super::error::GatewayError;

/// How long a cached lookup is trusted without asking PostgreSQL again.
pub const FRESH_FOR: Duration = Duration::from_secs(1);
/// How long a refresh may take when a stale answer could be served instead.
const STALE_REFRESH_TIMEOUT: Duration = Duration::from_millis(250);
/// How long a first lookup may take before the request fails with 503.
const COLD_LOOKUP_TIMEOUT: Duration = Duration::from_secs(3);
/// Known keys cached (valid or suspended).
const KNOWN_ENTRIES: usize = 100_000;
/// Unknown keys cached, and addresses tracked for failures.
const UNKNOWN_ENTRIES: usize = 16_384;
/// Unknown keys one address may try per [`FAILURE_WINDOW`] before it is refused without a lookup.
pub const FAILURES_PER_WINDOW: u32 = 20;
/// The failure limiter's window.
const FAILURE_WINDOW: Duration = Duration::from_secs(60);
/// A key's `last_used_at` is written at most this often (per replica; the statement also skips
/// keys another replica marked within the minute).
pub const LAST_USED_EVERY: Duration = Duration::from_secs(60);

/// Who is calling, as proven by the key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Principal {
    pub key_id: Uuid,
    pub tenant_id: Uuid,
    pub tenant_name: String,
    /// The tenant opted in to storing request bodies (cached with the key, refreshed like it).
    pub body_logging: bool,
}

#[derive(Debug, Clone)]
enum Lookup {
    /// A working key, and when its rotation grace period ends, if it is ending.
    Valid(Principal, Option<OffsetDateTime>),
    Suspended,
    Unknown,
}

#[derive(Clone)]
struct Entry {
    lookup: Lookup,
    fetched: Instant,
    /// The cache epoch it was fetched in; an older epoch means "re-check before trusting".
    epoch: u64,
}

/// Failed lookups of one address in the current window.
#[derive(Debug)]
struct Failures {
    window_start: Instant,
    count: u32,
}

/// The per-replica key cache and the batch of keys seen since the last `last_used_at` flush.
pub struct KeyCache {
    pool: PgPool,
    known: Cache<[u8; 32], Entry>,
    unknown: Cache<[u8; 32], Entry>,
    /// One lookup per key at a time: concurrent requests of a key wait for the first one.
    gates: Cache<[u8; 32], Arc<tokio::sync::Mutex<()>>>,
    failures: Cache<IpAddr, Arc<Mutex<Failures>>>,
    /// Addresses over their failure limit look keys up one at a time.
    address_gates: Cache<IpAddr, Arc<tokio::sync::Mutex<()>>>,
    used: Mutex<std::collections::HashSet<Uuid>>,
    /// When each key was last put into `used`, so a busy key is marked once per minute.
    marked: Cache<Uuid, Instant>,
    epoch: AtomicU64,
    lookups: AtomicU64,
    /// Proxies whose `X-Forwarded-For` names the client the failure limiter counts.
    trusted_proxies: TrustedProxies,
    /// `last_used_at` rows written since start.
    last_used_writes: AtomicU64,
}

impl KeyCache {
    pub fn new(pool: PgPool) -> Self {
        Self {
            pool,
            known: Cache::new(KNOWN_ENTRIES),
            unknown: Cache::new(UNKNOWN_ENTRIES),
            gates: Cache::new(UNKNOWN_ENTRIES),
            failures: Cache::new(UNKNOWN_ENTRIES),
            address_gates: Cache::new(UNKNOWN_ENTRIES),
            used: Mutex::new(std::collections::HashSet::new()),
            marked: Cache::new(KNOWN_ENTRIES),
            epoch: AtomicU64::new(0),
            lookups: AtomicU64::new(0),
            trusted_proxies: TrustedProxies::default(),
            last_used_writes: AtomicU64::new(0),
        }
    }

    /// Counts key failures by the client a trusted proxy names (`--trusted-proxies`, as the
    /// portal's login throttle does) instead of by the proxy's own address.
    pub fn trusting(mut self, proxies: TrustedProxies) -> Self {
        self.trusted_proxies = proxies;
        self
    }

    /// Key lookups sent to PostgreSQL since start (what a flood of bad keys would drive up).
    pub fn lookups(&self) -> u64 {
        self.lookups.load(Ordering::Relaxed)
    }

    /// `last_used_at` rows this replica has written since start (at most one a minute per key).
    pub fn last_used_writes(&self) -> u64 {
        self.last_used_writes.load(Ordering::Relaxed)
    }

    /// Forgets everything (on NOTIFY, or when the listener reconnects and may have missed one).
    ///
    /// Entries are marked stale, not dropped: each is re-read on its next use, and if PostgreSQL
    /// cannot answer then (a reconnect during an outage), the stale answer keeps serving.
    pub fn invalidate_all(&self) {
        self.epoch.fetch_add(1, Ordering::AcqRel);
    }

    fn current_epoch(&self) -> u64 {
        self.epoch.load(Ordering::Acquire)
    }

    /// The cached answer and whether it may be trusted without asking PostgreSQL.
    fn cached(&self, hash: &[u8; 32]) -> Option<(Lookup, bool)> {
        let e = self.known.get(hash).or_else(|| self.unknown.get(hash))?;
        let fresh = e.epoch == self.current_epoch() && e.fetched.elapsed() < FRESH_FOR;
        Some((e.lookup, fresh))
    }

    /// Authenticates the `Authorization` header of a request from `peer` (the socket's address,
    /// when known, for the failure limiter: it counts the peer, or behind a trusted proxy the
    /// client its `X-Forwarded-For` names).
    pub async fn authenticate(
        &self,
        headers: &HeaderMap,
        peer: Option<IpAddr>,
    ) -> Result<Principal, GatewayError> {
        let secret = bearer(headers).ok_or(GatewayError::MissingKey)?;
        let client = peer.map(|p| self.client(p, headers));
        let hash = tf_core::keys::hash_secret(secret);
        let lookup = match self.cached(&hash) {
            Some((lookup, true)) => lookup,
            stale => self.refresh(hash, stale, client).await?,
        };
        match lookup {
            // INVARIANT: a rotated key is refused from its deadline on, whatever the cache holds
            // (test: portal_keys::a_rotated_key_works_for_its_grace_period_then_is_refused).
            Lookup::Valid(_, Some(ends)) if ends <= OffsetDateTime::now_utc() => {
                Err(GatewayError::InvalidKey)
            }
            Lookup::Valid(p, _) => {
                self.mark_used(p.key_id);
                Ok(p)
            }
            Lookup::Suspended => Err(GatewayError::TenantSuspended),
            // An address over its limit hears 429 for its unknown keys, cached or not.
            Lookup::Unknown => Err(match client.and_then(|c| self.refused(c)) {
                Some(retry_after) => GatewayError::TooManyKeyFailures(retry_after),
                None => GatewayError::InvalidKey,
            }),
        }
    }

    /// The address the failure limiter counts for a request from `peer`. INVARIANT: behind a
    /// trusted proxy a flooding client is refused and its neighbours are not (test:
    /// hardening::bad_keys_count_by_the_client_a_trusted_proxy_names).
    fn client(&self, peer: IpAddr, headers: &HeaderMap) -> IpAddr {
        let forwarded = headers
            .get_all("x-forwarded-for")
            .iter()
            .filter_map(|v| v.to_str().ok());
        self.trusted_proxies.client(peer, forwarded)
    }

    /// Queues the key for the next `last_used_at` write unless it was queued within the minute.
    fn mark_used(&self, key_id: Uuid) {
        let recent = self
            .marked
            .get(&key_id)
            .is_some_and(|at| at.elapsed() < LAST_USED_EVERY);
        if recent {
            return;
        }
        self.marked.insert(key_id, Instant::now());
        if let Ok(mut used) = self.used.lock() {
            used.insert(key_id);
        }
    }

    /// Asks PostgreSQL, one request per key at a time; the others wait and take its answer.
    async fn refresh(
        &self,
        hash: [u8; 32],
        stale: Option<(Lookup, bool)>,
        client: Option<IpAddr>,
    ) -> Result<Lookup, GatewayError> {
        // With a stale answer in hand, do not let a slow database hold the request.
        let limit = if stale.is_some() {
            STALE_REFRESH_TIMEOUT
        } else {
            COLD_LOOKUP_TIMEOUT
        };
        let gate = self
            .gates
            .get_or_insert_with(&hash, || Ok::<_, std::convert::Infallible>(Arc::default()));
        let gate = match gate {
            Ok(g) => g,
            Err(never) => match never {},
        };
        let waited = tokio::time::timeout(limit, gate.lock()).await;
        let stale = match self.cached(&hash) {
            Some((lookup, true)) => return Ok(lookup),
            again => again.or(stale),
        };
        // INVARIANT: the key is looked up whatever its address did, so a key that exists is
        // never refused for its neighbours' bad keys (test:
        // hardening::a_valid_key_behind_an_address_full_of_bad_keys_is_served).
        let refused = client.and_then(|c| self.refused(c));
        let _address_turn = match (refused, client, &stale) {
            (Some(_), Some(c), None) => Some(self.address_turn(c, limit).await),
            _ => None,
        };
        let fetched = match waited {
            Ok(_only_lookup) => tokio::time::timeout(limit, self.fetch(&hash))
                .await
                .unwrap_or(Err(sqlx::Error::PoolTimedOut)),
            Err(_) => Err(sqlx::Error::PoolTimedOut),
        };
        match (fetched, stale) {
            (Ok(lookup), _) => {
                self.store(hash, lookup.clone());
                if matches!(lookup, Lookup::Unknown) && refused.is_none() {
                    if let Some(c) = client {
                        self.count_failure(c);
                    }
                }
                Ok(lookup)
            }
            (Err(e), Some((lookup, _))) => {
                tracing::warn!(error = %e, "key lookup failed; serving the cached answer");
                // Retry after another FRESH_FOR, not on every request.
                self.store(hash, lookup.clone());
                Ok(lookup)
            }
            (Err(e), None) => {
                tracing::warn!(error = %e, "key lookup failed");
                Err(GatewayError::ServiceUnavailable)
            }
        }
    }

    /// Waits (bounded by `limit`) until no other lookup of this over-limit address is running,
    /// so an address sending bad keys holds at most one database connection; after `limit` the
    /// lookup goes ahead anyway (a good key behind it must not fail).
    async fn address_turn(
        &self,
        client: IpAddr,
        limit: Duration,
    ) -> Option<tokio::sync::OwnedMutexGuard<()>> {
        let gate = match self
            .address_gates
            .get_or_insert_with(&Self::limiter_key(client), || {
                Ok::<_, std::convert::Infallible>(Arc::default())
            }) {
            Ok(g) => g,
            Err(never) => match never {},
        };
        tokio::time::timeout(limit, gate.lock_owned()).await.ok()
    }

    /// The limiter's key for an address: IPv6 clients hold whole /64s, so they count as one.
    fn limiter_key(client: IpAddr) -> IpAddr {
        match client {
            IpAddr::V4(_) => client,
            IpAddr::V6(v6) => {
                let mut o = v6.octets();
                o[8..].fill(0);
                IpAddr::from(o)
            }
        }
    }

    /// How long `client` must wait, if its failures used up the window.
    fn refused(&self, client: IpAddr) -> Option<Duration> {
        let f = self.failures.get(&Self::limiter_key(client))?;
        let f = f.lock().ok()?;
        let elapsed = f.window_start.elapsed();
        (f.count >= FAILURES_PER_WINDOW && elapsed < FAILURE_WINDOW)
            .then(|| FAILURE_WINDOW - elapsed)
    }

    fn count_failure(&self, client: IpAddr) {
        let key = Self::limiter_key(client);
        let entry = match self.failures.get_or_insert_with(&key, || {
            Ok::<_, std::convert::Infallible>(Arc::new(Mutex::new(Failures {
                window_start: Instant::now(),
                count: 0,
            })))
        }) {
            Ok(e) => e,
            Err(never) => match never {},
        };
        if let Ok(mut f) = entry.lock() {
            if f.window_start.elapsed() >= FAILURE_WINDOW {
                f.window_start = Instant::now();
                f.count = 0;
            }
            f.count = f.count.saturating_add(1);
        };
    }

    fn store(&self, hash: [u8; 32], lookup: Lookup) {
        let entry = Entry {
            lookup,
            fetched: Instant::now(),
            epoch: self.current_epoch(),
        };
        if matches!(entry.lookup, Lookup::Unknown) {
            self.known.remove(&hash);
            self.unknown.insert(hash, entry);
        } else {
            self.unknown.remove(&hash);
            self.known.insert(hash, entry);
        }
    }

    async fn fetch(&self, hash: &[u8; 32]) -> sqlx::Result<Lookup> {
        self.lookups.fetch_add(1, Ordering::Relaxed);
        let row = tf_core::db::keys::owner_by_hash(&self.pool, hash).await?;
        Ok(match row {
            None => Lookup::Unknown,
            Some(k) if k.revoked => Lookup::Unknown,
            Some(k) => match k.tenant_status {
                TenantStatus::Suspended => Lookup::Suspended,
                TenantStatus::Active => Lookup::Valid(
                    Principal {
                        key_id: k.key_id,
                        tenant_id: k.tenant_id,
                        tenant_name: k.tenant_name,
                        body_logging: k.body_logging,
                    },
                    k.expires_at,
                ),
            },
        })
    }

    /// Writes `last_used_at` for the keys seen since the previous flush, in one statement.
    pub async fn flush_last_used(&self) -> sqlx::Result<u64> {
        let ids: Vec<Uuid> = match self.used.lock() {
            Ok(mut used) => used.drain().collect(),
            Err(_) => return Ok(0),
        };
        if ids.is_empty() {
            return Ok(0);
        }
        let written = tf_core::db::keys::touch_last_used(&self.pool, &ids).await?;
        self.last_used_writes.fetch_add(written, Ordering::Relaxed);
        Ok(written)
    }
}

/// The key from `Authorization: Bearer <key>`.
/// The key: `Authorization: Bearer`, else `x-api-key` (how Anthropic's clients send it; the
/// same key, looked up the same way).
fn bearer(headers: &HeaderMap) -> Option<&str> {
    let from_authorization = || {
        let value = headers
            .get(axum::http::header::AUTHORIZATION)?
            .to_str()
            .ok()?;
        let (scheme, key) = value.trim().split_once(' ')?;
        scheme
            .eq_ignore_ascii_case("bearer")
            .then(|| key.trim())
            .filter(|k| !k.is_empty())
    };
    from_authorization().or_else(|| {
        headers
            .get("x-api-key")?
            .to_str()
            .ok()
            .map(str::trim)
            .filter(|k| !k.is_empty())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn unknown_keys_never_evict_known_ones() {
        let pool = sqlx::postgres::PgPoolOptions::new()
            .connect_lazy("postgres://nobody@127.0.0.1:1/none")
            .unwrap();
        let cache = KeyCache::new(pool);
        let good = Lookup::Valid(
            Principal {
                key_id: Uuid::nil(),
                tenant_id: Uuid::nil(),
                tenant_name: "acme".into(),
                body_logging: false,
            },
            None,
        );
        cache.store([1; 32], good);
        for i in 0..(KNOWN_ENTRIES as u32 + 50_000) {
            let mut h = [0u8; 32];
            h[..4].copy_from_slice(&i.to_le_bytes());
            h[31] = 2;
            cache.store(h, Lookup::Unknown);
        }
        assert!(matches!(
            cache.cached(&[1; 32]),
            Some((Lookup::Valid(..), _))
        ));
        assert!(cache.unknown.len() <= UNKNOWN_ENTRIES);
    }

    #[test]
    fn ipv6_clients_count_per_64() {
        let a: IpAddr = "2001:db8:1:2:aaaa::1".parse().unwrap();
        let b: IpAddr = "2001:db8:1:2:bbbb::9".parse().unwrap();
        assert_eq!(KeyCache::limiter_key(a), KeyCache::limiter_key(b));
    }
}
