//! What this replica owes Redis and has not sent yet: settled spend by counter, and the SYNC
//! batches that failed. Pure bookkeeping (the syncer in `sync.rs` does the sending). A batch is
//! numbered and Redis applies a number once, so a failed batch is kept whole and sent again until
//! Redis takes it: its spend is neither lost (the reconciler need not repair it) nor counted twice
//! (if the call that "failed" had in fact been applied).

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::AtomicBool;
use std::sync::Mutex;

use tokio::sync::{watch, Notify};

use super::credit::Credits;
use super::plan::Key;
use super::scripts::SyncOp;

/// A failed batch older than this is dropped (its leases lapsed long ago; the reconciler rebuilds
/// the spend), so an outage of hours does not replay stale holdings.
const FAILED_KEEP_MS: i64 = 5 * 60_000;

/// One SYNC call's content.
#[derive(Debug, Clone)]
pub(super) struct Batch {
    pub seq: u64,
    pub made_ms: i64,
    pub ops: Vec<SyncOp>,
}

/// Spend waiting to be sent, failed batches, and the completion signal of each batch.
pub(super) struct SpendQueue {
    pending: Mutex<Pending>,
    /// Wakes the syncer when somebody waits for the spend to reach Redis.
    pub wake: Notify,
    /// The last batch sent (or given up on).
    pub done: watch::Sender<u64>,
    /// Whether the syncer's loop runs (else callers send themselves).
    pub running: AtomicBool,
}

struct Pending {
    spend: HashMap<Key, i64>,
    /// The number of the next SYNC.
    batch: u64,
    /// The SYNC that carries (or carried) the latest queued spend.
    spend_batch: u64,
    /// Batches Redis did not confirm, oldest first.
    failed: VecDeque<Batch>,
}

impl Default for SpendQueue {
    fn default() -> Self {
        Self {
            pending: Mutex::new(Pending {
                spend: HashMap::new(),
                batch: 1,
                spend_batch: 0,
                failed: VecDeque::new(),
            }),
            wake: Notify::new(),
            done: watch::channel(0).0,
            running: AtomicBool::new(false),
        }
    }
}

impl SpendQueue {
    /// Adds the settled spend `settle` returns to the next batch; `settle` changes the holdings
    /// to match under the same lock as [`Self::snapshot`], so a batch carries both or neither.
    /// Returns whether anything was queued.
    pub fn push(&self, settle: impl FnOnce() -> Vec<(Key, i64)>) -> bool {
        let Ok(mut p) = self.pending.lock() else {
            return false;
        };
        let spend = settle();
        if spend.is_empty() {
            return false;
        }
        for (key, micros) in spend {
            *p.spend.entry(key).or_default() += micros;
        }
        p.spend_batch = p.batch;
        true
    }

    /// The batch that carries the latest queued spend.
    pub fn spend_batch(&self) -> Option<u64> {
        self.pending.lock().ok().map(|p| p.spend_batch)
    }

    /// The next batch: its number (as the first op), queued spend and the holdings' changes.
    /// `periodic`: also corrections, credit given back and renewals (every holding when `all`).
    pub fn snapshot(
        &self,
        credits: &Credits,
        seq_key: &Key,
        now_ms: i64,
        periodic: Option<(i64, bool)>,
    ) -> Batch {
        let Ok(mut p) = self.pending.lock() else {
            return Batch {
                seq: u64::MAX,
                made_ms: now_ms,
                ops: Vec::new(),
            };
        };
        let mut ops = match periodic {
            Some((renew_every, all)) => credits.due(now_ms, renew_every, all),
            None => credits.dirty_holds(now_ms),
        };
        let seq = p.batch;
        p.batch += 1;
        ops.extend(
            p.spend
                .drain()
                .filter(|(_, m)| *m > 0)
                .map(|(settled, micros)| SyncOp::Spend { settled, micros }),
        );
        if !ops.is_empty() {
            ops.insert(
                0,
                SyncOp::Batch {
                    key: seq_key.clone(),
                    seq,
                },
            );
        }
        Batch {
            seq,
            made_ms: now_ms,
            ops,
        }
    }

    /// The oldest failed batch, to send again (stale ones are dropped first).
    pub fn oldest_failed(&self, now_ms: i64) -> Option<Batch> {
        let mut p = self.pending.lock().ok()?;
        while p
            .failed
            .front()
            .is_some_and(|b| now_ms - b.made_ms > FAILED_KEEP_MS)
        {
            if let Some(b) = p.failed.pop_front() {
                tracing::warn!(seq = b.seq, "quota batch dropped after failing for minutes");
            }
        }
        p.failed.front().cloned()
    }

    /// Redis took the failed batch `seq`.
    pub fn resent(&self, seq: u64) {
        if let Ok(mut p) = self.pending.lock() {
            p.failed.retain(|b| b.seq != seq);
        }
    }

    /// Redis did not confirm `batch`: keep it to send again.
    pub fn failed(&self, batch: Batch) {
        if batch.ops.is_empty() {
            return;
        }
        if let Ok(mut p) = self.pending.lock() {
            if p.failed.iter().all(|b| b.seq != batch.seq) {
                p.failed.push_back(batch);
            }
        }
    }

    /// The spend queued so far will not be attempted now (an older batch still fails): release
    /// whoever waits for it, as when a send fails.
    pub fn give_up(&self) {
        if let Ok(mut p) = self.pending.lock() {
            self.mark_done(p.batch);
            p.batch += 1;
        }
    }

    /// Batches up to `seq` were sent or given up on (never moves back: senders may overlap).
    pub fn mark_done(&self, seq: u64) {
        self.done.send_if_modified(|d| {
            let moved = seq > *d;
            *d = (*d).max(seq);
            moved
        });
    }
}
