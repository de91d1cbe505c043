//! Money as the portal shows it: integer micro-units formatted without floats. One formatter for
//! every page (home, usage, logs, limits, admin), usable on the server and in the browser.
//!
//! Amounts that stand in one column (or a column and its total, or a summary line beside them)
//! share one number of decimals, [`Decimals::for_amounts`], so they line up under right-aligned
//! tabular numerals: `$0.000040` above `$0.000039`, never `$0.00004` above `$0.000039`.

/// How many decimals a set of amounts is shown with: from 2 (cents) to 6 (every micro).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Decimals(u8);

impl Decimals {
    /// Cents: `$2.50`.
    pub const CENTS: Self = Self(2);
    /// Every micro-unit: `$0.000001`.
    pub const MICROS: Self = Self(6);

    /// The fewest decimals (at least two) that show every amount exactly: the amounts of one
    /// column share them, so the column aligns and none is rounded.
    pub fn for_amounts(amounts: impl IntoIterator<Item = i64>) -> Self {
        let needed = amounts
            .into_iter()
            .map(|m| {
                let frac = m.unsigned_abs() % 1_000_000;
                // Trailing zero digits of the six-digit fraction.
                let mut zeros = 0u8;
                let mut f = frac;
                while zeros < 6 && f % 10 == 0 {
                    f /= 10;
                    zeros += 1;
                }
                if frac == 0 {
                    0
                } else {
                    6 - zeros
                }
            })
            .max()
            .unwrap_or(0);
        Self(needed.max(2))
    }

    /// `micros` with these decimals (rounded half away from zero when they are fewer than six).
    pub fn show(self, micros: i64) -> String {
        format_fixed(micros, self)
    }
}

/// Micro-units as an amount on its own: `$` and at least two decimals, up to all six when they are
/// not zero (`$0.001234`, `$2.50`, `-$1.00`). Amounts shown together use [`Decimals::for_amounts`]
/// instead. Integer arithmetic only.
pub fn format_micros(micros: i64) -> String {
    format_fixed(micros, Decimals::for_amounts([micros]))
}

/// `micros` with exactly `d` decimals (rounded half away from zero), thousands grouped.
fn format_fixed(micros: i64, d: Decimals) -> String {
    let sign = if micros < 0 { "-" } else { "" };
    let places = u32::from(d.0.min(6));
    let step = 10u128.pow(6 - places);
    // u128: rounding i64::MIN's magnitude up cannot overflow.
    let m = u128::from(micros.unsigned_abs());
    let rounded = (m + step / 2) / step * step;
    let (whole, frac) = (rounded / 1_000_000, rounded % 1_000_000);
    let frac = format!("{frac:06}");
    let digits = &frac[..places as usize];
    let whole = group_thousands(u64::try_from(whole).unwrap_or(u64::MAX));
    if places == 0 {
        format!("{sign}${whole}")
    } else {
        format!("{sign}${whole}.{digits}")
    }
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
    use super::{format_micros, group_thousands, Decimals};

    #[test]
    fn amounts_keep_every_nonzero_micro_and_group_thousands() {
        assert_eq!(format_micros(0), "$0.00");
        assert_eq!(format_micros(1), "$0.000001");
        assert_eq!(format_micros(1_234), "$0.001234");
        assert_eq!(format_micros(2_500_000), "$2.50");
        assert_eq!(format_micros(1_234_567_000_001), "$1,234,567.000001");
        assert_eq!(format_micros(-1_000_000), "-$1.00");
        assert_eq!(format_micros(i64::MIN), "-$9,223,372,036,854.775808");
        assert_eq!(group_thousands(999), "999");
        assert_eq!(group_thousands(1000), "1,000");
        assert_eq!(group_thousands(12_345_678), "12,345,678");
    }

    #[test]
    fn a_column_shares_its_decimals_so_it_aligns() {
        // The case: 40 micros above 39 micros.
        let column = [40, 39, 2_500_000, 0];
        let d = Decimals::for_amounts(column);
        assert_eq!(d, Decimals::MICROS);
        let shown: Vec<String> = column.iter().map(|m| d.show(*m)).collect();
        assert_eq!(shown, ["$0.000040", "$0.000039", "$2.500000", "$0.000000"]);
        // Every amount of the column has as many characters after the point.
        let after_point = |s: &String| s.len() - s.find('.').unwrap();
        assert!(shown
            .iter()
            .all(|s| after_point(s) == after_point(&shown[0])));
        // A column of whole cents keeps two; one of tenths of a cent three.
        assert_eq!(Decimals::for_amounts([1_000_000, 20_000]), Decimals::CENTS);
        assert_eq!(
            Decimals::for_amounts([1_500, 20_000]).show(20_000),
            "$0.0200"
        );
        assert_eq!(Decimals::for_amounts([]), Decimals::CENTS);
        assert_eq!(Decimals::for_amounts([-1_000_001]).show(-5), "-$0.000005");
    }

    #[test]
    fn fewer_decimals_round_half_away_from_zero() {
        assert_eq!(Decimals::CENTS.show(1_234_567_890), "$1,234.57");
        assert_eq!(Decimals::CENTS.show(4_999), "$0.00");
        assert_eq!(Decimals::CENTS.show(5_000), "$0.01");
        assert_eq!(Decimals::CENTS.show(-5_000), "-$0.01");
        assert_eq!(Decimals::CENTS.show(i64::MIN), "-$9,223,372,036,854.78");
    }
}
