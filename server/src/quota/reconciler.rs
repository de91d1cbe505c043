//! The spend reconciler: one leader per cluster (a PostgreSQL session advisory lock held on a
//! dedicated connection) periodically brings each limited subject's settled-spend counter in Redis
//! up to the spend billed in PostgreSQL this period, so drift (a settle lost while Redis was down,
//! a Redis restart or flush, spend admitted on local limits) self-corrects. It runs at once when
//! Redis comes back, or is reached for the first time after a start without it. Counters are only
//! raised, never lowered: a request's spend reaches Redis before its event reaches PostgreSQL (the
//! usage writers wait for `Quota::spend_flushed`), so PostgreSQL lower than Redis only means
//! events in transit (the journal's shipping lag, or a race with this pass); lowering would forget
//! them and let spend overshoot (an early version did:
//! quota::spend_overshoots_by_at_most_the_reservations_in_flight caught it). The one upward drift
//! left, an event Redis counted but the sink lost, errs on the safe side. Live reservations are
//! kept apart from settled spend, so a pass never touches requests in flight. Failures are logged
//! and retried next pass.

use std::time::Duration;

use sqlx::pool::PoolConnection;
use sqlx::{PgPool, Postgres};
use tf_core::db::leader as advisory;
use tf_core::db::spend::{self, Subject};
use time::OffsetDateTime;
use tokio_util::sync::CancellationToken;

use super::plan;
use super::scripts::SETTLED_TTL_S;
use super::state::Inner;

/// Advisory lock key of the reconciler ("tfquota" in ASCII).
const LOCK_KEY: i64 = 0x0074_6671_756f_7461;

/// Runs until `cancel`: leader election, then a pass every `quota_reconcile_ms` or when Redis
/// comes back.
pub(super) async fn run(inner: std::sync::Arc<Inner>, pool: PgPool, cancel: CancellationToken) {
    // Redis may be reached long after start-up (the connector keeps trying): wait for it.
    tokio::select! {
        () = cancel.cancelled() => return,
        _ = inner.redis.wait() => {}
    }
    let every = Duration::from_millis(inner.cfg.quota_reconcile_ms.max(50));
    let mut leader: Option<PoolConnection<Postgres>> = None;
    loop {
        tokio::select! {
            () = cancel.cancelled() => break,
            () = tokio::time::sleep(every) => {}
            () = inner.recovered.notified() => {}
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
            // This replica's failed SYNCs first, so their spend is not counted twice (here and
            // in the billed sum); other replicas' that race this pass err on the safe side.
            super::sync::resend_failed(&inner).await;
            if let Err(e) = reconcile_once(&inner, &pool).await {
                tracing::warn!(error = %e, "spend reconciliation failed");
            }
        }
    }
    if let Some(mut conn) = leader {
        let _ = advisory::unlock(&mut conn, LOCK_KEY).await;
    }
}

async fn try_lead(pool: &PgPool) -> Option<PoolConnection<Postgres>> {
    let mut conn = pool.acquire().await.ok()?;
    let won = advisory::try_lock(&mut conn, LOCK_KEY).await.ok()?;
    // INVARIANT: the lock is held by this connection's session; keeping the connection out of the
    // pool keeps the lock (test: quota::spend_counters_recover_after_a_redis_outage).
    won.then_some(conn)
}

/// One pass: billed spend this period for every subject with a spend limit, written to Redis.
async fn reconcile_once(inner: &Inner, pool: &PgPool) -> anyhow::Result<usize> {
    let now = OffsetDateTime::now_utc();
    let (period, _) = plan::period(now);
    let start = tf_core::period::month_of(now);
    let rows = spend::billed_by_limited_subject(pool, start).await?;
    for batch in rows.chunks(500) {
        let mut inv = inner.scripts.reconcile.prepare_invoke();
        inv.arg(SETTLED_TTL_S);
        for (subject, billed) in batch {
            let subject = match subject {
                Subject::Tenant(id) => format!("t:{id}"),
                Subject::Key(id) => format!("k:{id}"),
            };
            inv.key(plan::settled_key(&inner.prefix, &subject, &period))
                .arg(*billed);
        }
        inner
            .call::<i64>(&inv)
            .await
            .ok_or_else(|| anyhow::anyhow!("Redis unavailable"))?;
    }
    Ok(rows.len())
}
