//! A fixed-bucket histogram of atomics: one `fetch_add` per bucket hit plus one for the sum, no
//! lock and no allocation per observation. Rendered in Prometheus' text format (cumulative
//! `_bucket{le}` series, `_sum`, `_count`).

use std::fmt::Write;
use std::sync::atomic::{AtomicU64, Ordering};

/// OpenTelemetry GenAI's advised bounds for `gen_ai.server.request.duration` (seconds).
pub const DURATION_BOUNDS: &[f64] = &[
    0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24, 20.48, 40.96, 81.92,
];
/// OpenTelemetry GenAI's advised bounds for `gen_ai.server.time_to_first_token` (seconds).
pub const TTFT_BOUNDS: &[f64] = &[
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
];
/// OpenTelemetry GenAI's advised bounds for `gen_ai.server.time_per_output_token` (seconds).
pub const TPOT_BOUNDS: &[f64] = &[
    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5,
];
/// OpenTelemetry GenAI's advised bounds for `gen_ai.client.token.usage` (tokens).
pub const TOKEN_BOUNDS: &[f64] = &[
    1.0, 4.0, 16.0, 64.0, 256.0, 1024.0, 4096.0, 16384.0, 65536.0, 262144.0, 1048576.0, 4194304.0,
    16777216.0, 67108864.0,
];

/// Counts per bucket (the last one is `+Inf`) and the sum, in millionths of the unit.
#[derive(Debug)]
pub struct Histogram {
    bounds: &'static [f64],
    counts: Box<[AtomicU64]>,
    sum_micros: AtomicU64,
}

impl Histogram {
    pub fn new(bounds: &'static [f64]) -> Self {
        Self {
            bounds,
            counts: (0..=bounds.len()).map(|_| AtomicU64::new(0)).collect(),
            sum_micros: AtomicU64::new(0),
        }
    }

    /// Observes `micros` millionths of the unit (microseconds for times, micro-tokens for
    /// counts), so integer inputs land in their bucket exactly.
    pub fn observe_micros(&self, micros: u64) {
        let value = micros as f64 / 1e6;
        let i = self
            .bounds
            .iter()
            .position(|b| value <= *b)
            .unwrap_or(self.bounds.len());
        if let Some(c) = self.counts.get(i) {
            c.fetch_add(1, Ordering::Relaxed);
        }
        self.sum_micros.fetch_add(micros, Ordering::Relaxed);
    }

    pub fn observe_ms(&self, ms: u64) {
        self.observe_micros(ms.saturating_mul(1000));
    }

    pub fn count(&self) -> u64 {
        self.counts.iter().map(|c| c.load(Ordering::Relaxed)).sum()
    }

    /// Writes the series of `name` with `labels` (`k="v",...`, without braces; may be empty).
    pub fn render(&self, out: &mut String, name: &str, labels: &str) {
        let sep = if labels.is_empty() { "" } else { "," };
        let mut cumulative = 0;
        for (i, le) in self.bounds.iter().enumerate() {
            cumulative += self.counts[i].load(Ordering::Relaxed);
            let _ = writeln!(
                out,
                "{name}_bucket{{{labels}{sep}le=\"{le}\"}} {cumulative}"
            );
        }
        let count = self.count();
        let braces = if labels.is_empty() {
            String::new()
        } else {
            format!("{{{labels}}}")
        };
        let _ = writeln!(
            out,
            "{name}_bucket{{{labels}{sep}le=\"+Inf\"}} {count}\n{name}_sum{braces} {}\n{name}_count{braces} {count}",
            self.sum_micros.load(Ordering::Relaxed) as f64 / 1e6
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_value_on_a_bound_counts_in_that_bucket_and_buckets_are_cumulative() {
        let h = Histogram::new(&[0.1, 1.0]);
        h.observe_ms(100);
        h.observe_ms(101);
        h.observe_ms(5_000);
        let mut out = String::new();
        h.render(&mut out, "x", "m=\"a\"");
        assert_eq!(
            out,
            "x_bucket{m=\"a\",le=\"0.1\"} 1\nx_bucket{m=\"a\",le=\"1\"} 2\n\
             x_bucket{m=\"a\",le=\"+Inf\"} 3\nx_sum{m=\"a\"} 5.201\nx_count{m=\"a\"} 3\n"
        );
    }
}
