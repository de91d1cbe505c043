//! Server half of `/admin/economics`: reads the query string, asks `tf_core::db::economics` for
//! the 30 days ending on the chosen day, `tf_core::db::attribution` for who the day's cost is
//! for, `tf_core::db::advisor` for each templated base's advice, and runs the what-if through
//! `tf_core::economics`. Anything in the query string that does not parse is ignored and said so,
//! never an error page.

use sqlx::PgPool;
use tf_core::db::economics::{self as db, BaseDay, CostRow};
use tf_core::economics::{self, CostVersion, WhatIf};
use time::macros::format_description;
use time::{Date, Duration, OffsetDateTime, PrimitiveDateTime};

use super::advisor::{AdvisorView, BudgetView, PolicyRow};
use super::attribution::{AttributionView, MarginRow, ShareRow};
use super::{
    BaseEconomics, ChartDay, CostItem, EconomicsParams, EconomicsView, Weights, WhatIfOutcome,
    WhatIfView,
};
use std::collections::BTreeMap;
use tf_core::db::advisor::{self as advice_db, AdviseError};
use tf_core::db::attribution as attribution_db;
use tf_core::economics::advisor::{parse_share_ppm, Budget, FALLBACK_COLD_START_MS};
use uuid::Uuid;

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
    let (budget_view, budget, days) = budget(params);
    for b in &mut bases {
        if let Some(row) = rows.iter().find(|r| r.base == b.base && r.day == day) {
            b.attribution = Some(attribution(pool, row, now).await?);
        }
        b.advisor = Some(advisor(pool, &b.base, days, now, budget).await?);
    }
    let floors = db::template_floors(pool).await?;
    let what_if = what_if(params, &rows, &versions, &floors, day, now);
    Ok(EconomicsView {
        day: day_label(day),
        bases,
        catalog: db::base_names(pool).await?,
        what_if,
        notice,
        weights: Weights {
            fresh_prompt_milli: economics::FRESH_PROMPT_WEIGHT_MILLI,
            cached_prompt_milli: economics::CACHED_PROMPT_WEIGHT_MILLI,
            completion_milli: economics::COMPLETION_WEIGHT_MILLI,
        },
        budget: budget_view,
    })
}

/// The advisor's days (1 to 366, default 30) and budget (default: at most 1 % of requests wait)
/// from the query string, echoed for the form.
pub fn budget(params: &EconomicsParams) -> (BudgetView, Budget, u16) {
    let mut notices = Vec::new();
    let days = match given(&params.days) {
        None => 30,
        Some(d) => match d.parse::<u16>() {
            Ok(n) if (1..=366).contains(&n) => n,
            _ => {
                notices.push("The advisor's days are 1 to 366: using 30.");
                30
            }
        },
    };
    let max_share = given(&params.max_share).unwrap_or("0.01").to_owned();
    let max_starts = given(&params.max_starts).unwrap_or("3").to_owned();
    let kind = match given(&params.budget) {
        Some("starts") => "starts",
        _ => "share",
    };
    let budget = if kind == "starts" {
        match max_starts.parse::<i64>() {
            Ok(n) if n >= 0 => Budget::MaxColdStartsPerDay(n),
            _ => {
                notices.push(
                    "Cold starts a day are a whole number of 0 or more: using 1 % of requests.",
                );
                Budget::MaxColdSharePpm(10_000)
            }
        }
    } else {
        parse_share_ppm(&max_share).map_or_else(
            || {
                notices.push("A share is a fraction from 0 to 1 (e.g. 0.01): using 0.01.");
                Budget::MaxColdSharePpm(10_000)
            },
            Budget::MaxColdSharePpm,
        )
    };
    let label = match budget {
        Budget::MaxColdSharePpm(ppm) => format!(
            "at most {} of requests wait for a cold start",
            super::chart::percent((ppm + 50) / 100)
        ),
        Budget::MaxColdStartsPerDay(n) => format!("at most {n} cold starts a day on average"),
    };
    let view = BudgetView {
        days: days.to_string(),
        budget: kind.to_owned(),
        max_share,
        max_starts,
        label,
        notice: (!notices.is_empty()).then(|| notices.join(" ")),
    };
    (view, budget, days)
}

/// A base-day's attribution with tenants by handle.
async fn attribution(
    pool: &PgPool,
    row: &BaseDay,
    now: OffsetDateTime,
) -> sqlx::Result<AttributionView> {
    let a = attribution_db::of_row(pool, row, now).await?;
    let ids: Vec<Uuid> = a.margins.iter().map(|m| m.tenant_id).collect();
    let names: BTreeMap<Uuid, String> = attribution_db::tenant_names(pool, &ids)
        .await?
        .into_iter()
        .collect();
    let name = |t: Uuid| names.get(&t).cloned().unwrap_or_else(|| t.to_string());
    let cost = a.figures.gpu_cost_micros;
    Ok(AttributionView {
        gpu_cost_micros: cost,
        idle_floor_cost_micros: a.figures.idle_floor_cost_micros,
        shares: a
            .shares
            .iter()
            .map(|s| ShareRow {
                tenant: s.tenant_id.map(name),
                adapter: s.adapter.clone(),
                requests: s.requests,
                load_tokens: s.load_tokens,
                waited_for_ms: s.waited_for_ms,
                used_cost_micros: s.used_cost_micros,
                idle_floor_cost_micros: s.idle_floor_cost_micros,
                cost_micros: s.cost_micros,
                share_bp: (cost > 0).then(|| {
                    economics::div_half_up(i128::from(s.cost_micros) * 10_000, i128::from(cost))
                }),
            })
            .collect(),
        margins: a
            .margins
            .iter()
            .map(|m| MarginRow {
                tenant: name(m.tenant_id),
                revenue_micros: m.revenue_micros,
                cost_micros: m.cost_micros,
                margin_micros: m.margin_micros,
                margin_bp: m.margin_bp,
            })
            .collect(),
    })
}

/// A base's advice over the `days` whole UTC days before today, or why there is none.
async fn advisor(
    pool: &PgPool,
    base: &str,
    days: u16,
    now: OffsetDateTime,
    budget: Budget,
) -> sqlx::Result<AdvisorView> {
    let report =
        match advice_db::advise(pool, base, days, now, budget, FALLBACK_COLD_START_MS).await {
            Ok(r) => r,
            Err(AdviseError::Db(e)) => return Err(e),
            Err(AdviseError::NoBase(_)) => {
                return Ok(AdvisorView {
                    notice: Some(
                        "Not a templated base: the advisor replays the bases the fleet \
                         controller serves from a template."
                            .to_owned(),
                    ),
                    ..AdvisorView::default()
                })
            }
            Err(AdviseError::NoCost(_)) => {
                return Ok(AdvisorView {
                    notice: Some("No cost in effect now: set one below to get advice.".to_owned()),
                    ..AdvisorView::default()
                })
            }
        };
    let a = &report.advice;
    let rows = a
        .outcomes
        .iter()
        .enumerate()
        .map(|(i, o)| PolicyRow {
            floor: o.policy.floor,
            idle_after_secs: o.policy.idle_after_secs,
            gpu_cost_micros: o.gpu_cost_micros,
            idle_floor_cost_micros: o.idle_floor_cost_micros,
            cold_starts: o.cold_starts,
            waited_requests: o.waited_requests,
            waited_share_ppm: o.waited_share_ppm,
            added_wait_ms: o.added_wait_ms,
            duty_cycle_bp: o.duty_cycle_bp,
            margin_micros: o.margin_micros,
            margin_bp: o.margin_bp,
            frontier: a.frontier.contains(&i),
            recommended: a.recommended == Some(i),
            current: o.policy == report.current,
            within: tf_core::economics::advisor::within(a.budget, o, a.requests, a.window_ms),
        })
        .collect();
    Ok(AdvisorView {
        first_day: day_label(report.first_day),
        days: i64::from(report.days),
        requests: a.requests,
        load_tokens: a.load_tokens,
        revenue_micros: a.revenue_micros,
        ceiling: a.template.ceiling,
        peak_tokens_per_second: a.template.peak_tokens_per_second,
        replica_micros_per_hour: a.template.replica_micros_per_hour,
        cold_start_ms: a.template.cold_start_ms,
        cold_start_source: report.cold_start_source.to_owned(),
        wakes: report.inputs.wakes,
        rows,
        notice: None,
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
