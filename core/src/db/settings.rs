//! A tenant's settings (`tenants.display_name`, `body_logging`, `body_retention_days`), read by
//! the settings page and changed by its owners, one transaction with the audit record.

use sqlx::{PgConnection, PgExecutor};
use uuid::Uuid;

/// What the settings page shows and owners change.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TenantSettings {
    pub display_name: String,
    pub body_logging: bool,
    pub body_retention_days: i32,
}

pub async fn of_tenant(
    db: impl PgExecutor<'_>,
    tenant_id: Uuid,
) -> sqlx::Result<Option<TenantSettings>> {
    sqlx::query_as!(
        TenantSettings,
        "SELECT display_name, body_logging, body_retention_days FROM tenants WHERE id = $1",
        tenant_id,
    )
    .fetch_optional(db)
    .await
}

/// The settings as they are, locked until the transaction ends (so the audit record's "from"
/// is what was replaced).
pub async fn for_update(
    conn: &mut PgConnection,
    tenant_id: Uuid,
) -> sqlx::Result<Option<TenantSettings>> {
    sqlx::query_as!(
        TenantSettings,
        "SELECT display_name, body_logging, body_retention_days FROM tenants WHERE id = $1 FOR UPDATE",
        tenant_id,
    )
    .fetch_optional(conn)
    .await
}

pub async fn set(db: impl PgExecutor<'_>, tenant_id: Uuid, s: &TenantSettings) -> sqlx::Result<()> {
    sqlx::query!(
        "UPDATE tenants SET display_name = $2, body_logging = $3, body_retention_days = $4 WHERE id = $1",
        tenant_id,
        s.display_name,
        s.body_logging,
        s.body_retention_days,
    )
    .execute(db)
    .await?;
    Ok(())
}
