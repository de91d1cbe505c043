//! The prologue of every tenant form other than `/keys`'s: the CSRF token first (and the one
//! refusal of a bad token, [`refuse_csrf`], every form shares), then the
//! signed-in member, then the member's role; and the audit record of what an owner did, written
//! inside the action's transaction.

use tf_core::TenantRole;
use tower_cookies::Cookies;
use tower_sessions::Session;

use super::member::{self, Member};
use super::portal::{internal, Portal};
use super::{cookies, csrf, session};
use crate::error::PortalError;

/// What a tenant form has once its token, member and role are checked.
pub struct TenantForm {
    pub portal: Portal,
    pub session: Session,
    pub jar: Cookies,
    pub member: Member,
}

/// Checks the form's CSRF token, then that a tenant member is signed in and that their role
/// passes `allowed`; a refusal changes nothing and sends a browser back to `back`. `None`: nobody
/// is signed in (redirected to the login).
pub async fn tenant_form(
    token: &str,
    back: &str,
    allowed: fn(TenantRole) -> bool,
) -> Result<Option<TenantForm>, PortalError> {
    let portal = Portal::current()?;
    let s = session::current().await?;
    let jar = cookies::jar().await?;
    if !csrf::verify(&jar, token) {
        return Err(refuse_csrf(&jar, back));
    }
    let Some(m) = member::current(&portal, &s).await? else {
        session::redirect("/login");
        return Ok(None);
    };
    let member = member::permitted(m, allowed, &jar, back)?;
    Ok(Some(TenantForm {
        portal,
        session: s,
        jar,
        member,
    }))
}

/// Back to `path`, with a message.
pub fn back(jar: &Cookies, path: &str, flash: Option<cookies::Flash>) -> Result<(), PortalError> {
    if let Some(f) = flash {
        cookies::set_flash(jar, f);
    }
    session::redirect(path);
    Ok(())
}

/// Appends what `m` did to the audit log, on the action's transaction.
pub async fn audit(
    conn: &mut sqlx::PgConnection,
    m: &Member,
    action: &str,
    target: &str,
    detail: serde_json::Value,
) -> Result<(), PortalError> {
    let ip = session::client_ip().await;
    tf_core::db::audit::record(
        conn,
        &tf_core::db::audit::Entry {
            actor_user_id: Some(m.user.id),
            actor: &m.user.email,
            tenant_id: Some(m.tenant.id),
            action,
            target,
            detail,
            source_ip: Some(&ip),
        },
    )
    .await
    .map_err(|e| internal("writing the audit log", e))
}

/// Refuses a form whose CSRF token is missing or wrong, changing nothing else. A browser posting a
/// stale form is sent back with an explanation; other clients get 403. A request without the
/// token cookie (a cross-site post: SameSite=Lax withholds cookies) gets no cookie either, so a
/// forged post cannot touch a victim's cookies.
pub fn refuse_csrf(jar: &tower_cookies::Cookies, back: &str) -> PortalError {
    tracing::warn!("refused a form with a missing or wrong CSRF token");
    if session::accepts_html() {
        if csrf::has_token(jar) {
            cookies::set_flash(jar, cookies::Flash::Csrf);
        }
        session::redirect(back);
    } else {
        session::set_status(http::StatusCode::FORBIDDEN);
    }
    PortalError::Csrf
}
