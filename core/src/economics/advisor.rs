//! The floor and idle-policy advisor (issue 36): replays a base's request arrivals against each
//! candidate serving policy and says what each would have cost and how many requests would have
//! waited for a cold start, then recommends the cheapest policy within the admin's cold-start
//! budget. No I/O: `db::advisor` reads the inputs.
//!
//! The model, stated once (shown with the advice):
//! - a policy is a *floor* (replicas while the graph is awake, 1 to the ceiling: the template's
//!   `replicas_min`) and an *idle-after* (the graph sleeps at zero replicas once nothing arrived
//!   for that long: `idle_after_secs`; `None` is always on). Scaling to zero is the idle-after
//!   axis: a floor of 0 would never serve, so it is not a candidate;
//! - an always-on graph is warm for the whole window; an idle policy starts the window asleep;
//! - a request that finds the graph asleep starts a wake (a *cold start*); it and every request
//!   arriving before the wake ends wait until then (`cold_start_ms`, measured from the fleet's
//!   state history); the graph then stays awake until `idle_after` after the later of its last
//!   arrival and the end of the wake (the controller's rule: idle since the later of last
//!   activity and the last state change). GPUs are paid from the wake's start;
//! - above the floor, replicas follow the load per minute: a minute's replicas are its load over
//!   one replica's peak for a minute, rounded up, at most the ceiling (the scaled-up ones are paid
//!   for that minute; an autoscaler's minute granularity);
//! - a request's load is its tokens weighted by kind, x 1,000
//!   ([`crate::economics::Served::load_milli`]); revenue is the window's rated revenue, the same
//!   under every policy (held requests are served, late).
//!
//! Linear: one pass over the sorted arrivals builds the per-minute load histogram, then one pass
//! per policy; the scaled-up time of a floor is read off the histogram.
//!
//! Money is integer micro-units, each figure rounded once, half-up ([`div_half_up`]); shares are
//! parts per million, ratios basis points.

use serde::Serialize;

use super::div_half_up;

const MS_PER_HOUR: i128 = 3_600_000;
const BUCKET_MS: i64 = 60_000;
const BP: i128 = 10_000;
const PPM: i128 = 1_000_000;

/// The cold start assumed when a base's history holds no measured wake (the CLI's
/// `--cold-start-secs` default and the admin page's).
pub const FALLBACK_COLD_START_MS: i64 = 120_000;

/// The idle-after durations tried, in seconds, and always on (`None`).
pub const IDLE_CANDIDATES: [Option<i64>; 5] =
    [Some(300), Some(900), Some(3_600), Some(14_400), None];

/// One request: when it arrived (milliseconds from the window's start) and its load (tokens
/// weighted by kind, x 1,000).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Arrival {
    pub at_ms: i64,
    pub load_milli: i64,
}

/// What the replay needs of the base: its ceiling, one replica's peak and price, and how long a
/// wake takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Template {
    pub ceiling: i64,
    pub peak_tokens_per_second: i64,
    /// GPU micro-units per hour x GPUs per replica.
    pub replica_micros_per_hour: i64,
    pub cold_start_ms: i64,
}

/// A serving policy: the floor while awake, and the idle time after which the graph sleeps.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
pub struct Policy {
    pub floor: i64,
    pub idle_after_secs: Option<i64>,
}

/// The admin's cold-start budget.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum Budget {
    /// At most this share of requests wait for a wake, in parts per million (0.01 = 10,000).
    MaxColdSharePpm(i64),
    /// At most this many wakes per day on average over the window.
    MaxColdStartsPerDay(i64),
}

/// What one policy would have done over the window.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Outcome {
    pub policy: Policy,
    pub gpu_cost_micros: i64,
    /// The floor's part of the GPU cost; the rest is scaled-up replicas.
    pub floor_cost_micros: i64,
    /// The floor's cost times the share of its capacity left unused (traffic fills it first).
    pub idle_floor_cost_micros: i64,
    pub awake_seconds: i64,
    pub scaled_replica_seconds: i64,
    pub cold_starts: i64,
    /// Requests that waited for a wake, and their share of all requests (ppm).
    pub waited_requests: i64,
    pub waited_share_ppm: i64,
    /// All the waiting added up, in milliseconds (each wake's first request waits a whole cold
    /// start, those arriving during the wake less).
    pub added_wait_ms: i64,
    pub duty_cycle_bp: Option<i64>,
    pub margin_micros: i64,
    pub margin_bp: Option<i64>,
}

/// The advice for a base: every candidate's outcome, which are on the cost versus cold-start
/// frontier, and the recommendation.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Advice {
    pub window_ms: i64,
    pub requests: i64,
    /// The window's load in tokens (weighted by kind), rounded once.
    pub load_tokens: i64,
    pub revenue_micros: i64,
    pub template: Template,
    pub budget: Budget,
    pub outcomes: Vec<Outcome>,
    /// Indexes into `outcomes` of the policies no other beats on both cost and cold starts.
    pub frontier: Vec<usize>,
    /// The index of the cheapest policy within the budget (always-on has no cold start, so one
    /// always is unless the budget is negative).
    pub recommended: Option<usize>,
}

/// The candidate grid: floors 1 to the ceiling, each with every idle duration.
pub fn candidates(ceiling: i64) -> Vec<Policy> {
    (1..=ceiling.max(1))
        .flat_map(|floor| {
            IDLE_CANDIDATES.iter().map(move |&idle_after_secs| Policy {
                floor,
                idle_after_secs,
            })
        })
        .collect()
}

/// The per-minute load, as a histogram: `counts[n]` minutes needed `n` replicas (at most the
/// ceiling). One pass over the arrivals (sorted or not).
pub fn load_histogram(arrivals: &[Arrival], window_ms: i64, t: &Template) -> Vec<i64> {
    let ceiling = usize::try_from(t.ceiling.max(1)).unwrap_or(1);
    let buckets = usize::try_from(window_ms.max(0) / BUCKET_MS + 1).unwrap_or(1);
    let mut tokens = vec![0i64; buckets];
    for a in arrivals {
        let b = usize::try_from(a.at_ms.clamp(0, window_ms.max(0)) / BUCKET_MS).unwrap_or(0);
        if let Some(slot) = tokens.get_mut(b) {
            *slot = slot.saturating_add(a.load_milli.max(0));
        }
    }
    // One replica's minute, in tokens x 1,000.
    let per_minute = i128::from(t.peak_tokens_per_second.max(1)) * i128::from(BUCKET_MS);
    let mut counts = vec![0i64; ceiling + 1];
    for &n in &tokens {
        let needed = (i128::from(n) + per_minute - 1) / per_minute;
        let needed = usize::try_from(needed).unwrap_or(ceiling).min(ceiling);
        if let Some(c) = counts.get_mut(needed) {
            *c += 1;
        }
    }
    counts
}

/// Replays sorted `arrivals` against `p` (see the module's model).
pub fn replay(
    arrivals: &[Arrival],
    histogram: &[i64],
    window_ms: i64,
    t: &Template,
    p: Policy,
    revenue_micros: i64,
) -> Outcome {
    let window_ms = window_ms.max(0);
    let cold = t.cold_start_ms.max(0);
    let (mut awake_ms, mut cold_starts, mut waited, mut wait_ms) = (0i64, 0i64, 0i64, 0i64);
    match p.idle_after_secs {
        None => awake_ms = window_ms,
        Some(idle) => {
            let idle_ms = idle.saturating_mul(1000);
            // The current awake spell: its start, when its wake ends, and when it goes idle.
            let mut spell: Option<(i64, i64, i64)> = None;
            for a in arrivals {
                let at = a.at_ms;
                let (start, ready, sleeps) = match spell {
                    Some((start, ready, sleeps)) if at < sleeps => (start, ready, sleeps),
                    previous => {
                        if let Some((start, _, sleeps)) = previous {
                            awake_ms += sleeps.min(window_ms) - start;
                        }
                        cold_starts += 1;
                        (at, at.saturating_add(cold), 0)
                    }
                };
                if at < ready {
                    waited += 1;
                    wait_ms += ready - at;
                }
                let sleeps = sleeps.max(at.max(ready).saturating_add(idle_ms));
                spell = Some((start, ready, sleeps));
            }
            if let Some((start, _, sleeps)) = spell {
                awake_ms += sleeps.min(window_ms) - start;
            }
        }
    }
    let floor = p.floor.max(1);
    let scaled_ms: i128 = histogram
        .iter()
        .enumerate()
        .map(|(n, &minutes)| {
            let over = i128::try_from(n).unwrap_or(0) - i128::from(floor);
            over.max(0) * i128::from(minutes) * i128::from(BUCKET_MS)
        })
        .sum();
    let per_hour = i128::from(t.replica_micros_per_hour);
    let floor_ms = i128::from(awake_ms) * i128::from(floor);
    let floor_num = floor_ms * per_hour;
    let cost_num = (floor_ms + scaled_ms) * per_hour;
    let gpu_cost_micros = div_half_up(cost_num, MS_PER_HOUR);
    let peak = i128::from(t.peak_tokens_per_second);
    // Capacities in tokens x 1,000 (replica-ms x tokens/s).
    let floor_capacity = floor_ms * peak;
    let capacity = (floor_ms + scaled_ms) * peak;
    let load: i128 = arrivals
        .iter()
        .map(|a| i128::from(a.load_milli.max(0)))
        .sum();
    let unused_floor = (floor_capacity - load).max(0);
    let margin_micros = revenue_micros.saturating_sub(gpu_cost_micros);
    let requests = i128::try_from(arrivals.len()).unwrap_or(i128::MAX);
    Outcome {
        policy: p,
        gpu_cost_micros,
        floor_cost_micros: div_half_up(floor_num, MS_PER_HOUR),
        idle_floor_cost_micros: if floor_capacity > 0 {
            div_half_up(floor_num * unused_floor, MS_PER_HOUR * floor_capacity)
        } else {
            0
        },
        awake_seconds: div_half_up(i128::from(awake_ms), 1000),
        scaled_replica_seconds: div_half_up(scaled_ms, 1000),
        cold_starts,
        waited_requests: waited,
        waited_share_ppm: if requests > 0 {
            div_half_up(i128::from(waited) * PPM, requests)
        } else {
            0
        },
        added_wait_ms: wait_ms,
        duty_cycle_bp: (capacity > 0).then(|| div_half_up(load * BP, capacity)),
        margin_micros,
        margin_bp: (revenue_micros > 0)
            .then(|| div_half_up(i128::from(margin_micros) * BP, i128::from(revenue_micros))),
    }
}

/// Whether `o` keeps to `budget` over a window of `window_ms`. Exact: the share is compared as
/// waited x 1,000,000 <= ppm x requests; wakes per day as wakes x one day <= N x the window.
pub fn within(budget: Budget, o: &Outcome, requests: i64, window_ms: i64) -> bool {
    match budget {
        Budget::MaxColdSharePpm(ppm) => {
            i128::from(o.waited_requests) * PPM <= i128::from(ppm) * i128::from(requests)
        }
        Budget::MaxColdStartsPerDay(n) => {
            i128::from(o.cold_starts) * 86_400_000 <= i128::from(n) * i128::from(window_ms)
        }
    }
}

/// The order of preference among policies within the budget: cheaper, then fewer cold starts,
/// then fewer waiting requests, then the smaller floor and the shorter idle time (always on
/// last), so the choice is deterministic.
pub fn preference(o: &Outcome) -> (i64, i64, i64, i64, i64) {
    (
        o.gpu_cost_micros,
        o.cold_starts,
        o.waited_requests,
        o.policy.floor,
        o.policy.idle_after_secs.unwrap_or(i64::MAX),
    )
}

/// The policies that no other beats on both GPU cost and cold starts (one of each tie kept),
/// cheapest first.
pub fn frontier(outcomes: &[Outcome]) -> Vec<usize> {
    let mut order: Vec<usize> = (0..outcomes.len()).collect();
    order.sort_by_key(|&i| outcomes.get(i).map(preference));
    let mut out = Vec::new();
    let mut fewest = i64::MAX;
    for i in order {
        if let Some(o) = outcomes.get(i) {
            if o.cold_starts < fewest {
                fewest = o.cold_starts;
                out.push(i);
            }
        }
    }
    out
}

/// Replays every candidate (the grid, plus `extra` such as the base's current policy when it is
/// off the grid) and recommends the cheapest within `budget`.
pub fn advise(
    arrivals: &mut [Arrival],
    window_ms: i64,
    t: &Template,
    revenue_micros: i64,
    budget: Budget,
    extra: Option<Policy>,
) -> Advice {
    if !arrivals.is_sorted_by_key(|a| a.at_ms) {
        arrivals.sort_unstable_by_key(|a| a.at_ms);
    }
    let arrivals: &[Arrival] = arrivals;
    let histogram = load_histogram(arrivals, window_ms, t);
    let mut policies = candidates(t.ceiling);
    if let Some(p) = extra {
        if !policies.contains(&p) {
            policies.push(p);
        }
    }
    let outcomes: Vec<Outcome> = policies
        .into_iter()
        .map(|p| replay(arrivals, &histogram, window_ms, t, p, revenue_micros))
        .collect();
    let requests = i64::try_from(arrivals.len()).unwrap_or(i64::MAX);
    let recommended = outcomes
        .iter()
        .enumerate()
        .filter(|(_, o)| within(budget, o, requests, window_ms))
        .min_by_key(|(_, o)| preference(o))
        .map(|(i, _)| i);
    Advice {
        window_ms,
        requests,
        load_tokens: div_half_up(
            arrivals
                .iter()
                .map(|a| i128::from(a.load_milli.max(0)))
                .sum(),
            1000,
        ),
        revenue_micros,
        template: *t,
        budget,
        frontier: frontier(&outcomes),
        outcomes,
        recommended,
    }
}

/// A share typed as a decimal fraction (`0.01`, `.5`, `1`) in parts per million, parsed exactly
/// (at most six decimals; 0 to 1).
pub fn parse_share_ppm(typed: &str) -> Option<i64> {
    let t = typed.trim();
    let (whole, frac) = t.split_once('.').unwrap_or((t, ""));
    if (whole.is_empty() && frac.is_empty())
        || frac.len() > 6
        || !whole
            .chars()
            .chain(frac.chars())
            .all(|c| c.is_ascii_digit())
    {
        return None;
    }
    let whole: i64 = if whole.is_empty() {
        0
    } else {
        whole.parse().ok()?
    };
    let frac_ppm: i64 = if frac.is_empty() {
        0
    } else {
        format!("{frac:0<6}").parse().ok()?
    };
    let ppm = whole.checked_mul(1_000_000)?.checked_add(frac_ppm)?;
    (0..=1_000_000).contains(&ppm).then_some(ppm)
}

#[cfg(test)]
mod tests;
