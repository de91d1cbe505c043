//! `/logs`: the tenant's request log, newest first, filtered by model, key, status and time (a
//! GET form), paginated by a cursor (the last row's start and request id) in the "Older" link,
//! never by an offset. Each row links to its detail page (`/logs/{id}`), which shows the stored
//! prompt and completion when the tenant opted in.

use leptos::prelude::*;
use leptos_meta::Title;
use leptos_router::hooks::use_query_map;

use super::page::options;
use super::{fetch_request_log, Choice, LogParams, LogReport, ENDPOINTS, STATUSES};
use crate::frame::{framed, Guarded, WIDE};
use crate::model::{Access, PageState};
use crate::money::{group_thousands, Decimals};
use crate::PRODUCT;

#[component]
pub fn LogsPage() -> impl IntoView {
    view! {
        <Title text=format!("Request log · {PRODUCT}")/>
        <Guarded access=Access::Tenant content=page/>
    }
}

fn page(state: PageState) -> AnyView {
    let query = use_query_map().get_untracked();
    let params = LogParams {
        model: query.get("model"),
        key: query.get("key"),
        status: query.get("status"),
        since: query.get("since"),
        until: query.get("until"),
        before: query.get("before"),
        after: query.get("after"),
        endpoint: query.get("endpoint"),
    };
    let first_page = params.before.is_none() && params.after.is_none();
    framed(
        state,
        WIDE,
        "Request log",
        fetch_request_log(params),
        move |report, _| log_view(report, first_page),
    )
}

/// Percent-encodes a query-string value.
fn enc(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'a'..=b'z' | b'A'..=b'Z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// Which way a pager link goes from its cursor.
#[derive(Clone, Copy)]
enum Page<'a> {
    Newest,
    Before(&'a str),
    After(&'a str),
}

/// `/logs?...` with the filters and, for another page, a cursor.
fn link(filter: &LogParams, page: Page<'_>) -> String {
    let (before, after) = match page {
        Page::Newest => (None, None),
        Page::Before(c) => (Some(c), None),
        Page::After(c) => (None, Some(c)),
    };
    let pairs = [
        ("model", filter.model.as_deref()),
        ("key", filter.key.as_deref()),
        ("status", filter.status.as_deref()),
        ("endpoint", filter.endpoint.as_deref()),
        ("since", filter.since.as_deref()),
        ("until", filter.until.as_deref()),
        ("before", before),
        ("after", after),
    ];
    let query = pairs
        .iter()
        .filter_map(|(k, v)| v.map(|v| format!("{k}={}", enc(v))))
        .collect::<Vec<_>>()
        .join("&");
    if query.is_empty() {
        "/logs".into()
    } else {
        format!("/logs?{query}")
    }
}

fn choice(value: &str, label: &str) -> Choice {
    Choice {
        value: value.into(),
        label: label.into(),
    }
}

fn n(v: i64) -> String {
    group_thousands(u64::try_from(v).unwrap_or(0))
}

fn log_view(report: LogReport, first_page: bool) -> AnyView {
    let f = &report.filter;
    let mut keys = vec![choice("", "All keys")];
    keys.extend(report.keys.clone());
    keys.push(choice("none", "Without a key"));
    let mut models = vec![choice("", "All models")];
    models.extend(report.models.iter().map(|m| choice(m, m)));
    let mut statuses = vec![choice("", "All statuses")];
    statuses.extend(STATUSES.iter().map(|s| choice(s, s)));
    let mut endpoints = vec![choice("", "All endpoints")];
    endpoints.extend(ENDPOINTS.iter().map(|(v, l)| choice(v, l)));
    let older = report.older.as_deref().map(|c| link(f, Page::Before(c)));
    let newer = report.newer.as_deref().map(|c| link(f, Page::After(c)));
    // "Newest" only where "Newer" does not already lead there in one step.
    let newest = (!first_page && report.newer.is_some()).then(|| link(f, Page::Newest));
    let empty = report.entries.is_empty();
    let cost = Decimals::for_amounts(report.entries.iter().map(|e| e.cost_micros));
    let rows = report
        .entries
        .into_iter()
        .map(|e| {
            let status_class = format!("status status-{}", e.status);
            let id = e.request_id.clone();
            let href = format!("/logs/{}", e.request_id);
            view! {
                <tr class="log-row" data-request-id=id>
                    <td class="mono"><a href=href>{e.request_id}</a></td>
                    <td class="mono">{e.time}</td>
                    <td>{e.model}</td>
                    <td class="endpoint">{e.endpoint}</td>
                    <td class="key" title=e.key.clone()>{e.key.clone()}</td>
                    <td><span class=status_class>{e.status}</span></td>
                    <td class="num">{n(e.prompt_tokens)}</td>
                    <td class="num">{n(e.cached_tokens)}</td>
                    <td class="num">{n(e.completion_tokens)}</td>
                    <td class="num cost">{cost.show(e.cost_micros)}</td>
                    <td class="num">{e.ttft_ms.map_or_else(|| "-".to_owned(), |t| n(i64::from(t)))}</td>
                    <td class="num">{n(i64::from(e.duration_ms))}</td>
                </tr>
            }
        })
        .collect_view();
    view! {
        {report.notice.clone().map(|m| view! { <p class="notice" role="status">{m}</p> })}
        <form class="filters" method="get" action="/logs">
            <label>"Model"<select name="model">{options(models, f.model.as_deref().unwrap_or(""))}</select></label>
            <label>"Key"<select name="key">{options(keys, f.key.as_deref().unwrap_or(""))}</select></label>
            <label>"Status"<select name="status">{options(statuses, f.status.as_deref().unwrap_or(""))}</select></label>
            <label>"Endpoint"<select name="endpoint">{options(endpoints, f.endpoint.as_deref().unwrap_or(""))}</select></label>
            <label>"From"<input type="datetime-local" name="since" step="1" value=f.since.clone().unwrap_or_default()/></label>
            <label>"To"<input type="datetime-local" name="until" step="1" value=f.until.clone().unwrap_or_default()/></label>
            <button type="submit">"Filter"</button>
        </form>
        <p class="muted">"Newest first. Times are UTC. Open a request for its details and, when body logging is on (Settings), its prompt and completion."</p>
        {if empty {
            view! { <p class="muted">"No requests match."</p> }.into_any()
        } else {
            ().into_any()
        }}
        <div class="scroll">
        <table class="log">
            <thead>
                <tr>
                    <th>"Request id"</th><th>"Time (UTC)"</th><th>"Model"</th><th>"Endpoint"</th><th>"Key"</th>
                    <th>"Status"</th><th class="num">"Prompt"</th><th class="num">"Cached"</th>
                    <th class="num">"Completion"</th><th class="num">"Cost"</th>
                    <th class="num">"TTFT ms"</th><th class="num">"Duration ms"</th>
                </tr>
            </thead>
            <tbody>{rows}</tbody>
        </table>
        </div>
        <nav class="pager">
            {newest.map(|href| view! { <a class="newest" href=href>"« Newest"</a> })}
            {newer.map(|href| view! { <a class="newer" rel="prev" href=href>"← Newer"</a> })}
            {older.map(|href| view! { <a class="older" rel="next" href=href>"Older →"</a> })}
        </nav>
    }
    .into_any()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn links_carry_the_filters_encoded() {
        let f = LogParams {
            model: Some("a b&c".into()),
            since: Some("2026-12-01T10:00".into()),
            ..Default::default()
        };
        assert_eq!(
            link(&f, Page::Before("1_ab")),
            "/logs?model=a%20b%26c&since=2026-12-01T10%3A00&before=1_ab"
        );
        assert_eq!(
            link(&f, Page::After("2_cd")),
            "/logs?model=a%20b%26c&since=2026-12-01T10%3A00&after=2_cd"
        );
        assert_eq!(link(&LogParams::default(), Page::Newest), "/logs");
    }
}
