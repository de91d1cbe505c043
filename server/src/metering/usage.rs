//! The usage event (the metered fact) and the sinks that store it. Every request that reached an
//! upstream produces exactly one event, keyed by its request id; storage enforces uniqueness, so a
//! retried emission can never count twice.

use std::future::Future;
use std::pin::Pin;
use std::sync::Mutex;

use serde::{Deserialize, Serialize};
use sqlx::PgPool;
use time::OffsetDateTime;
use uuid::Uuid;

/// Token counts as an engine reports them (`usage` of the OpenAI API). Missing details are 0.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
pub struct Usage {
    #[serde(default)]
    pub prompt_tokens: u64,
    #[serde(default)]
    pub completion_tokens: u64,
    #[serde(default)]
    pub prompt_tokens_details: Option<PromptDetails>,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
pub struct PromptDetails {
    #[serde(default)]
    pub cached_tokens: Option<u64>,
}

impl Usage {
    pub fn cached_tokens(&self) -> u64 {
        self.prompt_tokens_details
            .and_then(|d| d.cached_tokens)
            .unwrap_or(0)
            .min(self.prompt_tokens)
    }
}

/// How an event's counts were obtained.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, sqlx::Type)]
#[sqlx(type_name = "text", rename_all = "snake_case")]
#[serde(rename_all = "snake_case")]
pub enum Provenance {
    /// The engine's final usage.
    Engine,
    /// The engine's last running usage before the stream was cut.
    Partial,
    /// Counted by the gateway from the chunks it received; prompt from the base's tokenizer.
    Estimated,
}

impl Provenance {
    /// The stored name (as sqlx and serde write it).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Engine => "engine",
            Self::Partial => "partial",
            Self::Estimated => "estimated",
        }
    }
}

/// How the request ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, sqlx::Type)]
#[sqlx(type_name = "text", rename_all = "snake_case")]
#[serde(rename_all = "snake_case")]
pub enum UsageStatus {
    Ok,
    ClientAbort,
    UpstreamError,
    /// Cut by the gateway at its shutdown deadline; billed like an abort.
    Interrupted,
    /// Refused at admission (the quotas issue); carries no tokens.
    Rejected,
}

impl UsageStatus {
    /// The stored name (as sqlx and serde write it).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Ok => "ok",
            Self::ClientAbort => "client_abort",
            Self::UpstreamError => "upstream_error",
            Self::Interrupted => "interrupted",
            Self::Rejected => "rejected",
        }
    }
}

/// One metered request.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, sqlx::FromRow)]
pub struct UsageEvent {
    pub request_id: Uuid,
    pub tenant_id: Uuid,
    pub api_key_id: Option<Uuid>,
    pub served_name: String,
    pub base_model: String,
    pub adapter: Option<String>,
    pub graph: String,
    pub price_key: String,
    pub prompt_tokens: i64,
    pub cached_tokens: i64,
    pub completion_tokens: i64,
    pub provenance: Provenance,
    pub status: UsageStatus,
    pub stream: bool,
    pub ttft_ms: Option<i32>,
    pub duration_ms: i32,
    #[serde(with = "time::serde::rfc3339")]
    pub started_at: OffsetDateTime,
}

/// The columns, in the order of [`UsageEvent`]'s fields (one place for every INSERT/SELECT).
pub const COLUMNS: &str = "request_id, tenant_id, api_key_id, served_name, base_model, adapter, graph, price_key, \
     prompt_tokens, cached_tokens, completion_tokens, provenance, status, stream, ttft_ms, duration_ms, started_at";

pub type SinkFuture<'a> = Pin<Box<dyn Future<Output = anyhow::Result<()>> + Send + 'a>>;

/// Where finished events go. `record` resolves once the event is as durable as the sink
/// promises; the request path awaits it before the response's final bytes leave.
pub trait UsageSink: Send + Sync + 'static {
    fn record<'a>(&'a self, event: &'a UsageEvent) -> SinkFuture<'a>;
}

/// Keeps events in memory (tests, and a gateway run without a database).
#[derive(Default)]
pub struct MemorySink {
    events: Mutex<Vec<UsageEvent>>,
}

impl MemorySink {
    pub fn events(&self) -> Vec<UsageEvent> {
        self.events.lock().map(|e| e.clone()).unwrap_or_default()
    }
}

impl UsageSink for MemorySink {
    fn record<'a>(&'a self, event: &'a UsageEvent) -> SinkFuture<'a> {
        Box::pin(async move {
            self.events
                .lock()
                .map_err(|_| anyhow::anyhow!("memory sink poisoned"))?
                .push(event.clone());
            Ok(())
        })
    }
}

/// Inserts each event into PostgreSQL directly (idempotent on request id).
pub struct PgSink {
    pool: PgPool,
    quota: Option<crate::quota::Quota>,
}

impl PgSink {
    pub fn new(pool: PgPool) -> Self {
        Self { pool, quota: None }
    }

    /// Waits for `quota`'s spend to reach Redis before each insert (see quota/reconciler.rs).
    pub fn with_quota(mut self, quota: crate::quota::Quota) -> Self {
        self.quota = Some(quota);
        self
    }
}

impl UsageSink for PgSink {
    fn record<'a>(&'a self, event: &'a UsageEvent) -> SinkFuture<'a> {
        Box::pin(async move {
            store(&self.pool, self.quota.as_ref(), std::slice::from_ref(event)).await?;
            Ok(())
        })
    }
}

/// Writes events to PostgreSQL once `quota`'s settled spend has reached Redis. INVARIANT: every
/// usage write goes through here, so Redis never counts less than PostgreSQL has billed and the
/// spend reconciler only ever raises counters (test: spend_order).
pub async fn store(
    pool: &PgPool,
    quota: Option<&crate::quota::Quota>,
    events: &[UsageEvent],
) -> sqlx::Result<u64> {
    if let Some(q) = quota {
        q.spend_flushed().await;
    }
    insert_batch(pool, events).await
}

/// Inserts events in one statement; events already stored are skipped. Returns rows inserted.
/// One array per column (UNNEST), so the statement text is the same for every batch size: it is
/// prepared once, and PostgreSQL never parses and plans thousands of bind parameters per batch.
pub async fn insert_batch(pool: &PgPool, events: &[UsageEvent]) -> sqlx::Result<u64> {
    if events.is_empty() {
        return Ok(0);
    }
    fn col<'a, T>(events: &'a [UsageEvent], f: impl Fn(&'a UsageEvent) -> T) -> Vec<T> {
        events.iter().map(f).collect()
    }
    let sql = format!(
        "INSERT INTO usage_events ({COLUMNS}) SELECT * FROM UNNEST(\
         $1::uuid[], $2::uuid[], $3::uuid[], $4::text[], $5::text[], $6::text[], $7::text[], \
         $8::text[], $9::int8[], $10::int8[], $11::int8[], $12::text[], $13::text[], $14::bool[], \
         $15::int4[], $16::int4[], $17::timestamptz[]) ON CONFLICT (request_id) DO NOTHING"
    );
    let done = sqlx::query(&sql)
        .bind(col(events, |e| e.request_id))
        .bind(col(events, |e| e.tenant_id))
        .bind(col(events, |e| e.api_key_id))
        .bind(col(events, |e| e.served_name.as_str()))
        .bind(col(events, |e| e.base_model.as_str()))
        .bind(col(events, |e| e.adapter.as_deref()))
        .bind(col(events, |e| e.graph.as_str()))
        .bind(col(events, |e| e.price_key.as_str()))
        .bind(col(events, |e| e.prompt_tokens))
        .bind(col(events, |e| e.cached_tokens))
        .bind(col(events, |e| e.completion_tokens))
        .bind(col(events, |e| e.provenance.as_str()))
        .bind(col(events, |e| e.status.as_str()))
        .bind(col(events, |e| e.stream))
        .bind(col(events, |e| e.ttft_ms))
        .bind(col(events, |e| e.duration_ms))
        .bind(col(events, |e| e.started_at))
        .execute(pool)
        .await?;
    Ok(done.rows_affected())
}

/// Stored events, oldest first, filtered by tenant and time (for `admin usage`).
pub async fn query(
    pool: &PgPool,
    tenant: Option<Uuid>,
    since: Option<OffsetDateTime>,
    until: Option<OffsetDateTime>,
) -> sqlx::Result<Vec<UsageEvent>> {
    sqlx::query_as::<_, UsageEvent>(&format!(
        "SELECT {COLUMNS} FROM usage_events
         WHERE ($1::uuid IS NULL OR tenant_id = $1)
           AND ($2::timestamptz IS NULL OR started_at >= $2)
           AND ($3::timestamptz IS NULL OR started_at < $3)
         ORDER BY started_at, request_id"
    ))
    .bind(tenant)
    .bind(since)
    .bind(until)
    .fetch_all(pool)
    .await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stored_names_match_the_serde_and_sqlx_names() {
        let serde_name = |v: serde_json::Value| v.as_str().map(str::to_owned);
        for p in [
            Provenance::Engine,
            Provenance::Partial,
            Provenance::Estimated,
        ] {
            assert_eq!(
                serde_name(serde_json::json!(p)).as_deref(),
                Some(p.as_str())
            );
        }
        for s in [
            UsageStatus::Ok,
            UsageStatus::ClientAbort,
            UsageStatus::UpstreamError,
            UsageStatus::Interrupted,
            UsageStatus::Rejected,
        ] {
            assert_eq!(
                serde_name(serde_json::json!(s)).as_deref(),
                Some(s.as_str())
            );
        }
    }
}
