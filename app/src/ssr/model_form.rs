//! The `/models` forms (upload, start, stop, delete) are plain axum handlers in the server crate,
//! because the lifecycle service lives there and the upload is streamed (a server function would
//! buffer it). This module gives those handlers the portal's own checks: [`in_portal`] runs them
//! under the same reactive context a server function gets (the portal, the request parts), so
//! the CSRF token, the signed-in member and the flash cookie are read and written exactly as the
//! other forms do; [`gate`] is their prologue; [`ModelFlash`] the messages they leave.

use std::future::Future;

use http::request::Parts;
use leptos::prelude::provide_context;
use leptos::reactive::computed::ScopedFuture;
use leptos::reactive::owner::Owner;
use tf_core::TenantRole;

use super::member::{self, Member};
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

/// What a model form did, shown once on `/models`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ModelFlash {
    /// Uploaded and validated: it may be started.
    Uploaded,
    /// Uploaded but refused by validation (the reason is in the adapter's row).
    Rejected,
    /// The name is not a usable model name.
    NameInvalid,
    /// The base is not offered for adapters.
    BaseUnknown,
    /// The form lacked a field or a file, or was not multipart.
    UploadInvalid,
    /// The model's current state does not allow that (being uploaded, rejected, deleted, running).
    Busy,
    Started,
    Stopped,
    Deleted,
    /// Delete was posted without ticking the confirmation.
    DeleteUnconfirmed,
}

const CODES: &[(ModelFlash, &str)] = &[
    (ModelFlash::Uploaded, "uploaded"),
    (ModelFlash::Rejected, "rejected"),
    (ModelFlash::NameInvalid, "name"),
    (ModelFlash::BaseUnknown, "base"),
    (ModelFlash::UploadInvalid, "upload"),
    (ModelFlash::Busy, "busy"),
    (ModelFlash::Started, "started"),
    (ModelFlash::Stopped, "stopped"),
    (ModelFlash::Deleted, "deleted"),
    (ModelFlash::DeleteUnconfirmed, "unconfirmed"),
];

impl ModelFlash {
    /// The cookie's value (after `model-`).
    pub fn code(self) -> &'static str {
        CODES
            .iter()
            .find(|(f, _)| *f == self)
            .map_or("busy", |(_, c)| c)
    }

    pub fn parse(code: &str) -> Option<Self> {
        CODES.iter().find(|(_, c)| *c == code).map(|(f, _)| *f)
    }

    /// Whether it reports something done (the success style) rather than a refusal.
    pub fn ok(self) -> bool {
        matches!(
            self,
            Self::Uploaded | Self::Started | Self::Stopped | Self::Deleted
        )
    }

    pub fn message(self) -> &'static str {
        match self {
            Self::Uploaded => "Adapter uploaded and validated. Start it to serve it.",
            Self::Rejected => {
                "The adapter was rejected: the reason is shown in its row below. Nothing will \
                 be served from it."
            }
            Self::NameInvalid => {
                "A model name is 1 to 64 letters, digits, '-', '_' or '.', starting with a \
                 letter or digit."
            }
            Self::BaseUnknown => "That base model does not accept adapters.",
            Self::UploadInvalid => {
                "Give a name, a base and both files (adapter_config.json and \
                 adapter_model.safetensors)."
            }
            Self::Busy => {
                "That model cannot do this in its current state (still uploading, rejected, \
                 running or being deleted): nothing was changed."
            }
            Self::Started => "Starting: the model is served as soon as it is ready.",
            Self::Stopped => "Stopped: the model is no longer served.",
            Self::Deleted => "Deleted: the model and its files are being removed.",
            Self::DeleteUnconfirmed => "Tick the confirmation to delete: nothing was changed.",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_round_trip() {
        for (f, c) in CODES {
            assert_eq!(ModelFlash::parse(c), Some(*f));
            assert_eq!(f.code(), *c);
        }
        assert_eq!(ModelFlash::parse("nonsense"), None);
    }
}
