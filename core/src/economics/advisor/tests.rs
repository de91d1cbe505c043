use std::collections::BTreeMap;

use proptest::prelude::*;

use super::*;

const HOUR: i64 = 3_600_000;
const DAY: i64 = 24 * HOUR;

/// $3.60 an hour per replica: exactly 1,000 micros a second, so costs read as seconds.
fn template(ceiling: i64, cold_start_ms: i64) -> Template {
    Template {
        ceiling,
        peak_tokens_per_second: 1_000,
        replica_micros_per_hour: 3_600_000,
        cold_start_ms,
    }
}

fn at(ms: &[i64]) -> Vec<Arrival> {
    ms.iter()
        .map(|&at_ms| Arrival {
            at_ms,
            load_milli: 1_000_000,
        })
        .collect()
}

fn outcome(advice: &Advice, floor: i64, idle: Option<i64>) -> Outcome {
    let p = Policy {
        floor,
        idle_after_secs: idle,
    };
    *advice
        .outcomes
        .iter()
        .find(|o| o.policy == p)
        .unwrap_or_else(|| panic!("no outcome for {p:?}"))
}

/// Four requests on one day: 01:00, 01:00:30, 01:10, 05:00; a wake takes 60 s.
fn four() -> Vec<Arrival> {
    at(&[HOUR, HOUR + 30_000, HOUR + 600_000, 5 * HOUR])
}

#[test]
fn a_day_replayed_by_hand() {
    let t = template(2, 60_000);
    let a = advise(
        &mut four(),
        DAY,
        &t,
        1_000_000,
        Budget::MaxColdSharePpm(1_000_000),
        None,
    );
    assert_eq!(a.requests, 4);
    assert_eq!(a.outcomes.len(), 10);
    // 15 min: woken at 01:00 (ready 01:01; the 01:00:30 request waits 30 s), idle from 01:10
    // until 01:25; woken again at 05:00 until 05:16 (ready 05:01 + 15 min).
    // Awake 1,500 s + 960 s = 2,460 s at 1,000 micros/s.
    let q = outcome(&a, 1, Some(900));
    assert_eq!(q.awake_seconds, 2_460);
    assert_eq!(q.gpu_cost_micros, 2_460_000);
    assert_eq!(q.floor_cost_micros, 2_460_000);
    assert_eq!(q.cold_starts, 2);
    assert_eq!(q.waited_requests, 3);
    assert_eq!(q.waited_share_ppm, 750_000);
    assert_eq!(q.added_wait_ms, 60_000 + 30_000 + 60_000);
    // 4,000 of 2,460,000 tokens: 16.26 bp; the floor idles 2,456,000 of 2,460,000.
    assert_eq!(q.duty_cycle_bp, Some(16));
    assert_eq!(q.idle_floor_cost_micros, 2_456_000);
    assert_eq!(q.margin_micros, 1_000_000 - 2_460_000);
    assert_eq!(q.margin_bp, Some(-14_600));
    // 4 h: one wake (01:00) that lasts to 09:00 (05:00 + 4 h): 28,800 s.
    let h4 = outcome(&a, 1, Some(14_400));
    assert_eq!(
        (h4.awake_seconds, h4.cold_starts, h4.waited_requests),
        (28_800, 1, 2)
    );
    assert_eq!(h4.gpu_cost_micros, 28_800_000);
    // Always on: the whole day, no wake; two replicas cost twice.
    let on = outcome(&a, 1, None);
    assert_eq!(
        (on.gpu_cost_micros, on.cold_starts, on.waited_requests),
        (86_400_000, 0, 0)
    );
    assert_eq!(outcome(&a, 2, None).gpu_cost_micros, 172_800_000);
    // 5 min: three wakes of 360 s each; every request waits (60 + 30 + 60 + 60 s).
    let m5 = outcome(&a, 1, Some(300));
    assert_eq!(
        (m5.gpu_cost_micros, m5.cold_starts, m5.added_wait_ms),
        (1_080_000, 3, 210_000)
    );
    // Any share allowed: the cheapest wins.
    assert_eq!(a.recommended.map(|i| a.outcomes[i].policy), Some(m5.policy));
}

#[test]
fn the_budget_picks_the_cheapest_policy_it_allows() {
    let t = template(2, 60_000);
    let pick = |budget| {
        let a = advise(&mut four(), DAY, &t, 0, budget, None);
        a.recommended.map(|i| a.outcomes[i].policy)
    };
    let p = |floor, idle| {
        Some(Policy {
            floor,
            idle_after_secs: idle,
        })
    };
    // One wake a day: only 4 h (one wake) and always on; 4 h is cheaper.
    assert_eq!(pick(Budget::MaxColdStartsPerDay(1)), p(1, Some(14_400)));
    // 1 % of requests may wait: every idle policy makes at least two of four wait.
    assert_eq!(pick(Budget::MaxColdSharePpm(10_000)), p(1, None));
    assert_eq!(pick(Budget::MaxColdStartsPerDay(3)), p(1, Some(300)));
    assert_eq!(pick(Budget::MaxColdStartsPerDay(-1)), None);
}

#[test]
fn load_above_the_floor_pays_scaled_up_replicas_per_minute() {
    // 150,000 tokens in one minute need three replicas of 60,000 a minute; the ceiling is two.
    let t = template(2, 0);
    let mut a = vec![Arrival {
        at_ms: 10_000,
        load_milli: 150_000_000,
    }];
    let advice = advise(&mut a, DAY, &t, 0, Budget::MaxColdStartsPerDay(10), None);
    let on1 = outcome(&advice, 1, None);
    assert_eq!(on1.scaled_replica_seconds, 60);
    assert_eq!(on1.gpu_cost_micros, 86_400_000 + 60_000);
    assert_eq!(on1.floor_cost_micros, 86_400_000);
    assert_eq!(outcome(&advice, 2, None).scaled_replica_seconds, 0);
    // Capacity 86,460 s x 1,000 tokens: 150,000 of it is 17.35 bp.
    assert_eq!(on1.duty_cycle_bp, Some(17));
}

#[test]
fn an_off_grid_current_policy_is_replayed_too_and_the_frontier_is_pareto() {
    let t = template(1, 60_000);
    let current = Policy {
        floor: 1,
        idle_after_secs: Some(600),
    };
    let a = advise(
        &mut four(),
        DAY,
        &t,
        0,
        Budget::MaxColdStartsPerDay(9),
        Some(current),
    );
    assert_eq!(a.outcomes.len(), 6);
    assert!(a.outcomes.iter().any(|o| o.policy == current));
    let f: Vec<_> = a.frontier.iter().map(|&i| a.outcomes[i]).collect();
    assert!(f.windows(2).all(
        |w| w[0].gpu_cost_micros <= w[1].gpu_cost_micros && w[0].cold_starts > w[1].cold_starts
    ));
    for o in &a.outcomes {
        assert!(f
            .iter()
            .any(|g| g.gpu_cost_micros <= o.gpu_cost_micros && g.cold_starts <= o.cold_starts));
    }
    assert_eq!(f.last().map(|o| o.policy.idle_after_secs), Some(None));
}

#[test]
fn shares_parse_exactly() {
    assert_eq!(parse_share_ppm("0.01"), Some(10_000));
    assert_eq!(parse_share_ppm(".5"), Some(500_000));
    assert_eq!(parse_share_ppm("1"), Some(1_000_000));
    assert_eq!(parse_share_ppm("0.000001"), Some(1));
    for bad in ["", ".", "1.5", "-0.1", "0.0000001", "1e-2", "x"] {
        assert_eq!(parse_share_ppm(bad), None, "{bad:?}");
    }
}

/// A second-by-second simulation of the same rules, written the slow obvious way: whether the
/// graph is awake in each second, and who waits.
fn naive(
    arrivals: &[(i64, i64)],
    window_s: i64,
    cold_s: i64,
    idle: Option<i64>,
) -> (i64, i64, i64) {
    let Some(idle) = idle else {
        return (window_s, 0, 0);
    };
    let (mut awake, mut cold, mut waited) = (0, 0, 0);
    let (mut asleep, mut ready, mut last) = (true, 0, 0);
    for s in 0..window_s {
        for _ in arrivals.iter().filter(|(t, _)| *t == s) {
            if asleep {
                asleep = false;
                cold += 1;
                ready = s + cold_s;
            }
            if s < ready {
                waited += 1;
            }
            last = s;
        }
        if !asleep {
            awake += 1;
            if s + 1 >= last.max(ready) + idle {
                asleep = true;
            }
        }
    }
    (awake, cold, waited)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    /// The recommendation is the brute-force optimum over the grid, each candidate simulated
    /// second by second.
    #[test]
    fn the_recommendation_is_the_brute_force_optimum(
        mut secs in proptest::collection::vec((0i64..21_600, 0i64..150_000), 0..40),
        cold_s in 0i64..600,
        ceiling in 1i64..4,
        by_share in any::<bool>(),
        limit in 0i64..5,
    ) {
        secs.sort_unstable();
        let window_s = 21_600;
        let t = template(ceiling, cold_s * 1000);
        let budget = if by_share {
            Budget::MaxColdSharePpm(limit * 200_000)
        } else {
            Budget::MaxColdStartsPerDay(limit * 4)
        };
        let mut arrivals: Vec<Arrival> = secs
            .iter()
            .map(|&(s, tokens)| Arrival { at_ms: s * 1000, load_milli: tokens * 1000 })
            .collect();
        let advice = advise(&mut arrivals, window_s * 1000, &t, 0, budget, None);
        let mut minutes: BTreeMap<i64, i64> = BTreeMap::new();
        for &(s, tokens) in &secs {
            *minutes.entry(s / 60).or_default() += tokens;
        }
        let n = i64::try_from(secs.len()).unwrap_or(0);
        // (cost, cold starts, waited, floor, idle) ordered as the advisor ranks, and the policy.
        type Ranked = ((i64, i64, i64, i64, i64), Policy);
        let mut best: Option<Ranked> = None;
        for floor in 1..=ceiling {
            for idle in IDLE_CANDIDATES {
                let (awake, cold, waited) = naive(&secs, window_s, cold_s, idle);
                let scaled: i64 = minutes
                    .values()
                    .map(|&tok| (((tok + 59_999) / 60_000).min(ceiling) - floor).max(0) * 60)
                    .sum();
                let cost = (awake * floor + scaled) * 1_000;
                let o = outcome(&advice, floor, idle);
                prop_assert_eq!((o.gpu_cost_micros, o.cold_starts, o.waited_requests),
                    (cost, cold, waited), "floor {} idle {:?}", floor, idle);
                let ok = match budget {
                    Budget::MaxColdSharePpm(ppm) => waited * 1_000_000 <= ppm * n,
                    Budget::MaxColdStartsPerDay(k) => cold * 86_400 <= k * window_s,
                };
                let key = (cost, cold, waited, floor, idle.unwrap_or(i64::MAX));
                if ok && best.is_none_or(|(b, _)| key < b) {
                    best = Some((key, Policy { floor, idle_after_secs: idle }));
                }
            }
        }
        prop_assert_eq!(advice.recommended.map(|i| advice.outcomes[i].policy), best.map(|(_, p)| p));
    }
}
