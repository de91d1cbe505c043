//! Counters of the journal and shipper, exposed on `/metrics` in Prometheus' text format.

use std::sync::atomic::{AtomicU64, Ordering};

#[derive(Debug, Default)]
pub struct JournalMetrics {
    /// Events appended to the journal by this process.
    pub journaled: AtomicU64,
    /// Events acknowledged by PostgreSQL (new rows, or duplicates absorbed there).
    pub shipped: AtomicU64,
    /// Unshipped bytes on disk, as of the shipper's last pass.
    pub backlog_bytes: AtomicU64,
    /// Seconds between the oldest unshipped event's end and the shipper's last pass.
    pub ship_lag_ms: AtomicU64,
    /// Failed attempts to ship (PostgreSQL unreachable or refusing).
    pub ship_failures: AtomicU64,
    /// Records found corrupt (not torn tails) and skipped.
    pub corrupt_records: AtomicU64,
    /// fsync calls made by the group committer.
    pub fsyncs: AtomicU64,
    /// When the shipper last moved events to PostgreSQL, in unix milliseconds (0: never); the
    /// replica's report to `/admin/ops` carries it.
    pub last_shipped_unix_ms: AtomicU64,
    /// The segment the writer appends to and the length of its records, in one word so that a
    /// reader never pairs one segment's number with another's length: `(number + 1) << 32 |
    /// length` (0: none). The file's own length counts the reserved tail (`mapped`), so the
    /// backlog reads this one's from here.
    active: AtomicU64,
}

/// The length half of [`JournalMetrics::active`]'s word (a segment is under 4 GiB: `writer`).
const LEN_BITS: u64 = u32::MAX as u64;

impl JournalMetrics {
    /// Publishes the active segment and its length (the writer, under its lock).
    pub(super) fn set_active(&self, active: Option<(u64, u64)>) {
        let word = active.map_or(0, |(seq, len)| ((seq + 1) << 32) | (len & LEN_BITS));
        self.active.store(word, Ordering::Release);
    }

    /// The segment the writer appends to and the length of its records, if one is open.
    pub fn active_segment(&self) -> Option<(u64, u64)> {
        let word = self.active.load(Ordering::Acquire);
        (word >> 32)
            .checked_sub(1)
            .map(|seq| (seq, word & LEN_BITS))
    }

    /// Records a shipment acknowledged by PostgreSQL at `at`.
    pub fn mark_shipped(&self, at: time::OffsetDateTime) {
        let ms = u64::try_from(at.unix_timestamp_nanos() / 1_000_000).unwrap_or(0);
        self.last_shipped_unix_ms.store(ms, Ordering::Relaxed);
    }

    /// When the shipper last shipped (`None`: not since start-up).
    pub fn last_shipped(&self) -> Option<time::OffsetDateTime> {
        match self.last_shipped_unix_ms.load(Ordering::Relaxed) {
            0 => None,
            ms => time::OffsetDateTime::from_unix_timestamp_nanos(i128::from(ms) * 1_000_000).ok(),
        }
    }

    /// The figures the admin home shows.
    pub fn snapshot(&self) -> tf_app::model::OpsSnapshot {
        let g = |a: &AtomicU64| a.load(Ordering::Relaxed);
        tf_app::model::OpsSnapshot {
            journaled: g(&self.journaled),
            shipped: g(&self.shipped),
            backlog_bytes: g(&self.backlog_bytes),
            ship_lag_ms: g(&self.ship_lag_ms),
            ship_failures: g(&self.ship_failures),
        }
    }

    pub fn render(&self, out: &mut String) {
        use std::fmt::Write;
        let g = |a: &AtomicU64| a.load(Ordering::Relaxed);
        let rows: [(&str, &str, &str, f64); 7] = [
            (
                "tf_usage_events_journaled_total",
                "counter",
                "Usage events appended to the local journal.",
                g(&self.journaled) as f64,
            ),
            (
                "tf_usage_events_shipped_total",
                "counter",
                "Usage events acknowledged by PostgreSQL.",
                g(&self.shipped) as f64,
            ),
            (
                "tf_journal_backlog_bytes",
                "gauge",
                "Journal bytes not yet acknowledged by PostgreSQL.",
                g(&self.backlog_bytes) as f64,
            ),
            (
                "tf_journal_ship_lag_seconds",
                "gauge",
                "Age of the oldest unshipped usage event.",
                g(&self.ship_lag_ms) as f64 / 1000.0,
            ),
            (
                "tf_journal_ship_failures_total",
                "counter",
                "Failed attempts to ship usage events.",
                g(&self.ship_failures) as f64,
            ),
            (
                "tf_journal_corrupt_records_total",
                "counter",
                "Corrupt journal records skipped.",
                g(&self.corrupt_records) as f64,
            ),
            (
                "tf_journal_fsyncs_total",
                "counter",
                "fsync calls of the journal's group committer.",
                g(&self.fsyncs) as f64,
            ),
        ];
        for (name, kind, help, value) in rows {
            let _ = writeln!(
                out,
                "# HELP {name} {help}\n# TYPE {name} {kind}\n{name} {value}"
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The segment and its length travel in one word: each read is a pair the writer published.
    #[test]
    fn the_active_segment_reads_back_as_published() {
        let m = JournalMetrics::default();
        assert_eq!(m.active_segment(), None);
        m.set_active(Some((0, 0)));
        assert_eq!(m.active_segment(), Some((0, 0)));
        m.set_active(Some((7, 32 * 1024 * 1024)));
        assert_eq!(m.active_segment(), Some((7, 32 * 1024 * 1024)));
        m.set_active(Some((8, 153)));
        assert_eq!(m.active_segment(), Some((8, 153)));
        m.set_active(None);
        assert_eq!(m.active_segment(), None);
    }
}
