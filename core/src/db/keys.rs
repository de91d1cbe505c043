//! API keys: issuing, revoking, the gateway's lookup by hash and its batched `last_used_at`.
//! Revocations fire `tf_auth_changed` (a trigger), so every replica drops its key cache.

use sqlx::PgPool;
use uuid::Uuid;

use crate::tenancy::{ApiKey, TenantStatus};

/// A key to insert: only its hash and visible prefix are stored.
pub struct NewKey<'a> {
    pub tenant_id: Uuid,
    pub name: &'a str,
    pub prefix: &'a str,
    pub sha256: &'a [u8; 32],
}

pub async fn insert(pool: &PgPool, key: &NewKey<'_>) -> sqlx::Result<ApiKey> {
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

pub async fn revoke_by_id(pool: &PgPool, id: Uuid) -> sqlx::Result<Option<ApiKey>> {
    sqlx::query_as!(
        ApiKey,
        "UPDATE api_keys SET revoked_at = now() WHERE id = $1 AND revoked_at IS NULL
         RETURNING id, tenant_id, name, prefix, created_at, last_used_at, revoked_at",
        id,
    )
    .fetch_optional(pool)
    .await
}

pub async fn revoke_by_prefix(pool: &PgPool, prefix: &str) -> sqlx::Result<Option<ApiKey>> {
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
    pub revoked: bool,
}

/// The key with this SHA-256, revoked or not, and its tenant.
pub async fn owner_by_hash(pool: &PgPool, sha256: &[u8; 32]) -> sqlx::Result<Option<KeyOwner>> {
    sqlx::query_as!(
        KeyOwner,
        r#"SELECT k.id AS key_id, t.id AS tenant_id, t.name AS tenant_name,
                  t.status AS "tenant_status: TenantStatus", k.revoked_at IS NOT NULL AS "revoked!"
           FROM api_keys k JOIN tenants t ON t.id = k.tenant_id WHERE k.secret_sha256 = $1"#,
        &sha256[..],
    )
    .fetch_optional(pool)
    .await
}

/// Whether the key with this SHA-256 is an unrevoked key of `tenant_id`.
pub async fn is_live_key_of(
    pool: &PgPool,
    tenant_id: Uuid,
    sha256: &[u8; 32],
) -> sqlx::Result<bool> {
    sqlx::query_scalar!(
        r#"SELECT EXISTS (SELECT 1 FROM api_keys
                          WHERE secret_sha256 = $1 AND tenant_id = $2 AND revoked_at IS NULL) AS "live!""#,
        &sha256[..],
        tenant_id,
    )
    .fetch_one(pool)
    .await
}

/// Marks these keys used now, in one statement; returns how many rows changed.
pub async fn touch_last_used(pool: &PgPool, ids: &[Uuid]) -> sqlx::Result<u64> {
    let done = sqlx::query!(
        "UPDATE api_keys SET last_used_at = now() WHERE id = ANY($1)",
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

pub async fn by_prefix(pool: &PgPool, prefix: &str) -> sqlx::Result<Option<KeyRef>> {
    sqlx::query_as!(
        KeyRef,
        "SELECT id, tenant_id FROM api_keys WHERE prefix = $1",
        prefix
    )
    .fetch_optional(pool)
    .await
}
