//! `/admin/users`: every portal user (admins and tenant users) with their tenant, role and
//! creation time; an admin resets a user's password (the new one shown once) or ends their
//! portal sessions.

pub mod page;

use leptos::prelude::*;
use serde::{Deserialize, Serialize};

use crate::error::PortalError;
use crate::keys::FreshKey;

/// One user of the list.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct UserItem {
    pub id: String,
    pub email: String,
    /// `admin`, `tenant member`, …
    pub role: String,
    /// The tenant's handle (admins have none).
    pub tenant: Option<String>,
    pub created: String,
    /// Live portal sessions.
    pub sessions: i64,
    /// The signed-in admin themself (their password is not reset from here).
    pub you: bool,
}

/// What `/admin/users` shows.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct UsersView {
    pub users: Vec<UserItem>,
    /// The cursor of the next page (the last email shown), when there is one.
    pub next: Option<String>,
    /// A password just reset: `name` is the email, `secret` the password, shown this once.
    pub fresh: Option<FreshKey>,
}

/// A page of users after the email `after`.
#[server(prefix = "/api", endpoint = "admin_users", input = leptos::server_fn::codec::GetUrl)]
pub async fn admin_users(
    #[server(default)] after: Option<String>,
) -> Result<UsersView, PortalError> {
    use crate::admin::server as admin;
    use crate::keys::reveal;
    use crate::keys::when;
    use crate::ssr::{cookies, internal, session, Portal};

    let portal = Portal::current()?;
    let me = admin::required(&portal).await?;
    let s = session::current().await?;
    let fresh = reveal::take(reveal::Slot::Password, &s, &cookies::jar().await?).await?;
    let after = after.filter(|a| !a.is_empty());
    let mut rows =
        tf_core::db::overview::user_page(&portal.deps.pool, after.as_deref(), super::PAGE_SIZE + 1)
            .await
            .map_err(|e| internal("listing users", e))?;
    let more = rows.len() > usize::try_from(super::PAGE_SIZE).unwrap_or(usize::MAX);
    rows.truncate(usize::try_from(super::PAGE_SIZE).unwrap_or(0));
    let next = more.then(|| rows.last().map(|r| r.email.clone())).flatten();
    Ok(UsersView {
        users: rows
            .into_iter()
            .map(|r| UserItem {
                id: r.id.to_string(),
                you: r.id == me.id,
                email: r.email,
                role: role_label(r.role),
                tenant: r.tenant_name,
                created: when(r.created_at),
                sessions: r.sessions,
            })
            .collect(),
        next,
        fresh,
    })
}

/// A role as its stored name, spaced: `tenant_member` -> `tenant member`.
#[cfg(feature = "ssr")]
fn role_label(role: tf_core::Role) -> String {
    serde_json::to_value(role)
        .ok()
        .and_then(|v| v.as_str().map(|s| s.replace('_', " ")))
        .unwrap_or_default()
}

/// The user a form names by id, or a flash saying there is none.
#[cfg(feature = "ssr")]
async fn named_user(
    f: &crate::admin::server::AdminForm,
    user: &str,
) -> Result<Option<tf_core::accounts::User>, PortalError> {
    let Ok(id) = user.trim().parse::<uuid::Uuid>() else {
        return Ok(None);
    };
    tf_core::db::accounts::user_by_id(&f.portal.deps.pool, id)
        .await
        .map_err(|e| crate::ssr::internal("loading a user", e))
}

/// Resets a user's password to a generated one (shown once) and ends their sessions.
#[server(prefix = "/api", endpoint = "admin_reset_password")]
pub async fn admin_reset_password(
    #[server(default)] csrf: String,
    #[server(default)] user: String,
) -> Result<(), PortalError> {
    use crate::keys::reveal;
    use crate::ssr::admin_flash::AdminFlash;
    use crate::ssr::internal;

    let Some(f) = super::form(&csrf, "/admin/users").await? else {
        return Ok(());
    };
    let Some(u) = named_user(&f, &user).await? else {
        return f.back("/admin/users", Some(AdminFlash::NoSuchUser));
    };
    if u.id == f.user.id {
        return f.back("/admin/users", Some(AdminFlash::NotYourself));
    }
    let password = tf_core::accounts::generate_password();
    tf_core::operator::reset_password(&f.portal.deps.pool, &f.actor(), &u, &password)
        .await
        .map_err(|e| internal("resetting a password", e))?;
    tracing::info!(user = %u.email, admin = %f.user.email, "password reset in the portal");
    let fresh = FreshKey {
        name: u.email,
        prefix: String::new(),
        secret: password,
        note: None,
    };
    reveal::stash(reveal::Slot::Password, &f.session, &f.jar, &fresh).await?;
    f.back("/admin/users", Some(AdminFlash::PasswordReset))
}

/// Ends every portal session of a user.
#[server(prefix = "/api", endpoint = "admin_end_sessions")]
pub async fn admin_end_sessions(
    #[server(default)] csrf: String,
    #[server(default)] user: String,
) -> Result<(), PortalError> {
    use crate::ssr::admin_flash::AdminFlash;
    use crate::ssr::internal;

    let Some(f) = super::form(&csrf, "/admin/users").await? else {
        return Ok(());
    };
    let Some(u) = named_user(&f, &user).await? else {
        return f.back("/admin/users", Some(AdminFlash::NoSuchUser));
    };
    tf_core::operator::end_sessions(&f.portal.deps.pool, &f.actor(), &u)
        .await
        .map_err(|e| internal("ending a user's sessions", e))?;
    tracing::info!(user = %u.email, admin = %f.user.email, "sessions ended in the portal");
    f.back("/admin/users", Some(AdminFlash::SessionsEnded))
}
