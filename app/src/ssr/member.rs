//! The signed-in tenant member behind a tenant page or form: the only source of the tenant id
//! every tenant query is scoped by.

use tf_core::accounts::{Tenant, User};
use tf_core::TenantRole;
use tower_sessions::Session;

use super::portal::Portal;
use super::session;
use crate::error::PortalError;

/// A signed-in member and their (active) tenant.
pub struct Member {
    pub user: User,
    pub tenant: Tenant,
    /// Loaded with the user on every request, so a role change applies to the next click.
    pub role: TenantRole,
    /// The name the user chose (empty: none).
    pub display_name: String,
}

impl Member {
    /// Who acts, for the audited operations of `tf_core` (`member_ops`), from `ip`.
    pub fn actor<'a>(&'a self, ip: &'a str) -> tf_core::operator::Actor<'a> {
        tf_core::operator::Actor {
            user_id: Some(self.user.id),
            name: &self.user.email,
            source_ip: Some(ip),
        }
    }
}

/// The request's tenant member, if the session has one (admins have no tenant: `None`).
pub async fn current(portal: &Portal, s: &Session) -> Result<Option<Member>, PortalError> {
    let Some(si) = session::signed_in(portal, s).await? else {
        return Ok(None);
    };
    let Some(tenant) = si.tenant else {
        return Ok(None);
    };
    let standing = tf_core::db::members::standing(&portal.deps.pool, si.user.id)
        .await
        .map_err(|e| super::internal("loading the member's role", e))?;
    Ok(standing.map(|st| Member {
        user: si.user,
        tenant,
        role: st.tenant_role,
        display_name: st.display_name,
    }))
}

/// For a form that changes something: the member when `allowed(role)` holds. Otherwise nothing
/// is changed: a browser is sent back to `back` with a message, another client gets 403, and
/// the error is [`PortalError::Forbidden`].
pub fn permitted(
    m: Member,
    allowed: fn(TenantRole) -> bool,
    jar: &tower_cookies::Cookies,
    back: &str,
) -> Result<Member, PortalError> {
    if allowed(m.role) {
        return Ok(m);
    }
    tracing::warn!(user = %m.user.id, role = m.role.as_str(), "refused a form the role may not use");
    if session::accepts_html() {
        super::cookies::set_flash(jar, super::cookies::Flash::RoleRefused);
        session::redirect(back);
    } else {
        session::set_status(http::StatusCode::FORBIDDEN);
    }
    Err(PortalError::Forbidden)
}

/// For a read (a page's data): the member, or 403 and [`PortalError::SignedOut`].
pub async fn required(portal: &Portal, s: &Session) -> Result<Member, PortalError> {
    match current(portal, s).await? {
        Some(m) => Ok(m),
        None => {
            session::set_status(http::StatusCode::FORBIDDEN);
            Err(PortalError::SignedOut)
        }
    }
}
