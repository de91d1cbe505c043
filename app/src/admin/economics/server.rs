//! Server half of `/admin/economics`: reads the query string, asks `tf_core::db::economics` for
//! the 30 days ending on the chosen day, and runs the what-if through `tf_core::economics`.
//! Anything in the query string that does not parse is ignored and said so, never an error page.

use sqlx::PgPool;
use tf_core::db::economics::{self as db, BaseDay, CostRow};
use tf_core::economics::{self, CostVersion, WhatIf};
use time::macros::format_description;
use time::{Date, Duration, OffsetDateTime, PrimitiveDateTime};

use super::{
    BaseEconomics, ChartDay, CostItem, EconomicsParams, EconomicsView, WhatIfOutcome, WhatIfView,
};

/// Days on the chart, ending with the day shown.
pub const CHART_DAYS: u16 = 30;

const DAY: &[time::format_description::BorrowedFormatItem<'static>] =
    format_description!("[year]-[month]-[day]");

/// `YYYY-MM-DD`.
pub fn day_label(d: Date) -> String {
    d.format(DAY).unwrap_or_default()
}

fn when(t: OffsetDateTime) -> String {
    t.format(format_description!(
        "[year]-[month]-[day] [hour]:[minute]:[second]"
    ))
    .unwrap_or_default()
}

/// A cost form's "effective from": empty is `now`; else `YYYY-MM-DD`, `YYYY-MM-DDTHH:MM` or
/// `YYYY-MM-DDTHH:MM:SS` (as `<input type=datetime-local>` sends), UTC.
pub fn parse_from(typed: &str, now: OffsetDateTime) -> Option<OffsetDateTime> {
    let t = typed.trim();
    if t.is_empty() {
        return Some(now);
    }
    let long = format_description!("[year]-[month]-[day]T[hour]:[minute]:[second]");
    let short = format_description!("[year]-[month]-[day]T[hour]:[minute]");
    PrimitiveDateTime::parse(t, long)
        .or_else(|_| PrimitiveDateTime::parse(t, short))
        .map(PrimitiveDateTime::assume_utc)
        .ok()
        .or_else(|| Date::parse(t, DAY).ok().map(|d| d.midnight().assume_utc()))
}

fn cost_item(c: &CostRow) -> CostItem {
    CostItem {
        effective_from: when(c.effective_from),
        gpu_micros_per_hour: c.gpu_micros_per_hour,
        gpus_per_replica: i64::from(c.gpus_per_replica),
        peak_tokens_per_second: c.peak_tokens_per_second,
        created_by: c.created_by.clone(),
        peak_measured: c.peak_measured.is_some(),
    }
}

fn given(v: &Option<String>) -> Option<&str> {
    v.as_deref().map(str::trim).filter(|s| !s.is_empty())
}

/// What `/admin/economics` shows for `params` at `now`.
pub async fn view(
    pool: &PgPool,
    params: &EconomicsParams,
    now: OffsetDateTime,
) -> sqlx::Result<EconomicsView> {
    let today = now.date();
    let mut notice = None;
    let day = match given(&params.day).map(|d| Date::parse(d, DAY)) {
        None => today,
        Some(Ok(d)) if d <= today => d,
        Some(_) => {
            notice = Some("Unknown or future day: showing today (UTC).".to_owned());
            today
        }
    };
    let first = day - Duration::days(i64::from(CHART_DAYS) - 1);
    let rows = db::days(pool, first, CHART_DAYS, now).await?;
    let versions = db::costs(pool).await?;
    let mut bases: Vec<BaseEconomics> = Vec::new();
    for r in &rows {
        if bases.last().is_none_or(|b| b.base != r.base) {
            bases.push(BaseEconomics {
                base: r.base.clone(),
                versions: versions
                    .iter()
                    .filter(|v| v.base_model == r.base)
                    .map(cost_item)
                    .collect(),
                ..BaseEconomics::default()
            });
        }
        let Some(b) = bases.last_mut() else { continue };
        b.chart.push(ChartDay {
            day: day_label(r.day),
            duty_cycle_bp: r.figures.duty_cycle_bp,
            margin_bp: r.figures.margin_bp,
        });
        if r.day == day {
            b.figures = r.figures;
            b.cost = r.cost.and_then(|c| {
                versions
                    .iter()
                    .find(|v| v.base_model == r.base && v.effective_from == c.effective_from)
                    .map(cost_item)
            });
        }
    }
    let floors = db::template_floors(pool).await?;
    let what_if = what_if(params, &rows, &versions, &floors, day, now);
    Ok(EconomicsView {
        day: day_label(day),
        bases,
        catalog: db::base_names(pool).await?,
        what_if,
        notice,
    })
}

/// The what-if of the query string; its defaults are the chosen base's day as measured (price
/// from revenue, the tokens served) and its floor: the template's now (the what-if is about
/// running the base from today on), or, for a base without a template, the day's as measured.
fn what_if(
    params: &EconomicsParams,
    rows: &[BaseDay],
    versions: &[CostRow],
    floors: &[(String, i32)],
    day: Date,
    now: OffsetDateTime,
) -> WhatIfView {
    let costed = |b: &str| versions.iter().any(|v| v.base_model == b);
    let base = given(&params.base)
        .map(str::to_owned)
        .or_else(|| {
            rows.iter()
                .find(|r| costed(&r.base))
                .map(|r| r.base.clone())
        })
        .unwrap_or_default();
    let measured = rows.iter().find(|r| r.base == base && r.day == day);
    let f = measured.map(|r| r.figures).unwrap_or_default();
    let template_floor = floors
        .iter()
        .find(|(b, _)| *b == base)
        .map(|(_, floor)| i64::from(*floor).max(1));
    let floor_default = template_floor.unwrap_or(if f.floor_replica_seconds > 0 {
        (f.floor_replica_seconds + 86_399) / 86_400
    } else {
        1
    });
    let field = |v: &Option<String>, default: i64| {
        given(v).map_or_else(|| default.to_string(), str::to_owned)
    };
    let mut view = WhatIfView {
        base: base.clone(),
        price: field(&params.price, f.price_per_million_micros.unwrap_or(0)),
        floor: field(&params.floor, floor_default),
        tokens: field(
            &params.tokens,
            f.prompt_tokens.saturating_add(f.completion_tokens),
        ),
        outcome: None,
        notice: None,
    };
    // The version in effect now: the what-if is about running the base from today on.
    let cost: Option<CostVersion> = versions
        .iter()
        .rev()
        .find(|v| v.base_model == base && v.effective_from <= now)
        .map(CostRow::version);
    let Some(cost) = cost else {
        view.notice = Some(if base.is_empty() {
            "Set a base's cost below to use the what-if.".to_owned()
        } else {
            format!("{base} has no cost in effect: set one below.")
        });
        return view;
    };
    let parse = |s: &str| s.trim().parse::<i64>().ok().filter(|n| *n >= 0);
    let (Some(price), Some(floor), Some(tokens)) = (
        parse(&view.price),
        parse(&view.floor).filter(|n| *n >= 1 && *n <= 10_000),
        parse(&view.tokens),
    ) else {
        view.notice = Some(
            "Price and tokens are whole numbers of 0 or more, the floor 1 to 10,000 replicas."
                .to_owned(),
        );
        return view;
    };
    let r = economics::what_if(
        &cost,
        &WhatIf {
            price_per_million_micros: price,
            floor,
            tokens_per_day: tokens,
        },
    );
    view.outcome = Some(WhatIfOutcome {
        replicas: r.replicas,
        figures: r.figures,
        break_even_duty_cycle_bp: r.break_even_duty_cycle_bp,
        break_even_tokens_per_day: r.break_even_tokens_per_day,
    });
    view
}

#[cfg(test)]
mod tests {
    use super::parse_from;
    use time::macros::datetime;

    #[test]
    fn effective_from_parses_what_the_form_sends() {
        let now = datetime!(2026-12-03 10:20 UTC);
        assert_eq!(parse_from(" ", now), Some(now));
        assert_eq!(
            parse_from("2026-12-04T06:30", now),
            Some(datetime!(2026-12-04 06:30 UTC))
        );
        assert_eq!(
            parse_from("2026-12-04", now),
            Some(datetime!(2026-12-04 00:00 UTC))
        );
        assert_eq!(parse_from("tomorrow", now), None);
    }
}
