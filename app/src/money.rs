//! Money as the portal shows it: integer micro-units formatted without floats. One formatter for
//! every page (home, usage, logs), usable on the server and in the browser.

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
    use super::{format_micros, group_thousands};

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
}
