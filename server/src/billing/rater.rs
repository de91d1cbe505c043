//! The rater: one leader per cluster (a PostgreSQL session advisory lock held on a connection
//! kept out of the pool, as the spend reconciler) turns new usage events into charge lines of
//! the live rating run, in batches of one set-based statement each (`billing_rate_batch`). The
//! work list is `rating_queue`, filled by the shipper's own INSERT, and each batch removes what it
//! rated in the same transaction, so a crash or a lost leadership loses and doubles nothing;
//! rating an event twice is refused by the lines' key anyway. Failures are logged and retried.

use std::time::Duration;

use sqlx::{Connection, PgConnection, PgPool};
use tf_core::db::billing;
use tf_core::db::leader as advisory;
use tokio_util::sync::CancellationToken;

/// Advisory lock key of the rater ("tfrate" in ASCII).
pub const LOCK_KEY: i64 = 0x0000_7466_7261_7465;

#[derive(Debug, Clone, Copy)]
pub struct RaterOptions {
    /// Pause between passes (a pass rates everything queued).
    pub every: Duration,
    /// Events per statement.
    pub batch: i32,
}

impl Default for RaterOptions {
    fn default() -> Self {
        Self {
            every: Duration::from_secs(1),
            batch: 20_000,
        }
    }
}

/// Runs until `cancel`: competes for the lock, and while leading rates what is queued.
pub async fn run(pool: PgPool, options: RaterOptions, cancel: CancellationToken) {
    let mut leader: Option<PgConnection> = None;
    loop {
        tokio::select! {
            () = cancel.cancelled() => break,
            () = tokio::time::sleep(options.every) => {}
        }
        if leader.is_none() {
            leader = try_lead(&pool).await;
        } else if let Some(conn) = leader.as_mut() {
            // A broken connection has lost the lock: step down and compete again.
            if advisory::ping(conn).await.is_err() {
                leader = None;
                continue;
            }
        }
        if leader.is_some() {
            if let Err(e) = pass(&pool, options.batch, &cancel).await {
                tracing::warn!(error = %e, "rating pass failed");
            }
        }
    }
    if let Some(mut conn) = leader {
        let _ = advisory::unlock(&mut conn, LOCK_KEY).await;
    }
}

/// A connection of its own, not one of the pool's: a leader would otherwise hold one of the
/// pool's connections for as long as it leads.
async fn try_lead(pool: &PgPool) -> Option<PgConnection> {
    let mut conn = PgConnection::connect_with(&pool.connect_options())
        .await
        .ok()?;
    let won = advisory::try_lock(&mut conn, LOCK_KEY).await.ok()?;
    if won {
        Some(conn)
    } else {
        let _ = conn.close().await;
        None
    }
}

/// Rates batches of the live run until the queue is empty or `cancel`; returns the events taken.
pub async fn pass(pool: &PgPool, batch: i32, cancel: &CancellationToken) -> sqlx::Result<i64> {
    let run = billing::live_run(pool).await?;
    let mut total = 0;
    while !cancel.is_cancelled() {
        let n = billing::rate_batch(pool, run, batch).await?;
        if n == 0 {
            break;
        }
        total += n;
    }
    Ok(total)
}
