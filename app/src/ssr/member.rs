//! The signed-in tenant member behind a tenant page or form: the only source of the tenant id
//! every tenant query is scoped by.

use tf_core::accounts::{Tenant, User};
use tower_sessions::Session;

use super::portal::Portal;
use super::session;
use crate::error::PortalError;

/// A signed-in member and their (active) tenant.
pub struct Member {
    pub user: User,
    pub tenant: Tenant,
}

/// The request's tenant member, if the session has one (admins have no tenant: `None`).
pub async fn current(portal: &Portal, s: &Session) -> Result<Option<Member>, PortalError> {
    Ok(session::signed_in(portal, s).await?.and_then(|si| {
        si.tenant.map(|tenant| Member {
            user: si.user,
            tenant,
        })
    }))
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
