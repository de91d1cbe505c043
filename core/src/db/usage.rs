//! Usage events: the batched, idempotent insert (the journal shipper's and the direct sink's) and
//! the operator's listing. Billed-spend sums are in `spend`.

use sqlx::PgPool;
use time::OffsetDateTime;
use uuid::Uuid;

use crate::endpoint::Endpoint;
use crate::usage::{Provenance, UsageEvent, UsageStatus};

/// The batch insert, with `$conflict` (a literal) after it.
macro_rules! insert_with {
    ($pool:expr, $events:expr, $conflict:tt) => {{
        fn col<'a, T>(events: &'a [UsageEvent], f: impl Fn(&'a UsageEvent) -> T) -> Vec<T> {
            events.iter().map(f).collect()
        }
        let events: &[UsageEvent] = $events;
        sqlx::query!(
            "INSERT INTO usage_events (request_id, tenant_id, api_key_id, served_name, base_model, adapter, graph,
                 price_key, prompt_tokens, cached_tokens, completion_tokens, provenance, status, stream, ttft_ms,
                 duration_ms, started_at, reasoning_tokens, endpoint)
             SELECT * FROM UNNEST($1::uuid[], $2::uuid[], $3::uuid[], $4::text[], $5::text[], $6::text[],
                 $7::text[], $8::text[], $9::int8[], $10::int8[], $11::int8[], $12::text[], $13::text[],
                 $14::bool[], $15::int4[], $16::int4[], $17::timestamptz[], $18::int8[], $19::text[]) "
                + $conflict,
            &col(events, |e| e.request_id),
            &col(events, |e| e.tenant_id),
            &col(events, |e| e.api_key_id) as &[Option<Uuid>],
            &col(events, |e| e.served_name.as_str()) as &[&str],
            &col(events, |e| e.base_model.as_str()) as &[&str],
            &col(events, |e| e.adapter.as_deref()) as &[Option<&str>],
            &col(events, |e| e.graph.as_str()) as &[&str],
            &col(events, |e| e.price_key.as_str()) as &[&str],
            &col(events, |e| e.prompt_tokens),
            &col(events, |e| e.cached_tokens),
            &col(events, |e| e.completion_tokens),
            &col(events, |e| e.provenance.as_str()) as &[&str],
            &col(events, |e| e.status.as_str()) as &[&str],
            &col(events, |e| e.stream),
            &col(events, |e| e.ttft_ms) as &[Option<i32>],
            &col(events, |e| e.duration_ms),
            &col(events, |e| e.started_at),
            &col(events, |e| e.reasoning_tokens),
            &col(events, |e| e.endpoint.as_str()) as &[&str],
        )
        .execute($pool)
        .await
        .map(|done| done.rows_affected())
    }};
}

/// Inserts events in one statement; events already stored are skipped. Returns rows inserted.
/// One array per column (UNNEST), so the statement text is the same for every batch size: it is
/// prepared once, and PostgreSQL never parses and plans thousands of bind parameters per batch.
///
/// A plain insert first: `ON CONFLICT` inserts every row speculatively (an index probe and one
/// more WAL record each, about 1.2 us a row here). Only a batch that meets a stored event (one
/// replayed after a crash) or holds an event twice fails on the key, and is inserted again with
/// `ON CONFLICT DO NOTHING`; the failed statement stored nothing (migration
/// 20261223100000_plain_inserts.sql).
pub async fn insert_batch(pool: &PgPool, events: &[UsageEvent]) -> sqlx::Result<u64> {
    if events.is_empty() {
        return Ok(0);
    }
    match insert_with!(pool, events, "") {
        Err(sqlx::Error::Database(e)) if e.is_unique_violation() => {
            insert_with!(pool, events, "ON CONFLICT (request_id) DO NOTHING")
        }
        done => done,
    }
}

/// Stored events, oldest first, filtered by tenant and time (for `admin usage`).
pub async fn list(
    pool: &PgPool,
    tenant: Option<Uuid>,
    since: Option<OffsetDateTime>,
    until: Option<OffsetDateTime>,
) -> sqlx::Result<Vec<UsageEvent>> {
    sqlx::query_as!(
        UsageEvent,
        r#"SELECT request_id, tenant_id, api_key_id, served_name, base_model, adapter, graph, price_key,
                  prompt_tokens, cached_tokens, completion_tokens, reasoning_tokens,
                  endpoint AS "endpoint: Endpoint",
                  provenance AS "provenance: Provenance", status AS "status: UsageStatus",
                  stream, ttft_ms, duration_ms, started_at
           FROM usage_events
           WHERE ($1::uuid IS NULL OR tenant_id = $1)
             AND ($2::timestamptz IS NULL OR started_at >= $2)
             AND ($3::timestamptz IS NULL OR started_at < $3)
           ORDER BY started_at, request_id"#,
        tenant as Option<Uuid>,
        since as Option<OffsetDateTime>,
        until as Option<OffsetDateTime>,
    )
    .fetch_all(pool)
    .await
}
