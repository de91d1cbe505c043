//! Signing in and out. Like every portal form these post as plain
//! `application/x-www-form-urlencoded` (no JavaScript needed) and every outcome a user can fix —
//! wrong password, throttled, suspended tenant, stale form — is a redirect to a page with a
//! one-shot flash message, never an error page. The CSRF token is checked before anything else.

pub mod page;

use leptos::prelude::*;

use crate::error::PortalError;
#[cfg(feature = "ssr")]
use crate::model::MAX_INPUT_LEN;
#[cfg(feature = "ssr")]
use crate::ssr::form::refuse_csrf;

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
