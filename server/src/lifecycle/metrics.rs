//! The controller's counters: `tf_fleet_errors_total{kind}` (one series per `FleetError` kind,
//! plus `database`), reconcile passes, whether this replica leads, wakes from zero replicas
//! (`tf_fleet_wakes_total`, `tf_fleet_wake_failures_total`, counted by the leader that ran them)
//! and the time to first byte of requests held for a wake (`tf_gateway_cold_ttft_seconds`,
//! observed by the gateway replica that held them).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

/// Error kinds, in the order they are rendered.
const KINDS: [&str; 4] = ["unavailable", "rejected", "conflict", "database"];

#[derive(Debug, Default)]
pub struct FleetMetrics {
    errors: [AtomicU64; 4],
    passes: AtomicU64,
    leader: AtomicBool,
    wakes: AtomicU64,
    wake_failures: AtomicU64,
    /// Cold requests per [`COLD_BUCKETS`] bucket (plus +Inf last), and their total in ms.
    cold: [AtomicU64; COLD_BUCKETS.len() + 1],
    cold_ms_sum: AtomicU64,
}

/// Upper bounds (seconds) of the cold time-to-first-byte histogram.
const COLD_BUCKETS: [f64; 9] = [0.5, 1.0, 2.0, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0];

impl FleetMetrics {
    pub fn error(&self, kind: &str) {
        if let Some(i) = KINDS.iter().position(|k| *k == kind) {
            self.errors[i].fetch_add(1, Ordering::Relaxed);
        }
    }

    pub fn errors(&self, kind: &str) -> u64 {
        KINDS
            .iter()
            .position(|k| *k == kind)
            .map_or(0, |i| self.errors[i].load(Ordering::Relaxed))
    }

    pub fn pass(&self) {
        self.passes.fetch_add(1, Ordering::Relaxed);
    }

    pub fn passes(&self) -> u64 {
        self.passes.load(Ordering::Relaxed)
    }

    pub fn set_leader(&self, leader: bool) {
        self.leader.store(leader, Ordering::Relaxed);
    }

    pub fn is_leader(&self) -> bool {
        self.leader.load(Ordering::Relaxed)
    }

    pub fn wake(&self) {
        self.wakes.fetch_add(1, Ordering::Relaxed);
    }

    pub fn wakes(&self) -> u64 {
        self.wakes.load(Ordering::Relaxed)
    }

    pub fn wake_failed(&self) {
        self.wake_failures.fetch_add(1, Ordering::Relaxed);
    }

    /// A request held for a wake got its first byte from the engine after `ttft`.
    pub fn cold_ttft(&self, ttft: std::time::Duration) {
        let secs = ttft.as_secs_f64();
        let i = COLD_BUCKETS
            .iter()
            .position(|b| secs <= *b)
            .unwrap_or(COLD_BUCKETS.len());
        self.cold[i].fetch_add(1, Ordering::Relaxed);
        self.cold_ms_sum.fetch_add(
            u64::try_from(ttft.as_millis()).unwrap_or(u64::MAX),
            Ordering::Relaxed,
        );
    }

    /// Cold requests observed so far.
    pub fn cold_requests(&self) -> u64 {
        self.cold.iter().map(|c| c.load(Ordering::Relaxed)).sum()
    }

    pub fn render(&self, out: &mut String) {
        use std::fmt::Write;
        let _ = writeln!(out, "# TYPE tf_fleet_errors_total counter");
        for (i, kind) in KINDS.iter().enumerate() {
            let _ = writeln!(
                out,
                "tf_fleet_errors_total{{kind=\"{kind}\"}} {}",
                self.errors[i].load(Ordering::Relaxed)
            );
        }
        let _ = writeln!(
            out,
            "# TYPE tf_fleet_reconcile_passes_total counter\ntf_fleet_reconcile_passes_total {}",
            self.passes()
        );
        let _ = writeln!(
            out,
            "# TYPE tf_fleet_leader gauge\ntf_fleet_leader {}",
            u8::from(self.is_leader())
        );
        let _ = writeln!(
            out,
            "# TYPE tf_fleet_wakes_total counter\ntf_fleet_wakes_total {}",
            self.wakes()
        );
        let _ = writeln!(
            out,
            "# TYPE tf_fleet_wake_failures_total counter\ntf_fleet_wake_failures_total {}",
            self.wake_failures.load(Ordering::Relaxed)
        );
        let _ = writeln!(out, "# TYPE tf_gateway_cold_ttft_seconds histogram");
        let mut cumulative = 0;
        for (i, le) in COLD_BUCKETS.iter().enumerate() {
            cumulative += self.cold[i].load(Ordering::Relaxed);
            let _ = writeln!(
                out,
                "tf_gateway_cold_ttft_seconds_bucket{{le=\"{le}\"}} {cumulative}"
            );
        }
        let count = self.cold_requests();
        let _ = writeln!(
            out,
            "tf_gateway_cold_ttft_seconds_bucket{{le=\"+Inf\"}} {count}\n\
             tf_gateway_cold_ttft_seconds_sum {:.3}\ntf_gateway_cold_ttft_seconds_count {count}",
            self.cold_ms_sum.load(Ordering::Relaxed) as f64 / 1000.0
        );
    }
}
