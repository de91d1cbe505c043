//! `/usage`: the tenant's usage per day and model over a range they pick (last 7, 30 or 90 days,
//! or custom dates), filtered by key and model: a stacked bar per day (fresh prompt, cached
//! prompt, completion tokens) with the cost as a line, drawn on the server, and the exact figures
//! in a table. The filter is a GET form, so the URL can be shared and it works with JS off.

use leptos::prelude::*;
use leptos_meta::Title;
use leptos_router::hooks::use_query_map;

use super::charts::{compact, ChartData, Column, StackedBarsWithLine};
use super::{fetch_usage, Choice, UsageFigures, UsageParams, UsageReport, VIEWS};
use crate::frame::{framed, Guarded, WIDE};
use crate::model::{Access, PageState};
use crate::money::{format_micros, group_thousands, Decimals};
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
        view: query.get("view"),
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

/// Series a chart stacks at most; the rest are summed as one "other".
const MAX_SERIES: usize = 6;

/// Stacks per day by name (a model or a key): the names with the most tokens first (up to
/// [`MAX_SERIES`], then "other"), and each day's stack in that order.
fn stacked_by_name<'a>(
    days: &[(String, UsageFigures)],
    items: impl Iterator<Item = (&'a str, &'a str, u64)> + Clone,
    other: &str,
) -> (Vec<String>, Vec<Vec<u64>>) {
    let mut totals: Vec<(String, u64)> = Vec::new();
    for (_, name, tokens) in items.clone() {
        match totals.iter_mut().find(|(n, _)| n == name) {
            Some((_, t)) => *t = t.saturating_add(tokens),
            None => totals.push((name.to_owned(), tokens)),
        }
    }
    totals.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
    let mut series: Vec<String> = totals.iter().map(|(n, _)| n.clone()).collect();
    let overflow = series.len() > MAX_SERIES + 1;
    if overflow {
        series.truncate(MAX_SERIES);
        series.push(other.to_owned());
    }
    let slot = |name: &str| {
        series
            .iter()
            .position(|s| s == name)
            .filter(|i| !overflow || *i < MAX_SERIES)
            .unwrap_or(series.len().saturating_sub(1))
    };
    let stacks = days
        .iter()
        .map(|(day, _)| {
            let mut stack = vec![0u64; series.len()];
            for (d, name, tokens) in items.clone() {
                if d == day {
                    if let Some(v) = stack.get_mut(slot(name)) {
                        *v = v.saturating_add(tokens);
                    }
                }
            }
            stack
        })
        .collect();
    (series, stacks)
}

fn chart(report: &UsageReport) -> ChartData {
    let unsigned = |v: i64| u64::try_from(v).unwrap_or(0);
    let (series, stacks): (Vec<String>, Vec<Vec<u64>>) = match report.view.as_str() {
        "model" => stacked_by_name(
            &report.days,
            report.rows.iter().map(|r| {
                let f = &r.figures;
                (
                    r.day.as_str(),
                    r.model.as_str(),
                    unsigned(f.prompt_tokens.saturating_add(f.completion_tokens)),
                )
            }),
            "other models",
        ),
        "key" => stacked_by_name(
            &report.days,
            report
                .key_days
                .iter()
                .map(|k| (k.day.as_str(), k.key.as_str(), unsigned(k.tokens))),
            "other keys",
        ),
        _ => (
            vec![
                "fresh prompt".to_owned(),
                "cached prompt".to_owned(),
                "completion".to_owned(),
            ],
            report
                .days
                .iter()
                .map(|(_, f)| {
                    vec![
                        unsigned(fresh(f)),
                        unsigned(f.cached_tokens),
                        unsigned(f.completion_tokens),
                    ]
                })
                .collect(),
        ),
    };
    ChartData {
        series,
        unit: "tokens",
        line_name: "cost",
        columns: report
            .days
            .iter()
            .zip(stacks)
            .map(|((day, f), stack)| Column {
                // MM-DD: the year is in the range above the chart.
                label: day.get(5..).unwrap_or(day).to_owned(),
                stack,
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

fn figures_cells(f: &UsageFigures, cost: Decimals) -> impl IntoView {
    view! {
        <td class="num requests">{n(f.requests)}</td>
        <td class="num prompt">{n(f.prompt_tokens)}</td>
        <td class="num cached">{n(f.cached_tokens)}</td>
        <td class="num completion">{n(f.completion_tokens)}</td>
        <td class="num cost">{cost.show(f.cost_micros)}</td>
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
    let what = match report.view.as_str() {
        "model" => "by model",
        "key" => "by key",
        _ => "by kind (fresh prompt, cached prompt, completion)",
    };
    let caption = format!(
        "Tokens per day {what} and cost, {} to {}",
        report.from, report.to
    );
    let views: Vec<Choice> = VIEWS.iter().map(|(v, l)| choice(v, l)).collect();
    let endpoint_rows = report
        .endpoints
        .iter()
        .map(|e| {
            view! {
                <tr class="endpoint-row" data-endpoint=e.endpoint.clone()>
                    <td>{e.label.clone()}</td>
                    <td class="num requests">{n(e.requests)}</td>
                    <td class="num prompt">{n(e.prompt_tokens)}</td>
                    <td class="num cached">{n(e.cached_tokens)}</td>
                    <td class="num completion">{n(e.completion_tokens)}</td>
                </tr>
            }
        })
        .collect_view();
    let no_endpoints = report.endpoints.is_empty();
    let data = chart(&report);
    let t = &report.totals;
    // One number of decimals for the cost column, its total and the summary: they align.
    let cost = Decimals::for_amounts(
        report
            .rows
            .iter()
            .map(|r| r.figures.cost_micros)
            .chain([t.cost_micros]),
    );
    let summary = format!(
        "{} to {} (UTC): {} requests, {} prompt tokens ({} cached), {} completion tokens, cost {}.",
        report.from,
        report.to,
        n(t.requests),
        n(t.prompt_tokens),
        n(t.cached_tokens),
        n(t.completion_tokens),
        cost.show(t.cost_micros)
    );
    let rows = report
        .rows
        .iter()
        .map(|r| {
            view! {
                <tr class="usage-row" data-day=r.day.clone() data-model=r.model.clone()>
                    <td>{r.day.clone()}</td>
                    <td>{r.model.clone()}</td>
                    {figures_cells(&r.figures, cost)}
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
            <label>"Chart"<select name="view">{options(views, &report.view)}</select></label>
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
                <tr class="totals"><th colspan="2">"Total"</th>{figures_cells(t, cost)}</tr>
            </tfoot>
        </table>
        </div>
        <h2 class="table-title">"By endpoint"</h2>
        {if no_endpoints {
            view! { <p class="muted">"No requests in this range."</p> }.into_any()
        } else {
            view! {
                <div class="scroll">
                <table class="usage endpoints">
                    <thead>
                        <tr>
                            <th>"Endpoint"</th><th class="num">"Requests"</th>
                            <th class="num">"Prompt tokens"</th><th class="num">"Cached"</th>
                            <th class="num">"Completion tokens"</th>
                        </tr>
                    </thead>
                    <tbody>{endpoint_rows}</tbody>
                </table>
                </div>
            }
            .into_any()
        }}
    }
    .into_any()
}

#[cfg(test)]
mod tests {
    use super::{cost_tick, stacked_by_name, UsageFigures, MAX_SERIES};

    #[test]
    fn stacks_by_name_keep_the_biggest_and_sum_the_rest() {
        let days: Vec<(String, UsageFigures)> = ["d1", "d2"]
            .iter()
            .map(|d| ((*d).to_owned(), UsageFigures::default()))
            .collect();
        let names: Vec<String> = (0..9).map(|i| format!("m{i}")).collect();
        let items: Vec<(&str, &str, u64)> = names
            .iter()
            .enumerate()
            .map(|(i, n)| ("d1", n.as_str(), 100 - i as u64))
            .chain([("d2", "m7", 1)])
            .collect();
        let (series, stacks) = stacked_by_name(&days, items.iter().copied(), "other");
        assert_eq!(series.len(), MAX_SERIES + 1);
        assert_eq!(series[0], "m0");
        assert_eq!(series[MAX_SERIES], "other");
        // m6, m7, m8 (94 + 93 + 92) are "other" on d1; m7's 1 on d2 too.
        assert_eq!(stacks[0][MAX_SERIES], 94 + 93 + 92);
        assert_eq!(stacks[1], [0, 0, 0, 0, 0, 0, 1]);
        assert_eq!(stacks[0].iter().sum::<u64>(), (92..=100).sum::<u64>());
        // Few names: no "other".
        let (series, _) =
            stacked_by_name(&days, [("d1", "a", 1), ("d2", "b", 2)].into_iter(), "other");
        assert_eq!(series, ["b", "a"]);
    }

    #[test]
    fn cost_ticks_are_short() {
        assert_eq!(cost_tick(0), "$0.00");
        assert_eq!(cost_tick(1_500), "$0.0015");
        assert_eq!(cost_tick(2_500_000), "$2.50");
        assert_eq!(cost_tick(1_234_567_890), "$1,234.56");
    }
}
