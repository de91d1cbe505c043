//! Billing periods and the runs an invoice is built from (issue 31). A tenant's invoice for a UTC
//! month covers event start times in [from, until): the calendar month, unless an admin closed
//! the month early at a stated instant (`period_closes`), which ends this month's period there and
//! starts the next month's there, so every event lies in exactly one period.
//!
//! A draft is built from segments of its period, each rated by one run: re-rates the admin chose
//! (clipped to the period; never overlapping) and the live run for the gaps ([`plan`]). The
//! segments are stored with the draft (`invoice_sources`) so a rebuild keeps the choice.

use sqlx::PgExecutor;
use time::{Date, OffsetDateTime};
use uuid::Uuid;

/// A part of an invoice's period and the run whose lines count for it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Segment {
    pub run: i64,
    pub from: OffsetDateTime,
    pub until: OffsetDateTime,
}

/// A re-rate run as a draft may use it: whose it is and the events it rated.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rerate {
    pub run: i64,
    pub tenant: Uuid,
    pub from: OffsetDateTime,
    pub until: OffsetDateTime,
}

/// Splits `period` into segments: each chosen re-rate over its part of the period, the live run
/// over the rest. `Err(run)` names a run that is not `tenant`'s, does not touch the period, or
/// overlaps another chosen run (two prices for one event: refused, not guessed).
///
/// INVARIANT: the segments are disjoint, ordered and cover `period` exactly (test:
/// `tests::segments_cover_the_period_once`).
pub fn plan(
    tenant: Uuid,
    period: (OffsetDateTime, OffsetDateTime),
    live: i64,
    chosen: &[Rerate],
) -> Result<Vec<Segment>, i64> {
    let mut parts: Vec<Segment> = Vec::new();
    for r in chosen {
        let (from, until) = (r.from.max(period.0), r.until.min(period.1));
        if r.tenant != tenant || from >= until {
            return Err(r.run);
        }
        parts.push(Segment {
            run: r.run,
            from,
            until,
        });
    }
    parts.sort_by_key(|s| s.from);
    let mut out = Vec::with_capacity(parts.len() * 2 + 1);
    let mut at = period.0;
    for p in parts {
        if p.from < at {
            return Err(p.run);
        }
        if p.from > at {
            out.push(Segment {
                run: live,
                from: at,
                until: p.from,
            });
        }
        at = p.until;
        out.push(p);
    }
    if at < period.1 {
        out.push(Segment {
            run: live,
            from: at,
            until: period.1,
        });
    }
    Ok(out)
}

/// The period `tenant`'s invoice for the month starting `month` covers: from the previous
/// month's early close (else the month's start) to this month's (else the next month's start).
pub async fn period(
    db: impl PgExecutor<'_>,
    tenant: Uuid,
    month: Date,
) -> sqlx::Result<(OffsetDateTime, OffsetDateTime)> {
    let row = sqlx::query!(
        r#"SELECT COALESCE((SELECT closes_at FROM period_closes
                            WHERE tenant_id = $1
                              AND period_start = ($2::date - interval '1 month')::date),
                           $2::date::timestamp AT TIME ZONE 'UTC') AS "from!",
                  COALESCE((SELECT closes_at FROM period_closes
                            WHERE tenant_id = $1 AND period_start = $2),
                           ($2::date + interval '1 month') AT TIME ZONE 'UTC') AS "until!""#,
        tenant,
        month,
    )
    .fetch_one(db)
    .await?;
    Ok((row.from, row.until))
}

/// The re-rate runs `runs` as [`plan`] takes them (unknown ids and live runs left out).
pub async fn rerates(db: impl PgExecutor<'_>, runs: &[i64]) -> sqlx::Result<Vec<Rerate>> {
    let rows = sqlx::query!(
        r#"SELECT id, tenant_id AS "tenant_id!", period_start AS "period_start!",
                  period_end AS "period_end!"
           FROM rating_runs WHERE id = ANY($1) AND kind = 'rerate' ORDER BY id"#,
        runs,
    )
    .fetch_all(db)
    .await?;
    Ok(rows
        .into_iter()
        .map(|r| Rerate {
            run: r.id,
            tenant: r.tenant_id,
            from: r.period_start,
            until: r.period_end,
        })
        .collect())
}

/// The segments an invoice was built from, in order.
pub async fn sources(db: impl PgExecutor<'_>, invoice: Uuid) -> sqlx::Result<Vec<Segment>> {
    sqlx::query_as!(
        Segment,
        r#"SELECT run_id AS run, covers_from AS "from", covers_until AS "until"
           FROM invoice_sources WHERE invoice_id = $1 ORDER BY covers_from"#,
        invoice,
    )
    .fetch_all(db)
    .await
}

/// The re-rate runs a month's draft was built from (what a rebuild keeps); empty without a draft.
pub async fn chosen_runs(
    db: impl PgExecutor<'_>,
    tenant: Uuid,
    month: Date,
) -> sqlx::Result<Vec<i64>> {
    sqlx::query_scalar!(
        "SELECT s.run_id FROM invoices i
              JOIN invoice_sources s ON s.invoice_id = i.id
              JOIN rating_runs r ON r.id = s.run_id AND r.kind = 'rerate'
         WHERE i.tenant_id = $1 AND i.period_start = $2 AND i.kind = 'invoice'
           AND i.status = 'draft'
         ORDER BY s.covers_from",
        tenant,
        month,
    )
    .fetch_all(db)
    .await
}

/// What [`close`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Close {
    Closed,
    /// The month was already closed early (at this instant); a close is never moved.
    AlreadyClosed(OffsetDateTime),
    /// The month has an issued invoice: its period is over already.
    Issued(Uuid),
    /// The next month has an issued invoice: the usage the close would move onto it would be on
    /// no invoice (found by the property test `core/tests/billing_props.rs`).
    NextIssued(Uuid),
    /// The month's draft is built from this re-rate over a part after the instant: the close
    /// would cut the admin's choice short (and the kept runs would no longer fit the period), so
    /// the draft is to be rebuilt without it first (found by `core/tests/billing_props.rs`).
    KeptRerate(i64),
    /// The instant is not inside the month (after its start, before its end).
    OutsideMonth,
}

/// Takes `tenant`'s row lock (every builder, closer and issuer of its invoices takes it first, so
/// they run one at a time) and returns the month's issued invoice that no credit note corrects.
pub async fn lock_month(
    db: &mut sqlx::PgConnection,
    tenant: Uuid,
    month: Date,
) -> sqlx::Result<Option<Uuid>> {
    sqlx::query!("SELECT id FROM tenants WHERE id = $1 FOR UPDATE", tenant)
        .fetch_optional(&mut *db)
        .await?;
    sqlx::query_scalar!(
        "SELECT i.id FROM invoices i
         WHERE i.tenant_id = $1 AND i.period_start = $2 AND i.kind = 'invoice' AND i.status = 'issued'
           AND NOT EXISTS (SELECT 1 FROM invoices n WHERE n.kind = 'credit_note' AND n.corrects = i.id)",
        tenant,
        month,
    )
    .fetch_optional(&mut *db)
    .await
}

/// Ends `tenant`'s period for the month starting `month` at `at`: the month's invoice covers
/// events started before it, the next month's those from it on.
pub async fn close(
    db: &mut sqlx::PgConnection,
    tenant: Uuid,
    month: Date,
    at: OffsetDateTime,
    by: &str,
) -> sqlx::Result<Close> {
    // The tenant's row, as a draft build takes it: a build sees the close whole or not at all.
    let issued = lock_month(db, tenant, month).await?;
    if let Some(id) = issued {
        return Ok(Close::Issued(id));
    }
    let start = month.midnight().assume_utc();
    if at <= start || crate::period::month_of(at) != month {
        return Ok(Close::OutsideMonth);
    }
    // INVARIANT: what a close moves to the next month's period lands on an invoice still to be
    // built, never on none (test: core/tests/billing_props.rs).
    let next = crate::period::month_of(start + time::Duration::days(32));
    let next_issued = sqlx::query_scalar!(
        "SELECT i.id FROM invoices i
         WHERE i.tenant_id = $1 AND i.period_start = $2 AND i.kind = 'invoice' AND i.status = 'issued'
           AND NOT EXISTS (SELECT 1 FROM invoices n WHERE n.kind = 'credit_note' AND n.corrects = i.id)",
        tenant,
        next,
    )
    .fetch_optional(&mut *db)
    .await?;
    if let Some(id) = next_issued {
        return Ok(Close::NextIssued(id));
    }
    let kept = sqlx::query_scalar!(
        "SELECT s.run_id FROM invoices i
                JOIN invoice_sources s ON s.invoice_id = i.id
                JOIN rating_runs r ON r.id = s.run_id AND r.kind = 'rerate'
         WHERE i.tenant_id = $1 AND i.period_start = $2 AND i.kind = 'invoice'
           AND i.status = 'draft' AND s.covers_until > $3
         ORDER BY s.covers_from LIMIT 1",
        tenant,
        month,
        at,
    )
    .fetch_optional(&mut *db)
    .await?;
    if let Some(run) = kept {
        return Ok(Close::KeptRerate(run));
    }
    let done = sqlx::query_scalar!(
        r#"INSERT INTO period_closes (tenant_id, period_start, closes_at, closed_by)
           VALUES ($1, $2, $3, $4)
           ON CONFLICT (tenant_id, period_start) DO NOTHING
           RETURNING closes_at"#,
        tenant,
        month,
        at,
        by,
    )
    .fetch_optional(&mut *db)
    .await?;
    if done.is_some() {
        return Ok(Close::Closed);
    }
    let existing = sqlx::query_scalar!(
        "SELECT closes_at FROM period_closes WHERE tenant_id = $1 AND period_start = $2",
        tenant,
        month,
    )
    .fetch_one(&mut *db)
    .await?;
    Ok(Close::AlreadyClosed(existing))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::{plan, Rerate, Segment};
    use proptest::prelude::*;
    use time::macros::datetime;
    use time::{Duration, OffsetDateTime};
    use uuid::Uuid;

    const LIVE: i64 = 1;

    fn at(s: i64) -> OffsetDateTime {
        datetime!(2026-05-01 0:00 UTC) + Duration::seconds(s)
    }

    proptest! {
        #[test]
        fn segments_cover_the_period_once(
            runs in prop::collection::vec((0..100_i64, 1..40_i64), 0..5),
            other in any::<bool>(),
        ) {
            let t = Uuid::from_u128(7);
            let period = (at(10), at(90));
            let chosen: Vec<Rerate> = runs
                .iter()
                .enumerate()
                .map(|(i, (from, len))| Rerate {
                    run: 10 + i64::try_from(i).unwrap(),
                    tenant: if other && i == 0 { Uuid::from_u128(8) } else { t },
                    from: at(*from),
                    until: at(from + len),
                })
                .collect();
            match plan(t, period, LIVE, &chosen) {
                Ok(segs) => {
                    prop_assert_eq!(segs.first().map(|s| s.from), Some(period.0));
                    prop_assert_eq!(segs.last().map(|s| s.until), Some(period.1));
                    for w in segs.windows(2) {
                        prop_assert_eq!(w[0].until, w[1].from);
                    }
                    for s in &segs {
                        prop_assert!(s.from < s.until);
                    }
                    // Every chosen run is used, over exactly its part of the period.
                    for r in &chosen {
                        let want = Segment { run: r.run, from: r.from.max(period.0), until: r.until.min(period.1) };
                        prop_assert!(segs.contains(&want));
                    }
                    prop_assert!(!other || chosen.is_empty(), "another tenant's run accepted");
                }
                Err(run) => {
                    // Refused only for a reason.
                    let r = chosen.iter().find(|r| r.run == run).unwrap();
                    let outside = r.until <= period.0 || r.from >= period.1;
                    let overlaps = chosen.iter().any(|o| o.run != run
                        && o.from.max(period.0) < r.until.min(period.1)
                        && r.from.max(period.0) < o.until.min(period.1));
                    prop_assert!(r.tenant != t || outside || overlaps);
                }
            }
        }
    }

    #[test]
    fn no_rerate_is_the_live_run_over_the_period() {
        let t = Uuid::from_u128(7);
        assert_eq!(
            plan(t, (at(0), at(5)), LIVE, &[]).unwrap(),
            vec![Segment {
                run: LIVE,
                from: at(0),
                until: at(5)
            }]
        );
    }
}
