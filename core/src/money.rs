//! Money: integer micro-units of currency, never floats. The one price formula of the product
//! (quota's estimates and settlements, `admin limits`, later billing) lives here.

/// Cost in micro-units of `tokens` at `micros_per_1k` micro-units per 1000 tokens, rounded up per
/// request: a request that used any token of a priced model costs at least one micro. A negative
/// price counts as 0 (the schema forbids one); the product saturates instead of wrapping.
///
/// INVARIANT: the spend aggregates in `db::spend` compute the same per event in SQL (test:
/// db::spend::tests::sql_spend_agrees_with_cost_micros).
pub fn cost_micros(tokens: u64, micros_per_1k: i64) -> i64 {
    let price = u64::try_from(micros_per_1k).unwrap_or(0);
    let micros = tokens.saturating_mul(price).saturating_add(999) / 1000;
    i64::try_from(micros).unwrap_or(i64::MAX)
}

/// Micro-units as an amount to show: `$` and at least two decimals, up to all six when they are
/// not zero (`$0.001234`, `$2.50`, `-$1.00`). Integer arithmetic only.
pub fn format_micros(micros: i64) -> String {
    let sign = if micros < 0 { "-" } else { "" };
    let m = micros.unsigned_abs();
    let (whole, frac) = (m / 1_000_000, m % 1_000_000);
    let mut digits = format!("{frac:06}");
    while digits.len() > 2 && digits.ends_with('0') {
        digits.pop();
    }
    format!("{sign}${}.{digits}", group_thousands(whole))
}

/// `1234567` as `1,234,567`.
pub fn group_thousands(n: u64) -> String {
    let s = n.to_string();
    let mut out = String::with_capacity(s.len() + s.len() / 3);
    for (i, c) in s.chars().enumerate() {
        if i > 0 && (s.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::{cost_micros, format_micros, group_thousands};

    #[test]
    fn amounts_show_exact_micros() {
        assert_eq!(format_micros(0), "$0.00");
        assert_eq!(format_micros(1_234), "$0.001234");
        assert_eq!(format_micros(2_500_000), "$2.50");
        assert_eq!(format_micros(1_234_567_890_001), "$1,234,567.890001");
        assert_eq!(format_micros(-1_000_000), "-$1.00");
        assert_eq!(format_micros(i64::MIN), "-$9,223,372,036,854.775808");
        assert_eq!(group_thousands(999), "999");
        assert_eq!(group_thousands(1_000), "1,000");
    }

    #[test]
    fn cost_rounds_up_per_request() {
        assert_eq!(cost_micros(0, 1000), 0);
        assert_eq!(cost_micros(1, 1), 1);
        assert_eq!(cost_micros(1000, 1), 1);
        assert_eq!(cost_micros(1001, 1), 2);
        assert_eq!(cost_micros(30, 1000), 30);
        assert_eq!(cost_micros(5, 0), 0);
    }

    #[test]
    fn negative_prices_are_free_and_huge_counts_saturate() {
        assert_eq!(cost_micros(1_000, -5), 0);
        assert_eq!(
            cost_micros(u64::MAX, i64::MAX),
            i64::try_from(u64::MAX / 1000).unwrap()
        );
    }
}
