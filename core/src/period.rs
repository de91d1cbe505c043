//! The period money is counted over: the calendar month in UTC. Invoices, spend limits, the
//! limits pages and the home's totals all start it here, so a month means the same everywhere.

use time::{Date, Month, OffsetDateTime, UtcOffset};

/// The first day of `now`'s UTC month.
pub fn month_of(now: OffsetDateTime) -> Date {
    let d = now.to_offset(UtcOffset::UTC).date();
    d.replace_day(1).unwrap_or(d)
}

/// The first day of the month before the one starting `month`.
pub fn previous_month(month: Date) -> Date {
    let (y, m) = match month.month() {
        Month::January => (month.year() - 1, Month::December),
        m => (month.year(), m.previous()),
    };
    Date::from_calendar_date(y, m, 1).unwrap_or(month)
}

#[cfg(test)]
mod tests {
    use super::{month_of, previous_month};
    use time::macros::{date, datetime};

    #[test]
    fn months_are_utc_calendar_months() {
        assert_eq!(
            month_of(datetime!(2026-12-31 23:59:59 UTC)),
            date!(2026 - 12 - 01)
        );
        assert_eq!(
            month_of(datetime!(2027-01-01 00:30 +01:00)),
            date!(2026 - 12 - 01)
        );
        assert_eq!(previous_month(date!(2027 - 01 - 01)), date!(2026 - 12 - 01));
        assert_eq!(previous_month(date!(2026 - 03 - 01)), date!(2026 - 02 - 01));
    }
}
