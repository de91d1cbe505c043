//! `tokenfactory admin economics advise --base B [--days 30] [--max-cold-share 0.01 |
//! --max-cold-starts-per-day N] [--apply]`: the floor and idle-policy advice of
//! `tf_core::db::advisor::advise` (the same the admin page shows), as a table or one JSON
//! document; `--apply` sets the recommendation through `tf_core::operator::set_serving_policy`
//! (audited, actor `cli`).

use std::fmt::Write as _;

use anyhow::{bail, Context};
use serde_json::json;
use sqlx::PgPool;
use tf_core::db::advisor::{self, Report};
use tf_core::economics::advisor::{parse_share_ppm, Budget, Outcome, Policy};
use tf_core::operator::{self, Actor};
use time::OffsetDateTime;

use crate::cli::{AdviseArgs, OutputFormat};

/// The budget the flags give (default: at most 1 % of requests wait).
pub fn budget(a: &AdviseArgs) -> anyhow::Result<Budget> {
    Ok(match (&a.max_cold_share, a.max_cold_starts_per_day) {
        (Some(s), _) => Budget::MaxColdSharePpm(
            parse_share_ppm(s)
                .with_context(|| format!("--max-cold-share {s:?}: a fraction 0 to 1, e.g. 0.01"))?,
        ),
        (None, Some(n)) if n >= 0 => Budget::MaxColdStartsPerDay(n),
        (None, Some(n)) => bail!("--max-cold-starts-per-day {n}: 0 or more"),
        (None, None) => Budget::MaxColdSharePpm(10_000),
    })
}

/// Advises (and applies, when asked); returns what to print.
pub async fn run(
    pool: &PgPool,
    a: &AdviseArgs,
    format: OutputFormat,
    now: OffsetDateTime,
) -> anyhow::Result<String> {
    let budget = budget(a)?;
    let cold_ms = a.cold_start_secs.max(0).saturating_mul(1000);
    let report = advisor::advise(pool, &a.base, a.days, now, budget, cold_ms).await?;
    let chosen = report
        .advice
        .recommended
        .and_then(|i| report.advice.outcomes.get(i))
        .map(|o| o.policy);
    let mut applied = None;
    if a.apply {
        let Some(p) = chosen else {
            bail!("no policy keeps to the budget: nothing applied");
        };
        let floor = i32::try_from(p.floor).context("floor out of range")?;
        let idle = p.idle_after_secs.map(i32::try_from).transpose()?;
        operator::set_serving_policy(pool, &Actor::CLI, &a.base, floor, idle).await?;
        applied = Some(p);
    }
    Ok(match format {
        OutputFormat::Json => serde_json::to_string_pretty(&to_json(&report, applied))?,
        OutputFormat::Text => text(&report, applied),
    })
}

/// `5m`, `4h`, `always on`.
pub fn idle_label(p: &Policy) -> String {
    match p.idle_after_secs {
        None => "always on".to_owned(),
        Some(s) if s % 3_600 == 0 => format!("{}h", s / 3_600),
        Some(s) if s % 60 == 0 => format!("{}m", s / 60),
        Some(s) => format!("{s}s"),
    }
}

fn budget_label(b: Budget) -> String {
    match b {
        Budget::MaxColdSharePpm(ppm) => format!("at most {ppm} ppm of requests wait for a wake"),
        Budget::MaxColdStartsPerDay(n) => format!("at most {n} cold starts a day"),
    }
}

fn to_json(r: &Report, applied: Option<Policy>) -> serde_json::Value {
    let a = &r.advice;
    let budget = match a.budget {
        Budget::MaxColdSharePpm(ppm) => json!({ "max_cold_share_ppm": ppm }),
        Budget::MaxColdStartsPerDay(n) => json!({ "max_cold_starts_per_day": n }),
    };
    json!({
        "base": r.base,
        "first_day": r.first_day.to_string(),
        "days": r.days,
        "requests": a.requests,
        "load_tokens": a.load_tokens,
        "revenue_micros": a.revenue_micros,
        "template": a.template,
        "cold_start_source": r.cold_start_source,
        "wakes_measured": r.inputs.wakes,
        "budget": budget,
        "current": r.current,
        "outcomes": a.outcomes,
        "frontier": a.frontier,
        "recommended": a.recommended,
        "applied": applied,
    })
}

fn opt(v: Option<i64>) -> String {
    v.map_or_else(|| "-".to_owned(), |n| n.to_string())
}

fn text(r: &Report, applied: Option<Policy>) -> String {
    let a = &r.advice;
    let t = &a.template;
    let mut out = String::new();
    let _ = writeln!(
        out,
        "{}: {} UTC days from {} ({} requests, load {} tokens, revenue {} micros)",
        r.base, r.days, r.first_day, a.requests, a.load_tokens, a.revenue_micros
    );
    let _ = writeln!(
        out,
        "  ceiling {} replicas, peak {} tokens/s per replica, {} micros per replica-hour, cold \
         start {} ms ({}, {} wakes in the days)",
        t.ceiling,
        t.peak_tokens_per_second,
        t.replica_micros_per_hour,
        t.cold_start_ms,
        r.cold_start_source,
        r.inputs.wakes
    );
    let _ = writeln!(out, "  budget: {}", budget_label(a.budget));
    let _ = writeln!(
        out,
        "  R recommended, F on the cost/cold-start frontier, C current\n  \
         {:<3} {:>5} {:>9} {:>14} {:>14} {:>14} {:>6} {:>8} {:>9} {:>10} {:>6} {:>14} {:>7}",
        "",
        "floor",
        "idle",
        "gpu cost",
        "floor cost",
        "idle floor",
        "wakes",
        "waited",
        "ppm",
        "wait s",
        "duty",
        "margin",
        "margin"
    );
    for (i, o) in a.outcomes.iter().enumerate() {
        let mark = format!(
            "{}{}{}",
            if a.recommended == Some(i) { "R" } else { "" },
            if a.frontier.contains(&i) { "F" } else { "" },
            if o.policy == r.current { "C" } else { "" },
        );
        let _ = writeln!(out, "  {:<3} {}", mark, row(o));
    }
    match a.recommended.and_then(|i| a.outcomes.get(i)) {
        Some(o) => {
            let current = a.outcomes.iter().find(|c| c.policy == r.current);
            let saving = current.map_or(0, |c| c.gpu_cost_micros.saturating_sub(o.gpu_cost_micros));
            let _ = writeln!(
                out,
                "recommended: floor {}, {}: {} micros over the days ({} micros less than the \
                 current floor {}, {})",
                o.policy.floor,
                idle_label(&o.policy),
                o.gpu_cost_micros,
                saving,
                r.current.floor,
                idle_label(&r.current)
            );
        }
        None => {
            let _ = writeln!(out, "no policy keeps to the budget");
        }
    }
    if let Some(p) = applied {
        let _ = writeln!(
            out,
            "applied: {} floor {}, {}",
            r.base,
            p.floor,
            idle_label(&p)
        );
    }
    out
}

fn row(o: &Outcome) -> String {
    format!(
        "{:>5} {:>9} {:>14} {:>14} {:>14} {:>6} {:>8} {:>9} {:>10} {:>6} {:>14} {:>7}",
        o.policy.floor,
        idle_label(&o.policy),
        o.gpu_cost_micros,
        o.floor_cost_micros,
        o.idle_floor_cost_micros,
        o.cold_starts,
        o.waited_requests,
        o.waited_share_ppm,
        o.added_wait_ms / 1000,
        opt(o.duty_cycle_bp),
        o.margin_micros,
        opt(o.margin_bp)
    )
}
