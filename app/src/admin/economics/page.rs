//! `/admin/economics`: per base, what a million tokens cost on a UTC day at full load and at the
//! duty cycle measured, the price earned, the margin and the floor's idle cost; 30 days of duty
//! cycle and of margin as server-drawn charts scaled to the data; who the day's cost is for
//! ([`super::attribution`]); the floor and idle-policy advisor with its Apply buttons
//! ([`super::advisor`]); a what-if (a GET form, computed on the server); and the form that
//! appends a base's cost version (POST with CSRF). Works with JavaScript off.

use leptos::prelude::*;
use leptos_meta::Title;
use leptos_router::hooks::use_query_map;

use super::advisor::BudgetView;
use super::chart::{percent, Point, RatioChart};
use super::{
    admin_economics, AdminSetBaseCost, BaseEconomics, CostItem, EconomicsParams, EconomicsView,
    Figures, Weights, WhatIfView,
};
use crate::admin::count;
use crate::frame::{framed, CsrfField, Guarded, WIDE};
use crate::model::{Access, PageState};
use crate::money::format_micros;
use crate::PRODUCT;

#[component]
pub fn EconomicsPage() -> impl IntoView {
    view! {
        <Title text=format!("Economics · {PRODUCT}")/>
        <Guarded access=Access::Admin content=page/>
    }
}

fn page(state: PageState) -> AnyView {
    let query = use_query_map().get_untracked();
    let params = EconomicsParams {
        day: query.get("day"),
        base: query.get("base"),
        price: query.get("price"),
        floor: query.get("floor"),
        tokens: query.get("tokens"),
        days: query.get("days"),
        budget: query.get("budget"),
        max_share: query.get("max_share"),
        max_starts: query.get("max_starts"),
    };
    framed(state, WIDE, "Economics", admin_economics(params), body)
}

fn opt_money(v: Option<i64>) -> String {
    v.map_or_else(|| "–".to_owned(), format_micros)
}

fn opt_percent(v: Option<i64>) -> String {
    v.map_or_else(|| "–".to_owned(), percent)
}

/// Replica-seconds as hours with two decimals.
fn hours(seconds: i64) -> String {
    let centi = (seconds.max(0) * 100 + 1_800) / 3_600;
    format!("{}.{:02} h", centi / 100, centi % 100)
}

fn cost_line(c: &CostItem) -> String {
    format!(
        "{} per GPU-hour × {} GPU(s) per replica, peak {} tokens/s per replica{}, from {} UTC",
        format_micros(c.gpu_micros_per_hour),
        c.gpus_per_replica,
        count(c.peak_tokens_per_second),
        if c.peak_measured { " (measured)" } else { "" },
        c.effective_from
    )
}

fn facts(f: &Figures) -> AnyView {
    let rows: Vec<(&'static str, &'static str, String)> = vec![
        (
            "floor-hours",
            "Warm floor replica-hours",
            hours(f.floor_replica_seconds),
        ),
        (
            "scaled-hours",
            "Warm scaled-up replica-hours",
            hours(f.scaled_replica_seconds),
        ),
        (
            "capacity",
            "Tokens the warm replicas could serve",
            count(f.capacity_tokens),
        ),
        (
            "served",
            "Tokens served (prompt + completion)",
            count(f.prompt_tokens.saturating_add(f.completion_tokens)),
        ),
        (
            "split",
            "Prompt / cached / completion",
            format!(
                "{} / {} / {}",
                count(f.prompt_tokens),
                count(f.cached_tokens),
                count(f.completion_tokens)
            ),
        ),
        ("duty", "Duty cycle", opt_percent(f.duty_cycle_bp)),
        ("gpu-cost", "GPU cost", format_micros(f.gpu_cost_micros)),
        (
            "full-load",
            "Cost per million tokens at full load",
            opt_money(f.full_load_cost_per_million_micros),
        ),
        (
            "real-cost",
            "Cost per million tokens at this duty cycle",
            opt_money(f.real_cost_per_million_micros),
        ),
        ("revenue", "Revenue", format_micros(f.revenue_micros)),
        (
            "price",
            "Blended price per million tokens",
            opt_money(f.price_per_million_micros),
        ),
        ("margin", "Margin", format_micros(f.margin_micros)),
        (
            "margin-share",
            "Margin share of revenue",
            opt_percent(f.margin_bp),
        ),
        (
            "floor-cost",
            "Floor cost",
            format_micros(f.floor_cost_micros),
        ),
        (
            "idle-floor",
            "Floor cost while idle",
            format_micros(f.idle_floor_cost_micros),
        ),
    ];
    view! {
        <table class="facts economics">
            {rows.into_iter().map(|(class, label, value)| view! {
                <tr class=class><th>{label}</th><td class="num">{value}</td></tr>
            }).collect_view()}
        </table>
    }
    .into_any()
}

fn base_panel(b: BaseEconomics, day: &str, budget: &BudgetView, csrf: String) -> AnyView {
    let points = |f: fn(&super::ChartDay) -> Option<i64>| -> Vec<Point> {
        b.chart
            .iter()
            .map(|d| Point {
                label: d.day.get(5..).unwrap_or(&d.day).to_owned(),
                value_bp: f(d),
            })
            .collect()
    };
    let duty = points(|d| d.duty_cycle_bp);
    let margin = points(|d| d.margin_bp);
    let duty_caption = format!("{}: duty cycle, 30 days to {day}", b.base);
    let margin_caption = format!(
        "{}: margin share of revenue, 30 days to {day} (no bar: no revenue that day)",
        b.base
    );
    let attribution = b
        .attribution
        .clone()
        .map(|a| super::attribution::section(a, &b.base, day));
    let advisor = b
        .advisor
        .clone()
        .map(|a| super::advisor::section(a, &b.base, budget, day, csrf));
    let uncosted = b.figures.uncosted_replica_seconds;
    let versions = b.versions.clone();
    view! {
        <section class="panel base-economics" data-base=b.base.clone()>
            <h2>{b.base.clone()}</h2>
            <p class="cost">{b.cost.as_ref().map_or_else(
                || "No cost in effect on this day: set one below.".to_owned(), cost_line)}</p>
            {(uncosted > 0).then(|| view! {
                <p class="notice" role="status">{format!(
                    "{} of warm replica time had no cost in effect and is not counted.",
                    hours(uncosted))}</p>
            })}
            {facts(&b.figures)}
            <RatioChart points=duty caption=duty_caption name="duty cycle"/>
            <RatioChart points=margin caption=margin_caption name="margin share"/>
            {attribution}
            {advisor}
            {(!versions.is_empty()).then(|| view! {
                <details>
                    <summary>{format!("Cost versions ({})", versions.len())}</summary>
                    <ul class="versions">
                        {versions.iter().map(|v| view! {
                            <li>{cost_line(v)} {format!(" (set by {})", v.created_by)}</li>
                        }).collect_view()}
                    </ul>
                </details>
            })}
        </section>
    }
    .into_any()
}

fn what_if_panel(w: WhatIfView, day: &str, bases: &[String]) -> AnyView {
    let outcome = w.outcome.clone().map(|o| {
        let f = o.figures;
        view! {
            <table class="facts what-if">
                <tr class="replicas"><th>"Replicas (floor, or more to serve the tokens)"</th>
                    <td class="num">{o.replicas}</td></tr>
                <tr class="duty"><th>"Duty cycle"</th><td class="num">{opt_percent(f.duty_cycle_bp)}</td></tr>
                <tr class="break-even"><th>"Break-even duty cycle"</th>
                    <td class="num">{opt_percent(o.break_even_duty_cycle_bp)}</td></tr>
                <tr class="break-even-tokens"><th>"Break-even tokens per day"</th>
                    <td class="num">{o.break_even_tokens_per_day.map_or_else(|| "–".to_owned(), count)}</td></tr>
                <tr class="gpu-cost"><th>"GPU cost per day"</th><td class="num">{format_micros(f.gpu_cost_micros)}</td></tr>
                <tr class="revenue"><th>"Revenue per day"</th><td class="num">{format_micros(f.revenue_micros)}</td></tr>
                <tr class="margin"><th>"Margin per day"</th><td class="num">{format_micros(f.margin_micros)}</td></tr>
                <tr class="margin-share"><th>"Margin share"</th><td class="num">{opt_percent(f.margin_bp)}</td></tr>
                <tr class="real-cost"><th>"Cost per million tokens"</th>
                    <td class="num">{opt_money(f.real_cost_per_million_micros)}</td></tr>
                <tr class="idle-floor"><th>"Floor cost while idle"</th>
                    <td class="num">{format_micros(f.idle_floor_cost_micros)}</td></tr>
            </table>
        }
    });
    let current = w.base.clone();
    view! {
        <section class="panel what-if">
            <h2>"What if"</h2>
            <form class="filters" method="get" action="/admin/economics">
                <input type="hidden" name="day" value=day.to_owned()/>
                <label>"Base"
                    <select name="base">
                        {bases.iter().map(|b| {
                            let selected = *b == current;
                            view! { <option value=b.clone() selected=selected>{b.clone()}</option> }
                        }).collect_view()}
                    </select>
                </label>
                <label>"Price per million tokens (micros)"
                    <input type="text" inputmode="numeric" name="price" value=w.price.clone() size="12"/></label>
                <label>"Floor (replicas)"
                    <input type="text" inputmode="numeric" name="floor" value=w.floor.clone() size="4"/></label>
                <label>"Expected tokens per day"
                    <input type="text" inputmode="numeric" name="tokens" value=w.tokens.clone() size="14"/></label>
                <button type="submit">"Compute"</button>
            </form>
            <p class="muted">"One full day at the base's cost in effect now; replicas scale above \
                the floor only as far as the tokens need at peak."</p>
            {w.notice.clone().map(|m| view! { <p class="notice" role="status">{m}</p> })}
            {outcome}
        </section>
    }
    .into_any()
}

fn cost_form(catalog: Vec<String>, csrf: String) -> AnyView {
    let save = ServerAction::<AdminSetBaseCost>::new();
    view! {
        <section class="panel">
            <h2>"Set a base's cost"</h2>
            <ActionForm action=save attr:class="limits cost-form">
                <CsrfField token=csrf/>
                <label>"Base"
                    <select name="base">
                        {catalog.into_iter().map(|b| view! { <option value=b.clone()>{b.clone()}</option> })
                            .collect_view()}
                    </select>
                </label>
                <label>"GPU cost per hour (micros)"
                    <input type="text" inputmode="numeric" name="gpu_micros_per_hour" size="12"/></label>
                <label>"GPUs per replica"
                    <input type="text" inputmode="numeric" name="gpus_per_replica" size="4"/></label>
                <label>"Peak tokens/s per replica"
                    <input type="text" inputmode="numeric" name="peak_tokens_per_second" size="8"/></label>
                <label>"Effective from (UTC, empty: now)"
                    <input type="datetime-local" name="effective_from"/></label>
                <button type="submit">"Add cost version"</button>
            </ActionForm>
            <p class="muted">"A change is a new version from its time on; earlier days keep the \
                costs they had."</p>
        </section>
    }
    .into_any()
}

/// The token weights as the data layer counts load: `1`, `0.1`.
fn weight(milli: i64) -> String {
    let (whole, frac) = (milli / 1000, milli % 1000);
    if frac == 0 {
        return whole.to_string();
    }
    let mut f = format!("{frac:03}");
    while f.ends_with('0') {
        f.pop();
    }
    format!("{whole}.{f}")
}

fn weights_line(w: &Weights) -> String {
    format!(
        "Token weights (the load the duty cycle, the idle floor, the advisor and the \
         attribution count): fresh prompt token {}, cached prompt token {}, completion token {}.",
        weight(w.fresh_prompt_milli),
        weight(w.cached_prompt_milli),
        weight(w.completion_milli)
    )
}

fn body(v: EconomicsView, csrf: String) -> AnyView {
    let day = v.day.clone();
    let budget = v.budget.clone();
    let weights = weights_line(&v.weights);
    let empty = v.bases.is_empty();
    let costed: Vec<String> = v
        .bases
        .iter()
        .filter(|b| !b.versions.is_empty())
        .map(|b| b.base.clone())
        .collect();
    view! {
        {v.notice.clone().map(|m| view! { <p class="notice" role="status">{m}</p> })}
        <form class="filters" method="get" action="/admin/economics">
            <label>"Day (UTC)"<input type="date" name="day" value=day.clone()/></label>
            <button type="submit">"Show"</button>
        </form>
        <p class="muted">
            "A replica is warm while its graph is ready. Duty cycle: the load served (tokens at \
             the weights below) over what the warm replicas could serve at peak. The floor's idle cost \
             is its cost times the share of its capacity unused (traffic fills the floor first). \
             Money in micro-units and ratios in basis points, each rounded once, half-up; the \
             margin is revenue minus GPU cost as shown. Revenue is billing's rated charges \
             (the live rating run); usage the rater has not reached yet is not counted. Today \
             counts up to now."
        </p>
        <p class="muted weights">{weights}</p>
        {budget.notice.clone().map(|m| view! { <p class="notice" role="status">{m}</p> })}
        {empty.then(|| view! { <p class="muted">"No base has costs, graph history or usage in these 30 days."</p> })}
        {v.bases.into_iter().map(|b| base_panel(b, &day, &budget, csrf.clone())).collect_view()}
        {what_if_panel(v.what_if, &day, &costed)}
        {cost_form(v.catalog, csrf)}
    }
    .into_any()
}
