//! `/logs/{request_id}`: one request of the tenant's log, its metadata (endpoint, streamed or
//! not, how its tokens were counted) and, when the tenant had opted in, the stored prompt and
//! completion read as a conversation (each message with its role, then the answer's text joined
//! from the stream's chunks and why it ended), the raw bodies behind a `<details>` disclosure
//! (bounded; shown as text, escaped by the renderer). Another tenant's request id answers 404,
//! like an unknown one.

use leptos::prelude::*;
use leptos_meta::Title;
use leptos_router::hooks::use_params_map;

use super::{fetch_log_detail, Conversation, LogDetail, StoredBodyView};
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
    let counted = match e.provenance.as_str() {
        "engine" => "by the engine (its final usage)",
        "partial" => "partly: the engine's last running count before the request ended",
        "estimated" => "estimated by the gateway from what it delivered",
        _ => "-",
    };
    let streamed = if e.stream { "yes" } else { "no" };
    let finish = d
        .conversation
        .as_ref()
        .and_then(|c| c.finish_reason.clone())
        .unwrap_or_else(|| "-".to_owned());
    view! {
        <h1>"Request " <span class="mono">{e.request_id.clone()}</span></h1>
        <section class="panel">
            <dl class="facts">
                <dt>"Time (UTC)"</dt><dd class="mono">{e.time}</dd>
                <dt>"Model"</dt><dd>{e.model}</dd>
                <dt>"Endpoint"</dt><dd id="endpoint">{e.endpoint}</dd>
                <dt>"Streamed"</dt><dd id="streamed">{streamed}</dd>
                <dt>"Key"</dt><dd>{e.key}</dd>
                <dt>"Status"</dt><dd><span class=status_class>{e.status.clone()}</span></dd>
                <dt>"Prompt tokens"</dt><dd>{n(e.prompt_tokens)} " (" {n(e.cached_tokens)} " cached)"</dd>
                <dt>"Completion tokens"</dt><dd>{n(e.completion_tokens)}
                    {(e.reasoning_tokens > 0).then(|| format!(" ({} reasoning)", n(e.reasoning_tokens)))}</dd>
                <dt>"Tokens counted"</dt><dd id="provenance" data-provenance=e.provenance.clone()>{counted}</dd>
                <dt>"Finish reason"</dt><dd id="finish-reason">{finish}</dd>
                <dt>"Cost"</dt><dd>{format_micros(e.cost_micros)}</dd>
                <dt>"Time to first token"</dt><dd>{ttft}</dd>
                <dt>"Duration"</dt><dd>{n(i64::from(e.duration_ms))} " ms"</dd>
            </dl>
        </section>
        {bodies(d.body, d.conversation.unwrap_or_default())}
    }
    .into_any()
}

fn bodies(body: Option<StoredBodyView>, c: Conversation) -> AnyView {
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
    let turns = c
        .messages
        .into_iter()
        .map(|t| {
            let class = format!("turn role-{}", t.role);
            view! {
                <li class=class>
                    <span class="role">{t.role}</span>
                    <div class="text">{t.text}</div>
                </li>
            }
        })
        .collect_view();
    let source = if c.streamed_events > 0 {
        format!("assembled from {} stream events", c.streamed_events)
    } else {
        "one response".to_owned()
    };
    let answer = match c.completion {
        Some(text) => view! {
            <li class="turn role-assistant completion">
                <span class="role">"assistant"</span>
                <div class="text" id="completion-text">{text}</div>
                <span class="muted source">{source}</span>
            </li>
        }
        .into_any(),
        None => view! {
            <li class="turn muted">"No answer text could be read from the stored completion."</li>
        }
        .into_any(),
    };
    view! {
        <section class="panel">
            <h2>"Conversation"</h2>
            {(b.prompt_truncated || b.completion_truncated).then(|| view! {
                <p class="muted">"A body was cut at 32 KiB: what follows is what could be read."</p>
            })}
            <ol class="conversation" id="conversation">{turns}{answer}</ol>
            <details class="raw" id="raw-bodies">
                <summary>"Raw request and response"</summary>
                <h3>"Prompt"</h3>
                {cut_note(b.prompt_truncated, b.prompt_bytes)}
                <pre class="body" id="prompt-body">{b.prompt}</pre>
                <h3>"Completion"</h3>
                {cut_note(b.completion_truncated, b.completion_bytes)}
                <pre class="body" id="completion-body">{b.completion}</pre>
            </details>
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
