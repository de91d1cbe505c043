//! The controller's counters: `tf_fleet_errors_total{kind}` (one series per `FleetError` kind,
//! plus `database`), reconcile passes, whether this replica leads, wakes from zero replicas
//! (`tf_fleet_wakes_total`, `tf_fleet_wake_failures_total`, counted by the leader that ran them),
//! reloads of idle adapters (`tf_fleet_adapter_reloads_total`,
//! `tf_fleet_adapter_reload_failures_total`, likewise) and the time to first token of requests
//! held for a wake or a reload (`tf_gateway_cold_ttft_seconds`, observed by the gateway replica
//! that held them, from the request's arrival: a streamed answer's first content chunk, a
//! non-streamed answer's whole body, which is when its first token reaches the client).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

/// Error kinds, in the order they are rendered.
const KINDS: [&str; 4] = ["unavailable", "rejected", "conflict", "database"];

#[derive(Debug)]
pub struct FleetMetrics {
    errors: [AtomicU64; 4],
    passes: AtomicU64,
    leader: AtomicBool,
    wakes: AtomicU64,
    wake_failures: AtomicU64,
    reloads: AtomicU64,
    reload_failures: AtomicU64,
    /// Cold requests per [`COLD_BUCKETS`] bucket (plus +Inf last), and their total in ms.
    cold: [AtomicU64; COLD_BUCKETS.len() + 1],
    cold_ms_sum: AtomicU64,
    /// The last cold request's time to first token, in ms (`u64::MAX`: none yet).
    cold_last_ms: AtomicU64,
}

impl Default for FleetMetrics {
    fn default() -> Self {
        Self {
            errors: Default::default(),
            passes: AtomicU64::new(0),
            leader: AtomicBool::new(false),
            wakes: AtomicU64::new(0),
            wake_failures: AtomicU64::new(0),
            reloads: AtomicU64::new(0),
            reload_failures: AtomicU64::new(0),
            cold: Default::default(),
            cold_ms_sum: AtomicU64::new(0),
            cold_last_ms: AtomicU64::new(u64::MAX),
        }
    }
}

/// This replica's cold requests, for `/admin/fleet`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ColdSummary {
    /// Cold requests answered with a first token.
    pub requests: u64,
    /// The last one's time to first token, ms.
    pub last_ms: Option<u64>,
    /// Upper bound (ms) of the histogram bucket holding the median and the 99th percentile
    /// (`None` when it is the unbounded last bucket, above 120 s).
    pub p50_le_ms: Option<u64>,
    pub p99_le_ms: Option<u64>,
}

/// Upper bounds (seconds) of the cold time-to-first-token histogram.
const COLD_BUCKETS: [f64; 9] = [0.5, 1.0, 2.0, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0];
/// The same bounds in milliseconds.
const COLD_BUCKETS_MS: [u64; 9] = [
    500, 1_000, 2_000, 5_000, 10_000, 20_000, 30_000, 60_000, 120_000,
];

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

    pub fn reload(&self) {
        self.reloads.fetch_add(1, Ordering::Relaxed);
    }

    pub fn reloads(&self) -> u64 {
        self.reloads.load(Ordering::Relaxed)
    }

    pub fn reload_failed(&self) {
        self.reload_failures.fetch_add(1, Ordering::Relaxed);
    }

    /// A request held for a wake got its first token from the engine `ttft` after it arrived.
    pub fn cold_ttft(&self, ttft: std::time::Duration) {
        let secs = ttft.as_secs_f64();
        let i = COLD_BUCKETS
            .iter()
            .position(|b| secs <= *b)
            .unwrap_or(COLD_BUCKETS.len());
        self.cold[i].fetch_add(1, Ordering::Relaxed);
        let ms = u64::try_from(ttft.as_millis()).unwrap_or(u64::MAX - 1);
        self.cold_ms_sum.fetch_add(ms, Ordering::Relaxed);
        self.cold_last_ms.store(ms, Ordering::Relaxed);
    }

    /// Count, last value and the buckets of the median and p99 (a histogram gives bounds, not
    /// exact quantiles: the same bounds Prometheus's `histogram_quantile` interpolates within).
    pub fn cold_summary(&self) -> ColdSummary {
        let counts: Vec<u64> = self
            .cold
            .iter()
            .map(|c| c.load(Ordering::Relaxed))
            .collect();
        let requests: u64 = counts.iter().sum();
        let last = self.cold_last_ms.load(Ordering::Relaxed);
        // The bucket holding the q-th request (rank = ceil(q * n)), q in percent.
        let quantile = |pct: u64| -> Option<u64> {
            if requests == 0 {
                return None;
            }
            let rank = (requests * pct).div_ceil(100).max(1);
            let mut seen = 0;
            for (i, n) in counts.iter().enumerate() {
                seen += n;
                if seen >= rank {
                    return COLD_BUCKETS_MS.get(i).copied();
                }
            }
            None
        };
        ColdSummary {
            requests,
            last_ms: (last != u64::MAX).then_some(last),
            p50_le_ms: quantile(50),
            p99_le_ms: quantile(99),
        }
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
        let _ = writeln!(
            out,
            "# TYPE tf_fleet_adapter_reloads_total counter\ntf_fleet_adapter_reloads_total {}",
            self.reloads()
        );
        let _ = writeln!(
            out,
            "# TYPE tf_fleet_adapter_reload_failures_total counter\ntf_fleet_adapter_reload_failures_total {}",
            self.reload_failures.load(Ordering::Relaxed)
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn the_cold_summary_names_the_buckets_of_the_median_and_p99() {
        let m = FleetMetrics::default();
        assert_eq!(m.cold_summary(), ColdSummary::default());
        for ms in [300, 400, 700, 1_500, 3_000] {
            m.cold_ttft(Duration::from_millis(ms));
        }
        // Ranks: median = 3rd of 5 (700 ms, bucket <= 1 s); p99 = 5th (3 s, bucket <= 5 s).
        assert_eq!(
            m.cold_summary(),
            ColdSummary {
                requests: 5,
                last_ms: Some(3_000),
                p50_le_ms: Some(1_000),
                p99_le_ms: Some(5_000),
            }
        );
        m.cold_ttft(Duration::from_secs(200));
        assert_eq!(m.cold_summary().p99_le_ms, None, "beyond the last bound");
    }
}
