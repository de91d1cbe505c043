//! Money: integer micro-units of currency, never floats. The one cost function of the product
//! lives here: [`line_micros`], what one usage event costs under a price's three rates. Quota's
//! estimates and settlements use it; the SQL that prices events (the rater's
//! `billing_rate_batch`, and `line_amount`/`charge_micros` behind the usage rollup, the spend
//! limit and the request log) applies the same rule, and tests prove they agree. What operators
//! type is parsed here too ([`parse_money`]: dollars to micro-units, exactly) and echoed back
//! ([`echo_money`]).

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
/// computes the same per line (test: server/tests/integration/billing.rs,
/// random_events_and_price_histories_rate_and_invoice_exactly).
pub fn line_micros(q: Quantities, r: Rates) -> i64 {
    let sum = i128::from(q.fresh.max(0)) * i128::from(r.fresh_per_m.max(0))
        + i128::from(q.cached.max(0)) * i128::from(r.cached_per_m.max(0))
        + i128::from(q.output.max(0)) * i128::from(r.output_per_m.max(0));
    i64::try_from((sum + 500_000) / 1_000_000).unwrap_or(i64::MAX)
}

/// Why a typed amount of money was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum MoneyError {
    #[error("no amount given")]
    Empty,
    #[error("not an amount of money: use digits with at most one decimal point, like 5, 5.00, $5 or 0.000125")]
    NotAnAmount,
    #[error("more than six decimals: amounts are whole micro-units (0.000001)")]
    TooPrecise,
    #[error("too large an amount")]
    TooLarge,
}

/// Parses an operator's typed amount of currency into micro-units, exactly (no float): `5`,
/// `5.00`, `$5`, `$1,234.50`, `0.000125`, `-$2` (a refund). Up to six decimals (more only as
/// trailing zeros); commas only as thousands separators between groups of three. Every admin form
/// and CLI flag that takes money parses it here, and echoes the result with a formatter.
///
/// INVARIANT: `parse_money(&format!("{}.{:06}", m / 1_000_000, m % 1_000_000)) == Ok(m)` for
/// every non-negative `m` (test: `tests::typed_amounts_parse_exactly`).
pub fn parse_money(typed: &str) -> Result<i64, MoneyError> {
    let t = typed.trim();
    if t.is_empty() {
        return Err(MoneyError::Empty);
    }
    let (negative, t) = match t.strip_prefix('-') {
        Some(rest) => (true, rest),
        None => (false, t),
    };
    let t = t.strip_prefix('$').unwrap_or(t);
    let (negative, t) = match t.strip_prefix('-') {
        Some(rest) if !negative => (true, rest),
        Some(_) => return Err(MoneyError::NotAnAmount),
        None => (negative, t),
    };
    let (whole, frac) = t.split_once('.').unwrap_or((t, ""));
    if whole.is_empty() && frac.is_empty() {
        return Err(MoneyError::NotAnAmount);
    }
    let whole = ungroup(whole).ok_or(MoneyError::NotAnAmount)?;
    if !frac.bytes().all(|b| b.is_ascii_digit()) {
        return Err(MoneyError::NotAnAmount);
    }
    let (kept, extra) = frac.split_at(frac.len().min(6));
    if extra.bytes().any(|b| b != b'0') {
        return Err(MoneyError::TooPrecise);
    }
    let mut micros: i64 = 0;
    for b in whole.bytes() {
        micros = micros
            .checked_mul(10)
            .and_then(|m| m.checked_add(i64::from(b - b'0')))
            .ok_or(MoneyError::TooLarge)?;
    }
    micros = micros.checked_mul(1_000_000).ok_or(MoneyError::TooLarge)?;
    let mut f: i64 = 0;
    for i in 0..6 {
        let d = kept.as_bytes().get(i).map_or(0, |b| i64::from(b - b'0'));
        f = f * 10 + d;
    }
    micros = micros.checked_add(f).ok_or(MoneyError::TooLarge)?;
    Ok(if negative { -micros } else { micros })
}

/// The digits of a whole part, with commas removed when they separate groups of three
/// (`1,234,567`); None for anything else.
fn ungroup(whole: &str) -> Option<String> {
    if !whole.contains(',') {
        return whole
            .bytes()
            .all(|b| b.is_ascii_digit())
            .then(|| whole.to_owned());
    }
    let mut groups = whole.split(',');
    let first = groups.next()?;
    if first.is_empty() || first.len() > 3 || !first.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let mut out = first.to_owned();
    for g in groups {
        if g.len() != 3 || !g.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        out.push_str(g);
    }
    Some(out)
}

/// Micro-units as an operator reads them back: `$5.00`, `$0.000125`, `-$2.00`, and the exact
/// micro-units (`5000000 micros`), so what was stored is never in doubt.
pub fn echo_money(micros: i64) -> String {
    let sign = if micros < 0 { "-" } else { "" };
    let m = micros.unsigned_abs();
    let (whole, frac) = (m / 1_000_000, m % 1_000_000);
    let mut digits = format!("{frac:06}");
    while digits.len() > 2 && digits.ends_with('0') {
        digits.pop();
    }
    format!("{sign}${whole}.{digits} ({micros} micros)")
}

#[cfg(test)]
mod tests {
    use super::{echo_money, line_micros, parse_money, MoneyError, Quantities, Rates};
    use proptest::prelude::*;

    #[test]
    fn operators_type_dollars() {
        for (typed, micros) in [
            ("5", 5_000_000),
            ("5.00", 5_000_000),
            ("$5", 5_000_000),
            (" $5.5 ", 5_500_000),
            ("0.000125", 125),
            (".5", 500_000),
            ("5.", 5_000_000),
            ("$1,234.50", 1_234_500_000),
            ("-$2", -2_000_000),
            ("$-2", -2_000_000),
            ("1.2500000", 1_250_000),
            ("0", 0),
        ] {
            assert_eq!(parse_money(typed), Ok(micros), "{typed}");
        }
        for (typed, why) in [
            ("", MoneyError::Empty),
            ("$", MoneyError::NotAnAmount),
            (".", MoneyError::NotAnAmount),
            ("5e3", MoneyError::NotAnAmount),
            ("1,23.0", MoneyError::NotAnAmount),
            ("1.2.3", MoneyError::NotAnAmount),
            ("--5", MoneyError::NotAnAmount),
            ("0.0000001", MoneyError::TooPrecise),
            ("99999999999999", MoneyError::TooLarge),
        ] {
            assert_eq!(parse_money(typed), Err(why), "{typed}");
        }
        assert_eq!(echo_money(5_000_000), "$5.00 (5000000 micros)");
        assert_eq!(echo_money(125), "$0.000125 (125 micros)");
    }

    proptest! {
        #[test]
        fn typed_amounts_parse_exactly(m in 0..i64::MAX / 2, dollar in any::<bool>(), neg in any::<bool>()) {
            let typed = format!(
                "{}{}{}.{:06}",
                if neg { "-" } else { "" },
                if dollar { "$" } else { "" },
                m / 1_000_000,
                m % 1_000_000
            );
            prop_assert_eq!(parse_money(&typed), Ok(if neg { -m } else { m }));
            // The echo's amount reads back as the same micro-units.
            let echoed = echo_money(m);
            let shown = echoed.split(' ').next().unwrap_or("");
            prop_assert_eq!(parse_money(shown), Ok(m));
        }
    }

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
