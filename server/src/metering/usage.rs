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
}

impl PgSink {
    pub fn new(pool: PgPool) -> Self {
        Self { pool }
    }
}

impl UsageSink for PgSink {
    fn record<'a>(&'a self, event: &'a UsageEvent) -> SinkFuture<'a> {
        Box::pin(async move {
            insert_batch(&self.pool, std::slice::from_ref(event)).await?;
            Ok(())
        })
    }
}

/// Inserts events in one statement; events already stored are skipped. Returns rows inserted.
pub async fn insert_batch(pool: &PgPool, events: &[UsageEvent]) -> sqlx::Result<u64> {
    if events.is_empty() {
        return Ok(0);
    }
    let mut qb = sqlx::QueryBuilder::new(format!("INSERT INTO usage_events ({COLUMNS}) "));
    qb.push_values(events, |mut b, e| {
        b.push_bind(e.request_id)
            .push_bind(e.tenant_id)
            .push_bind(e.api_key_id)
            .push_bind(&e.served_name)
            .push_bind(&e.base_model)
            .push_bind(&e.adapter)
            .push_bind(&e.graph)
            .push_bind(&e.price_key)
            .push_bind(e.prompt_tokens)
            .push_bind(e.cached_tokens)
            .push_bind(e.completion_tokens)
            .push_bind(e.provenance)
            .push_bind(e.status)
            .push_bind(e.stream)
            .push_bind(e.ttft_ms)
            .push_bind(e.duration_ms)
            .push_bind(e.started_at);
    });
    qb.push(" ON CONFLICT (request_id) DO NOTHING");
    Ok(qb.build().execute(pool).await?.rows_affected())
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
