//! Deletes stored bodies older than their tenant's retention period. One replica does it (the
//! holder of an advisory lock, as the other cluster-wide jobs); the others keep trying to lead.

use std::time::Duration;

use sqlx::{Connection, PgConnection, PgPool};
use time::OffsetDateTime;
use tokio_util::sync::CancellationToken;

/// The retention job's advisory lock ("tfbodies").
const LOCK_KEY: i64 = 0x7466_626f_6469_6573;

/// How often the leader deletes expired bodies.
pub const EVERY: Duration = Duration::from_secs(600);

/// Runs until `cancel`: a pass every `every` while this replica leads.
pub async fn run(pool: PgPool, every: Duration, cancel: CancellationToken) {
    let mut leader: Option<PgConnection> = None;
    // The first pass waits a period: a replica starting up has nothing urgent to delete, and a
    // pass at start would race a test that runs its own pass at a clock of its choosing.
    let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + every, every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            () = cancel.cancelled() => break,
            _ = tick.tick() => {}
        }
        if let Some(conn) = leader.as_mut() {
            // A broken connection has lost the lock: step down and compete again.
            if tf_core::db::leader::ping(conn).await.is_err() {
                leader = None;
            }
        }
        if leader.is_none() {
            leader = try_lead(&pool).await;
        }
        if leader.is_some() {
            match pass(&pool, OffsetDateTime::now_utc()).await {
                Ok(0) => {}
                Ok(n) => tracing::info!(deleted = n, "expired stored bodies deleted"),
                Err(e) => tracing::warn!(error = %e, "could not delete expired stored bodies"),
            }
        }
    }
    if let Some(mut conn) = leader {
        let _ = tf_core::db::leader::unlock(&mut conn, LOCK_KEY).await;
    }
}

/// Most rows one DELETE statement removes.
const CHUNK: i64 = 5_000;

/// One pass as of `now`: deletes every tenant's bodies older than its retention period, a
/// bounded statement at a time; returns how many.
pub async fn pass(pool: &PgPool, now: OffsetDateTime) -> sqlx::Result<u64> {
    let mut total = 0;
    loop {
        let n = tf_core::db::bodies::delete_expired(pool, now, CHUNK).await?;
        total += n;
        if n < CHUNK.unsigned_abs() {
            return Ok(total);
        }
    }
}

/// A connection of its own, not one of the pool's: a leader would otherwise hold one of the
/// pool's connections for as long as it leads.
async fn try_lead(pool: &PgPool) -> Option<PgConnection> {
    let mut conn = PgConnection::connect_with(&pool.connect_options())
        .await
        .ok()?;
    let won = tf_core::db::leader::try_lock(&mut conn, LOCK_KEY)
        .await
        .ok()?;
    // The lock lives in this connection's session: keeping it out of the pool keeps the lock.
    if won {
        Some(conn)
    } else {
        let _ = conn.close().await;
        None
    }
}
