//! The syncer: the one regular writer of what this replica owes Redis. Finished requests' spend
//! is group-committed: a settle only queues its spend, and the queue travels with the next SYNC,
//! which the syncer sends every [`TICK`] or at once when somebody needs the spend in Redis now
//! ([`flushed`]: the usage writers, before an event reaches PostgreSQL, since the reconciler
//! relies on Redis never counting less than PostgreSQL has billed, see reconciler.rs). So a
//! request never waits for Redis on its way out, and a busy replica sends tens of SYNCs a second,
//! not one per handful of requests. A settle moves its spend out of this replica's holding into
//! the settled counter; both changes travel in one SYNC, so Redis never sees the holding shrink
//! before the settled spend grows (which would let spend overshoot), and until then the holding
//! (the request's reservation) still counts against the limit on every replica. Every [`TICK`]
//! the syncer also sends window corrections, gives back unspent credit and renews (or shrinks)
//! this replica's holdings. Holdings travel as deltas, so ACQUIREs go on meanwhile and no lock
//! is held across a Redis call. A SYNC that fails is kept and sent again first (see queue.rs).

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use super::queue::Batch;
use super::scripts::{self, SyncOp};
use super::state::{now_ms, Inner};

/// Failed syncs (every batch fails while Redis is down), logged once per interval with a count.
static NOT_SYNCED: super::warn_every::WarnEvery =
    super::warn_every::WarnEvery::new(super::warn_every::EVERY);

/// How often credit is given back and leases renewed.
const TICK: Duration = Duration::from_millis(50);

/// Adds the settled spend `settle` returns (settled-spend key, micros), having changed the
/// holdings to match, to the next SYNC (see `SpendQueue::push`). Without a running syncer
/// (shutdown) it is sent at once.
pub(super) async fn settle_spend(
    inner: &Inner,
    settle: impl FnOnce() -> Vec<(super::plan::Key, i64)>,
) {
    if inner.queue.push(settle) && !inner.queue.running.load(Ordering::Acquire) {
        attempt(inner, None).await;
    }
}

/// Returns once every spend settled so far has been sent to Redis (or given up on for now: Redis
/// down or too slow; the failed batch is sent again when Redis answers).
pub(super) async fn flushed(inner: &Inner) {
    let q = &inner.queue;
    let mut done = q.done.subscribe();
    let Some(target) = q.spend_batch() else {
        return;
    };
    if *done.borrow() >= target {
        return;
    }
    if !q.running.load(Ordering::Acquire) {
        attempt(inner, None).await;
        return;
    }
    q.wake.notify_one();
    let wait = done.wait_for(|d| *d >= target);
    if tokio::time::timeout(inner.cfg.redis_timeout() * 4, wait)
        .await
        .is_err()
    {
        tracing::warn!("quota spend not confirmed by Redis in time");
    }
}

/// Sends the failed batches again, oldest first; true when none is left.
pub(super) async fn resend_failed(inner: &Inner) -> bool {
    while let Some(batch) = inner.queue.oldest_failed(now_ms()) {
        if !send(inner, &batch.ops).await {
            return false;
        }
        inner.queue.resent(batch.seq);
    }
    true
}

/// Runs until `cancel`, then sends what is left once.
pub(super) async fn run(inner: Arc<Inner>, cancel: CancellationToken) {
    let q = &inner.queue;
    q.running.store(true, Ordering::Release);
    let renew_every = inner.cfg.lease_ms() / 3;
    let mut tick = tokio::time::interval(TICK);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut resync = false;
    loop {
        let periodic = tokio::select! {
            () = cancel.cancelled() => break,
            _ = tick.tick() => true,
            () = q.wake.notified() => false,
        };
        let ok = attempt(&inner, periodic.then_some((renew_every, resync))).await;
        if periodic {
            resync = !ok;
        }
    }
    q.running.store(false, Ordering::Release);
    attempt(&inner, None).await;
}

/// One round: failed batches first, then a new one (not while an older batch still fails, so
/// an outage keeps one batch waiting, not one per tick). True when Redis took everything.
async fn attempt(inner: &Inner, periodic: Option<(i64, bool)>) -> bool {
    if !resend_failed(inner).await {
        inner.queue.give_up();
        return false;
    }
    let batch: Batch = inner
        .queue
        .snapshot(&inner.credits, &inner.seq_key, now_ms(), periodic);
    let seq = batch.seq;
    let ok = send(inner, &batch.ops).await;
    if !ok {
        inner.queue.failed(batch);
    }
    inner.queue.mark_done(seq);
    ok
}

/// One SYNC call; true when Redis took it (or there was nothing to send).
async fn send(inner: &Inner, ops: &[SyncOp]) -> bool {
    if ops.is_empty() {
        return true;
    }
    if inner.halted.load(Ordering::Relaxed) {
        return false;
    }
    let lease = inner.cfg.lease_ms();
    let now = now_ms();
    let mut inv = inner.scripts.sync.prepare_invoke();
    scripts::sync_args(&mut inv, ops, now, &inner.rid, now + lease, lease * 2);
    let ok = inner.call::<i64>(&inv).await.is_some();
    if !ok {
        // Kept and sent again; leases expire meanwhile, token windows stay high (safe side).
        if let Some(failures) = NOT_SYNCED.hit() {
            tracing::warn!(
                ops = ops.len(),
                failures,
                "quota not synced to Redis; will retry"
            );
        }
    }
    ok
}
