//! `tokenfactory admin economics --day D [--format json]`: the figures of `/admin/economics` for
//! one UTC day, from the same `tf_core::db::economics::days` (so the two never disagree). Money
//! is integer micro-units, ratios basis points (10,000 = 100 %), each rounded once, half-up;
//! `null` in JSON (`-` in text) is a ratio without a denominator.

use std::fmt::Write as _;

use anyhow::Context;
use serde_json::json;
use sqlx::PgPool;
use tf_core::db::economics::{self, BaseDay};
use time::format_description::well_known::Rfc3339;
use time::macros::format_description;
use time::{Date, OffsetDateTime};

use crate::cli::{EconomicsArgs, OutputFormat};

/// The report to print for `a` (today's window ends at `now`).
pub async fn run(pool: &PgPool, a: &EconomicsArgs, now: OffsetDateTime) -> anyhow::Result<String> {
    let Some(typed) = a.day.as_deref() else {
        anyhow::bail!("give --day YYYY-MM-DD (or the measure-peak subcommand)");
    };
    let day = Date::parse(typed.trim(), format_description!("[year]-[month]-[day]"))
        .with_context(|| format!("--day {typed:?} is not a date (YYYY-MM-DD)"))?;
    let rows = economics::days(pool, day, 1, now).await?;
    Ok(match a.format {
        OutputFormat::Json => {
            let bases: Vec<_> = rows.iter().map(to_json).collect();
            serde_json::to_string_pretty(&json!({ "day": typed.trim(), "bases": bases }))?
        }
        OutputFormat::Text => text(typed, &rows),
    })
}

fn to_json(r: &BaseDay) -> serde_json::Value {
    json!({
        "base": r.base,
        "cost": r.cost.map(|c| json!({
            "effective_from": c.effective_from.format(&Rfc3339).unwrap_or_default(),
            "gpu_micros_per_hour": c.gpu_micros_per_hour,
            "gpus_per_replica": c.gpus_per_replica,
            "peak_tokens_per_second": c.peak_tokens_per_second,
        })),
        "figures": r.figures,
    })
}

fn opt(v: Option<i64>) -> String {
    v.map_or_else(|| "-".to_owned(), |n| n.to_string())
}

fn text(day: &str, rows: &[BaseDay]) -> String {
    let mut out = String::new();
    if rows.is_empty() {
        let _ = writeln!(out, "no base has costs, graph history or usage on {day}");
    }
    for r in rows {
        let f = &r.figures;
        let cost = r.cost.map_or_else(
            || "no cost set".to_owned(),
            |c| {
                format!(
                    "{} micros/GPU-hour x {} GPU(s), peak {} tokens/s per replica",
                    c.gpu_micros_per_hour, c.gpus_per_replica, c.peak_tokens_per_second
                )
            },
        );
        let lines = [
            format!("{} on {day} ({cost})", r.base),
            format!(
                "  warm replica-seconds: floor {}, scaled up {}, uncosted {}",
                f.floor_replica_seconds, f.scaled_replica_seconds, f.uncosted_replica_seconds
            ),
            format!(
                "  tokens: capacity {}, prompt {}, cached {}, completion {}; load {} (weights: \
                 fresh prompt 1, cached prompt 0.1, completion 1)",
                f.capacity_tokens,
                f.prompt_tokens,
                f.cached_tokens,
                f.completion_tokens,
                f.load_tokens
            ),
            format!("  duty cycle (bp): {}", opt(f.duty_cycle_bp)),
            format!(
                "  gpu cost (micros): {}; per million at full load {}, at this duty cycle {}",
                f.gpu_cost_micros,
                opt(f.full_load_cost_per_million_micros),
                opt(f.real_cost_per_million_micros)
            ),
            format!(
                "  revenue (micros): {}; price per million {}",
                f.revenue_micros,
                opt(f.price_per_million_micros)
            ),
            format!(
                "  margin (micros): {}; share (bp) {}",
                f.margin_micros,
                opt(f.margin_bp)
            ),
            format!(
                "  floor cost (micros): {}; idle {}",
                f.floor_cost_micros, f.idle_floor_cost_micros
            ),
        ];
        for l in lines {
            let _ = writeln!(out, "{l}");
        }
    }
    out
}
