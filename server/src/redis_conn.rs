//! Connecting to Redis without making start-up depend on it. [`connect`] tries once (so a normal
//! start serves shared limits from the first request); if Redis is not there, it leaves a
//! background connector on the given tracker that retries with exponential backoff and fills the
//! [`RedisSlot`] when Redis answers, at which point the quota layer and the login throttle switch
//! from per-replica to shared counting and the spend reconciler starts. A URL that does not parse
//! is a configuration error: logged, and never retried.

use std::time::Duration;

use redis::aio::ConnectionManager;
use tf_core::redis_slot::RedisSlot;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

/// How long one connection attempt may take.
const ATTEMPT_TIMEOUT: Duration = Duration::from_secs(3);
/// The first pause between attempts; it doubles up to [`MAX_RETRY`].
const FIRST_RETRY: Duration = Duration::from_millis(250);
/// The longest pause between attempts.
const MAX_RETRY: Duration = Duration::from_secs(15);

/// Connects to Redis at `url`, or returns an empty slot that a connector task (on `tracker`,
/// stopped by `cancel`) fills once Redis answers.
pub async fn connect(url: &str, tracker: &TaskTracker, cancel: CancellationToken) -> RedisSlot {
    let client = match redis::Client::open(url) {
        Ok(c) => c,
        Err(e) => {
            tracing::warn!(error = %e, "REDIS_URL is invalid; running without Redis");
            return RedisSlot::empty();
        }
    };
    let slot = RedisSlot::empty();
    if let Some(conn) = attempt(&client).await {
        slot.fill(conn);
        return slot;
    }
    tracing::warn!(
        "Redis is unreachable; running on per-replica limits and retrying in the background"
    );
    tracker.spawn(keep_trying(client, slot.clone(), cancel));
    slot
}

async fn attempt(client: &redis::Client) -> Option<ConnectionManager> {
    // The manager's own settings stay the defaults: they also govern its reconnections later.
    match tokio::time::timeout(ATTEMPT_TIMEOUT, client.get_connection_manager()).await {
        Ok(Ok(conn)) => Some(conn),
        Ok(Err(e)) => {
            tracing::debug!(error = %e, "Redis connection attempt failed");
            None
        }
        Err(_) => {
            tracing::debug!("Redis connection attempt timed out");
            None
        }
    }
}

async fn keep_trying(client: redis::Client, slot: RedisSlot, cancel: CancellationToken) {
    let mut pause = FIRST_RETRY;
    loop {
        tokio::select! {
            () = cancel.cancelled() => return,
            () = tokio::time::sleep(pause) => {}
        }
        let attempted = tokio::select! {
            () = cancel.cancelled() => return,
            conn = attempt(&client) => conn,
        };
        if let Some(conn) = attempted {
            slot.fill(conn);
            tracing::info!("Redis reachable: limits and login throttling are shared again");
            return;
        }
        pause = (pause * 2).min(MAX_RETRY);
    }
}
