//! The Redis side of admission: one versioned Lua script per operation (acquire, sync,
//! reconcile, merge; the sources are in `lua/`), loaded at start-up and called with EVALSHA (re-loaded by the client if Redis
//! lost them). Each script is atomic, so replicas never race each other; nothing is ever read in
//! Rust and written back. Every key written gets a TTL. A failed call changes nothing the caller
//! relies on: admission then falls back to credit the replica grants itself.

use redis::{Script, ScriptInvocation};

use super::plan::{Check, Key};

/// TTL of a settled-spend counter, in seconds (longer than any month).
pub const SETTLED_TTL_S: i64 = 40 * 86_400;

/// Checks every step of a plan, then applies all of them or none. Each check takes its cost
/// (`need`) plus up to `want` more as this replica's credit, but never more than a sixteenth of
/// the room left, so a limit near exhaustion is shared out one request at a time.
/// Window costs are charged to the current second's bucket; spend and slots are added to this
/// replica's holding (a hash member named by the replica, with a lease it renews).
/// Returns `{failed_index (0: admitted), retry_ms, used_1, reset_ms_1, extra_1, used_2, ...}`.
const ACQUIRE: &str = include_str!("lua/acquire.lua");

/// What this replica owes Redis, in one call (see the script's header): window corrections and
/// unused credit given back, settled spend, and changes to this replica's holdings as deltas, so
/// no ACQUIRE (which adds to the same holdings) has to wait for it. A numbered batch is applied
/// at most once, so a SYNC whose answer was lost can be sent again.
const SYNC: &str = include_str!("lua/sync.lua");

/// Raises settled spend counters to the billed sums from PostgreSQL (never lowers them: every
/// settle reaches Redis before PostgreSQL, so a lower billed sum only means events in transit).
const RECONCILE: &str = include_str!("lua/reconcile.lua");

/// Adds window credit a replica granted itself (while Redis was unreachable) into the shared
/// windows.
const MERGE: &str = include_str!("lua/merge.lua");

/// The loaded scripts.
pub struct Scripts {
    pub acquire: Script,
    pub sync: Script,
    pub reconcile: Script,
    pub merge: Script,
}

impl Default for Scripts {
    fn default() -> Self {
        Self {
            acquire: Script::new(ACQUIRE),
            sync: Script::new(SYNC),
            reconcile: Script::new(RECONCILE),
            merge: Script::new(MERGE),
        }
    }
}

impl Scripts {
    /// Loads every script into Redis's script cache (SCRIPT LOAD).
    pub async fn load(&self, con: &mut redis::aio::ConnectionManager) -> redis::RedisResult<()> {
        for s in [&self.acquire, &self.sync, &self.reconcile, &self.merge] {
            s.load_async(con).await?;
        }
        Ok(())
    }
}

/// Adds a plan's keys and arguments to an ACQUIRE invocation: each check takes its cost plus up
/// to `wants[i]` of credit for this replica (`rid`).
pub fn acquire_args(
    inv: &mut ScriptInvocation<'_>,
    checks: &[Check],
    wants: &[i64],
    now_ms: i64,
    rid: &str,
    expiry_ms: i64,
    key_ttl_ms: i64,
) {
    inv.arg(now_ms)
        .arg(rid)
        .arg(expiry_ms)
        .arg(key_ttl_ms)
        .arg(SETTLED_TTL_S);
    for (c, want) in checks.iter().zip(wants.iter().chain(std::iter::repeat(&0))) {
        match c {
            Check::Window {
                key, limit, cost, ..
            } => {
                inv.key(&**key).arg("W").arg(*limit).arg(*cost).arg(*want);
            }
            Check::Spend {
                settled,
                leases,
                amounts,
                limit,
                cost,
            } => {
                inv.key(&**settled)
                    .key(&**leases)
                    .key(&**amounts)
                    .arg("S")
                    .arg(*limit)
                    .arg(*cost)
                    .arg(*want);
            }
            Check::Cap {
                leases,
                amounts,
                limit,
                ..
            } => {
                inv.key(&**leases)
                    .key(&**amounts)
                    .arg("C")
                    .arg(*limit)
                    .arg(1)
                    .arg(*want);
            }
        }
    }
}

/// One step of a SYNC call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SyncOp {
    /// The batch's number (first op): Redis skips a batch of this replica it already applied.
    Batch { key: Key, seq: u64 },
    /// Add `delta` to a window's bucket of second `bucket` (if still live).
    Window { key: Key, bucket: i64, delta: i64 },
    /// Add `micros` to a settled-spend counter.
    Spend { settled: Key, micros: i64 },
    /// This replica's holding (spend micros or slots) changes by `delta`, to `amount` by its own
    /// count (what Redis takes if the holding expired there); its lease is renewed.
    Hold {
        leases: Key,
        amounts: Key,
        delta: i64,
        amount: i64,
    },
}

/// Adds the SYNC header and `ops` to an invocation; returns whether there is anything to do.
pub fn sync_args(
    inv: &mut ScriptInvocation<'_>,
    ops: &[SyncOp],
    now_ms: i64,
    rid: &str,
    expiry_ms: i64,
    key_ttl_ms: i64,
) -> bool {
    inv.arg(now_ms)
        .arg(rid)
        .arg(expiry_ms)
        .arg(key_ttl_ms)
        .arg(SETTLED_TTL_S);
    for op in ops {
        match op {
            SyncOp::Window { key, bucket, delta } => {
                inv.key(&**key).arg("W").arg(*bucket).arg(*delta);
            }
            SyncOp::Batch { key, seq } => {
                inv.key(&**key).arg("Q").arg(*seq).arg(0);
            }
            SyncOp::Spend { settled, micros } => {
                inv.key(&**settled).arg("S").arg(*micros).arg(0);
            }
            SyncOp::Hold {
                leases,
                amounts,
                delta,
                amount,
            } => {
                inv.key(&**leases)
                    .key(&**amounts)
                    .arg("H")
                    .arg(*delta)
                    .arg(*amount);
            }
        }
    }
    !ops.is_empty()
}
