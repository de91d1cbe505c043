//! API keys: issuing, revoking, the gateway's lookup by hash and its batched `last_used_at`.
//! Revocations fire `tf_auth_changed` (a trigger), so every replica drops its key cache.

use sqlx::{PgConnection, PgPool};
use time::OffsetDateTime;
use uuid::Uuid;

use crate::tenancy::{ApiKey, TenantStatus};

/// A key to insert: only its hash and visible prefix are stored.
pub struct NewKey<'a> {
    pub tenant_id: Uuid,
    pub name: &'a str,
    pub prefix: &'a str,
    pub sha256: &'a [u8; 32],
}

pub async fn insert(pool: impl sqlx::PgExecutor<'_>, key: &NewKey<'_>) -> sqlx::Result<ApiKey> {
    sqlx::query_as!(
        ApiKey,
        "INSERT INTO api_keys (id, tenant_id, name, prefix, secret_sha256)
         VALUES ($1, $2, $3, $4, $5)
         RETURNING id, tenant_id, name, prefix, created_at, last_used_at, revoked_at",
        Uuid::now_v7(),
        key.tenant_id,
        key.name,
        key.prefix,
        &key.sha256[..],
    )
    .fetch_one(pool)
    .await
}

/// Revokes the unrevoked key with this visible prefix, within `tenant_id`'s keys or (`None`) any
/// tenant's. Returns whether one was revoked.
pub async fn revoke_prefix_of(
    pool: &PgPool,
    tenant_id: Option<Uuid>,
    prefix: &str,
) -> sqlx::Result<bool> {
    let done = sqlx::query!(
        "UPDATE api_keys SET revoked_at = now()
         WHERE prefix = $1 AND revoked_at IS NULL AND ($2::uuid IS NULL OR tenant_id = $2)",
        prefix,
        tenant_id as Option<Uuid>,
    )
    .execute(pool)
    .await?;
    Ok(done.rows_affected() > 0)
}

pub async fn revoke_by_id(
    pool: impl sqlx::PgExecutor<'_>,
    id: Uuid,
) -> sqlx::Result<Option<ApiKey>> {
    sqlx::query_as!(
        ApiKey,
        "UPDATE api_keys SET revoked_at = now() WHERE id = $1 AND revoked_at IS NULL
         RETURNING id, tenant_id, name, prefix, created_at, last_used_at, revoked_at",
        id,
    )
    .fetch_optional(pool)
    .await
}

pub async fn revoke_by_prefix(
    pool: impl sqlx::PgExecutor<'_>,
    prefix: &str,
) -> sqlx::Result<Option<ApiKey>> {
    sqlx::query_as!(
        ApiKey,
        "UPDATE api_keys SET revoked_at = now() WHERE prefix = $1 AND revoked_at IS NULL
         RETURNING id, tenant_id, name, prefix, created_at, last_used_at, revoked_at",
        prefix,
    )
    .fetch_optional(pool)
    .await
}

/// What the gateway needs to know about a presented key.
pub struct KeyOwner {
    pub key_id: Uuid,
    pub tenant_id: Uuid,
    pub tenant_name: String,
    pub tenant_status: TenantStatus,
    /// Whether the tenant opted in to storing request bodies.
    pub body_logging: bool,
    /// Revoked, or past the end of its rotation grace period.
    pub revoked: bool,
    /// When a rotated key stops working (the cache refuses it from then on by itself).
    pub expires_at: Option<OffsetDateTime>,
}

/// The key with this SHA-256, revoked or not, and its tenant.
pub async fn owner_by_hash(pool: &PgPool, sha256: &[u8; 32]) -> sqlx::Result<Option<KeyOwner>> {
    sqlx::query_as!(
        KeyOwner,
        r#"SELECT k.id AS key_id, t.id AS tenant_id, t.name AS tenant_name,
                  t.status AS "tenant_status: TenantStatus", t.body_logging,
                  (k.revoked_at IS NOT NULL OR COALESCE(k.expires_at <= now(), false)) AS "revoked!", k.expires_at
           FROM api_keys k JOIN tenants t ON t.id = k.tenant_id WHERE k.secret_sha256 = $1"#,
        &sha256[..],
    )
    .fetch_optional(pool)
    .await
}

/// Whether the key with this SHA-256 is a working key of `tenant_id` (not revoked, not past a
/// rotation's grace period).
pub async fn is_live_key_of(
    pool: &PgPool,
    tenant_id: Uuid,
    sha256: &[u8; 32],
) -> sqlx::Result<bool> {
    sqlx::query_scalar!(
        r#"SELECT EXISTS (SELECT 1 FROM api_keys
                          WHERE secret_sha256 = $1 AND tenant_id = $2 AND revoked_at IS NULL
                            AND (expires_at IS NULL OR expires_at > now())) AS "live!""#,
        &sha256[..],
        tenant_id,
    )
    .fetch_one(pool)
    .await
}

/// Marks these keys used now, in one statement; returns how many rows changed. A key marked less
/// than a minute ago (by any replica) is left alone, so a busy key costs at most one row write a
/// minute across the cluster.
pub async fn touch_last_used(pool: &PgPool, ids: &[Uuid]) -> sqlx::Result<u64> {
    let done = sqlx::query!(
        "UPDATE api_keys SET last_used_at = now()
         WHERE id = ANY($1) AND (last_used_at IS NULL OR last_used_at < now() - interval '1 minute')",
        ids
    )
    .execute(pool)
    .await?;
    Ok(done.rows_affected())
}

/// A key's id and tenant, by visible prefix (revoked keys too: limits outlive a revocation).
pub struct KeyRef {
    pub id: Uuid,
    pub tenant_id: Uuid,
}

pub async fn by_prefix(
    pool: impl sqlx::PgExecutor<'_>,
    prefix: &str,
) -> sqlx::Result<Option<KeyRef>> {
    sqlx::query_as!(
        KeyRef,
        "SELECT id, tenant_id FROM api_keys WHERE prefix = $1",
        prefix
    )
    .fetch_optional(pool)
    .await
}

/// A tenant's key as the portal lists it.
#[derive(Debug, Clone)]
pub struct KeyRow {
    pub id: Uuid,
    pub name: String,
    pub prefix: String,
    pub created_at: OffsetDateTime,
    pub last_used_at: Option<OffsetDateTime>,
    pub revoked_at: Option<OffsetDateTime>,
    /// End of a rotation's grace period.
    pub expires_at: Option<OffsetDateTime>,
}

/// Most keys one listing returns (newest first); a tenant has a handful in practice.
pub const LIST_LIMIT: i64 = 500;

/// The tenant's keys, newest first, at most [`LIST_LIMIT`].
pub async fn list_of_tenant(
    pool: impl sqlx::PgExecutor<'_>,
    tenant_id: Uuid,
) -> sqlx::Result<Vec<KeyRow>> {
    sqlx::query_as!(
        KeyRow,
        "SELECT id, name, prefix, created_at, last_used_at, revoked_at, expires_at
         FROM api_keys WHERE tenant_id = $1 ORDER BY created_at DESC, id DESC LIMIT $2",
        tenant_id,
        LIST_LIMIT,
    )
    .fetch_all(pool)
    .await
}

/// How many of the tenant's keys work now (not revoked, not past a grace period).
pub async fn count_active(pool: impl sqlx::PgExecutor<'_>, tenant_id: Uuid) -> sqlx::Result<i64> {
    sqlx::query_scalar!(
        r#"SELECT count(*) AS "n!" FROM api_keys
           WHERE tenant_id = $1 AND revoked_at IS NULL AND (expires_at IS NULL OR expires_at > now())"#,
        tenant_id,
    )
    .fetch_one(pool)
    .await
}

/// Locks the tenant's row until the transaction ends, so two key creations of one tenant do
/// not both pass its key cap.
pub async fn lock_tenant(conn: &mut PgConnection, tenant_id: Uuid) -> sqlx::Result<()> {
    sqlx::query!("SELECT id FROM tenants WHERE id = $1 FOR UPDATE", tenant_id)
        .fetch_optional(conn)
        .await?;
    Ok(())
}

/// A key's name and visible prefix: what the portal says and the audit log records of it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Named {
    pub name: String,
    pub prefix: String,
}

/// Revokes the tenant's working key with this id (the tenant scopes it: another tenant's id
/// matches nothing). Returns the revoked key's name and prefix, or `None`.
pub async fn revoke_of_tenant(
    pool: impl sqlx::PgExecutor<'_>,
    tenant_id: Uuid,
    id: Uuid,
) -> sqlx::Result<Option<Named>> {
    sqlx::query_as!(
        Named,
        "UPDATE api_keys SET revoked_at = now()
         WHERE id = $1 AND tenant_id = $2 AND revoked_at IS NULL
           AND (expires_at IS NULL OR expires_at > now())
         RETURNING name, prefix",
        id,
        tenant_id,
    )
    .fetch_optional(pool)
    .await
}

/// Locks the tenant's working key with this id for a rotation; returns its name and prefix.
pub async fn lock_working_of_tenant(
    conn: &mut PgConnection,
    tenant_id: Uuid,
    id: Uuid,
) -> sqlx::Result<Option<Named>> {
    sqlx::query_as!(
        Named,
        "SELECT name, prefix FROM api_keys
         WHERE id = $1 AND tenant_id = $2 AND revoked_at IS NULL
           AND (expires_at IS NULL OR expires_at > now())
         FOR UPDATE",
        id,
        tenant_id,
    )
    .fetch_optional(conn)
    .await
}

/// Inserts a key inside a transaction (a rotation's new key).
pub async fn insert_in(conn: &mut PgConnection, key: &NewKey<'_>) -> sqlx::Result<Uuid> {
    sqlx::query_scalar!(
        "INSERT INTO api_keys (id, tenant_id, name, prefix, secret_sha256)
         VALUES ($1, $2, $3, $4, $5) RETURNING id",
        Uuid::now_v7(),
        key.tenant_id,
        key.name,
        key.prefix,
        &key.sha256[..],
    )
    .fetch_one(conn)
    .await
}

/// Ends a key's life `grace_secs` from now (0: revoked now). An earlier deadline is kept.
/// Returns when the key stops working.
pub async fn retire_in(
    conn: &mut PgConnection,
    tenant_id: Uuid,
    id: Uuid,
    grace_secs: i64,
) -> sqlx::Result<OffsetDateTime> {
    if grace_secs <= 0 {
        return sqlx::query_scalar!(
            r#"UPDATE api_keys SET revoked_at = now() WHERE id = $1 AND tenant_id = $2
               RETURNING revoked_at AS "at!""#,
            id,
            tenant_id,
        )
        .fetch_one(conn)
        .await;
    }
    sqlx::query_scalar!(
        r#"UPDATE api_keys
           SET expires_at = LEAST(COALESCE(expires_at, 'infinity'), now() + make_interval(secs => $3))
           WHERE id = $1 AND tenant_id = $2
           RETURNING expires_at AS "at!""#,
        id,
        tenant_id,
        grace_secs as f64,
    )
    .fetch_one(conn)
    .await
}
