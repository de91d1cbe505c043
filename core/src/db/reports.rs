//! What the tenant's `/usage` and `/logs` pages read: usage per day and model from the
//! `usage_daily` rollup (kept exact by a trigger on `usage_events`, see its migration), and the
//! request log, newest first, keyset-paginated on `(started_at, request_id)`.
//! Every statement takes the tenant id and filters on it first.
//!
//! The rollup's cost and each log row's are the one cost function's (SQL `charge_micros`, the
//! rule of [`crate::money::line_micros`] under the price book, as `db::spend` and the invoices
//! count). The test `server/tests/integration/usage_portal.rs` checks both against the events.

use sqlx::PgPool;
use time::{Date, OffsetDateTime};
use uuid::Uuid;

/// The rollup's key for events without an API key.
pub const NO_KEY: Uuid = Uuid::nil();

/// One day and model of a tenant's usage.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DailyRow {
    pub day: Date,
    pub served_name: String,
    pub requests: i64,
    pub prompt_tokens: i64,
    pub cached_tokens: i64,
    pub completion_tokens: i64,
    pub cost_micros: i64,
}

/// Usage per UTC day and served model name for days `from..=to`, optionally of one key (the nil
/// uuid: events without a key) and one model. Ordered by day, then model.
pub async fn daily(
    pool: &PgPool,
    tenant: Uuid,
    from: Date,
    to: Date,
    key: Option<Uuid>,
    model: Option<&str>,
) -> sqlx::Result<Vec<DailyRow>> {
    sqlx::query_as!(
        DailyRow,
        r#"SELECT day, served_name,
                  SUM(requests)::bigint AS "requests!", SUM(prompt_tokens)::bigint AS "prompt_tokens!",
                  SUM(cached_tokens)::bigint AS "cached_tokens!",
                  SUM(completion_tokens)::bigint AS "completion_tokens!",
                  SUM(cost_micros)::bigint AS "cost_micros!"
           FROM usage_daily
           WHERE tenant_id = $1 AND day BETWEEN $2 AND $3
             AND ($4::uuid IS NULL OR api_key_id = $4)
             AND ($5::text IS NULL OR served_name = $5)
           GROUP BY day, served_name
           ORDER BY day, served_name"#,
        tenant,
        from,
        to,
        key as Option<Uuid>,
        model as Option<&str>,
    )
    .fetch_all(pool)
    .await
}

/// One day and key of a tenant's usage (the nil key: requests without a key).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyDayRow {
    pub day: Date,
    pub api_key_id: Uuid,
    pub tokens: i64,
}

/// Tokens (prompt and completion) per UTC day and key for days `from..=to`, optionally of one
/// model, for the usage page's per-key chart. Ordered by day, then key.
pub async fn daily_by_key(
    pool: &PgPool,
    tenant: Uuid,
    from: Date,
    to: Date,
    model: Option<&str>,
) -> sqlx::Result<Vec<KeyDayRow>> {
    sqlx::query_as!(
        KeyDayRow,
        r#"SELECT day, api_key_id,
                  SUM(prompt_tokens + completion_tokens)::bigint AS "tokens!"
           FROM usage_daily
           WHERE tenant_id = $1 AND day BETWEEN $2 AND $3
             AND ($4::text IS NULL OR served_name = $4)
           GROUP BY day, api_key_id
           ORDER BY day, api_key_id"#,
        tenant,
        from,
        to,
        model as Option<&str>,
    )
    .fetch_all(pool)
    .await
}

/// A tenant's usage through one `/v1` endpoint over a range.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EndpointRow {
    pub endpoint: String,
    pub requests: i64,
    pub prompt_tokens: i64,
    pub cached_tokens: i64,
    pub completion_tokens: i64,
}

/// Requests and tokens per `/v1` endpoint of the requests started in `[since, until)`,
/// optionally of one key (the nil key: requests without a key) and one model. Read from the
/// events (the daily rollup has no endpoint): one range scan of the tenant's time index.
pub async fn by_endpoint(
    pool: &PgPool,
    tenant: Uuid,
    since: OffsetDateTime,
    until: OffsetDateTime,
    key: Option<Uuid>,
    model: Option<&str>,
) -> sqlx::Result<Vec<EndpointRow>> {
    let no_key = key == Some(NO_KEY);
    sqlx::query_as!(
        EndpointRow,
        r#"SELECT endpoint, count(*) AS "requests!",
                  COALESCE(SUM(prompt_tokens), 0)::bigint AS "prompt_tokens!",
                  COALESCE(SUM(cached_tokens), 0)::bigint AS "cached_tokens!",
                  COALESCE(SUM(completion_tokens), 0)::bigint AS "completion_tokens!"
           FROM usage_events
           WHERE tenant_id = $1 AND started_at >= $2 AND started_at < $3
             AND ($4::uuid IS NULL OR api_key_id = $4)
             AND (NOT $5 OR api_key_id IS NULL)
             AND ($6::text IS NULL OR served_name = $6)
           GROUP BY endpoint
           ORDER BY endpoint"#,
        tenant,
        since,
        until,
        key.filter(|_| !no_key) as Option<Uuid>,
        no_key,
        model as Option<&str>,
    )
    .fetch_all(pool)
    .await
}

/// The served model names a tenant has usage of, for the filters.
pub async fn models(pool: &PgPool, tenant: Uuid) -> sqlx::Result<Vec<String>> {
    sqlx::query_scalar!(
        "SELECT DISTINCT served_name FROM usage_daily WHERE tenant_id = $1 ORDER BY served_name",
        tenant,
    )
    .fetch_all(pool)
    .await
}

/// A key as the filters and the log show it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyLabel {
    pub id: Uuid,
    pub name: String,
    pub prefix: String,
}

/// All of a tenant's keys (revoked ones too: their usage stays), oldest first.
pub async fn key_labels(pool: &PgPool, tenant: Uuid) -> sqlx::Result<Vec<KeyLabel>> {
    sqlx::query_as!(
        KeyLabel,
        "SELECT id, name, prefix FROM api_keys WHERE tenant_id = $1 ORDER BY created_at, id",
        tenant,
    )
    .fetch_all(pool)
    .await
}

/// What the request log is filtered by; `None` lets everything through.
#[derive(Debug, Clone, Default)]
pub struct LogFilter<'a> {
    pub model: Option<&'a str>,
    pub key: Option<Uuid>,
    pub status: Option<&'a str>,
    /// Requests started at or after this.
    pub since: Option<OffsetDateTime>,
    /// Requests started before this.
    pub until: Option<OffsetDateTime>,
    /// Only requests made without a key.
    pub no_key: bool,
    /// Only requests served by this `/v1` endpoint.
    pub endpoint: Option<&'a str>,
}

/// One request of the log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogRow {
    pub request_id: Uuid,
    pub started_at: OffsetDateTime,
    pub served_name: String,
    pub api_key_id: Option<Uuid>,
    pub key_name: Option<String>,
    pub key_prefix: Option<String>,
    pub status: String,
    pub prompt_tokens: i64,
    pub cached_tokens: i64,
    pub completion_tokens: i64,
    pub ttft_ms: Option<i32>,
    pub duration_ms: i32,
    /// What the request costs (the price book's rates at its start; 0 when refused or unpriced).
    pub cost_micros: i64,
    /// The `/v1` endpoint that served it: chat, completions, responses, embeddings, messages.
    pub endpoint: String,
    /// Whether the answer was streamed.
    pub stream: bool,
    /// How the tokens were counted: `engine`, `partial` or `estimated`.
    pub provenance: String,
    /// Of the completion tokens, the reasoning ones the engine reported.
    pub reasoning_tokens: i64,
}

/// Up to `limit` requests of `tenant` older than `before` (a `(started_at, request_id)` cursor:
/// the last row of the previous page), newest first. The cursor is always a bound, so the
/// statement is one range scan of `usage_events_tenant_log_idx` whatever the page (no OFFSET).
pub async fn log_page(
    pool: &PgPool,
    tenant: Uuid,
    filter: &LogFilter<'_>,
    before: (OffsetDateTime, Uuid),
    limit: i64,
) -> sqlx::Result<Vec<LogRow>> {
    // `started_at < until` is the cursor `(until, nil)`: the tighter of the two is the bound.
    let before = match filter.until {
        Some(until) if (until, Uuid::nil()) < before => (until, Uuid::nil()),
        _ => before,
    };
    sqlx::query_as!(
        LogRow,
        r#"SELECT e.request_id, e.started_at, e.served_name, e.api_key_id,
                  k.name AS "key_name?", k.prefix AS "key_prefix?", e.status,
                  e.prompt_tokens, e.cached_tokens, e.completion_tokens, e.ttft_ms, e.duration_ms,
                  CASE WHEN e.status = 'rejected' THEN 0
                       ELSE charge_micros_of_event(e.tenant_id, e.price_key, e.served_name,
                                                   e.adapter IS NOT NULL, e.started_at,
                                                   e.prompt_tokens - e.cached_tokens,
                                                   e.cached_tokens, e.completion_tokens)
                  END AS "cost_micros!",
                  e.endpoint, e.stream, e.provenance, e.reasoning_tokens
           FROM usage_events e
                LEFT JOIN api_keys k ON k.id = e.api_key_id AND k.tenant_id = e.tenant_id
           WHERE e.tenant_id = $1
             AND (e.started_at, e.request_id) < ($2, $3)
             AND ($4::text IS NULL OR e.served_name = $4)
             AND ($5::uuid IS NULL OR e.api_key_id = $5)
             AND ($6::text IS NULL OR e.status = $6)
             AND ($7::timestamptz IS NULL OR e.started_at >= $7)
             AND (NOT $9 OR e.api_key_id IS NULL)
             AND ($10::text IS NULL OR e.endpoint = $10)
           ORDER BY e.started_at DESC, e.request_id DESC
           LIMIT $8"#,
        tenant,
        before.0,
        before.1,
        filter.model as Option<&str>,
        filter.key as Option<Uuid>,
        filter.status as Option<&str>,
        filter.since as Option<OffsetDateTime>,
        limit,
        filter.no_key,
        filter.endpoint as Option<&str>,
    )
    .fetch_all(pool)
    .await
}

/// Up to `limit` requests of `tenant` newer than `after` (the first row of the page being left by
/// its "Newer" link), the oldest of them first (the caller shows them newest first). The cursor
/// is a bound of the same index scan, read the other way.
pub async fn log_page_newer(
    pool: &PgPool,
    tenant: Uuid,
    filter: &LogFilter<'_>,
    after: (OffsetDateTime, Uuid),
    limit: i64,
) -> sqlx::Result<Vec<LogRow>> {
    // `started_at >= since` is the cursor `(since, nil)` less a hair: the tighter is the bound.
    let after = match filter.since {
        Some(since) if (since - time::Duration::nanoseconds(1), Uuid::max()) > after => {
            (since - time::Duration::nanoseconds(1), Uuid::max())
        }
        _ => after,
    };
    sqlx::query_as!(
        LogRow,
        r#"SELECT e.request_id, e.started_at, e.served_name, e.api_key_id,
                  k.name AS "key_name?", k.prefix AS "key_prefix?", e.status,
                  e.prompt_tokens, e.cached_tokens, e.completion_tokens, e.ttft_ms, e.duration_ms,
                  CASE WHEN e.status = 'rejected' THEN 0
                       ELSE charge_micros_of_event(e.tenant_id, e.price_key, e.served_name,
                                                   e.adapter IS NOT NULL, e.started_at,
                                                   e.prompt_tokens - e.cached_tokens,
                                                   e.cached_tokens, e.completion_tokens)
                  END AS "cost_micros!",
                  e.endpoint, e.stream, e.provenance, e.reasoning_tokens
           FROM usage_events e
                LEFT JOIN api_keys k ON k.id = e.api_key_id AND k.tenant_id = e.tenant_id
           WHERE e.tenant_id = $1
             AND (e.started_at, e.request_id) > ($2, $3)
             AND ($4::text IS NULL OR e.served_name = $4)
             AND ($5::uuid IS NULL OR e.api_key_id = $5)
             AND ($6::text IS NULL OR e.status = $6)
             AND ($7::timestamptz IS NULL OR e.started_at < $7)
             AND (NOT $9 OR e.api_key_id IS NULL)
             AND ($10::text IS NULL OR e.endpoint = $10)
           ORDER BY e.started_at, e.request_id
           LIMIT $8"#,
        tenant,
        after.0,
        after.1,
        filter.model as Option<&str>,
        filter.key as Option<Uuid>,
        filter.status as Option<&str>,
        filter.until as Option<OffsetDateTime>,
        limit,
        filter.no_key,
        filter.endpoint as Option<&str>,
    )
    .fetch_all(pool)
    .await
}

/// One request of `tenant` by id (`None`: no such request, or another tenant's).
pub async fn log_entry(
    pool: &PgPool,
    tenant: Uuid,
    request_id: Uuid,
) -> sqlx::Result<Option<LogRow>> {
    sqlx::query_as!(
        LogRow,
        r#"SELECT e.request_id, e.started_at, e.served_name, e.api_key_id,
                  k.name AS "key_name?", k.prefix AS "key_prefix?", e.status,
                  e.prompt_tokens, e.cached_tokens, e.completion_tokens, e.ttft_ms, e.duration_ms,
                  CASE WHEN e.status = 'rejected' THEN 0
                       ELSE charge_micros_of_event(e.tenant_id, e.price_key, e.served_name,
                                                   e.adapter IS NOT NULL, e.started_at,
                                                   e.prompt_tokens - e.cached_tokens,
                                                   e.cached_tokens, e.completion_tokens)
                  END AS "cost_micros!",
                  e.endpoint, e.stream, e.provenance, e.reasoning_tokens
           FROM usage_events e
                LEFT JOIN api_keys k ON k.id = e.api_key_id AND k.tenant_id = e.tenant_id
           WHERE e.tenant_id = $1 AND e.request_id = $2"#,
        tenant,
        request_id,
    )
    .fetch_optional(pool)
    .await
}
