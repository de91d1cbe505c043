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

#[cfg(test)]
mod tests {
    use super::cost_micros;

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
