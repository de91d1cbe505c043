//! Advisor benchmark (issue 36): advising a base over 30 days of 1,000,000 requests (target
//! < 2 s): one pass building the per-minute load, then one pass per candidate (floors 1 to a
//! ceiling of 4, five idle durations: 20 policies). The arrivals are a steady stream with daily
//! bursts and quiet nights, from a fixed seed, sorted as `db::advisor::arrivals` returns them;
//! the time also covers the check that they are sorted. Reading them from PostgreSQL is not
//! timed here.
//!
//! `cargo bench -p tf-core --bench advisor`. Env: `TF_BENCH_EVENTS` (default 1000000).

#![allow(
    clippy::print_stdout,
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic
)]

use std::time::Instant;

use tf_core::economics::advisor::{advise, Arrival, Budget, Template};

const DAY_MS: i64 = 86_400_000;

fn main() {
    let n: usize = std::env::var("TF_BENCH_EVENTS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1_000_000);
    let window_ms = 30 * DAY_MS;
    // A 64-bit LCG: deterministic, no dependency.
    let mut x: u64 = 0x2545_f491_4f6c_dd1d;
    let mut next = move || {
        x = x
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        x >> 33
    };
    let mut arrivals: Vec<Arrival> = (0..n)
        .map(|_| {
            let r = next();
            let day = i64::try_from(r % 30).unwrap() * DAY_MS;
            // Three in four in working hours (08-18), a third of those in the 09:00 burst hour.
            let hour_ms = match r % 12 {
                0..=2 => 9 * 3_600_000,
                3..=8 => (8 + i64::try_from(next() % 10).unwrap()) * 3_600_000,
                _ => i64::try_from(next() % 24).unwrap() * 3_600_000,
            };
            let at_ms = day + hour_ms + i64::try_from(next() % 3_600_000).unwrap();
            let load_milli = i64::try_from(200 + next() % 4_000).unwrap() * 1_000;
            Arrival { at_ms, load_milli }
        })
        .collect();
    arrivals.sort_unstable_by_key(|a| a.at_ms);
    let t = Template {
        ceiling: 4,
        peak_tokens_per_second: 2_500,
        replica_micros_per_hour: 4_000_000,
        cold_start_ms: 90_000,
    };
    let started = Instant::now();
    let advice = advise(
        &mut arrivals,
        window_ms,
        &t,
        1_000_000_000,
        Budget::MaxColdSharePpm(10_000),
        None,
    );
    let took = started.elapsed();
    let best = advice.recommended.map(|i| advice.outcomes[i]);
    println!(
        "advised {} requests over 30 days, {} policies, in {:.3} s (target < 2 s); recommended {:?}",
        advice.requests,
        advice.outcomes.len(),
        took.as_secs_f64(),
        best.map(|o| (o.policy, o.gpu_cost_micros, o.cold_starts))
    );
    assert!(took.as_secs_f64() < 2.0, "advising took {took:?}");
}
