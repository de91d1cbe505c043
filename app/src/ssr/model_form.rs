//! The `/models` forms (upload, start, stop, delete) are plain axum handlers in the server crate,
//! because the lifecycle service lives there and the upload is a multipart stream (the portal's
//! server functions take url-encoded forms; server_fn's multipart codec is not enabled). This module gives those handlers the portal's own checks: [`in_portal`] runs them
//! under the same reactive context a server function gets (the portal, the request parts), so
//! the CSRF token, the signed-in member and the flash cookie are read and written exactly as the
//! other forms do; [`gate`] is their prologue; [`ModelFlash`] names the messages they leave.

use std::future::Future;

use http::request::Parts;
use leptos::prelude::provide_context;
use leptos::reactive::computed::ScopedFuture;
use leptos::reactive::owner::Owner;
use tf_core::TenantRole;

use super::member::{self, Member};
use super::model_flash::ModelFlash;
use super::portal::Portal;
use super::{cookies, csrf, session};
use crate::error::PortalError;

/// Runs `work` with `portal` and the request's `parts` in the reactive context, as
/// `leptos_axum` does for a server function.
pub async fn in_portal<T, Fut>(portal: Portal, parts: Parts, work: Fut) -> T
where
    Fut: Future<Output = T>,
{
    let owner = Owner::new();
    owner
        .with(|| {
            ScopedFuture::new(async move {
                provide_context(parts);
                portal.provide();
                work.await
            })
        })
        .await
}

/// What a model form may do once its prologue ran.
pub enum Gate {
    /// A member whose role may manage models: go ahead.
    Allowed(Member),
    /// Nobody is signed in: send the browser to the login.
    SignedOut,
    /// The CSRF token was missing or wrong: refused, nothing read further.
    Csrf,
    /// A read-only member: refused.
    ReadOnly,
}

/// The CSRF token first, then the signed-in member, then the role (owner or member). Must run
/// inside [`in_portal`].
pub async fn gate(token: &str) -> Result<Gate, PortalError> {
    let portal = Portal::current()?;
    let s = session::current().await?;
    let jar = cookies::jar().await?;
    if !csrf::verify(&jar, token) {
        tracing::warn!("refused a model form with a missing or wrong CSRF token");
        return Ok(Gate::Csrf);
    }
    let Some(m) = member::current(&portal, &s).await? else {
        return Ok(Gate::SignedOut);
    };
    // INVARIANT: a read-only member changes no model (test:
    // models_portal::read_only_csrf_and_other_tenants_are_refused).
    if !TenantRole::manages_models(m.role) {
        tracing::warn!(user = %m.user.id, "a read-only member tried a model form");
        return Ok(Gate::ReadOnly);
    }
    Ok(Gate::Allowed(m))
}

/// Leaves `flash` for the next page. Must run inside [`in_portal`].
pub async fn flash(flash: ModelFlash) -> Result<(), PortalError> {
    cookies::set_flash(&cookies::jar().await?, cookies::Flash::Model(flash));
    Ok(())
}
