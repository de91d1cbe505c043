//! `/usage`: the tenant's usage per day and model over a range they pick (last 7, 30 or 90 days,
//! or custom dates), filtered by key and model: a stacked bar per day (fresh prompt, cached
//! prompt, completion tokens) with the cost as a line, drawn on the server, and the exact figures
//! in a table. The filter is a GET form, so the URL can be shared and it works with JS off.

use leptos::prelude::*;
use leptos_meta::Title;
use leptos_router::hooks::use_query_map;

use super::charts::{compact, ChartData, Column, StackedBarsWithLine};
use super::{fetch_usage, Choice, UsageFigures, UsageParams, UsageReport};
use crate::frame::{framed, Guarded, WIDE};
use crate::model::{Access, PageState};
use crate::money::{format_micros, group_thousands};
use crate::PRODUCT;

#[component]
pub fn UsagePage() -> impl IntoView {
    view! {
        <Title text=format!("Usage · {PRODUCT}")/>
        <Guarded access=Access::Tenant content=page/>
    }
}

fn page(state: PageState) -> AnyView {
    let query = use_query_map().get_untracked();
    let params = UsageParams {
        range: query.get("range"),
        from: query.get("from"),
        to: query.get("to"),
        key: query.get("key"),
        model: query.get("model"),
    };
    framed(state, WIDE, "Usage", fetch_usage(params), |report, _| {
        report_view(report)
    })
}

/// `<option>`s with the current one selected.
pub(super) fn options(choices: Vec<Choice>, current: &str) -> impl IntoView {
    choices
        .into_iter()
        .map(|c| {
            let selected = c.value == current;
            view! { <option value=c.value selected=selected>{c.label}</option> }
        })
        .collect_view()
}

fn choice(value: &str, label: &str) -> Choice {
    Choice {
        value: value.into(),
        label: label.into(),
    }
}

/// A cost on the chart's scale: cents from one unit up (`$1,234.56`), else every non-zero micro.
fn cost_tick(micros: u64) -> String {
    let micros = i64::try_from(micros).unwrap_or(i64::MAX);
    if micros >= 1_000_000 {
        format_micros(micros - micros % 10_000)
    } else {
        format_micros(micros)
    }
}

fn fresh(f: &UsageFigures) -> i64 {
    f.prompt_tokens.saturating_sub(f.cached_tokens)
}

fn chart(report: &UsageReport) -> ChartData {
    let unsigned = |v: i64| u64::try_from(v).unwrap_or(0);
    ChartData {
        series: vec!["fresh prompt", "cached prompt", "completion"],
        line_name: "cost",
        columns: report
            .days
            .iter()
            .map(|(day, f)| Column {
                // MM-DD: the year is in the range above the chart.
                label: day.get(5..).unwrap_or(day).to_owned(),
                stack: vec![
                    unsigned(fresh(f)),
                    unsigned(f.cached_tokens),
                    unsigned(f.completion_tokens),
                ],
                line: unsigned(f.cost_micros),
            })
            .collect(),
        bar_format: compact,
        line_format: cost_tick,
    }
}

fn n(v: i64) -> String {
    group_thousands(u64::try_from(v).unwrap_or(0))
}

fn figures_cells(f: &UsageFigures) -> impl IntoView {
    view! {
        <td class="num requests">{n(f.requests)}</td>
        <td class="num prompt">{n(f.prompt_tokens)}</td>
        <td class="num cached">{n(f.cached_tokens)}</td>
        <td class="num completion">{n(f.completion_tokens)}</td>
        <td class="num cost">{format_micros(f.cost_micros)}</td>
    }
}

fn report_view(report: UsageReport) -> AnyView {
    let ranges = vec![
        choice("7", "Last 7 days"),
        choice("30", "Last 30 days"),
        choice("90", "Last 90 days"),
        choice("custom", "Custom range"),
    ];
    let mut keys = vec![choice("", "All keys")];
    keys.extend(report.keys.clone());
    keys.push(choice("none", "Without a key"));
    let mut models = vec![choice("", "All models")];
    models.extend(report.models.iter().map(|m| choice(m, m)));
    let caption = format!(
        "Tokens per day (fresh prompt, cached prompt, completion) and cost, {} to {}",
        report.from, report.to
    );
    let data = chart(&report);
    let t = &report.totals;
    let summary = format!(
        "{} to {} (UTC): {} requests, {} prompt tokens ({} cached), {} completion tokens, cost {}.",
        report.from,
        report.to,
        n(t.requests),
        n(t.prompt_tokens),
        n(t.cached_tokens),
        n(t.completion_tokens),
        format_micros(t.cost_micros)
    );
    let rows = report
        .rows
        .iter()
        .map(|r| {
            view! {
                <tr class="usage-row" data-day=r.day.clone() data-model=r.model.clone()>
                    <td>{r.day.clone()}</td>
                    <td>{r.model.clone()}</td>
                    {figures_cells(&r.figures)}
                </tr>
            }
        })
        .collect_view();
    let empty = report.rows.is_empty();
    view! {
        {report.notice.clone().map(|m| view! { <p class="notice" role="status">{m}</p> })}
        <form class="filters" method="get" action="/usage">
            <label>"Range"
                <select name="range">{options(ranges, &report.range)}</select>
            </label>
            <label>"From"<input type="date" name="from" value=report.from.clone()/></label>
            <label>"To"<input type="date" name="to" value=report.to.clone()/></label>
            <label>"Key"<select name="key">{options(keys, &report.key)}</select></label>
            <label>"Model"<select name="model">{options(models, &report.model)}</select></label>
            <button type="submit">"Show"</button>
        </form>
        <p class="muted">"From and To apply to a custom range. Days are UTC."</p>
        <p class="summary">{summary}</p>
        <StackedBarsWithLine data=data caption=caption/>
        {if empty {
            view! { <p class="muted">"No requests in this range."</p> }.into_any()
        } else {
            ().into_any()
        }}
        <div class="scroll">
        <table class="usage">
            <thead>
                <tr>
                    <th>"Day"</th><th>"Model"</th><th class="num">"Requests"</th>
                    <th class="num">"Prompt tokens"</th><th class="num">"Cached"</th>
                    <th class="num">"Completion tokens"</th><th class="num">"Cost"</th>
                </tr>
            </thead>
            <tbody>{rows}</tbody>
            <tfoot>
                <tr class="totals"><th colspan="2">"Total"</th>{figures_cells(t)}</tr>
            </tfoot>
        </table>
        </div>
    }
    .into_any()
}

#[cfg(test)]
mod tests {
    use super::cost_tick;

    #[test]
    fn cost_ticks_are_short() {
        assert_eq!(cost_tick(0), "$0.00");
        assert_eq!(cost_tick(1_500), "$0.0015");
        assert_eq!(cost_tick(2_500_000), "$2.50");
        assert_eq!(cost_tick(1_234_567_890), "$1,234.56");
    }
}
