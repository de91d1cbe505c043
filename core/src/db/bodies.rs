//! `stored_bodies`: prompts and completions of opted-in tenants' requests. Written in batches by
//! the gateway's capture writer, read by the `/logs` detail page, deleted by the retention job
//! and by an owner's "delete all".

use sqlx::PgExecutor;
use time::OffsetDateTime;
use uuid::Uuid;

/// One captured request, bounded by the gateway before it gets here.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredBody {
    pub request_id: Uuid,
    pub tenant_id: Uuid,
    pub prompt: String,
    pub prompt_truncated: bool,
    pub prompt_bytes: i32,
    pub completion: String,
    pub completion_truncated: bool,
    pub completion_bytes: i32,
}

/// Inserts a batch in one statement; a replayed request id is ignored.
pub async fn insert_batch(db: impl PgExecutor<'_>, rows: &[StoredBody]) -> sqlx::Result<u64> {
    let mut request_ids = Vec::with_capacity(rows.len());
    let mut tenant_ids = Vec::with_capacity(rows.len());
    let mut prompts = Vec::with_capacity(rows.len());
    let mut prompt_truncated = Vec::with_capacity(rows.len());
    let mut prompt_bytes = Vec::with_capacity(rows.len());
    let mut completions = Vec::with_capacity(rows.len());
    let mut completion_truncated = Vec::with_capacity(rows.len());
    let mut completion_bytes = Vec::with_capacity(rows.len());
    for r in rows {
        request_ids.push(r.request_id);
        tenant_ids.push(r.tenant_id);
        prompts.push(r.prompt.clone());
        prompt_truncated.push(r.prompt_truncated);
        prompt_bytes.push(r.prompt_bytes);
        completions.push(r.completion.clone());
        completion_truncated.push(r.completion_truncated);
        completion_bytes.push(r.completion_bytes);
    }
    let done = sqlx::query!(
        "INSERT INTO stored_bodies (request_id, tenant_id, prompt, prompt_truncated, prompt_bytes,
                                    completion, completion_truncated, completion_bytes)
         SELECT * FROM UNNEST($1::uuid[], $2::uuid[], $3::text[], $4::bool[], $5::int4[],
                              $6::text[], $7::bool[], $8::int4[])
         ON CONFLICT (request_id) DO NOTHING",
        &request_ids,
        &tenant_ids,
        &prompts,
        &prompt_truncated,
        &prompt_bytes,
        &completions,
        &completion_truncated,
        &completion_bytes,
    )
    .execute(db)
    .await?;
    Ok(done.rows_affected())
}

/// The tenant's stored body of one request (`None`: not stored, or another tenant's).
pub async fn of_request(
    db: impl PgExecutor<'_>,
    tenant_id: Uuid,
    request_id: Uuid,
) -> sqlx::Result<Option<StoredBody>> {
    sqlx::query_as!(
        StoredBody,
        "SELECT request_id, tenant_id, prompt, prompt_truncated, prompt_bytes,
                completion, completion_truncated, completion_bytes
           FROM stored_bodies WHERE tenant_id = $1 AND request_id = $2",
        tenant_id,
        request_id,
    )
    .fetch_optional(db)
    .await
}

/// How many bodies the tenant has stored (an index-only count on its index).
pub async fn count(db: impl PgExecutor<'_>, tenant_id: Uuid) -> sqlx::Result<i64> {
    sqlx::query_scalar!(
        r#"SELECT count(*) AS "n!" FROM stored_bodies WHERE tenant_id = $1"#,
        tenant_id
    )
    .fetch_one(db)
    .await
}

/// Deletes every stored body of the tenant; returns how many.
pub async fn delete_all(db: impl PgExecutor<'_>, tenant_id: Uuid) -> sqlx::Result<u64> {
    let done = sqlx::query!("DELETE FROM stored_bodies WHERE tenant_id = $1", tenant_id)
        .execute(db)
        .await?;
    Ok(done.rows_affected())
}

/// Deletes, for every tenant, up to `limit` bodies older than its retention period as of `now`
/// (the caller's clock, so tests control it); returns how many. Bounded so one statement never
/// holds a long transaction; the retention job repeats it until less than `limit` go.
pub async fn delete_expired(
    db: impl PgExecutor<'_>,
    now: OffsetDateTime,
    limit: i64,
) -> sqlx::Result<u64> {
    // Per tenant through (tenant_id, created_at), then by primary key: never a scan of the table.
    let done = sqlx::query!(
        "DELETE FROM stored_bodies WHERE request_id = ANY(ARRAY(
             SELECT e.request_id FROM tenants t
              CROSS JOIN LATERAL (
                    SELECT b.request_id FROM stored_bodies b
                     WHERE b.tenant_id = t.id
                       AND b.created_at < $1::timestamptz - make_interval(days => t.body_retention_days)
                     LIMIT $2) e
              LIMIT $2))",
        now,
        limit,
    )
    .execute(db)
    .await?;
    Ok(done.rows_affected())
}
