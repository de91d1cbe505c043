//! A tenant's people (`users.tenant_role`, `users.display_name`) and their invitations
//! (`invitations`). Every statement names the tenant it acts in, so a foreign user or invitation
//! id matches no row. Changes that must not leave a tenant without an owner lock the tenant's
//! owners first ([`owners_for_update`]) inside the caller's transaction.

use sqlx::{PgConnection, PgExecutor};
use time::OffsetDateTime;
use uuid::Uuid;

use crate::tenancy::TenantRole;

/// What the portal needs about a signed-in tenant user beyond [`crate::tenancy::User`].
pub struct Standing {
    pub tenant_role: TenantRole,
    pub display_name: String,
}

pub async fn standing(db: impl PgExecutor<'_>, user_id: Uuid) -> sqlx::Result<Option<Standing>> {
    sqlx::query_as!(
        Standing,
        r#"SELECT tenant_role AS "tenant_role: TenantRole", display_name
           FROM users WHERE id = $1 AND tenant_id IS NOT NULL"#,
        user_id,
    )
    .fetch_optional(db)
    .await
}

/// One of a tenant's users as the members page lists them.
pub struct MemberRow {
    pub id: Uuid,
    pub email: String,
    pub display_name: String,
    pub tenant_role: TenantRole,
    pub created_at: OffsetDateTime,
}

pub async fn list(db: impl PgExecutor<'_>, tenant_id: Uuid) -> sqlx::Result<Vec<MemberRow>> {
    sqlx::query_as!(
        MemberRow,
        r#"SELECT id, email, display_name, tenant_role AS "tenant_role: TenantRole", created_at
           FROM users WHERE tenant_id = $1 ORDER BY created_at, email"#,
        tenant_id,
    )
    .fetch_all(db)
    .await
}

/// The tenant's owners, locked until the transaction ends: two owners demoting each other at
/// once are serialised, and the second sees the first's change.
pub async fn owners_for_update(
    conn: &mut PgConnection,
    tenant_id: Uuid,
) -> sqlx::Result<Vec<Uuid>> {
    sqlx::query_scalar!(
        "SELECT id FROM users WHERE tenant_id = $1 AND tenant_role = 'owner' ORDER BY id FOR UPDATE",
        tenant_id,
    )
    .fetch_all(conn)
    .await
}

/// One of the tenant's users (none for another tenant's id).
pub async fn member(
    db: impl PgExecutor<'_>,
    tenant_id: Uuid,
    user_id: Uuid,
) -> sqlx::Result<Option<MemberRow>> {
    sqlx::query_as!(
        MemberRow,
        r#"SELECT id, email, display_name, tenant_role AS "tenant_role: TenantRole", created_at
           FROM users WHERE tenant_id = $1 AND id = $2"#,
        tenant_id,
        user_id,
    )
    .fetch_optional(db)
    .await
}

pub async fn set_role(
    db: impl PgExecutor<'_>,
    tenant_id: Uuid,
    user_id: Uuid,
    role: TenantRole,
) -> sqlx::Result<bool> {
    let done = sqlx::query!(
        "UPDATE users SET tenant_role = $3 WHERE tenant_id = $1 AND id = $2",
        tenant_id,
        user_id,
        role as TenantRole,
    )
    .execute(db)
    .await?;
    Ok(done.rows_affected() == 1)
}

/// Deletes the user (their sessions go with them: `ON DELETE CASCADE`).
pub async fn remove(db: impl PgExecutor<'_>, tenant_id: Uuid, user_id: Uuid) -> sqlx::Result<bool> {
    let done = sqlx::query!(
        "DELETE FROM users WHERE tenant_id = $1 AND id = $2",
        tenant_id,
        user_id,
    )
    .execute(db)
    .await?;
    Ok(done.rows_affected() == 1)
}

/// A tenant user to insert (an accepted invitation); `password_hash` is a PHC string.
pub struct NewMember<'a> {
    pub email: &'a str,
    pub password_hash: &'a str,
    pub tenant_id: Uuid,
    pub tenant_role: TenantRole,
}

pub async fn insert(db: impl PgExecutor<'_>, m: &NewMember<'_>) -> sqlx::Result<Uuid> {
    sqlx::query_scalar!(
        "INSERT INTO users (id, email, password_hash, role, tenant_id, tenant_role)
         VALUES ($1, $2, $3, 'tenant_member', $4, $5) RETURNING id",
        Uuid::now_v7(),
        m.email,
        m.password_hash,
        m.tenant_id,
        m.tenant_role as TenantRole,
    )
    .fetch_one(db)
    .await
}

pub async fn set_display_name(
    db: impl PgExecutor<'_>,
    user_id: Uuid,
    name: &str,
) -> sqlx::Result<()> {
    sqlx::query!(
        "UPDATE users SET display_name = $2 WHERE id = $1",
        user_id,
        name
    )
    .execute(db)
    .await?;
    Ok(())
}

pub async fn password_hash(db: impl PgExecutor<'_>, user_id: Uuid) -> sqlx::Result<Option<String>> {
    sqlx::query_scalar!("SELECT password_hash FROM users WHERE id = $1", user_id)
        .fetch_optional(db)
        .await
}

pub async fn set_password_hash(
    db: impl PgExecutor<'_>,
    user_id: Uuid,
    hash: &str,
) -> sqlx::Result<()> {
    sqlx::query!(
        "UPDATE users SET password_hash = $2 WHERE id = $1",
        user_id,
        hash
    )
    .execute(db)
    .await?;
    Ok(())
}

/// An invitation to insert; only the token's digest is stored.
pub struct NewInvitation<'a> {
    pub tenant_id: Uuid,
    pub email: &'a str,
    pub tenant_role: TenantRole,
    pub token_sha256: &'a [u8],
    pub invited_by: Uuid,
    pub expires_at: OffsetDateTime,
}

pub async fn insert_invitation(
    db: impl PgExecutor<'_>,
    i: &NewInvitation<'_>,
) -> sqlx::Result<Uuid> {
    sqlx::query_scalar!(
        "INSERT INTO invitations (id, tenant_id, email, tenant_role, token_sha256, invited_by, expires_at)
         VALUES ($1, $2, $3, $4, $5, $6, $7) RETURNING id",
        Uuid::now_v7(),
        i.tenant_id,
        i.email,
        i.tenant_role as TenantRole,
        i.token_sha256,
        i.invited_by,
        i.expires_at,
    )
    .fetch_one(db)
    .await
}

/// An invitation as pages show it.
pub struct InvitationRow {
    pub id: Uuid,
    pub tenant_id: Uuid,
    pub email: String,
    pub tenant_role: TenantRole,
    pub created_at: OffsetDateTime,
    pub expires_at: OffsetDateTime,
}

/// The tenant's invitations not yet used nor expired, newest first.
pub async fn pending_invitations(
    db: impl PgExecutor<'_>,
    tenant_id: Uuid,
) -> sqlx::Result<Vec<InvitationRow>> {
    sqlx::query_as!(
        InvitationRow,
        r#"SELECT id, tenant_id, email, tenant_role AS "tenant_role: TenantRole", created_at, expires_at
           FROM invitations
           WHERE tenant_id = $1 AND accepted_at IS NULL AND expires_at > now()
           ORDER BY created_at DESC LIMIT 100"#,
        tenant_id,
    )
    .fetch_all(db)
    .await
}

/// A usable invitation by its token's digest (not used, not expired, its tenant active).
pub async fn usable_invitation(
    db: impl PgExecutor<'_>,
    token_sha256: &[u8],
) -> sqlx::Result<Option<InvitationRow>> {
    sqlx::query_as!(
        InvitationRow,
        r#"SELECT i.id, i.tenant_id, i.email, i.tenant_role AS "tenant_role: TenantRole",
                  i.created_at, i.expires_at
           FROM invitations i JOIN tenants t ON t.id = i.tenant_id
           WHERE i.token_sha256 = $1 AND i.accepted_at IS NULL AND i.expires_at > now()
             AND t.status = 'active'"#,
        token_sha256,
    )
    .fetch_optional(db)
    .await
}

/// Marks a usable invitation used and returns it; `None` when it is unknown, used (also by a
/// concurrent accept: the row lock makes exactly one win), expired or its tenant suspended.
pub async fn take_invitation(
    db: impl PgExecutor<'_>,
    token_sha256: &[u8],
) -> sqlx::Result<Option<InvitationRow>> {
    sqlx::query_as!(
        InvitationRow,
        r#"UPDATE invitations i SET accepted_at = now()
           FROM tenants t
           WHERE t.id = i.tenant_id AND i.token_sha256 = $1 AND i.accepted_at IS NULL
             AND i.expires_at > now() AND t.status = 'active'
           RETURNING i.id, i.tenant_id, i.email, i.tenant_role AS "tenant_role: TenantRole",
                     i.created_at, i.expires_at"#,
        token_sha256,
    )
    .fetch_optional(db)
    .await
}

/// Withdraws one of the tenant's pending invitations (its link stops working); its email.
pub async fn cancel_invitation(
    db: impl PgExecutor<'_>,
    tenant_id: Uuid,
    id: Uuid,
) -> sqlx::Result<Option<String>> {
    sqlx::query_scalar!(
        "UPDATE invitations SET expires_at = now()
         WHERE tenant_id = $1 AND id = $2 AND accepted_at IS NULL AND expires_at > now()
         RETURNING email",
        tenant_id,
        id,
    )
    .fetch_optional(db)
    .await
}
