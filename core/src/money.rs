//! Money: integer micro-units of currency, never floats. The one cost function of the product
//! lives here: [`line_micros`], what one usage event costs under a price's three rates. Quota's
//! estimates and settlements use it; the SQL that prices events (the rater's
//! `billing_rate_batch`, and `line_amount`/`charge_micros` behind the usage rollup, the spend
//! limit and the request log) applies the same rule, and tests prove they agree.

/// Token quantities of one rated event: fresh (uncached) input, cached input and output.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Quantities {
    pub fresh: i64,
    pub cached: i64,
    pub output: i64,
}

/// Rates of one price, in micro-units per million tokens.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Rates {
    pub fresh_per_m: i64,
    pub cached_per_m: i64,
    pub output_per_m: i64,
}

/// Amount of one charge line: the three quantities at their rates per million, rounded once per
/// line, half-up to the micro-unit, never per token:
/// `(fresh * fresh_rate + cached * cached_rate + output * output_rate + 500_000) / 1_000_000`.
/// Computed in i128 so no product overflows; saturates at `i64::MAX`.
///
/// INVARIANT: the SQL rater (`billing_rate_batch` in migration 20261206100000_billing.sql)
/// computes the same per line (test: server/tests/billing.rs,
/// random_events_and_price_histories_rate_and_invoice_exactly).
pub fn line_micros(q: Quantities, r: Rates) -> i64 {
    let sum = i128::from(q.fresh.max(0)) * i128::from(r.fresh_per_m.max(0))
        + i128::from(q.cached.max(0)) * i128::from(r.cached_per_m.max(0))
        + i128::from(q.output.max(0)) * i128::from(r.output_per_m.max(0));
    i64::try_from((sum + 500_000) / 1_000_000).unwrap_or(i64::MAX)
}

#[cfg(test)]
mod tests {
    use super::{line_micros, Quantities, Rates};

    fn q(fresh: i64, cached: i64, output: i64) -> Quantities {
        Quantities {
            fresh,
            cached,
            output,
        }
    }
    fn r(fresh_per_m: i64, cached_per_m: i64, output_per_m: i64) -> Rates {
        Rates {
            fresh_per_m,
            cached_per_m,
            output_per_m,
        }
    }

    #[test]
    fn lines_round_half_up_once_per_line() {
        assert_eq!(line_micros(q(0, 0, 0), r(5, 5, 5)), 0);
        // 0.4999995 rounds down, 0.5 rounds up.
        assert_eq!(line_micros(q(1, 0, 0), r(499_999, 0, 0)), 0);
        assert_eq!(line_micros(q(1, 0, 0), r(500_000, 0, 0)), 1);
        // Once per line: three quantities of 0.4 each make 1.2 -> 1, not 0 + 0 + 0.
        assert_eq!(line_micros(q(1, 1, 1), r(400_000, 400_000, 400_000)), 1);
        // 7 fresh at 1/token, 3 cached at 0.5, 7 output at 2: 22.5 -> 23.
        assert_eq!(
            line_micros(q(7, 3, 7), r(1_000_000, 500_000, 2_000_000)),
            23
        );
        assert_eq!(line_micros(q(i64::MAX, 0, 0), r(i64::MAX, 0, 0)), i64::MAX);
        assert_eq!(line_micros(q(-5, 0, 0), r(1_000_000, 0, 0)), 0);
    }
}
