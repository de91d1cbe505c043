//! Unit economics, the arithmetic (issue 17): what a base's warm replicas cost over a window (a
//! UTC day, or its part up to now), what they could have served, and the figures derived from
//! what they did serve and what it earned. No I/O: `db::economics` reads the inputs.
//!
//! Exactness: replica time is kept in replica-milliseconds and every sum is an exact `i128`
//! (cost as micro-units x 3,600,000, capacity as tokens x 1,000); each shown figure is rounded
//! once, half-up (half away from zero for a negative margin), by [`div_half_up`]. Money is integer
//! micro-units, ratios are basis points (10,000 = 100 %). The margin is the shown revenue minus
//! the shown cost, so the table adds up to the micro.
//!
//! Definitions (documented on `/admin/economics`):
//! - a replica is *warm* while its graph's recorded state is `ready`; pending, failed and deleted
//!   time is not counted;
//! - the *floor* is the template's minimum replicas recorded with each change; replicas above it
//!   are *scaled up*;
//! - *tokens served* are prompt + completion tokens (cached prompt tokens included): what the
//!   real cost and the price per million are per;
//! - the *load* is what the tokens took of the capacity, weighted by kind (issue 36): a fresh
//!   prompt token and a completion token weigh 1 (the peak tokens per second is measured in
//!   prompt + completion tokens of uncached requests), a cached prompt token weighs 0.1 (a prefix
//!   cache hit skips the prefill's compute; what is left is the attention reading its cached
//!   keys and values and the memory they hold, taken as a tenth). The duty cycle is load over
//!   capacity, so a cached token no longer counts as one served at full cost;
//! - the *idle floor cost* is the floor's cost times the share of the floor's capacity the load
//!   left unused, traffic filling the floor first: a day with no traffic idles the whole floor.

use serde::Serialize;
use time::OffsetDateTime;

pub mod advisor;
pub mod attribution;

/// Capacity weights per token kind, in thousandths (see the module's note on load).
pub const FRESH_PROMPT_WEIGHT_MILLI: i64 = 1_000;
pub const CACHED_PROMPT_WEIGHT_MILLI: i64 = 100;
pub const COMPLETION_WEIGHT_MILLI: i64 = 1_000;

/// Milliseconds in an hour: cost numerators are micro-units x this.
const MS_PER_HOUR: i128 = 3_600_000;
const MILLION: i128 = 1_000_000;
const BP: i128 = 10_000;

/// A base's serving costs from `effective_from` on (one `base_costs` row).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CostVersion {
    pub effective_from: OffsetDateTime,
    pub gpu_micros_per_hour: i64,
    pub gpus_per_replica: i64,
    pub peak_tokens_per_second: i64,
}

/// A graph's state from `at` on: warm or not, its replicas and its floor.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GraphState {
    pub at: OffsetDateTime,
    pub warm: bool,
    pub replicas: i64,
    pub floor: i64,
}

/// Exact sums over a window's warm replica time (see the module's note on exactness).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Fleet {
    /// Replica-milliseconds of floor replicas, of scaled-up ones, and of replicas while no cost
    /// version was in effect (neither costed nor counted as capacity).
    pub floor_ms: i128,
    pub scaled_ms: i128,
    pub uncosted_ms: i128,
    /// Tokens the warm replicas could have served, x 1,000; the floor's part of it.
    pub capacity_milli: i128,
    pub floor_capacity_milli: i128,
    /// GPU cost in micro-units x 3,600,000; the floor's part of it.
    pub cost_num: i128,
    pub floor_cost_num: i128,
}

/// Tokens served in the window.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct Served {
    pub prompt_tokens: i64,
    pub cached_tokens: i64,
    pub completion_tokens: i64,
}

impl Served {
    /// Tokens served: prompt + completion.
    pub fn tokens(&self) -> i64 {
        self.prompt_tokens.saturating_add(self.completion_tokens)
    }

    /// The load on the capacity in tokens x 1,000, each kind at its weight: what the duty cycle
    /// counts.
    pub fn load_milli(&self) -> i128 {
        let cached = i128::from(self.cached_tokens.clamp(0, self.prompt_tokens.max(0)));
        let fresh = i128::from(self.prompt_tokens.max(0)) - cached;
        fresh * i128::from(FRESH_PROMPT_WEIGHT_MILLI)
            + cached * i128::from(CACHED_PROMPT_WEIGHT_MILLI)
            + i128::from(self.completion_tokens.max(0)) * i128::from(COMPLETION_WEIGHT_MILLI)
    }
}

pub use tf_types::economics::Figures;

/// `n / d` rounded half-up (half away from zero when `n` is negative), saturated to `i64`;
/// `d` must be positive.
pub fn div_half_up(n: i128, d: i128) -> i64 {
    debug_assert!(d > 0);
    let d = d.max(1);
    let q = if n >= 0 {
        n.saturating_mul(2).saturating_add(d) / d.saturating_mul(2)
    } else {
        -(n.saturating_neg().saturating_mul(2).saturating_add(d) / d.saturating_mul(2))
    };
    i64::try_from(q).unwrap_or(if q < 0 { i64::MIN } else { i64::MAX })
}

fn ms(from: OffsetDateTime, to: OffsetDateTime) -> i128 {
    (to - from).whole_milliseconds().max(0)
}

/// Sums the warm replica time of `states` (oldest first; the first may start before `start`)
/// inside `[start, end)`, split at the `costs` versions (oldest first) in effect.
pub fn fleet(
    states: &[GraphState],
    costs: &[CostVersion],
    start: OffsetDateTime,
    end: OffsetDateTime,
) -> Fleet {
    let mut f = Fleet::default();
    for (i, s) in states.iter().enumerate() {
        let from = s.at.max(start);
        let to = states.get(i + 1).map_or(end, |n| n.at.min(end));
        if !s.warm || s.replicas <= 0 || to <= from {
            continue;
        }
        let replicas = i128::from(s.replicas);
        let floor = i128::from(s.floor.clamp(0, s.replicas));
        // Before the first version: not costed.
        let first = costs
            .first()
            .map_or(to, |c| c.effective_from.clamp(from, to));
        f.uncosted_ms += ms(from, first) * replicas;
        for (j, c) in costs.iter().enumerate() {
            let c_from = c.effective_from.max(from);
            let c_to = costs.get(j + 1).map_or(to, |n| n.effective_from.min(to));
            let t = ms(c_from, c_to);
            if t == 0 {
                continue;
            }
            let peak = i128::from(c.peak_tokens_per_second);
            let per_replica_cost =
                i128::from(c.gpus_per_replica).saturating_mul(i128::from(c.gpu_micros_per_hour));
            f.floor_ms += t * floor;
            f.scaled_ms += t * (replicas - floor);
            f.capacity_milli += t * replicas * peak;
            f.floor_capacity_milli += t * floor * peak;
            f.cost_num += t.saturating_mul(replicas).saturating_mul(per_replica_cost);
            f.floor_cost_num += t.saturating_mul(floor).saturating_mul(per_replica_cost);
        }
    }
    f
}

/// The shown figures of a window from its fleet sums, what was served and what it earned.
pub fn figures(f: &Fleet, served: Served, revenue_micros: i64) -> Figures {
    let tokens = i128::from(served.tokens());
    let gpu_cost_micros = div_half_up(f.cost_num, MS_PER_HOUR);
    let margin_micros = revenue_micros.saturating_sub(gpu_cost_micros);
    let per_capacity = |n: i128| (f.capacity_milli > 0).then(|| div_half_up(n, f.capacity_milli));
    let per_token =
        |n: i128, d: i128| (tokens > 0).then(|| div_half_up(n, d.saturating_mul(tokens)));
    let load = served.load_milli();
    let unused_floor = (f.floor_capacity_milli - load).max(0);
    Figures {
        floor_replica_seconds: div_half_up(f.floor_ms, 1000),
        scaled_replica_seconds: div_half_up(f.scaled_ms, 1000),
        uncosted_replica_seconds: div_half_up(f.uncosted_ms, 1000),
        capacity_tokens: div_half_up(f.capacity_milli, 1000),
        prompt_tokens: served.prompt_tokens,
        cached_tokens: served.cached_tokens,
        completion_tokens: served.completion_tokens,
        load_tokens: div_half_up(load, 1000),
        gpu_cost_micros,
        floor_cost_micros: div_half_up(f.floor_cost_num, MS_PER_HOUR),
        idle_floor_cost_micros: if f.floor_capacity_milli > 0 {
            div_half_up(
                f.floor_cost_num.saturating_mul(unused_floor),
                MS_PER_HOUR.saturating_mul(f.floor_capacity_milli),
            )
        } else {
            0
        },
        // cost / (capacity / 1000) x 1e6 = cost_num x 1e6 / (3,600 x capacity_milli).
        full_load_cost_per_million_micros: (f.capacity_milli > 0).then(|| {
            div_half_up(
                f.cost_num.saturating_mul(MILLION),
                3_600i128.saturating_mul(f.capacity_milli),
            )
        }),
        duty_cycle_bp: per_capacity(load.saturating_mul(BP)),
        real_cost_per_million_micros: per_token(f.cost_num.saturating_mul(MILLION), MS_PER_HOUR),
        revenue_micros,
        price_per_million_micros: per_token(i128::from(revenue_micros).saturating_mul(MILLION), 1),
        margin_micros,
        margin_bp: (revenue_micros > 0).then(|| {
            div_half_up(
                i128::from(margin_micros).saturating_mul(BP),
                i128::from(revenue_micros),
            )
        }),
    }
}

/// A what-if: a price, a floor and the tokens expected per day.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WhatIf {
    pub price_per_million_micros: i64,
    pub floor: i64,
    pub tokens_per_day: i64,
}

/// What a what-if comes to over one full day at `cost`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct WhatIfResult {
    /// The floor, or more when the expected tokens need more replicas at peak (scaled up all day:
    /// an even load, the cheapest case).
    pub replicas: i64,
    pub figures: Figures,
    /// The duty cycle at which revenue equals cost with these replicas and this price (`None`:
    /// the price is zero); above 10,000 bp, these replicas cannot break even at this price.
    pub break_even_duty_cycle_bp: Option<i64>,
    pub break_even_tokens_per_day: Option<i64>,
}

/// Computes a what-if with the same arithmetic as the measured days.
pub fn what_if(cost: &CostVersion, w: &WhatIf) -> WhatIfResult {
    let day_capacity = i128::from(cost.peak_tokens_per_second.max(1)) * 86_400;
    let tokens = i128::from(w.tokens_per_day.max(0));
    let needed = i64::try_from((tokens + day_capacity - 1) / day_capacity).unwrap_or(i64::MAX);
    let replicas = w.floor.max(0).max(needed);
    let start = cost.effective_from;
    let end = start + time::Duration::DAY;
    let states = [GraphState {
        at: start,
        warm: true,
        replicas,
        floor: w.floor.max(0),
    }];
    let f = fleet(&states, &[*cost], start, end);
    let price = i128::from(w.price_per_million_micros.max(0));
    let revenue = div_half_up(tokens.saturating_mul(price), MILLION);
    let served = Served {
        prompt_tokens: w.tokens_per_day.max(0),
        cached_tokens: 0,
        completion_tokens: 0,
    };
    let priced = price > 0 && f.capacity_milli > 0;
    WhatIfResult {
        replicas,
        figures: figures(&f, served, revenue),
        // cost = duty x capacity x price / 1e6, so duty (bp) = cost_num x 1e6 x 1e4 x 1e3
        // / (3.6e6 x capacity_milli x price).
        break_even_duty_cycle_bp: priced.then(|| {
            div_half_up(
                f.cost_num.saturating_mul(MILLION * BP * 1000),
                MS_PER_HOUR
                    .saturating_mul(f.capacity_milli)
                    .saturating_mul(price),
            )
        }),
        break_even_tokens_per_day: (price > 0).then(|| {
            div_half_up(
                f.cost_num.saturating_mul(MILLION),
                MS_PER_HOUR.saturating_mul(price),
            )
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use time::macros::datetime;

    const DAY: OffsetDateTime = datetime!(2026-12-01 00:00 UTC);

    fn cost(from: OffsetDateTime, per_hour: i64, gpus: i64, peak: i64) -> CostVersion {
        CostVersion {
            effective_from: from,
            gpu_micros_per_hour: per_hour,
            gpus_per_replica: gpus,
            peak_tokens_per_second: peak,
        }
    }

    fn warm(at: OffsetDateTime, replicas: i64, floor: i64) -> GraphState {
        GraphState {
            at,
            warm: true,
            replicas,
            floor,
        }
    }

    #[test]
    fn rounding_is_half_up_once_and_away_from_zero_for_negatives() {
        assert_eq!(div_half_up(5, 10), 1);
        assert_eq!(div_half_up(4, 10), 0);
        assert_eq!(div_half_up(15, 10), 2);
        assert_eq!(div_half_up(-5, 10), -1);
        assert_eq!(div_half_up(-4, 10), 0);
        assert_eq!(div_half_up(i128::MAX, 1), i64::MAX);
    }

    #[test]
    fn a_full_day_of_one_replica_at_half_load() {
        // $2/GPU-hour, 2 GPUs, 1,000 tok/s: $96 a day for 86.4M tokens.
        let c = cost(DAY - time::Duration::DAY, 2_000_000, 2, 1_000);
        let f = fleet(&[warm(DAY, 1, 1)], &[c], DAY, DAY + time::Duration::DAY);
        let served = Served {
            prompt_tokens: 30_000_000,
            cached_tokens: 1_000_000,
            completion_tokens: 13_200_000,
        };
        let g = figures(&f, served, 120_000_000);
        assert_eq!(g.floor_replica_seconds, 86_400);
        assert_eq!(g.scaled_replica_seconds, 0);
        assert_eq!(g.capacity_tokens, 86_400_000);
        assert_eq!(g.gpu_cost_micros, 96_000_000);
        // 96 / 86.4 = 1.1111..: $1.111111 per million at full load.
        assert_eq!(g.full_load_cost_per_million_micros, Some(1_111_111));
        // Load: 29M fresh + 1M cached x 0.1 + 13.2M completion = 42.3M of 86.4M: 48.958 %.
        assert_eq!(g.load_tokens, 42_300_000);
        assert_eq!(g.duty_cycle_bp, Some(4_896));
        assert_eq!(g.real_cost_per_million_micros, Some(2_222_222));
        // 120 / 43.2 = 2.7777..: rounded up.
        assert_eq!(g.price_per_million_micros, Some(2_777_778));
        assert_eq!(g.margin_micros, 24_000_000);
        assert_eq!(g.margin_bp, Some(2_000));
        // 44.1M of the floor's 86.4M unused: 96 x 44.1 / 86.4 = $49 idle.
        assert_eq!(g.floor_cost_micros, 96_000_000);
        assert_eq!(g.idle_floor_cost_micros, 49_000_000);
    }

    #[test]
    fn scaled_up_time_and_a_cost_change_mid_window_are_split() {
        // 00:00-12:00 one replica (floor 1); 12:00-18:00 three; 18:00 not ready.
        let states = [
            warm(DAY, 1, 1),
            warm(DAY + time::Duration::hours(12), 3, 1),
            GraphState {
                at: DAY + time::Duration::hours(18),
                warm: false,
                replicas: 3,
                floor: 1,
            },
        ];
        // No cost until 06:00: six replica-hours uncosted. $1/h from then, $4/h from 12:00.
        let costs = [
            cost(DAY + time::Duration::hours(6), 1_000_000, 1, 100),
            cost(DAY + time::Duration::hours(12), 4_000_000, 1, 100),
        ];
        let f = fleet(&states, &costs, DAY, DAY + time::Duration::DAY);
        let g = figures(&f, Served::default(), 0);
        assert_eq!(g.uncosted_replica_seconds, 6 * 3_600);
        assert_eq!(g.floor_replica_seconds, 12 * 3_600);
        assert_eq!(g.scaled_replica_seconds, 2 * 6 * 3_600);
        // 6 h x $1 + 18 replica-hours x $4.
        assert_eq!(g.gpu_cost_micros, 6_000_000 + 72_000_000);
        assert_eq!(g.floor_cost_micros, 6_000_000 + 24_000_000);
        assert_eq!(g.idle_floor_cost_micros, g.floor_cost_micros);
        assert_eq!(g.capacity_tokens, 24 * 3_600 * 100);
        assert_eq!(g.duty_cycle_bp, Some(0));
        assert_eq!(g.real_cost_per_million_micros, None);
        assert_eq!(g.margin_micros, -78_000_000);
        assert_eq!(g.margin_bp, None);
    }

    #[test]
    fn a_state_before_the_window_counts_only_inside_it() {
        let c = cost(DAY - time::Duration::DAY, 3_600_000, 1, 10);
        let states = [warm(DAY - time::Duration::hours(5), 2, 2)];
        let end = DAY + time::Duration::minutes(30);
        let g = figures(&fleet(&states, &[c], DAY, end), Served::default(), 0);
        assert_eq!(g.floor_replica_seconds, 3_600);
        assert_eq!(g.gpu_cost_micros, 3_600_000);
    }

    #[test]
    fn what_if_finds_the_break_even() {
        // $2/h x 1 GPU, 1,000 tok/s: $48/day for 86.4M tokens; at $1/M break-even is 48M/day.
        let c = cost(DAY, 2_000_000, 1, 1_000);
        let r = what_if(
            &c,
            &WhatIf {
                price_per_million_micros: 1_000_000,
                floor: 1,
                tokens_per_day: 21_600_000,
            },
        );
        assert_eq!(r.replicas, 1);
        assert_eq!(r.figures.gpu_cost_micros, 48_000_000);
        assert_eq!(r.figures.revenue_micros, 21_600_000);
        assert_eq!(r.figures.duty_cycle_bp, Some(2_500));
        assert_eq!(r.break_even_tokens_per_day, Some(48_000_000));
        // 48 / 86.4 = 55.5555 %.
        assert_eq!(r.break_even_duty_cycle_bp, Some(5_556));
        assert_eq!(r.figures.margin_micros, 21_600_000 - 48_000_000);
        // More than one replica's day: scaled up to two.
        let big = what_if(
            &c,
            &WhatIf {
                price_per_million_micros: 1_000_000,
                floor: 1,
                tokens_per_day: 86_400_001,
            },
        );
        assert_eq!(big.replicas, 2);
        assert_eq!(big.figures.scaled_replica_seconds, 86_400);
        let free = what_if(
            &c,
            &WhatIf {
                price_per_million_micros: 0,
                floor: 1,
                tokens_per_day: 0,
            },
        );
        assert_eq!(free.break_even_duty_cycle_bp, None);
        assert_eq!(free.figures.idle_floor_cost_micros, 48_000_000);
    }
}
