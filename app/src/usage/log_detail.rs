//! `/logs/{request_id}`: one request of the tenant's log, its metadata and, when the tenant had
//! opted in, the stored prompt and completion (bounded; shown as text, escaped by the renderer).
//! Another tenant's request id answers 404, like an unknown one.

use leptos::prelude::*;
use leptos_meta::Title;
use leptos_router::hooks::use_params_map;

use super::{fetch_log_detail, LogDetail, StoredBodyView};
use crate::frame::{framed, missing, Guarded, Head, WIDE};
use crate::model::{Access, PageState};
use crate::money::{format_micros, group_thousands};
use crate::PRODUCT;

#[component]
pub fn LogDetailPage() -> impl IntoView {
    view! {
        <Title text=format!("Request · {PRODUCT}")/>
        <Guarded access=Access::Tenant content=page/>
    }
}

fn page(state: PageState) -> AnyView {
    let id = use_params_map()
        .get_untracked()
        .get("request_id")
        .unwrap_or_default();
    let back = Head::Back("/logs", "← Request log");
    framed(state, WIDE, back, fetch_log_detail(id), |d, _| match d {
        Some(d) => detail(d),
        None => not_found(),
    })
}

/// Unknown, malformed or another tenant's id.
fn not_found() -> AnyView {
    missing(
        "Request not found",
        "No request of this tenant has that id.",
    )
}

fn n(v: i64) -> String {
    group_thousands(u64::try_from(v).unwrap_or(0))
}

fn detail(d: LogDetail) -> AnyView {
    let e = d.entry;
    let status_class = format!("status status-{}", e.status);
    let ttft = e
        .ttft_ms
        .map_or_else(|| "-".to_owned(), |t| format!("{} ms", n(i64::from(t))));
    view! {
        <h1>"Request " <span class="mono">{e.request_id.clone()}</span></h1>
        <section class="panel">
            <dl class="facts">
                <dt>"Time (UTC)"</dt><dd class="mono">{e.time}</dd>
                <dt>"Model"</dt><dd>{e.model}</dd>
                <dt>"Key"</dt><dd>{e.key}</dd>
                <dt>"Status"</dt><dd><span class=status_class>{e.status.clone()}</span></dd>
                <dt>"Prompt tokens"</dt><dd>{n(e.prompt_tokens)} " (" {n(e.cached_tokens)} " cached)"</dd>
                <dt>"Completion tokens"</dt><dd>{n(e.completion_tokens)}</dd>
                <dt>"Cost"</dt><dd>{format_micros(e.cost_micros)}</dd>
                <dt>"Time to first token"</dt><dd>{ttft}</dd>
                <dt>"Duration"</dt><dd>{n(i64::from(e.duration_ms))} " ms"</dd>
            </dl>
        </section>
        {bodies(d.body)}
    }
    .into_any()
}

fn bodies(body: Option<StoredBodyView>) -> AnyView {
    let Some(b) = body else {
        return view! {
            <section class="panel">
                <h2>"Prompt and completion"</h2>
                <p class="muted" id="no-bodies">
                    "Bodies were not stored for this request: the tenant had not opted in \
                     (Settings), or they were deleted or are past the retention period."
                </p>
            </section>
        }
        .into_any();
    };
    view! {
        <section class="panel">
            <h2>"Prompt"</h2>
            {cut_note(b.prompt_truncated, b.prompt_bytes)}
            <pre class="body" id="prompt-body">{b.prompt}</pre>
        </section>
        <section class="panel">
            <h2>"Completion"</h2>
            {cut_note(b.completion_truncated, b.completion_bytes)}
            <pre class="body" id="completion-body">{b.completion}</pre>
        </section>
    }
    .into_any()
}

fn cut_note(truncated: bool, bytes: i32) -> Option<AnyView> {
    truncated.then(|| {
        view! {
            <p class="muted">
                "Truncated: the first 32 KiB of " {n(i64::from(bytes))} " bytes are kept."
            </p>
        }
        .into_any()
    })
}
