//! The one writer of what this replica owes Redis. Finished requests' spend is group-committed:
//! a settle only queues its spend, and the queue travels with the next SYNC, which the syncer
//! sends every [`TICK`] or at once when somebody needs the spend in Redis now ([`flushed`]: the
//! usage writers, before an event reaches PostgreSQL, since the reconciler relies on Redis never
//! counting less than PostgreSQL has billed, see reconciler.rs). So a request never waits for Redis
//! on its way out, and a busy replica sends tens of SYNCs a second, not one per handful of
//! requests. A settle moves its spend out of this replica's holding into the settled counter; both
//! changes travel in one SYNC, so Redis never sees the holding shrink before the settled spend
//! grows (which would let spend overshoot), and until then the holding (the request's
//! reservation) still counts against the limit on every replica. Every [`TICK`] the syncer also
//! sends window corrections, gives back unspent credit and renews (or shrinks) this replica's
//! holdings. Every call runs under the refill lock: holdings are written as absolute amounts, so
//! no ACQUIRE may be in flight then.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::{watch, Notify};
use tokio_util::sync::CancellationToken;

use super::admission::{now_ms, Inner};
use super::plan::Key;
use super::scripts::{self, SyncOp};

/// How often credit is given back and leases renewed.
const TICK: Duration = Duration::from_millis(50);

/// Spend waiting to be sent, and the completion signal of each batch.
pub(super) struct Syncer {
    pending: Mutex<Pending>,
    wake: Notify,
    /// The last batch sent (or given up on).
    done: watch::Sender<u64>,
    running: AtomicBool,
}

struct Pending {
    spend: HashMap<Key, i64>,
    /// The number of the next SYNC.
    batch: u64,
    /// The SYNC that carries (or carried) the latest queued spend.
    spend_batch: u64,
}

impl Default for Syncer {
    fn default() -> Self {
        Self {
            pending: Mutex::new(Pending {
                spend: HashMap::new(),
                batch: 1,
                spend_batch: 0,
            }),
            wake: Notify::new(),
            done: watch::channel(0).0,
            running: AtomicBool::new(false),
        }
    }
}

/// Adds settled spend (settled-spend key, micros) to the next SYNC. `apply` changes the holdings
/// to match; it runs under the same lock as the syncer's snapshot, so the next SYNC carries both
/// or neither. Without a running syncer (shutdown) the SYNC is sent here, at once.
pub(super) async fn settle_spend(inner: &Inner, spend: Vec<(Key, i64)>, apply: impl FnOnce()) {
    let s = &inner.syncer;
    let refill = if s.running.load(Ordering::Acquire) {
        None
    } else {
        Some(inner.refill.lock().await)
    };
    match s.pending.lock() {
        Ok(mut p) => {
            apply();
            for (key, micros) in spend {
                *p.spend.entry(key).or_default() += micros;
            }
            p.spend_batch = p.batch;
        }
        Err(_) => return,
    }
    if refill.is_some() {
        send_pending(inner).await;
    }
}

/// Returns once every spend settled so far has been sent to Redis (or given up on: Redis down or
/// too slow, when the reconciler makes up for it).
pub(super) async fn flushed(inner: &Inner) {
    let s = &inner.syncer;
    let mut done = s.done.subscribe();
    let target = match s.pending.lock() {
        Ok(p) => p.spend_batch,
        Err(_) => return,
    };
    if *done.borrow() >= target {
        return;
    }
    if !s.running.load(Ordering::Acquire) {
        let _no_acquire_in_flight = inner.refill.lock().await;
        send_pending(inner).await;
        return;
    }
    s.wake.notify_one();
    let wait = done.wait_for(|d| *d >= target);
    if tokio::time::timeout(inner.cfg.redis_timeout() * 4, wait)
        .await
        .is_err()
    {
        tracing::warn!("quota spend not confirmed by Redis in time");
    }
}

/// Runs until `cancel`, then sends what is left once.
pub(super) async fn run(inner: Arc<Inner>, cancel: CancellationToken) {
    let s = &inner.syncer;
    s.running.store(true, Ordering::Release);
    let renew_every = i64::try_from(inner.cfg.lease().as_millis() / 3).unwrap_or(10_000);
    let mut tick = tokio::time::interval(TICK);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut resync = false;
    loop {
        let periodic = tokio::select! {
            () = cancel.cancelled() => break,
            _ = tick.tick() => true,
            () = s.wake.notified() => false,
        };
        let _no_acquire_in_flight = inner.refill.lock().await;
        let (batch, ops) = snapshot(&inner, periodic.then_some((renew_every, resync)));
        let ok = send(&inner, &ops).await;
        if periodic {
            resync = !ok;
        }
        s.done.send_replace(batch);
    }
    s.running.store(false, Ordering::Release);
    let _no_acquire_in_flight = inner.refill.lock().await;
    send_pending(&inner).await;
}

/// Sends queued spend and changed holdings now, outside the syncer's loop. The caller holds the
/// refill lock.
async fn send_pending(inner: &Inner) {
    let (batch, ops) = snapshot(inner, None);
    send(inner, &ops).await;
    inner.syncer.done.send_replace(batch);
}

/// What the next SYNC carries: pending spend and the holdings as they are now, taken under the
/// pending lock (see [`settle_spend`]). `periodic`: also corrections, credit given back and
/// renewals (every holding when `all`, after a failed sync).
fn snapshot(inner: &Inner, periodic: Option<(i64, bool)>) -> (u64, Vec<SyncOp>) {
    let Ok(mut p) = inner.syncer.pending.lock() else {
        return (u64::MAX, Vec::new());
    };
    let now = now_ms();
    let mut ops = match periodic {
        Some((renew_every, all)) => inner.credits.due(now, renew_every, all),
        None => inner.credits.dirty_holds(now),
    };
    let batch = p.batch;
    p.batch += 1;
    ops.extend(
        p.spend
            .drain()
            .filter(|(_, m)| *m > 0)
            .map(|(settled, micros)| SyncOp::Spend { settled, micros }),
    );
    (batch, ops)
}

/// One SYNC call; true when Redis took it (or there was nothing to send).
async fn send(inner: &Inner, ops: &[SyncOp]) -> bool {
    if ops.is_empty() {
        return true;
    }
    if inner.halted.load(Ordering::Relaxed) {
        return false;
    }
    let lease = i64::try_from(inner.cfg.lease().as_millis()).unwrap_or(30_000);
    let now = now_ms();
    let mut inv = inner.scripts.sync.prepare_invoke();
    scripts::sync_args(&mut inv, ops, now, &inner.rid, now + lease, lease * 2);
    let ok = inner.call::<i64>(&inv).await.is_some();
    if !ok {
        // Leases expire, the reconciler rebuilds spend; token windows stay high (safe side).
        tracing::warn!(ops = ops.len(), "quota not synced to Redis");
    }
    ok
}
