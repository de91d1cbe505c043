//! The rater: one leader per cluster (a PostgreSQL session advisory lock held on a connection
//! kept out of the pool, as the spend reconciler) turns new usage events into charge lines of
//! the live rating run, in batches of one set-based statement each (`billing_rate_batch`). The
//! work list is `rating_queue`, filled by the shipper's own INSERT, and each batch removes what it
//! rated in the same transaction, so a crash or a lost leadership loses and doubles nothing;
//! rating an event twice is refused by the lines' key anyway. Failures are logged and retried.
//!
//! The same leader keeps the monthly drafts ([`drafts_tick`]): every
//! [`RaterOptions::drafts_every`] it rebuilds the draft invoice of each tenant with rated usage
//! in the open UTC month, and once the previous month has been closed for
//! [`RaterOptions::close_grace`] (so late events, journaled while PostgreSQL was away, are in)
//! it builds that month's final draft. It never issues: issuing makes an invoice immutable, so it
//! stays an admin's act (`/admin/invoices`, `tokenfactory admin invoices issue`) after the final
//! draft has been looked at and adjusted if need be. Building is `billing_ops::build_draft`, the
//! admin's own code path, audited (actor `scheduler`), from the runs the draft was built from (a
//! re-rate an admin chose stays chosen), idempotent (a rebuild of unchanged usage stores the
//! same figures; an issued month is left alone).

use std::time::Duration;

use sqlx::{Connection, PgConnection, PgPool};
use tf_core::accounts::AccountError;
use tf_core::billing_ops;
use tf_core::db::leader as advisory;
use tf_core::db::{billing, invoicing};
use time::{Date, OffsetDateTime};
use tokio_util::sync::CancellationToken;

/// Advisory lock key of the rater ("tfrate" in ASCII).
pub const LOCK_KEY: i64 = 0x0000_7466_7261_7465;

#[derive(Debug, Clone, Copy)]
pub struct RaterOptions {
    /// Pause between passes (a pass rates everything queued).
    pub every: Duration,
    /// Events per statement.
    pub batch: i32,
    /// How often the open month's drafts are rebuilt.
    pub drafts_every: Duration,
    /// How long after a month ends its final draft is built.
    pub close_grace: Duration,
}

impl Default for RaterOptions {
    fn default() -> Self {
        Self {
            every: Duration::from_secs(1),
            batch: 20_000,
            drafts_every: Duration::from_secs(300),
            close_grace: Duration::from_secs(3_600),
        }
    }
}

/// Runs until `cancel`: competes for the lock, and while leading rates what is queued.
pub async fn run(pool: PgPool, options: RaterOptions, cancel: CancellationToken) {
    let mut leader: Option<PgConnection> = None;
    let mut drafts = Drafts::default();
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
            let now = OffsetDateTime::now_utc();
            if let Err(e) = drafts_tick(&pool, now, &options, &mut drafts).await {
                tracing::warn!(error = %e, "building the monthly drafts failed");
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

/// What the draft scheduler remembers between ticks (the leader's own; a new leader starts
/// afresh, which at worst builds once more what is already built).
#[derive(Debug, Clone, Default)]
pub struct Drafts {
    /// When the open month's drafts were last built.
    open_built_at: Option<OffsetDateTime>,
    /// The closed month whose final drafts were built.
    closed_built: Option<Date>,
}

/// What one [`drafts_tick`] built.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DraftsBuilt {
    /// Drafts of the open month (re)built.
    pub open: usize,
    /// Final drafts of the month just closed.
    pub closed: usize,
    /// Tenants whose month already had an issued invoice (left alone).
    pub issued: usize,
}

pub use tf_core::period::{month_of, previous_month};

async fn build_month(
    pool: &PgPool,
    run: i64,
    month: Date,
    built: &mut DraftsBuilt,
) -> Result<usize, AccountError> {
    let mut n = 0;
    for tenant in invoicing::tenants_to_invoice(pool, run, month).await? {
        // The runs the draft was built from (an admin's re-rate stays chosen), audited.
        let draft = billing_ops::build_draft(
            pool,
            &billing_ops::SCHEDULER,
            tenant,
            month,
            billing::Runs::Kept,
        )
        .await;
        match draft {
            Ok(billing::Draft::Built(_)) => n += 1,
            Ok(billing::Draft::AlreadyIssued(_)) => built.issued += 1,
            Ok(billing::Draft::RunRefused(_)) => {}
            // A kept run that no longer fits (the month was closed early since): left for the
            // admin, who sees the draft's sources; the other tenants are built.
            Err(AccountError::Invalid(why)) => {
                tracing::warn!(%tenant, %month, %why, "a draft keeps a run it cannot use");
            }
            Err(e) => return Err(e),
        }
    }
    Ok(n)
}

/// One step of the monthly drafts at `now` (the leader calls it after each rating pass; tests
/// call it with the time they choose): rebuilds the open month's drafts when
/// `options.drafts_every` has passed since the last time, and the previous month's final drafts
/// once `options.close_grace` after it ended, once.
pub async fn drafts_tick(
    pool: &PgPool,
    now: OffsetDateTime,
    options: &RaterOptions,
    state: &mut Drafts,
) -> Result<DraftsBuilt, AccountError> {
    let mut built = DraftsBuilt::default();
    let open = month_of(now);
    let due = state
        .open_built_at
        .is_none_or(|at| now - at >= options.drafts_every || month_of(at) != open);
    let closed = previous_month(open);
    let grace_over = now - open.midnight().assume_utc() >= options.close_grace;
    let close_due = grace_over && state.closed_built != Some(closed);
    if !due && !close_due {
        return Ok(built);
    }
    let run = billing::live_run(pool).await?;
    if close_due {
        built.closed = build_month(pool, run, closed, &mut built).await?;
        state.closed_built = Some(closed);
        tracing::info!(month = %closed, drafts = built.closed, "built the closed month's final drafts");
    }
    if due {
        built.open = build_month(pool, run, open, &mut built).await?;
        state.open_built_at = Some(now);
    }
    Ok(built)
}
