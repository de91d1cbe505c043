//! What a tenant's members do to their own keys and password in the portal (issue 31): each
//! action and its `audit_log` row commit in one transaction, as [`crate::operator`] does for
//! operators, so the tenant's owners and the platform's admins can see who created, rotated or
//! revoked which key and when a password changed. A failed audit write undoes the action.

use serde_json::json;
use sqlx::PgPool;
use uuid::Uuid;

use crate::db;
use crate::keys::{self, ApiKey, IssueError, Rotated};
use crate::operator::{record, Actor};

/// Creates a key for the member's tenant unless it already has `cap` working keys, audited as
/// `key.create` (target: the new key's prefix). Returns the key and its secret (shown once).
pub async fn create_key(
    pool: &PgPool,
    actor: &Actor<'_>,
    tenant_id: Uuid,
    name: &str,
    cap: u32,
) -> Result<(ApiKey, String), IssueError> {
    let mut tx = pool.begin().await?;
    let (key, secret) = keys::issue_capped_in(&mut tx, tenant_id, name, cap).await?;
    record(
        &mut tx,
        actor,
        Some(tenant_id),
        "key.create",
        &key.prefix,
        json!({ "name": key.name }),
    )
    .await?;
    tx.commit().await?;
    Ok((key, secret))
}

/// Rotates one of the tenant's working keys (see [`keys::rotate`]), audited as `key.rotate`
/// (target: the old key's prefix; detail: the new prefix, the grace and when the old one stops).
/// `None`, and no row, when the tenant has no working key with that id.
pub async fn rotate_key(
    pool: &PgPool,
    actor: &Actor<'_>,
    tenant_id: Uuid,
    id: Uuid,
    grace_secs: i64,
) -> sqlx::Result<Option<Rotated>> {
    let mut tx = pool.begin().await?;
    let Some(rotated) = keys::rotate_in(&mut tx, tenant_id, id, grace_secs).await? else {
        return Ok(None);
    };
    let ends = rotated
        .old_ends_at
        .format(&time::format_description::well_known::Rfc3339)
        .unwrap_or_default();
    record(
        &mut tx,
        actor,
        Some(tenant_id),
        "key.rotate",
        &rotated.old_prefix,
        json!({
            "name": rotated.name,
            "new_prefix": rotated.prefix,
            "grace_secs": grace_secs,
            "old_ends_at": ends,
        }),
    )
    .await?;
    tx.commit().await?;
    Ok(Some(rotated))
}

/// Revokes one of the tenant's working keys, audited as `key.revoke` (target: its prefix).
/// `None`, and no row, when the tenant has no working key with that id.
pub async fn revoke_key(
    pool: &PgPool,
    actor: &Actor<'_>,
    tenant_id: Uuid,
    id: Uuid,
) -> sqlx::Result<Option<db::keys::Named>> {
    let mut tx = pool.begin().await?;
    let Some(key) = db::keys::revoke_of_tenant(&mut *tx, tenant_id, id).await? else {
        return Ok(None);
    };
    record(
        &mut tx,
        actor,
        Some(tenant_id),
        "key.revoke",
        &key.prefix,
        json!({ "name": key.name }),
    )
    .await?;
    tx.commit().await?;
    Ok(Some(key))
}

/// Stores a member's new password hash (the caller checked the current password and hashed the
/// new one) and ends every portal session of the user, audited as `user.change_password`
/// (target: the email; never the hash). Returns the sessions ended.
pub async fn change_password(
    pool: &PgPool,
    actor: &Actor<'_>,
    user_id: Uuid,
    tenant_id: Option<Uuid>,
    email: &str,
    new_hash: &str,
) -> sqlx::Result<u64> {
    let mut tx = pool.begin().await?;
    db::members::set_password_hash(&mut *tx, user_id, new_hash).await?;
    let ended = db::sessions::delete_of_user(&mut *tx, user_id).await?;
    record(
        &mut tx,
        actor,
        tenant_id,
        "user.change_password",
        email,
        json!({ "sessions_ended": ended }),
    )
    .await?;
    tx.commit().await?;
    Ok(ended)
}
