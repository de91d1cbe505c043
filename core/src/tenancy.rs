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

/// What a tenant's user may do inside their tenant (`users.tenant_role`). Checked by the server
/// functions themselves, not only by which buttons a page shows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, sqlx::Type)]
#[sqlx(type_name = "text", rename_all = "snake_case")]
#[serde(rename_all = "snake_case")]
pub enum TenantRole {
    /// Everything a member may, plus members, tenant settings and body logging.
    Owner,
    /// Manages API keys and uses models.
    Member,
    /// Reads the tenant's pages; changes nothing.
    ReadOnly,
}

impl TenantRole {
    /// Every role, most rights first (the order forms offer them in).
    pub const ALL: [Self; 3] = [Self::Owner, Self::Member, Self::ReadOnly];

    /// Create, rotate and revoke API keys.
    pub fn manages_keys(self) -> bool {
        matches!(self, Self::Owner | Self::Member)
    }

    /// Upload, start, stop and delete the tenant's models (adapters).
    pub fn manages_models(self) -> bool {
        matches!(self, Self::Owner | Self::Member)
    }

    /// Invite, re-role and remove members; tenant settings; request-body logging.
    pub fn manages_tenant(self) -> bool {
        self == Self::Owner
    }

    /// The stored (and form) spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Owner => "owner",
            Self::Member => "member",
            Self::ReadOnly => "read_only",
        }
    }

    /// Parses the stored (and form) spelling.
    pub fn parse(s: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|r| r.as_str() == s)
    }

    /// How pages name it.
    pub fn label(self) -> &'static str {
        match self {
            Self::Owner => "Owner",
            Self::Member => "Member",
            Self::ReadOnly => "Read-only",
        }
    }
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
