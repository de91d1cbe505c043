//! The demo tenant of the embedded default: a tenant with a member login, an admin login, the
//! demo adapters and an API key, printed at start-up so a new user can try everything at once.
//! Passwords and the key are fresh on every start (only hashes are stored, so they cannot be
//! shown again); the previous start's demo key is revoked.

use rand::distributions::{Alphanumeric, DistString};
use sqlx::PgPool;
use tf_core::accounts::{self, AccountError, Role};
use tf_core::keys;

use crate::fleet::{self, local_sim};

pub const DEMO_TENANT: &str = "demo";
pub const DEMO_EMAIL: &str = "demo@tokenfactory.local";
pub const ADMIN_EMAIL: &str = "admin@tokenfactory.local";
const DEMO_KEY_NAME: &str = "demo key (printed at start-up)";

/// What start-up prints.
pub struct DemoCredentials {
    pub member_email: &'static str,
    pub member_password: String,
    pub admin_email: &'static str,
    pub admin_password: String,
    pub api_key: String,
}

/// A random password that meets the minimum length.
pub fn random_password() -> String {
    Alphanumeric.sample_string(&mut rand::rngs::OsRng, 16)
}

/// Creates or refreshes the demo tenant, its users, adapters (on the local simulator) and key.
pub async fn ensure(pool: &PgPool, with_sim_adapters: bool) -> anyhow::Result<DemoCredentials> {
    let tenant = match accounts::find_tenant(pool, DEMO_TENANT).await {
        Ok(t) => t,
        Err(AccountError::NotFound(_)) => {
            accounts::create_tenant(pool, DEMO_TENANT, "Demo Tenant").await?
        }
        Err(e) => return Err(e.into()),
    };
    let member_password = random_password();
    let admin_password = random_password();
    upsert_user(
        pool,
        DEMO_EMAIL,
        &member_password,
        Role::TenantMember,
        Some(tenant.id),
    )
    .await?;
    upsert_user(pool, ADMIN_EMAIL, &admin_password, Role::Admin, None).await?;
    if with_sim_adapters {
        for (served, lora) in local_sim::DEMO_ADAPTERS {
            fleet::register_adapter(pool, tenant.id, served, local_sim::DEMO_BASE, lora).await?;
        }
    }
    sqlx::query("UPDATE api_keys SET revoked_at = now() WHERE tenant_id = $1 AND name = $2 AND revoked_at IS NULL")
        .bind(tenant.id)
        .bind(DEMO_KEY_NAME)
        .execute(pool)
        .await?;
    let (_, api_key) = keys::issue(pool, tenant.id, DEMO_KEY_NAME).await?;
    Ok(DemoCredentials {
        member_email: DEMO_EMAIL,
        member_password,
        admin_email: ADMIN_EMAIL,
        admin_password,
        api_key,
    })
}

async fn upsert_user(
    pool: &PgPool,
    email: &str,
    password: &str,
    role: Role,
    tenant: Option<uuid::Uuid>,
) -> Result<(), AccountError> {
    match accounts::create_user(pool, email, password, role, tenant).await {
        Ok(_) => Ok(()),
        Err(AccountError::Exists(_)) => accounts::reset_password(pool, email, password).await,
        Err(e) => Err(e),
    }
}
