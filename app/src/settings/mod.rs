//! Server functions of `/settings`: the user's own name and password (every role: they are the
//! user's own account), and the tenant's settings, owners only: its display name, whether request
//! bodies may be stored and for how long. Owners' changes are audit-logged in the transaction
//! that makes them; a password change ends the user's other sessions.

pub mod page;

use leptos::prelude::*;
use serde::{Deserialize, Serialize};

use crate::error::PortalError;

/// Longest display name (users and tenants).
pub const MAX_DISPLAY_NAME: usize = 100;
/// Retention bounds, in days (the column's CHECK).
pub const RETENTION_DAYS: (i32, i32) = (1, 365);

/// Everything `/settings` shows.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SettingsView {
    pub email: String,
    pub display_name: String,
    /// The viewer's role's label.
    pub role: String,
    /// Whether the tenant panel is editable (owners).
    pub can_manage: bool,
    pub tenant_display_name: String,
    pub body_logging: bool,
    pub body_retention_days: i32,
    /// Request bodies stored now (what "Delete all stored bodies" would delete).
    pub stored_bodies: i64,
}

#[server(prefix = "/api", endpoint = "settings", input = leptos::server_fn::codec::GetUrl)]
pub async fn load_settings() -> Result<SettingsView, PortalError> {
    use crate::ssr::{internal, member, session, Portal};

    let portal = Portal::current()?;
    let s = session::current().await?;
    let m = member::required(&portal, &s).await?;
    let t = tf_core::db::settings::of_tenant(&portal.deps.pool, m.tenant.id)
        .await
        .map_err(|e| internal("reading settings", e))?
        .ok_or(PortalError::Internal)?;
    let stored_bodies = tf_core::db::bodies::count(&portal.deps.pool, m.tenant.id)
        .await
        .map_err(|e| internal("counting stored bodies", e))?;
    Ok(SettingsView {
        email: m.user.email,
        display_name: m.display_name,
        role: m.role.label().to_owned(),
        can_manage: m.role.manages_tenant(),
        tenant_display_name: t.display_name,
        body_logging: t.body_logging,
        body_retention_days: t.body_retention_days,
        stored_bodies,
    })
}

/// A display name as typed: trimmed; `None` when too long or holding control characters.
#[cfg(feature = "ssr")]
fn clean_name(name: &str) -> Option<&str> {
    let name = name.trim();
    (name.chars().count() <= MAX_DISPLAY_NAME && !name.chars().any(char::is_control))
        .then_some(name)
}

/// Sets the user's own display name (any role: it is their own).
#[server(prefix = "/api", endpoint = "save_profile")]
pub async fn save_profile(
    #[server(default)] csrf: String,
    #[server(default)] display_name: String,
) -> Result<(), PortalError> {
    use crate::ssr::cookies::Flash;
    use crate::ssr::form::{back, tenant_form, TenantForm};
    use crate::ssr::internal;

    let Some(TenantForm {
        portal,
        jar,
        member: m,
        ..
    }) = tenant_form(&csrf, "/settings", |_| true).await?
    else {
        return Ok(());
    };
    let Some(name) = clean_name(&display_name) else {
        return back(&jar, "/settings", Some(Flash::SettingsInvalid));
    };
    tf_core::db::members::set_display_name(&portal.deps.pool, m.user.id, name)
        .await
        .map_err(|e| internal("saving a display name", e))?;
    back(&jar, "/settings", Some(Flash::SettingsSaved))
}

/// Changes the user's password: the current one is required; the user's other sessions end and
/// this one continues under a new id.
#[server(prefix = "/api", endpoint = "change_password")]
pub async fn change_password(
    #[server(default)] csrf: String,
    #[server(default)] current: String,
    #[server(default)] password: String,
    #[server(default)] confirm: String,
) -> Result<(), PortalError> {
    use crate::model::MAX_INPUT_LEN;
    use crate::ssr::cookies::Flash;
    use crate::ssr::form::{back, tenant_form, TenantForm};
    use crate::ssr::{internal, session};
    use tf_core::accounts;

    let Some(TenantForm {
        portal,
        session: s,
        jar,
        member: m,
    }) = tenant_form(&csrf, "/settings", |_| true).await?
    else {
        return Ok(());
    };
    let pool = &portal.deps.pool;
    let fits = password.chars().count() >= accounts::MIN_PASSWORD_LEN
        && password.len() <= MAX_INPUT_LEN
        && current.len() <= MAX_INPUT_LEN
        && password == confirm;
    let stored = tf_core::db::members::password_hash(pool, m.user.id)
        .await
        .map_err(|e| internal("reading a password hash", e))?
        .unwrap_or_default();
    // Always verified (same cost whatever else is wrong).
    let current_ok = accounts::verify_password(&current, &stored).await;
    if !(fits && current_ok) {
        return back(&jar, "/settings", Some(Flash::PasswordRefused));
    }
    let hash = accounts::hash_password(&password)
        .await
        .map_err(|e| internal("hashing a password", e))?;
    // Every session of the user ends, this one included (this browser continues in a new one),
    // in the transaction that stores the hash and writes the `user.change_password` audit row.
    let ip = session::client_ip().await;
    tf_core::member_ops::change_password(
        pool,
        &m.actor(&ip),
        m.user.id,
        Some(m.tenant.id),
        &m.user.email,
        &hash,
    )
    .await
    .map_err(|e| internal("saving a password", e))?;
    session::sign_in(&s, m.user.id).await?;
    tracing::info!(user = %m.user.id, "password changed in the portal");
    back(&jar, "/settings", Some(Flash::PasswordChanged))
}

/// Saves the tenant's settings (owners): display name, body logging and retention. Each change
/// is audit-logged (`tenant.rename`, `bodies.opt_in` / `bodies.opt_out`, `bodies.retention`).
#[server(prefix = "/api", endpoint = "save_tenant_settings")]
pub async fn save_tenant_settings(
    #[server(default)] csrf: String,
    #[server(default)] display_name: String,
    // A checkbox: present (`on`) when ticked, absent otherwise.
    #[server(default)] body_logging: String,
    #[server(default)] retention_days: String,
) -> Result<(), PortalError> {
    use crate::ssr::cookies::Flash;
    use crate::ssr::form::{audit, back, tenant_form, TenantForm};
    use crate::ssr::internal;
    use serde_json::json;
    use tf_core::db::settings::{self, TenantSettings};

    let Some(TenantForm {
        portal,
        jar,
        member: m,
        ..
    }) = tenant_form(&csrf, "/settings", tf_core::TenantRole::manages_tenant).await?
    else {
        return Ok(());
    };
    let name = clean_name(&display_name).filter(|n| !n.is_empty());
    let days = retention_days
        .trim()
        .parse::<i32>()
        .ok()
        .filter(|d| (RETENTION_DAYS.0..=RETENTION_DAYS.1).contains(d));
    let (Some(name), Some(days)) = (name, days) else {
        return back(&jar, "/settings", Some(Flash::SettingsInvalid));
    };
    let new = TenantSettings {
        display_name: name.to_owned(),
        body_logging: !body_logging.is_empty(),
        body_retention_days: days,
    };
    let failed = |e| internal("saving tenant settings", e);
    let mut tx = portal.deps.pool.begin().await.map_err(failed)?;
    let old = settings::for_update(&mut tx, m.tenant.id)
        .await
        .map_err(failed)?
        .ok_or(PortalError::Internal)?;
    settings::set(&mut *tx, m.tenant.id, &new)
        .await
        .map_err(failed)?;
    let target = m.tenant.name.clone();
    if old.display_name != new.display_name {
        let d = json!({ "from": old.display_name, "to": new.display_name });
        audit(&mut tx, &m, "tenant.rename", &target, d).await?;
    }
    if old.body_logging != new.body_logging {
        let action = if new.body_logging {
            "bodies.opt_in"
        } else {
            "bodies.opt_out"
        };
        audit(&mut tx, &m, action, &target, json!({})).await?;
    }
    if old.body_retention_days != new.body_retention_days {
        let d = json!({ "from": old.body_retention_days, "to": new.body_retention_days });
        audit(&mut tx, &m, "bodies.retention", &target, d).await?;
    }
    tx.commit().await.map_err(failed)?;
    back(&jar, "/settings", Some(Flash::SettingsSaved))
}

/// Deletes every stored request body of the tenant (owners), audit-logged as
/// `bodies.delete_all` with how many were deleted, in the same transaction.
#[server(prefix = "/api", endpoint = "delete_stored_bodies")]
pub async fn delete_stored_bodies(#[server(default)] csrf: String) -> Result<(), PortalError> {
    use crate::ssr::cookies::Flash;
    use crate::ssr::form::{audit, back, tenant_form, TenantForm};
    use crate::ssr::internal;
    use serde_json::json;

    let Some(TenantForm {
        portal,
        jar,
        member: m,
        ..
    }) = tenant_form(&csrf, "/settings", tf_core::TenantRole::manages_tenant).await?
    else {
        return Ok(());
    };
    let failed = |e| internal("deleting stored bodies", e);
    let mut tx = portal.deps.pool.begin().await.map_err(failed)?;
    let deleted = tf_core::db::bodies::delete_all(&mut *tx, m.tenant.id)
        .await
        .map_err(failed)?;
    let target = m.tenant.name.clone();
    audit(
        &mut tx,
        &m,
        "bodies.delete_all",
        &target,
        json!({ "deleted": deleted }),
    )
    .await?;
    tx.commit().await.map_err(failed)?;
    back(&jar, "/settings", Some(Flash::BodiesDeleted))
}
