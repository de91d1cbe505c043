//! Who a base's GPU cost on the day shown is for (issue 36), as `/admin/economics` shows it: one
//! row per tenant and served model (and an unattributed row when part of the cost served
//! nobody), and each tenant's gross margin on the base. The split is
//! `tf_core::economics::attribution`'s; the page states its rule ([`RULE`], [`REMAINDER_RULE`]).

use leptos::prelude::*;
use serde::{Deserialize, Serialize};

use super::chart::percent;
use crate::admin::count;
use crate::money::format_micros;

/// The split, in words (the rule of `tf_core::economics::attribution`).
pub const RULE: &str = "The used cost (GPU cost minus the idle floor cost) is split by load: \
    each tenant and served model pays for the capacity its tokens took, at the token weights \
    above. The idle floor cost is split by the idle time each request was waited for: a \
    request weighs the time since the base's previous request (since the day's start for the \
    first), so a long-tail adapter called a few times a day pays for the hours the floor kept \
    warm for it. Cost nobody used (no load, or no request at all) is its own row, \
    unattributed, so the rows add up to the base's GPU cost.";

/// How micro-units left over by the split are placed.
pub const REMAINDER_RULE: &str = "Each part is split in whole micro-units by the largest \
    remainder: every share is rounded down, then the micros left go one each to the largest \
    remainders (ties to the earlier row, by tenant id then model), so the shares sum to the \
    cost exactly.";

/// One row of the split.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ShareRow {
    /// The tenant's handle (`None`: the unattributed row).
    pub tenant: Option<String>,
    /// The adapter (`None`: the bare base).
    pub adapter: Option<String>,
    pub requests: i64,
    pub load_tokens: i64,
    pub waited_for_ms: i64,
    pub used_cost_micros: i64,
    pub idle_floor_cost_micros: i64,
    pub cost_micros: i64,
    /// Of the base's GPU cost, in basis points.
    pub share_bp: Option<i64>,
}

/// A tenant's gross margin on the base that day.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct MarginRow {
    pub tenant: String,
    pub revenue_micros: i64,
    pub cost_micros: i64,
    pub margin_micros: i64,
    pub margin_bp: Option<i64>,
}

/// A base-day's attribution.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct AttributionView {
    pub gpu_cost_micros: i64,
    pub idle_floor_cost_micros: i64,
    pub shares: Vec<ShareRow>,
    pub margins: Vec<MarginRow>,
}

fn opt_percent(v: Option<i64>) -> String {
    v.map_or_else(|| "–".to_owned(), percent)
}

/// Milliseconds as hours with two decimals.
fn hours_ms(ms: i64) -> String {
    let centi = (ms.max(0) + 18_000) / 36_000;
    format!("{}.{:02} h", centi / 100, centi % 100)
}

/// The section of a base's panel.
pub fn section(a: AttributionView, base: &str, day: &str) -> AnyView {
    let total: i64 = a.shares.iter().map(|s| s.cost_micros).sum();
    let rows = a
        .shares
        .iter()
        .map(|s| {
            let who = s
                .tenant
                .clone()
                .unwrap_or_else(|| "(unattributed)".to_owned());
            let class = if s.tenant.is_none() {
                "unattributed"
            } else {
                "share"
            };
            view! {
                <tr class=class>
                    <td>{who}</td>
                    <td>{s.adapter.clone().unwrap_or_else(|| "(base)".to_owned())}</td>
                    <td class="num">{count(s.requests)}</td>
                    <td class="num">{count(s.load_tokens)}</td>
                    <td class="num">{hours_ms(s.waited_for_ms)}</td>
                    <td class="num">{format_micros(s.used_cost_micros)}</td>
                    <td class="num">{format_micros(s.idle_floor_cost_micros)}</td>
                    <td class="num">{format_micros(s.cost_micros)}</td>
                    <td class="num">{opt_percent(s.share_bp)}</td>
                </tr>
            }
        })
        .collect_view();
    let margins = a
        .margins
        .iter()
        .map(|m| {
            view! {
                <tr>
                    <td><a href=format!("/admin/tenants/{}", m.tenant)>{m.tenant.clone()}</a></td>
                    <td class="num">{format_micros(m.revenue_micros)}</td>
                    <td class="num">{format_micros(m.cost_micros)}</td>
                    <td class="num">{format_micros(m.margin_micros)}</td>
                    <td class="num">{opt_percent(m.margin_bp)}</td>
                </tr>
            }
        })
        .collect_view();
    view! {
        <section class="attribution" data-base=base.to_owned()>
            <h3>{format!("Who the cost of {day} is for")}</h3>
            <p>{format!(
                "GPU cost {} of which idle floor {}; the rows add up to {}.",
                format_micros(a.gpu_cost_micros),
                format_micros(a.idle_floor_cost_micros),
                format_micros(total)
            )}</p>
            <p class="muted rule">{RULE}</p>
            <p class="muted remainder-rule">{REMAINDER_RULE}</p>
            <div class="scroll">
            <table class="list attribution-shares">
                <thead><tr><th>"Tenant"</th><th>"Model"</th><th class="num">"Requests"</th>
                    <th class="num">"Load (tokens)"</th><th class="num">"Idle waited for"</th>
                    <th class="num">"Used cost"</th><th class="num">"Idle floor cost"</th>
                    <th class="num">"Cost"</th><th class="num">"Share"</th></tr></thead>
                <tbody>{rows}</tbody>
            </table>
            </div>
            {(!a.margins.is_empty()).then(|| view! {
                <table class="list tenant-margins">
                    <thead><tr><th>"Tenant"</th><th class="num">"Revenue"</th>
                        <th class="num">"Attributed cost"</th><th class="num">"Gross margin"</th>
                        <th class="num">"Margin share"</th></tr></thead>
                    <tbody>{margins}</tbody>
                </table>
            })}
        </section>
    }
    .into_any()
}
