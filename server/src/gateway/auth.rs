//! API key authentication. Keys are looked up by SHA-256 through an in-memory cache: a hit costs
//! no I/O; an entry older than [`FRESH_FOR`] is re-read, and every entry is dropped when
//! PostgreSQL notifies `tf_auth_changed`, so a revoked key or a suspended tenant is refused within
//! a second on every replica even if a notification is missed. When PostgreSQL is down, stale
//! entries keep serving (fail-static): a known good key keeps working through a database outage.

use std::collections::{HashMap, HashSet};
use std::sync::{Mutex, RwLock};
use std::time::{Duration, Instant};

use axum::http::HeaderMap;
use sqlx::PgPool;
use tf_core::accounts::TenantStatus;
use uuid::Uuid;

use super::error::GatewayError;

/// How long a cached lookup is trusted without asking PostgreSQL again.
pub const FRESH_FOR: Duration = Duration::from_secs(1);
/// How long a refresh may take when a stale answer could be served instead.
const STALE_REFRESH_TIMEOUT: Duration = Duration::from_millis(250);
/// How long a first lookup may take before the request fails with 503.
const COLD_LOOKUP_TIMEOUT: Duration = Duration::from_secs(3);
/// Bound on cached entries (unknown keys are cached too, so a flood of bad keys cannot grow it).
const MAX_ENTRIES: usize = 100_000;

/// Who is calling, as proven by the key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Principal {
    pub key_id: Uuid,
    pub tenant_id: Uuid,
    pub tenant_name: String,
}

#[derive(Debug, Clone)]
enum Lookup {
    Valid(Principal),
    Suspended,
    Unknown,
}

struct Entry {
    lookup: Lookup,
    fetched: Instant,
    /// The cache epoch it was fetched in; an older epoch means "re-check before trusting".
    epoch: u64,
}

/// The per-replica key cache and the batch of keys seen since the last `last_used_at` flush.
pub struct KeyCache {
    pool: PgPool,
    entries: RwLock<HashMap<[u8; 32], Entry>>,
    used: Mutex<HashSet<Uuid>>,
    epoch: std::sync::atomic::AtomicU64,
}

impl KeyCache {
    pub fn new(pool: PgPool) -> Self {
        Self {
            pool,
            entries: RwLock::new(HashMap::new()),
            used: Mutex::new(HashSet::new()),
            epoch: std::sync::atomic::AtomicU64::new(0),
        }
    }

    /// Forgets everything (on NOTIFY, or when the listener reconnects and may have missed one).
    ///
    /// Entries are marked stale, not dropped: each is re-read on its next use, and if PostgreSQL
    /// cannot answer then (a reconnect during an outage), the stale answer keeps serving.
    pub fn invalidate_all(&self) {
        self.epoch.fetch_add(1, std::sync::atomic::Ordering::AcqRel);
    }

    fn current_epoch(&self) -> u64 {
        self.epoch.load(std::sync::atomic::Ordering::Acquire)
    }

    /// Authenticates the `Authorization` header.
    pub async fn authenticate(&self, headers: &HeaderMap) -> Result<Principal, GatewayError> {
        let secret = bearer(headers).ok_or(GatewayError::MissingKey)?;
        let hash = tf_core::keys::hash_secret(secret);
        let cached = self.entries.read().ok().and_then(|map| {
            map.get(&hash).map(|e| {
                (
                    e.lookup.clone(),
                    e.epoch == self.current_epoch() && e.fetched.elapsed() < FRESH_FOR,
                )
            })
        });
        let lookup = match cached {
            Some((lookup, true)) => lookup,
            stale => {
                // With a stale answer in hand, do not let a slow database hold the request.
                let limit = if stale.is_some() {
                    STALE_REFRESH_TIMEOUT
                } else {
                    COLD_LOOKUP_TIMEOUT
                };
                let fetched = tokio::time::timeout(limit, self.fetch(&hash))
                    .await
                    .unwrap_or(Err(sqlx::Error::PoolTimedOut));
                match (fetched, stale) {
                    (Ok(lookup), _) => {
                        self.store(hash, lookup.clone());
                        lookup
                    }
                    (Err(e), Some((lookup, _))) => {
                        tracing::warn!(error = %e, "key lookup failed; serving the cached answer");
                        // Retry after another FRESH_FOR, not on every request.
                        self.store(hash, lookup.clone());
                        lookup
                    }
                    (Err(e), None) => {
                        tracing::warn!(error = %e, "key lookup failed");
                        return Err(GatewayError::ServiceUnavailable);
                    }
                }
            }
        };
        match lookup {
            Lookup::Valid(p) => {
                if let Ok(mut used) = self.used.lock() {
                    used.insert(p.key_id);
                }
                Ok(p)
            }
            Lookup::Suspended => Err(GatewayError::TenantSuspended),
            Lookup::Unknown => Err(GatewayError::InvalidKey),
        }
    }

    fn store(&self, hash: [u8; 32], lookup: Lookup) {
        if let Ok(mut map) = self.entries.write() {
            if map.len() >= MAX_ENTRIES {
                map.clear();
            }
            map.insert(
                hash,
                Entry {
                    lookup,
                    fetched: Instant::now(),
                    epoch: self.current_epoch(),
                },
            );
        }
    }

    async fn fetch(&self, hash: &[u8; 32]) -> sqlx::Result<Lookup> {
        let row: Option<(Uuid, Uuid, String, TenantStatus, bool)> = sqlx::query_as(
            "SELECT k.id, t.id, t.name, t.status, k.revoked_at IS NOT NULL
             FROM api_keys k JOIN tenants t ON t.id = k.tenant_id WHERE k.secret_sha256 = $1",
        )
        .bind(&hash[..])
        .fetch_optional(&self.pool)
        .await?;
        Ok(match row {
            None | Some((_, _, _, _, true)) => Lookup::Unknown,
            Some((_, _, _, TenantStatus::Suspended, false)) => Lookup::Suspended,
            Some((key_id, tenant_id, tenant_name, TenantStatus::Active, false)) => {
                Lookup::Valid(Principal {
                    key_id,
                    tenant_id,
                    tenant_name,
                })
            }
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
        let done = sqlx::query("UPDATE api_keys SET last_used_at = now() WHERE id = ANY($1)")
            .bind(&ids)
            .execute(&self.pool)
            .await?;
        Ok(done.rows_affected())
    }
}

/// The key from `Authorization: Bearer <key>`.
fn bearer(headers: &HeaderMap) -> Option<&str> {
    let value = headers
        .get(axum::http::header::AUTHORIZATION)?
        .to_str()
        .ok()?;
    let (scheme, key) = value.trim().split_once(' ')?;
    scheme
        .eq_ignore_ascii_case("bearer")
        .then(|| key.trim())
        .filter(|k| !k.is_empty())
}
