//! `replica_reports`: each replica's own figures (journal backlog, shipping, open connections),
//! written by the replica every few seconds and read by the admin ops page, which so sees every
//! replica and not only the one rendering it.

use sqlx::PgExecutor;
use time::OffsetDateTime;
use uuid::Uuid;

/// What a replica reports about itself.
#[derive(Debug, Clone, Default)]
pub struct Report {
    pub replica_id: Uuid,
    pub hostname: String,
    pub started_at: Option<OffsetDateTime>,
    pub backlog_bytes: i64,
    pub ship_lag_ms: i64,
    pub last_shipped_at: Option<OffsetDateTime>,
    pub journaled: i64,
    pub shipped: i64,
    pub ship_failures: i64,
    pub open_connections: i64,
}

/// Writes (or refreshes) a replica's row, stamped with the database's clock (replicas' clocks
/// may disagree; one clock decides what is stale).
pub async fn report(db: impl PgExecutor<'_>, r: &Report) -> sqlx::Result<()> {
    sqlx::query!(
        "INSERT INTO replica_reports (replica_id, hostname, started_at, seen_at, backlog_bytes,
                                      ship_lag_ms, last_shipped_at, journaled, shipped,
                                      ship_failures, open_connections)
         VALUES ($1, $2, COALESCE($3, now()), now(), $4, $5, $6, $7, $8, $9, $10)
         ON CONFLICT (replica_id) DO UPDATE SET
           hostname = EXCLUDED.hostname, seen_at = now(),
           backlog_bytes = EXCLUDED.backlog_bytes, ship_lag_ms = EXCLUDED.ship_lag_ms,
           last_shipped_at = EXCLUDED.last_shipped_at, journaled = EXCLUDED.journaled,
           shipped = EXCLUDED.shipped, ship_failures = EXCLUDED.ship_failures,
           open_connections = EXCLUDED.open_connections",
        r.replica_id,
        r.hostname,
        r.started_at,
        r.backlog_bytes,
        r.ship_lag_ms,
        r.last_shipped_at,
        r.journaled,
        r.shipped,
        r.ship_failures,
        r.open_connections,
    )
    .execute(db)
    .await?;
    Ok(())
}

/// A replica as the ops page shows it.
#[derive(Debug, Clone)]
pub struct Row {
    pub replica_id: Uuid,
    pub hostname: String,
    pub started_at: OffsetDateTime,
    pub seen_at: OffsetDateTime,
    /// Seconds since the last report, by the database's clock.
    pub seen_secs_ago: i64,
    pub backlog_bytes: i64,
    pub ship_lag_ms: i64,
    pub last_shipped_at: Option<OffsetDateTime>,
    pub journaled: i64,
    pub shipped: i64,
    pub ship_failures: i64,
    pub open_connections: i64,
}

/// Replicas seen within `window_secs`, most recently seen first.
pub async fn recent(db: impl PgExecutor<'_>, window_secs: i64) -> sqlx::Result<Vec<Row>> {
    sqlx::query_as!(
        Row,
        r#"SELECT replica_id, hostname, started_at, seen_at,
                  floor(extract(epoch FROM now() - seen_at))::bigint AS "seen_secs_ago!",
                  backlog_bytes, ship_lag_ms, last_shipped_at, journaled, shipped, ship_failures,
                  open_connections
           FROM replica_reports
           WHERE seen_at > now() - make_interval(secs => $1)
           ORDER BY seen_at DESC, hostname"#,
        window_secs as f64,
    )
    .fetch_all(db)
    .await
}

/// Deletes rows not refreshed for `older_than_secs` (replicas long gone); returns how many.
pub async fn forget(db: impl PgExecutor<'_>, older_than_secs: i64) -> sqlx::Result<u64> {
    let done = sqlx::query!(
        "DELETE FROM replica_reports WHERE seen_at < now() - make_interval(secs => $1)",
        older_than_secs as f64,
    )
    .execute(db)
    .await?;
    Ok(done.rows_affected())
}
