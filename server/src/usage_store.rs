//! Usage events in PostgreSQL: the direct sink ([`PgSink`]), the one insert every writer goes
//! through ([`store`]) and the read for `admin usage`.

use sqlx::PgPool;
use time::OffsetDateTime;
use uuid::Uuid;

use crate::usage::{SinkFuture, SpendBarrier, UsageEvent, UsageSink};

/// The columns, in the order of [`UsageEvent`]'s fields (one place for every INSERT/SELECT).
const COLUMNS: &str = "request_id, tenant_id, api_key_id, served_name, base_model, adapter, graph, price_key, \
     prompt_tokens, cached_tokens, completion_tokens, provenance, status, stream, ttft_ms, duration_ms, started_at";

/// Inserts each event into PostgreSQL directly (idempotent on request id).
pub struct PgSink {
    pool: PgPool,
    spend: Option<SpendBarrier>,
}

impl PgSink {
    pub fn new(pool: PgPool) -> Self {
        Self { pool, spend: None }
    }

    /// Waits on `spend` before each insert (see [`SpendBarrier`]).
    pub fn with_spend_barrier(mut self, spend: SpendBarrier) -> Self {
        self.spend = Some(spend);
        self
    }
}

impl UsageSink for PgSink {
    fn record<'a>(&'a self, event: &'a UsageEvent) -> SinkFuture<'a> {
        Box::pin(async move {
            store(&self.pool, self.spend.as_ref(), std::slice::from_ref(event)).await?;
            Ok(())
        })
    }
}

/// Writes events to PostgreSQL once the settled spend has reached Redis. INVARIANT: every
/// usage write goes through here, so Redis never counts less than PostgreSQL has billed and the
/// spend reconciler only ever raises counters (test: spend_order).
pub async fn store(
    pool: &PgPool,
    spend: Option<&SpendBarrier>,
    events: &[UsageEvent],
) -> sqlx::Result<u64> {
    if let Some(spend) = spend {
        spend.wait().await;
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
