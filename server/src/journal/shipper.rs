//! The shipper: moves journal records to PostgreSQL in batches (one multi-row INSERT; a batch that
//! meets a stored event is inserted again with ON CONFLICT (request_id) DO NOTHING), then advances
//! the cursor and deletes segments PostgreSQL has fully acknowledged. A crash between the insert
//! and the cursor write re-ships that batch on restart; the primary key absorbs it, so every event
//! is counted once.

use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use sqlx::PgPool;
use time::OffsetDateTime;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use super::metrics::JournalMetrics;
use super::segment::{self, Cursor};
use crate::usage::SpendBarrier;
use crate::usage_store;

/// Events per INSERT (17 parameters each; PostgreSQL allows 65,535 per statement).
const BATCH: usize = 2_000;
const BATCH_BYTES: usize = 8 * 1024 * 1024;
/// Pause after a pass that found less than a full batch.
const IDLE: Duration = Duration::from_millis(20);
/// Longest a caught-up shipper goes without a pass when the journal takes no write (its gauges
/// are refreshed at least this often).
const IDLE_RECHECK: Duration = Duration::from_secs(1);
const MAX_BACKOFF: Duration = Duration::from_secs(5);

pub struct Shipper {
    dir: PathBuf,
    pool: PgPool,
    metrics: Arc<JournalMetrics>,
    cursor: tokio::sync::Mutex<Option<Cursor>>,
    spend: Option<SpendBarrier>,
    /// The journal's append signal: a caught-up shipper sleeps until it instead of passing
    /// again every [`IDLE`].
    appended: Option<Arc<Notify>>,
    /// [`IDLE_RECHECK`], longer in the test that proves an append wakes the shipper.
    idle_recheck: Duration,
}

impl Shipper {
    pub fn new(dir: PathBuf, pool: PgPool, metrics: Arc<JournalMetrics>) -> Self {
        Self {
            dir,
            pool,
            metrics,
            cursor: tokio::sync::Mutex::new(None),
            spend: None,
            appended: None,
            idle_recheck: IDLE_RECHECK,
        }
    }

    /// Sleeps while caught up until `appended` is notified (the journal's
    /// [`super::Journal::appended`]), so an idle replica's shipper does not wake 50 times a second.
    pub fn waking_on(mut self, appended: Arc<Notify>) -> Self {
        self.appended = Some(appended);
        self
    }

    /// Sets how long a caught-up shipper may go without a pass (default [`IDLE_RECHECK`]).
    pub fn idle_recheck(mut self, every: Duration) -> Self {
        self.idle_recheck = every;
        self
    }

    /// Waits on `spend` before each batch is inserted (see [`SpendBarrier`]): one wait per
    /// batch, not per event.
    pub fn with_spend_barrier(mut self, spend: SpendBarrier) -> Self {
        self.spend = Some(spend);
        self
    }

    /// Ships until `cancel`, backing off while PostgreSQL is unreachable.
    ///
    /// With [`Self::waking_on`], a pass that found nothing to ship is followed by a sleep until
    /// the journal's next append (or [`IDLE_RECHECK`]) instead of another pass [`IDLE`] later: an
    /// idle pass lists the directory twice and reads the segment on a blocking thread, and 50 of
    /// them a second were a third of an idle replica's CPU (issue 35).
    pub async fn run(self: Arc<Self>, cancel: CancellationToken) {
        let mut backoff = Duration::from_millis(100);
        loop {
            let cursor = *self.cursor.lock().await;
            let pass = self.ship_once().await;
            // Caught up: nothing shipped and the cursor did not move to a later segment.
            let caught_up = matches!(pass, Ok(0)) && *self.cursor.lock().await == cursor;
            if let (true, Some(appended)) = (caught_up, &self.appended) {
                // An append made during the pass left a permit: no append is slept through.
                // The IDLE pause below still follows, so light traffic ships in batches.
                tokio::select! {
                    () = cancel.cancelled() => return,
                    () = appended.notified() => {}
                    () = tokio::time::sleep(self.idle_recheck) => {}
                }
            }
            let pause = match pass {
                Ok(n) => {
                    backoff = Duration::from_millis(100);
                    // A full batch means a backlog: go again at once. Otherwise wait, so that
                    // steady traffic ships in batches of IDLE's worth of events, not one INSERT
                    // (and a directory scan and a cursor write) per handful of requests.
                    if n >= BATCH {
                        Duration::ZERO
                    } else {
                        IDLE
                    }
                }
                Err(e) => {
                    self.metrics.ship_failures.fetch_add(1, Ordering::Relaxed);
                    // INVARIANT: the gauges keep moving while PostgreSQL is down (the failed
                    // pass returned before setting them). Test:
                    // journal::postgres_outage_grows_the_backlog_then_drains_once.
                    self.refresh_gauges().await;
                    tracing::warn!(error = %e, "shipping usage to PostgreSQL failed; retrying");
                    backoff = (backoff * 2).min(MAX_BACKOFF);
                    backoff
                }
            };
            if pause.is_zero() {
                if cancel.is_cancelled() {
                    return;
                }
                continue;
            }
            tokio::select! {
                () = cancel.cancelled() => return,
                () = tokio::time::sleep(pause) => {}
            }
        }
    }

    /// Ships everything journaled so far (graceful shutdown), or gives up at `deadline`.
    pub async fn drain(&self, deadline: Duration) -> anyhow::Result<()> {
        tokio::time::timeout(deadline, async {
            loop {
                if self.ship_once().await? == 0 && self.backlog().await? == 0 {
                    return Ok(());
                }
            }
        })
        .await
        .map_err(|_| anyhow::anyhow!("journal not fully shipped before the deadline"))?
    }

    async fn backlog(&self) -> anyhow::Result<u64> {
        let cursor = self.cursor.lock().await.unwrap_or_default();
        Ok(segment::backlog_bytes(
            &self.dir,
            cursor,
            self.metrics.active_segment(),
        )?)
    }

    /// Sets the backlog and lag gauges from the journal on disk alone (no PostgreSQL): after a
    /// failed pass, so an outage shows as a growing backlog and lag, not as the last good values.
    async fn refresh_gauges(&self) {
        let cursor = *self.cursor.lock().await;
        let dir = self.dir.clone();
        let active = self.metrics.active_segment();
        let gauges = tokio::task::spawn_blocking(move || -> std::io::Result<(u64, Option<u64>)> {
            let cursor = match cursor {
                Some(c) => c,
                None => segment::read_cursor(&dir)?,
            };
            let backlog = segment::backlog_bytes(&dir, cursor, active)?;
            // The oldest unshipped event: the first record at or after the cursor.
            let mut oldest = None;
            for seq in segment::list(&dir)?
                .into_iter()
                .filter(|s| *s >= cursor.seq)
            {
                let offset = if seq == cursor.seq { cursor.offset } else { 0 };
                let end = segment::records_end(seq, active);
                let batch = segment::read_from(&segment::path(&dir, seq), offset, 1, 1 << 20, end)?;
                if let Some(e) = batch.events.first() {
                    let end = e.started_at + time::Duration::milliseconds(i64::from(e.duration_ms));
                    let lag = (OffsetDateTime::now_utc() - end)
                        .whole_milliseconds()
                        .max(0);
                    oldest = Some(u64::try_from(lag).unwrap_or(0));
                    break;
                }
            }
            Ok((backlog, oldest))
        })
        .await;
        if let Ok(Ok((backlog, lag))) = gauges {
            self.metrics.backlog_bytes.store(backlog, Ordering::Relaxed);
            self.metrics
                .ship_lag_ms
                .store(lag.unwrap_or(0), Ordering::Relaxed);
        }
    }

    /// One pass: ships at most one batch. Returns the number of events acknowledged.
    async fn ship_once(&self) -> anyhow::Result<usize> {
        let mut guard = self.cursor.lock().await;
        let mut cursor = match *guard {
            Some(c) => c,
            None => segment::read_cursor(&self.dir)?,
        };
        *guard = Some(cursor);
        let segments = segment::list(&self.dir)?;
        let Some(&seq) = segments.iter().find(|s| **s >= cursor.seq) else {
            return Ok(0);
        };
        if seq > cursor.seq {
            cursor = Cursor { seq, offset: 0 };
        }
        let later = segments.iter().any(|s| *s > seq);
        let path = segment::path(&self.dir, seq);
        let offset = cursor.offset;
        // The writer's segment is read up to its records, not into megabytes of zeros each
        // pass. Taken after the listing, the writer's length is at least what the listed files
        // hold (a closed segment is cut to its records before the next one exists).
        let end = segment::records_end(seq, self.metrics.active_segment());
        let batch = tokio::task::spawn_blocking(move || {
            segment::read_from(&path, offset, BATCH, BATCH_BYTES, end)
        })
        .await??;
        let n = batch.events.len();
        if n > 0 {
            usage_store::store(&self.pool, self.spend.as_ref(), &batch.events).await?;
            self.metrics.shipped.fetch_add(n as u64, Ordering::Relaxed);
            self.metrics.mark_shipped(OffsetDateTime::now_utc());
            let oldest_end = batch
                .events
                .iter()
                .map(|e| e.started_at + time::Duration::milliseconds(i64::from(e.duration_ms)))
                .min();
            if let Some(t) = oldest_end {
                let lag = (OffsetDateTime::now_utc() - t).whole_milliseconds().max(0);
                self.metrics
                    .ship_lag_ms
                    .store(u64::try_from(lag).unwrap_or(0), Ordering::Relaxed);
            }
            cursor.offset = batch.end;
        } else if later {
            // This segment is closed (the writer moved on) and fully shipped, or its remainder
            // is corrupt: move to the next one.
            if batch.corrupt {
                self.metrics.corrupt_records.fetch_add(1, Ordering::Relaxed);
                tracing::error!(
                    segment = seq,
                    offset,
                    "corrupt journal record; skipping the rest of the segment"
                );
            }
            cursor = Cursor {
                seq: seq + 1,
                offset: 0,
            };
        } else {
            self.metrics.ship_lag_ms.store(0, Ordering::Relaxed);
        }
        if Some(cursor) != *guard {
            segment::write_cursor(&self.dir, cursor)?;
            for old in segments.iter().filter(|s| **s < cursor.seq) {
                let _ = std::fs::remove_file(segment::path(&self.dir, *old));
            }
            *guard = Some(cursor);
        }
        self.metrics.backlog_bytes.store(
            segment::backlog_bytes(&self.dir, cursor, self.metrics.active_segment()).unwrap_or(0),
            Ordering::Relaxed,
        );
        Ok(n)
    }
}
