//! Leader election for cluster-wide background jobs: a PostgreSQL session advisory lock, held by
//! the one connection that took it (keep that connection out of the pool to keep the lock).

use sqlx::PgConnection;

/// Takes the lock `key` on this connection's session if nobody holds it; returns whether it did.
pub async fn try_lock(conn: &mut PgConnection, key: i64) -> sqlx::Result<bool> {
    sqlx::query_scalar!(r#"SELECT pg_try_advisory_lock($1) AS "won!""#, key)
        .fetch_one(conn)
        .await
}

/// Fails when the connection (and with it the lock) is gone.
pub async fn ping(conn: &mut PgConnection) -> sqlx::Result<()> {
    sqlx::query!("SELECT 1 AS one").fetch_one(conn).await?;
    Ok(())
}

/// Releases the lock `key` held by this connection's session.
pub async fn unlock(conn: &mut PgConnection, key: i64) -> sqlx::Result<()> {
    sqlx::query!("SELECT pg_advisory_unlock($1) AS released", key)
        .fetch_one(conn)
        .await?;
    Ok(())
}
