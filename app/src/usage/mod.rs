//! Server functions of the tenant's `/usage` and `/logs` pages: aggregated usage and the request
//! log, always scoped by the session's tenant. Both are GETs whose parameters are the pages'
//! query strings as typed (so a shared URL shows the same thing); anything that does not parse is
//! ignored and said so, never an error page. Money is integer micro-units throughout.

pub mod charts;
#[cfg(feature = "ssr")]
pub mod conversation;
pub mod log_detail;
pub mod logs;
pub mod page;
#[cfg(feature = "ssr")]
pub mod server;

use leptos::prelude::*;
use serde::{Deserialize, Serialize};

use crate::error::PortalError;

/// Longest range the usage page shows, in days.
pub const MAX_RANGE_DAYS: i64 = 366;
/// Requests per page of the log.
pub const LOG_PAGE_SIZE: i64 = 50;
/// The statuses a usage event can have (`tf_core::usage::UsageStatus`), for the log's filter.
pub const STATUSES: [&str; 5] = [
    "ok",
    "client_abort",
    "upstream_error",
    "interrupted",
    "rejected",
];

/// The usage page's query string: `range` is `7`, `30`, `90` or `custom` (then `from` and `to`,
/// `YYYY-MM-DD`, UTC, inclusive); `key` a key id, `none` (requests without a key) or empty;
/// `model` a served model name or empty.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct UsageParams {
    pub range: Option<String>,
    pub from: Option<String>,
    pub to: Option<String>,
    pub key: Option<String>,
    pub model: Option<String>,
    /// What the chart stacks: `kind` (fresh prompt, cached prompt, completion; the default),
    /// `model` or `key`.
    #[serde(default)]
    pub view: Option<String>,
}

/// The chart views of `/usage`: value and label.
pub const VIEWS: &[(&str, &str)] = &[
    ("kind", "Tokens by kind"),
    ("model", "Tokens by model"),
    ("key", "Tokens by key"),
];

/// One day and key's tokens (prompt and completion), for the per-key chart.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct KeyDay {
    /// `YYYY-MM-DD` (UTC).
    pub day: String,
    /// The key's name and prefix, or "Without a key".
    pub key: String,
    pub tokens: i64,
}

/// Requests and tokens through one `/v1` endpoint over the range.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct EndpointUsage {
    /// `chat`, `completions`, `responses`, `embeddings` or `messages`.
    pub endpoint: String,
    pub label: String,
    pub requests: i64,
    pub prompt_tokens: i64,
    pub cached_tokens: i64,
    pub completion_tokens: i64,
}

/// A choice of a filter's `<select>`: its value and label.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Choice {
    pub value: String,
    pub label: String,
}

/// Figures of one day and model, of one day, or of the whole range.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct UsageFigures {
    pub requests: i64,
    pub prompt_tokens: i64,
    pub cached_tokens: i64,
    pub completion_tokens: i64,
    pub cost_micros: i64,
}

impl UsageFigures {
    /// Adds `other` (saturating: the sums are of non-negative bigints).
    pub fn add(&mut self, other: &Self) {
        self.requests = self.requests.saturating_add(other.requests);
        self.prompt_tokens = self.prompt_tokens.saturating_add(other.prompt_tokens);
        self.cached_tokens = self.cached_tokens.saturating_add(other.cached_tokens);
        self.completion_tokens = self
            .completion_tokens
            .saturating_add(other.completion_tokens);
        self.cost_micros = self.cost_micros.saturating_add(other.cost_micros);
    }
}

/// One row of the usage table.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct UsageRow {
    /// `YYYY-MM-DD` (UTC).
    pub day: String,
    pub model: String,
    pub figures: UsageFigures,
}

/// What `/usage` shows.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct UsageReport {
    /// The range shown: `7`, `30`, `90` or `custom`, and its first and last day.
    pub range: String,
    pub from: String,
    pub to: String,
    /// The filters applied (`""`: all).
    pub key: String,
    pub model: String,
    pub keys: Vec<Choice>,
    pub models: Vec<String>,
    /// Every day of the range, oldest first (zero days included), for the chart.
    pub days: Vec<(String, UsageFigures)>,
    /// Per day and model, newest day first; days without usage are left out.
    pub rows: Vec<UsageRow>,
    pub totals: UsageFigures,
    /// The chart view shown (`kind`, `model` or `key`).
    #[serde(default)]
    pub view: String,
    /// Per day and key (for the `key` view; empty otherwise).
    #[serde(default)]
    pub key_days: Vec<KeyDay>,
    /// Per endpoint over the range and filters.
    #[serde(default)]
    pub endpoints: Vec<EndpointUsage>,
    /// Why part of the query string was ignored.
    pub notice: Option<String>,
}

/// The log's query string: filters `model`, `key` (an id or `none`), `status`, `since` and
/// `until` (`YYYY-MM-DDTHH:MM[:SS]`, UTC, as `<input type=datetime-local>` sends), and `before`,
/// the cursor of the "Older" link, or `after`, the cursor of the "Newer" link; `endpoint` (chat,
/// completions, responses, embeddings, messages).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct LogParams {
    pub model: Option<String>,
    pub key: Option<String>,
    pub status: Option<String>,
    pub since: Option<String>,
    pub until: Option<String>,
    pub before: Option<String>,
    #[serde(default)]
    pub after: Option<String>,
    #[serde(default)]
    pub endpoint: Option<String>,
}

/// The `/v1` endpoints a usage event names (`usage_events.endpoint`), with their labels.
pub const ENDPOINTS: &[(&str, &str)] = &[
    ("chat", "Chat completions"),
    ("completions", "Completions"),
    ("responses", "Responses"),
    ("embeddings", "Embeddings"),
    ("messages", "Messages (Anthropic)"),
];

/// One request of the log.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LogEntry {
    pub request_id: String,
    /// `YYYY-MM-DD HH:MM:SS` UTC.
    pub time: String,
    pub model: String,
    /// The key's name and prefix, or `-` for a request without a key.
    pub key: String,
    pub status: String,
    pub prompt_tokens: i64,
    pub cached_tokens: i64,
    pub completion_tokens: i64,
    pub cost_micros: i64,
    pub ttft_ms: Option<i32>,
    pub duration_ms: i32,
    /// The `/v1` endpoint that served it (`chat`, `responses`, ...).
    pub endpoint: String,
    pub stream: bool,
    /// How the tokens were counted: `engine`, `partial` or `estimated`.
    pub provenance: String,
    pub reasoning_tokens: i64,
}

/// What `/logs` shows.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LogReport {
    /// The filters as applied (normalised), echoed into the form and the "Older" link.
    pub filter: LogParams,
    pub keys: Vec<Choice>,
    pub models: Vec<String>,
    pub entries: Vec<LogEntry>,
    /// The cursor of the next (older) page, when there is one.
    pub older: Option<String>,
    /// The cursor of the previous (newer) page, when this page is not the newest.
    #[serde(default)]
    pub newer: Option<String>,
    pub notice: Option<String>,
}

/// Usage of the session's tenant per day and model over the chosen range and filters.
#[server(prefix = "/api", endpoint = "usage", input = leptos::server_fn::codec::GetUrl)]
pub async fn fetch_usage(
    #[server(default)] params: UsageParams,
) -> Result<UsageReport, PortalError> {
    use crate::ssr::{internal, Portal};
    use crate::usage::server as report;

    let portal = Portal::current()?;
    let tenant = report::session_tenant(&portal).await?;
    report::usage(&portal.deps.pool, tenant, &params, report::today())
        .await
        .map_err(|e| internal("loading the usage page", e))
}

/// The session's tenant's request log, newest first, one page after the cursor.
#[server(prefix = "/api", endpoint = "logs", input = leptos::server_fn::codec::GetUrl)]
pub async fn fetch_request_log(
    #[server(default)] params: LogParams,
) -> Result<LogReport, PortalError> {
    use crate::ssr::{internal, Portal};
    use crate::usage::server as report;

    let portal = Portal::current()?;
    let tenant = report::session_tenant(&portal).await?;
    report::log(&portal.deps.pool, tenant, &params)
        .await
        .map_err(|e| internal("loading the request log", e))
}

/// A stored prompt and completion as the detail page shows them.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct StoredBodyView {
    pub prompt: String,
    pub prompt_truncated: bool,
    pub prompt_bytes: i32,
    pub completion: String,
    pub completion_truncated: bool,
    pub completion_bytes: i32,
}

/// One turn of a stored prompt: its role (`system`, `user`, `assistant`, `tool`; `input` for a
/// completions prompt or an embeddings input) and its text.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Turn {
    pub role: String,
    pub text: String,
}

/// A stored request read as a conversation ([`conversation::read`]).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Conversation {
    pub messages: Vec<Turn>,
    /// The answer's text, joined from the stream's deltas when it was streamed.
    pub completion: Option<String>,
    /// Why the answer ended (`stop`, `length`, `end_turn`, ...), when it says.
    pub finish_reason: Option<String>,
    /// How many stream events the answer was read from (0: one JSON document).
    pub streamed_events: usize,
}

/// What `/logs/{request_id}` shows.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LogDetail {
    pub entry: LogEntry,
    /// `None`: the bodies were not stored (not opted in then, dropped, or deleted since).
    pub body: Option<StoredBodyView>,
    /// The stored bodies read as a conversation (`None` without bodies).
    pub conversation: Option<Conversation>,
}

/// One request of the session's tenant and its stored bodies; `None` when the id is not one of
/// the tenant's requests (another tenant's id answers exactly like an unknown one).
#[server(prefix = "/api", endpoint = "log_detail", input = leptos::server_fn::codec::GetUrl)]
pub async fn fetch_log_detail(request_id: String) -> Result<Option<LogDetail>, PortalError> {
    use crate::ssr::{internal, Portal};
    use crate::usage::server as report;

    let portal = Portal::current()?;
    let tenant = report::session_tenant(&portal).await?;
    let Ok(id) = uuid::Uuid::parse_str(request_id.trim()) else {
        return Ok(None);
    };
    let failed = |e| internal("loading a request", e);
    let pool = &portal.deps.pool;
    let Some(row) = tf_core::db::reports::log_entry(pool, tenant, id)
        .await
        .map_err(failed)?
    else {
        return Ok(None);
    };
    let body = tf_core::db::bodies::of_request(pool, tenant, id)
        .await
        .map_err(failed)?
        .map(|b| StoredBodyView {
            prompt: b.prompt,
            prompt_truncated: b.prompt_truncated,
            prompt_bytes: b.prompt_bytes,
            completion: b.completion,
            completion_truncated: b.completion_truncated,
            completion_bytes: b.completion_bytes,
        });
    let entry = report::log_entry(row);
    let conversation = body
        .as_ref()
        .map(|b| crate::usage::conversation::read(&entry.endpoint, &b.prompt, &b.completion));
    Ok(Some(LogDetail {
        entry,
        body,
        conversation,
    }))
}
