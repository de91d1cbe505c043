//! The signed-in admin behind an admin page or form. Every
//! admin server function starts here: a form checks its CSRF token first, then that the session
//! is an admin's; a tenant user gets 403 and nothing is read or changed.

use tf_core::accounts::{Role, User};
use tf_core::operator::Actor;
use tower_cookies::Cookies;
use tower_sessions::Session;

use crate::error::PortalError;
use crate::ssr::admin_flash::AdminFlash;
use crate::ssr::portal::Portal;
use crate::ssr::{cookies, session};

/// The admin of a read (a page's data): 403 for anybody else.
pub async fn required(portal: &Portal) -> Result<User, PortalError> {
    let s = session::current().await?;
    match session::signed_in(portal, &s).await? {
        Some(si) if si.user.role == Role::Admin => Ok(si.user),
        _ => {
            session::set_status(http::StatusCode::FORBIDDEN);
            Err(PortalError::Forbidden)
        }
    }
}

/// What every admin form has once its CSRF token and its admin are checked.
pub struct AdminForm {
    pub portal: Portal,
    pub session: Session,
    pub jar: Cookies,
    pub user: User,
    /// The client's address, for the audit log.
    pub ip: String,
}

impl AdminForm {
    /// Who acts, for `tf_core::operator`.
    pub fn actor(&self) -> Actor<'_> {
        Actor {
            user_id: Some(self.user.id),
            name: &self.user.email,
            source_ip: Some(&self.ip),
        }
    }

    /// Back to `path` with a message.
    pub fn back(&self, path: &str, flash: Option<AdminFlash>) -> Result<(), PortalError> {
        if let Some(f) = flash {
            cookies::set_flash(&self.jar, cookies::Flash::Admin(f));
        }
        session::redirect(path);
        Ok(())
    }
}

/// The admin behind a form whose CSRF token the caller has already checked (signed out: to the
/// login, `None`; anybody else: 403, [`PortalError::Forbidden`]).
pub async fn form_after_csrf(
    portal: Portal,
    s: Session,
    jar: Cookies,
) -> Result<Option<AdminForm>, PortalError> {
    let Some(si) = session::signed_in(&portal, &s).await? else {
        session::redirect("/login");
        return Ok(None);
    };
    if si.user.role != Role::Admin {
        session::set_status(http::StatusCode::FORBIDDEN);
        return Err(PortalError::Forbidden);
    }
    Ok(Some(AdminForm {
        portal,
        session: s,
        jar,
        user: si.user,
        ip: session::client_ip().await,
    }))
}
