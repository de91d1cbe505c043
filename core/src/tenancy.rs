//! The tenancy records every layer passes around: tenants, portal users, API keys (without their
//! secrets). They sit below the data-access layer (`db`), which reads and writes them, and below
//! the rules in `accounts` and `keys`, so nothing here imports either.

use serde::Serialize;
use uuid::Uuid;

/// Whether a tenant may use the product.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, sqlx::Type)]
#[sqlx(type_name = "text", rename_all = "snake_case")]
#[serde(rename_all = "snake_case")]
pub enum TenantStatus {
    Active,
    Suspended,
}

/// What a portal user may do.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, sqlx::Type)]
#[sqlx(type_name = "text", rename_all = "snake_case")]
#[serde(rename_all = "snake_case")]
pub enum Role {
    /// Sees and manages only their own tenant.
    TenantMember,
    /// Operates the platform.
    Admin,
}

#[derive(Debug, Clone, sqlx::FromRow, Serialize)]
pub struct Tenant {
    pub id: Uuid,
    pub name: String,
    pub display_name: String,
    pub status: TenantStatus,
}

#[derive(Debug, Clone, sqlx::FromRow, Serialize)]
pub struct User {
    pub id: Uuid,
    pub email: String,
    pub role: Role,
    pub tenant_id: Option<Uuid>,
}

/// A key as stored, without its secret.
#[derive(Debug, Clone, sqlx::FromRow, serde::Serialize)]
pub struct ApiKey {
    pub id: Uuid,
    pub tenant_id: Uuid,
    pub name: String,
    pub prefix: String,
    pub created_at: time::OffsetDateTime,
    pub last_used_at: Option<time::OffsetDateTime>,
    pub revoked_at: Option<time::OffsetDateTime>,
}
