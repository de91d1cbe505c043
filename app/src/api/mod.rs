//! The portal's server functions. Forms post to them as plain `application/x-www-form-urlencoded`
//! (no JavaScript needed) and every outcome a user can fix — wrong password, throttled, suspended
//! tenant, stale form — is a redirect to a page with a one-shot flash message, never an error
//! page. State-changing functions check the CSRF token before anything else.

pub mod admin;
pub mod home;
pub mod invoices;
pub mod keys;
pub mod limits;
pub mod members;
pub mod models;
pub mod settings;
pub mod usage;

use leptos::prelude::*;

use crate::error::PortalError;
use crate::model::{Access, PageState};
#[cfg(feature = "ssr")]
use crate::model::{PageStatus, Viewer, MAX_INPUT_LEN};

/// Loads the session for a page and applies the page's access rule (redirects or 403). A first
/// visit gets its CSRF cookie here, and no stored session: that waits for a login. A GET, like
/// the pages: a cross-site POST carries no SameSite=Lax cookie, so it would be answered with a
/// new CSRF cookie that replaces the visitor's (staling their open forms).
#[server(prefix = "/api", endpoint = "page", input = leptos::server_fn::codec::GetUrl)]
pub async fn load_page(access: Access) -> Result<PageState, PortalError> {
    use crate::ssr::{cookies, csrf, session, Portal};

    let portal = Portal::current()?;
    let s = session::current().await?;
    let jar = cookies::jar().await?;
    let viewer = session::signed_in(&portal, &s).await?.map(|si| Viewer {
        email: si.user.email,
        admin: si.user.role == tf_core::Role::Admin,
        tenant: si.tenant.map(|t| t.display_name),
    });
    let home = |v: &Viewer| if v.admin { "/admin" } else { "/" };
    let target = match (access, &viewer) {
        (Access::Public, Some(v)) => Some(home(v)),
        (Access::Public, None) => None,
        (_, None) => Some("/login"),
        (Access::Tenant, Some(v)) if v.admin => Some("/admin"),
        _ => None,
    };
    if let Some(target) = target {
        // The flash (if any) is left for the page redirected to.
        session::redirect(target);
        return Ok(PageState {
            csrf: String::new(),
            flash: None,
            viewer: None,
            status: PageStatus::Redirect,
            ops: None,
        });
    }
    let forbidden = access == Access::Admin && viewer.as_ref().is_some_and(|v| !v.admin);
    if forbidden {
        session::set_status(http::StatusCode::FORBIDDEN);
    }
    let ops = match (&viewer, &portal.deps.ops) {
        (Some(v), Some(read)) if v.admin && access == Access::Admin => Some(read()),
        _ => None,
    };
    Ok(PageState {
        ops,
        csrf: csrf::ensure_token(&jar),
        flash: cookies::take_flash(&jar),
        viewer,
        status: if forbidden {
            PageStatus::Forbidden
        } else {
            PageStatus::Show
        },
    })
}

/// Signs in with email and password. Throttled attempts are refused before the password is
/// checked; success cycles the session id and goes to the user's home.
#[server(prefix = "/api", endpoint = "login")]
pub async fn login(
    // Defaults: a form missing a field is refused like a wrong one, not with a decoding error.
    #[server(default)] csrf: String,
    #[server(default)] email: String,
    #[server(default)] password: String,
) -> Result<(), PortalError> {
    use crate::ssr::cookies::{self, Flash};
    use crate::ssr::session;
    use crate::ssr::throttle::Verdict;
    use crate::ssr::{csrf as tokens, internal, Portal};
    use tf_core::accounts::{self, LoginRefusal};

    let portal = Portal::current()?;
    let s = session::current().await?;
    let jar = cookies::jar().await?;
    if !tokens::verify(&jar, &csrf) {
        return Err(refuse_csrf(&jar, "/login"));
    }
    let email = email.trim().to_lowercase();
    if email.len() > MAX_INPUT_LEN || password.len() > MAX_INPUT_LEN {
        return back_to_login(&jar, Flash::InvalidCredentials);
    }
    let ip = session::client_ip().await;
    if let Verdict::Throttled { retry_after } = portal.throttle.begin(&email, &ip).await {
        tracing::info!(%ip, "login throttled");
        return back_to_login(&jar, Flash::throttled(retry_after));
    }
    let outcome = accounts::authenticate(&portal.deps.pool, &email, &password)
        .await
        .map_err(|e| internal("checking a login", e))?;
    match outcome {
        Ok(user) => {
            portal.throttle.succeeded(&email, &ip).await;
            session::sign_in(&s, user.id).await?;
            session::redirect(if user.role == tf_core::Role::Admin {
                "/admin"
            } else {
                "/"
            });
            Ok(())
        }
        Err(LoginRefusal::TenantSuspended) => {
            // The password was right, so this is not a guess to count.
            portal.throttle.succeeded(&email, &ip).await;
            back_to_login(&jar, Flash::Suspended)
        }
        Err(LoginRefusal::BadCredentials) => back_to_login(&jar, Flash::InvalidCredentials),
    }
}

/// Signs out: the session is deleted and its cookie removed.
#[server(prefix = "/api", endpoint = "logout")]
pub async fn logout(#[server(default)] csrf: String) -> Result<(), PortalError> {
    use crate::ssr::{cookies, csrf as tokens, session};

    let s = session::current().await?;
    let jar = cookies::jar().await?;
    if !tokens::verify(&jar, &csrf) {
        return Err(refuse_csrf(&jar, "/"));
    }
    session::end(&s).await?;
    tokens::rotate_token(&jar);
    session::redirect("/login");
    Ok(())
}

/// A refused login: back to the form with the reason.
#[cfg(feature = "ssr")]
fn back_to_login(
    jar: &tower_cookies::Cookies,
    flash: crate::ssr::cookies::Flash,
) -> Result<(), PortalError> {
    crate::ssr::cookies::set_flash(jar, flash);
    crate::ssr::session::redirect("/login");
    Ok(())
}

/// Refuses a form whose CSRF token is missing or wrong, changing nothing else. A browser posting a
/// stale form is sent back with an explanation; other clients get 403. A request without the
/// token cookie (a cross-site post: SameSite=Lax withholds cookies) gets no cookie either, so a
/// forged post cannot touch a victim's cookies.
#[cfg(feature = "ssr")]
pub(crate) fn refuse_csrf(jar: &tower_cookies::Cookies, back: &str) -> PortalError {
    use crate::ssr::{cookies, csrf, session};

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
