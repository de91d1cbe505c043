//! Each replica reports its own figures (journal backlog and shipping, open connections) to
//! PostgreSQL's `replica_reports` every couple of seconds, so `/admin/ops`, whichever replica
//! renders it, lists every replica with the time it was last seen. A failed report is logged and
//! simply made again at the next tick (a replica that cannot reach PostgreSQL shows as stale,
//! which is the truth). Rows of replicas gone for a day are deleted by whoever reports.

use std::sync::Arc;
use std::time::Duration;

use sqlx::PgPool;
use tf_core::db::replicas::{self, Report};
use time::OffsetDateTime;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use crate::http_server::ServerMetrics;
use crate::journal::JournalMetrics;

/// How often a replica reports by default (`AppOptions::replica_report_every`).
pub const REPORT_EVERY: Duration = Duration::from_secs(2);
/// Rows not refreshed for this long are deleted.
const FORGET_AFTER_SECS: i64 = 86_400;
/// Deleting old rows is done once every this many reports.
const FORGET_EVERY: u64 = 300;

/// What one replica reports about itself.
pub struct Reporter {
    pub pool: PgPool,
    /// This process: a new id at every start.
    pub replica_id: Uuid,
    pub hostname: String,
    pub started_at: OffsetDateTime,
    /// The journal's counters (`None`: usage goes to PostgreSQL directly, nothing to ship).
    pub journal: Option<Arc<JournalMetrics>>,
    pub http: Arc<ServerMetrics>,
}

fn as_i64(n: u64) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

/// The machine's (or pod's) name; `unknown` when the kernel does not say.
pub fn hostname() -> String {
    std::env::var("HOSTNAME")
        .ok()
        .or_else(|| std::fs::read_to_string("/proc/sys/kernel/hostname").ok())
        .map(|h| h.trim().to_owned())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "unknown".to_owned())
}

impl Reporter {
    /// The figures as of now.
    pub fn report(&self) -> Report {
        use std::sync::atomic::Ordering::Relaxed;
        let mut r = Report {
            replica_id: self.replica_id,
            hostname: self.hostname.clone(),
            started_at: Some(self.started_at),
            open_connections: as_i64(self.http.open()),
            ..Report::default()
        };
        if let Some(j) = &self.journal {
            r.backlog_bytes = as_i64(j.backlog_bytes.load(Relaxed));
            r.ship_lag_ms = as_i64(j.ship_lag_ms.load(Relaxed));
            r.last_shipped_at = j.last_shipped();
            r.journaled = as_i64(j.journaled.load(Relaxed));
            r.shipped = as_i64(j.shipped.load(Relaxed));
            r.ship_failures = as_i64(j.ship_failures.load(Relaxed));
        }
        r
    }

    /// Reports every `every` until cancelled.
    pub async fn run(self, every: Duration, cancel: CancellationToken) {
        let mut tick = tokio::time::interval(every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut n: u64 = 0;
        loop {
            tokio::select! {
                () = cancel.cancelled() => break,
                _ = tick.tick() => {}
            }
            if let Err(e) = replicas::report(&self.pool, &self.report()).await {
                tracing::warn!(error = %e, "could not report this replica's figures");
            }
            if n.is_multiple_of(FORGET_EVERY) {
                if let Err(e) = replicas::forget(&self.pool, FORGET_AFTER_SECS).await {
                    tracing::warn!(error = %e, "could not delete old replica reports");
                }
            }
            n = n.wrapping_add(1);
        }
    }
}
