//! Portal sessions (`portal_sessions`): rows keyed by the SHA-256 of the session id, each naming
//! its user, so one statement ends a user's or a tenant's sessions.

use sqlx::types::JsonValue;
use sqlx::PgPool;
use time::OffsetDateTime;
use uuid::Uuid;

/// A session as written: its id's digest, its user, tower-sessions' record data, its expiry.
pub struct SessionWrite<'a> {
    pub id_sha256: &'a [u8],
    pub user_id: Uuid,
    pub data: &'a JsonValue,
    pub expiry_date: OffsetDateTime,
}

/// Inserts a new session; returns false when the id is taken (the row is left as it was).
pub async fn insert(pool: &PgPool, s: &SessionWrite<'_>) -> sqlx::Result<bool> {
    let done = sqlx::query!(
        "INSERT INTO portal_sessions (id_sha256, user_id, data, expiry_date)
         VALUES ($1, $2, $3, $4) ON CONFLICT (id_sha256) DO NOTHING",
        s.id_sha256,
        s.user_id,
        s.data,
        s.expiry_date,
    )
    .execute(pool)
    .await?;
    Ok(done.rows_affected() == 1)
}

/// Updates an existing session; a session deleted meanwhile stays deleted (never an upsert).
pub async fn update(pool: &PgPool, s: &SessionWrite<'_>) -> sqlx::Result<()> {
    sqlx::query!(
        "UPDATE portal_sessions SET user_id = $2, data = $3, expiry_date = $4
         WHERE id_sha256 = $1",
        s.id_sha256,
        s.user_id,
        s.data,
        s.expiry_date,
    )
    .execute(pool)
    .await?;
    Ok(())
}

/// A stored, unexpired session.
pub struct SessionRow {
    pub data: JsonValue,
    pub expiry_date: OffsetDateTime,
}

pub async fn load(pool: &PgPool, id_sha256: &[u8]) -> sqlx::Result<Option<SessionRow>> {
    sqlx::query_as!(
        SessionRow,
        "SELECT data, expiry_date FROM portal_sessions
         WHERE id_sha256 = $1 AND expiry_date > now()",
        id_sha256,
    )
    .fetch_optional(pool)
    .await
}

pub async fn delete(pool: &PgPool, id_sha256: &[u8]) -> sqlx::Result<()> {
    sqlx::query!(
        "DELETE FROM portal_sessions WHERE id_sha256 = $1",
        id_sha256
    )
    .execute(pool)
    .await?;
    Ok(())
}

pub async fn delete_expired(pool: &PgPool) -> sqlx::Result<u64> {
    let done = sqlx::query!("DELETE FROM portal_sessions WHERE expiry_date <= now()")
        .execute(pool)
        .await?;
    Ok(done.rows_affected())
}

/// Ends every session of one user; returns how many ended.
pub async fn delete_of_user(pool: impl sqlx::PgExecutor<'_>, user_id: Uuid) -> sqlx::Result<u64> {
    let done = sqlx::query!("DELETE FROM portal_sessions WHERE user_id = $1", user_id)
        .execute(pool)
        .await?;
    Ok(done.rows_affected())
}

/// Ends every session of a tenant's users; returns how many ended.
pub async fn delete_of_tenant(
    pool: impl sqlx::PgExecutor<'_>,
    tenant_id: Uuid,
) -> sqlx::Result<u64> {
    let done = sqlx::query!(
        "DELETE FROM portal_sessions
         WHERE user_id IN (SELECT id FROM users WHERE tenant_id = $1)",
        tenant_id,
    )
    .execute(pool)
    .await?;
    Ok(done.rows_affected())
}
