//! `tokenfactory admin economics attribution --base B --day D [--format json]`: who a base's
//! GPU cost on a day is for, from `tf_core::db::attribution` (the rule is
//! `tf_core::economics::attribution`'s): one row per tenant and served model, an
//! unattributed row when part of the cost served nobody, and each tenant's gross margin. The
//! rows add up to the base's GPU cost to the micro.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use anyhow::Context;
use serde_json::json;
use sqlx::PgPool;
use tf_core::db::attribution::{self, Attribution};
use time::macros::format_description;
use time::{Date, OffsetDateTime};
use uuid::Uuid;

use crate::cli::{AttributionArgs, OutputFormat};

/// The report to print.
pub async fn run(
    pool: &PgPool,
    a: &AttributionArgs,
    format: OutputFormat,
    now: OffsetDateTime,
) -> anyhow::Result<String> {
    let day = Date::parse(a.day.trim(), format_description!("[year]-[month]-[day]"))
        .with_context(|| format!("--day {:?} is not a date (YYYY-MM-DD)", a.day))?;
    let Some(r) = attribution::attribution(pool, &a.base, day, now).await? else {
        anyhow::bail!("{} has no cost, graph history or usage on {day}", a.base);
    };
    let ids: Vec<Uuid> = r.margins.iter().map(|m| m.tenant_id).collect();
    let names: BTreeMap<Uuid, String> = attribution::tenant_names(pool, &ids)
        .await?
        .into_iter()
        .collect();
    Ok(match format {
        OutputFormat::Json => serde_json::to_string_pretty(&to_json(&r, &names))?,
        OutputFormat::Text => text(&r, &names),
    })
}

fn name(names: &BTreeMap<Uuid, String>, t: Option<Uuid>) -> String {
    match t {
        None => "(unattributed)".to_owned(),
        Some(t) => names.get(&t).cloned().unwrap_or_else(|| t.to_string()),
    }
}

fn to_json(r: &Attribution, names: &BTreeMap<Uuid, String>) -> serde_json::Value {
    let shares: Vec<_> = r
        .shares
        .iter()
        .map(|s| json!({ "tenant": s.tenant_id.map(|t| name(names, Some(t))), "share": s }))
        .collect();
    let margins: Vec<_> = r
        .margins
        .iter()
        .map(|m| json!({ "tenant": name(names, Some(m.tenant_id)), "margin": m }))
        .collect();
    json!({
        "base": r.base,
        "day": r.day.to_string(),
        "gpu_cost_micros": r.figures.gpu_cost_micros,
        "idle_floor_cost_micros": r.figures.idle_floor_cost_micros,
        "shares": shares,
        "tenants": margins,
    })
}

fn text(r: &Attribution, names: &BTreeMap<Uuid, String>) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "{} on {}: gpu cost {} micros, of which idle floor {} (used: by load; idle floor: by \
         the idle time each request was waited for)",
        r.base, r.day, r.figures.gpu_cost_micros, r.figures.idle_floor_cost_micros
    );
    for s in &r.shares {
        let _ = writeln!(
            out,
            "  {:<24} {:<24} requests {:>8} load {:>12} used {:>12} idle floor {:>12} cost {:>12}",
            name(names, s.tenant_id),
            s.adapter.as_deref().unwrap_or("-"),
            s.requests,
            s.load_tokens,
            s.used_cost_micros,
            s.idle_floor_cost_micros,
            s.cost_micros
        );
    }
    let _ = writeln!(
        out,
        "tenants (gross margin = rated revenue - attributed cost):"
    );
    for m in &r.margins {
        let _ = writeln!(
            out,
            "  {:<24} revenue {:>12} cost {:>12} margin {:>12} ({} bp)",
            name(names, Some(m.tenant_id)),
            m.revenue_micros,
            m.cost_micros,
            m.margin_micros,
            m.margin_bp
                .map_or_else(|| "-".to_owned(), |b| b.to_string())
        );
    }
    out
}
