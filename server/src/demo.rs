//! The demo tenant of the embedded default (`serve --demo`): a tenant with a member login, an
//! admin login, the demo adapters and an API key, printed at start-up so a new user can try
//! everything at once.
//!
//! The credentials are made once and kept in a local state file (`--demo-state`, mode 0600, so
//! only its owner can read it), then reprinted at every later start: a restart does not break a
//! saved key or login. Each credential in the file is checked against the database first (a file
//! from another database, a password reset by an operator, a revoked key); only what no longer
//! works is replaced, and no key is ever revoked here.

use std::io::Write;
use std::path::Path;

use anyhow::Context;
use rand::distributions::{Alphanumeric, DistString};
use serde::{Deserialize, Serialize};
use sqlx::PgPool;
use tf_core::accounts::{self, AccountError, Role};
use tf_core::keys;
use uuid::Uuid;

use crate::adapter_check::config::BaseConfig;
use crate::fleet::local_sim;
use crate::lifecycle::transitions::Command;
use crate::lifecycle::{fixture, Actor, Lifecycle, LifecycleError};

const DEMO_TENANT: &str = "demo";
const DEMO_EMAIL: &str = "demo@tokenfactory.local";
const ADMIN_EMAIL: &str = "admin@tokenfactory.local";
const DEMO_KEY_NAME: &str = "demo key (printed at start-up)";

/// What start-up prints, and what the state file holds.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DemoCredentials {
    pub member_email: String,
    pub member_password: String,
    pub admin_email: String,
    pub admin_password: String,
    pub api_key: String,
}

impl std::fmt::Debug for DemoCredentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DemoCredentials")
            .field("member_email", &self.member_email)
            .field("admin_email", &self.admin_email)
            .finish_non_exhaustive()
    }
}

/// A random password that meets the minimum length.
/// The demo's price per million tokens of its simulated bases: fresh input, cached input (half),
/// output (three times), so its pages and invoices show the three rates at work.
pub const DEMO_RATES: tf_core::money::Rates = tf_core::money::Rates {
    fresh_per_m: 200_000,
    cached_per_m: 100_000,
    output_per_m: 600_000,
};

/// The demo's price of its embedding base: input only (an embedding generates nothing), a tenth
/// of the chat bases' fresh input.
pub const DEMO_EMBEDDING_RATES: tf_core::money::Rates = tf_core::money::Rates {
    fresh_per_m: 20_000,
    cached_per_m: 20_000,
    output_per_m: 0,
};

pub fn random_password() -> String {
    Alphanumeric.sample_string(&mut rand::rngs::OsRng, 16)
}

/// Creates the demo tenant, its users, adapters (uploaded and started through the lifecycle on the
/// local simulator, when `lifecycle` is given) and key, or takes them over from `state` (the file
/// written by an earlier start) as far as they still work. Writes the file back (mode 0600) with
/// what is printed.
pub async fn ensure(
    pool: &PgPool,
    lifecycle: Option<&Lifecycle>,
    state: &Path,
) -> anyhow::Result<DemoCredentials> {
    let tenant = match accounts::find_tenant(pool, DEMO_TENANT).await {
        Ok(t) => t,
        Err(AccountError::NotFound(_)) => {
            accounts::create_tenant(pool, DEMO_TENANT, "Demo Tenant").await?
        }
        Err(e) => return Err(e.into()),
    };
    let saved = read_state(state);
    let member_password = kept_password(
        pool,
        DEMO_EMAIL,
        saved.as_ref().map(|s| s.member_password.as_str()),
        Role::TenantMember,
        Some(tenant.id),
    )
    .await?;
    let admin_password = kept_password(
        pool,
        ADMIN_EMAIL,
        saved.as_ref().map(|s| s.admin_password.as_str()),
        Role::Admin,
        None,
    )
    .await?;
    if let Some(lifecycle) = lifecycle {
        for served in local_sim::DEMO_ADAPTERS {
            demo_adapter(pool, lifecycle, tenant.id, served).await?;
        }
        price_book(pool).await?;
        costs(pool, time::OffsetDateTime::now_utc()).await?;
    }
    let api_key = match saved.as_ref().map(|s| s.api_key.as_str()) {
        Some(key) if key_works(pool, tenant.id, key).await? => key.to_owned(),
        _ => keys::issue(pool, tenant.id, DEMO_KEY_NAME).await?.1,
    };
    let creds = DemoCredentials {
        member_email: DEMO_EMAIL.to_owned(),
        member_password,
        admin_email: ADMIN_EMAIL.to_owned(),
        admin_password,
        api_key,
    };
    write_state(state, &creds)
        .with_context(|| format!("writing the demo credentials to {}", state.display()))?;
    Ok(creds)
}

/// Prices the demo's simulated bases in the price book ([`DEMO_RATES`]), so its usage pages,
/// spend and invoices show money. A base the book already prices keeps its price (an operator's
/// is never overwritten); nothing new, no new version.
async fn price_book(pool: &PgPool) -> anyhow::Result<()> {
    use tf_core::billing_ops::{self, NewPrice};
    let now = time::OffsetDateTime::now_utc();
    let priced: std::collections::HashSet<String> = tf_core::db::billing::prices_at(pool, now)
        .await?
        .map(|(_, prices)| prices.into_iter().map(|p| p.price_key).collect())
        .unwrap_or_default();
    let missing: Vec<NewPrice> = tf_core::db::catalog::price_keys_of_fleet(pool, "local-sim")
        .await?
        .into_iter()
        .filter(|k| !priced.contains(k))
        .map(|price_key| NewPrice {
            rates: if price_key == local_sim::EMBEDDING_BASE {
                DEMO_EMBEDDING_RATES
            } else {
                DEMO_RATES
            },
            price_key,
            tier: "standard".to_owned(),
        })
        .collect();
    if !missing.is_empty() {
        let demo = tf_core::operator::Actor {
            user_id: None,
            name: "demo",
            source_ip: None,
        };
        billing_ops::set_prices(pool, &demo, None, &missing).await?;
    }
    Ok(())
}

/// What the demo says one simulated GPU costs an hour (an on-demand data-centre GPU) and what
/// one simulated replica serves at full load, so `/admin/economics` has figures to show.
pub const DEMO_GPU_MICROS_PER_HOUR: i64 = 2_500_000;
pub const DEMO_PEAK_TOKENS_PER_SECOND: i64 = 2_000;

/// Gives each simulated base without a cost version the demo's, in effect from the start of
/// `now`'s UTC day (so the whole first day of the demo is costed). A base with any cost version
/// keeps it: an operator's is never overwritten, and a restart adds nothing.
pub async fn costs(pool: &PgPool, now: time::OffsetDateTime) -> anyhow::Result<()> {
    let costed: std::collections::HashSet<String> = tf_core::db::economics::costs(pool)
        .await?
        .into_iter()
        .map(|c| c.base_model)
        .collect();
    let demo = tf_core::operator::Actor {
        user_id: None,
        name: "demo",
        source_ip: None,
    };
    let day_start = now
        .to_offset(time::UtcOffset::UTC)
        .replace_time(time::Time::MIDNIGHT);
    let bases = local_sim::BASES.map(|(b, _)| b);
    for base in bases.into_iter().chain([local_sim::EMBEDDING_BASE]) {
        if costed.contains(base) {
            continue;
        }
        let cost = tf_core::db::economics::NewCost {
            base_model: base,
            effective_from: day_start,
            gpu_micros_per_hour: DEMO_GPU_MICROS_PER_HOUR,
            gpus_per_replica: local_sim::GPUS_PER_REPLICA,
            peak_tokens_per_second: DEMO_PEAK_TOKENS_PER_SECOND,
            created_by: "demo",
        };
        match tf_core::operator::set_base_cost(pool, &demo, &cost).await {
            // Another replica starting at the same time wrote the same version first.
            Ok(_) | Err(AccountError::Exists(_)) => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(())
}

/// Uploads (generated, valid weights) and starts a demo adapter unless it is already there; a
/// row left by an older demo (registered without files) is replaced.
async fn demo_adapter(
    pool: &PgPool,
    lifecycle: &Lifecycle,
    tenant: Uuid,
    served: &str,
) -> anyhow::Result<()> {
    let actor = Actor {
        user_id: None,
        label: "system".into(),
    };
    let view = match lifecycle.view(tenant, served).await {
        Ok(v) => v,
        Err(LifecycleError::NotFound(_)) => {
            tf_core::db::catalog::delete_adapter(pool, tenant, served).await?;
            let base: BaseConfig = serde_json::from_value(local_sim::sim_base_config())?;
            let (config, weights) =
                fixture::valid(&local_sim::model_id(local_sim::DEMO_BASE), &base, 8);
            lifecycle
                .upload_bytes(
                    tenant,
                    served,
                    local_sim::DEMO_BASE,
                    config.into_bytes(),
                    weights,
                    &actor,
                )
                .await?
        }
        Err(e) => return Err(e.into()),
    };
    if view.state == "stopped" && view.desired == "stopped" {
        lifecycle
            .command(tenant, served, Command::Start, &actor)
            .await?;
    }
    Ok(())
}

/// The saved credentials, if the file exists and parses (otherwise new ones are made).
fn read_state(path: &Path) -> Option<DemoCredentials> {
    let text = match std::fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return None,
        Err(e) => {
            tracing::warn!(error = %e, path = %path.display(), "demo state unreadable; making new credentials");
            return None;
        }
    };
    match serde_json::from_str(&text) {
        Ok(c) => Some(c),
        Err(e) => {
            tracing::warn!(error = %e, path = %path.display(), "demo state malformed; making new credentials");
            None
        }
    }
}

/// Writes the file readable by its owner only, atomically (a crash leaves the old file or the
/// new one, never half of one).
fn write_state(path: &Path, creds: &DemoCredentials) -> anyhow::Result<()> {
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir)?;
    }
    let tmp = path.with_extension("tmp");
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create(true).truncate(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
    let mut file = options.open(&tmp)?;
    // The mode above applies only when the file is created; a leftover keeps its own.
    #[cfg(unix)]
    file.set_permissions(std::os::unix::fs::PermissionsExt::from_mode(0o600))?;
    file.write_all(serde_json::to_string_pretty(creds)?.as_bytes())?;
    file.sync_all()?;
    std::fs::rename(&tmp, path)?;
    Ok(())
}

/// The saved password when it still signs the user in; otherwise a new one, set on the user
/// (created if missing).
async fn kept_password(
    pool: &PgPool,
    email: &str,
    saved: Option<&str>,
    role: Role,
    tenant: Option<Uuid>,
) -> anyhow::Result<String> {
    if let Some(password) = saved {
        if matches!(
            accounts::authenticate(pool, email, password).await?,
            Ok(_) | Err(accounts::LoginRefusal::TenantSuspended)
        ) {
            return Ok(password.to_owned());
        }
    }
    let password = random_password();
    match accounts::create_user(pool, email, &password, role, tenant).await {
        Ok(_) => {}
        Err(AccountError::Exists(_)) => {
            accounts::reset_password(pool, email, &password).await?;
        }
        Err(e) => return Err(e.into()),
    }
    Ok(password)
}

/// Whether `key` is an unrevoked key of the demo tenant.
async fn key_works(pool: &PgPool, tenant: Uuid, key: &str) -> sqlx::Result<bool> {
    tf_core::db::keys::is_live_key_of(pool, tenant, &keys::hash_secret(key)).await
}
