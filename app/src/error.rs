//! The portal's one error type, returned by every server function. Expected outcomes of a form
//! (wrong password, throttled, suspended tenant) are not errors: they redirect with a flash
//! message. Errors are what a form cannot recover from; internal causes are logged on the server
//! and never shown.

use leptos::server_fn::codec::JsonEncoding;
use leptos::server_fn::error::{FromServerFnError, ServerFnErrorErr};
use serde::{Deserialize, Serialize};

/// Why a portal server function refused or failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error, Serialize, Deserialize)]
pub enum PortalError {
    /// 403: the form's CSRF token was missing or did not match the session's.
    #[error("This form has expired. Reload the page and try again.")]
    Csrf,
    /// 500: the database, the session store or another dependency failed (logged server-side).
    #[error("Something went wrong. Please try again.")]
    Internal,
    /// 403: no signed-in tenant member on the request (a direct call of a tenant's function).
    #[error("Sign in to continue.")]
    SignedOut,
    /// 400/500: the request did not reach the function body (bad encoding, missing context).
    #[error("{0}")]
    ServerFn(ServerFnErrorErr),
    /// 403: the signed-in user may not use this function (not a tenant member, or not signed in).
    #[error("You do not have access to this.")]
    Forbidden,
}

impl PortalError {
    /// Low-cardinality label for counters: the variant name.
    pub fn metric_label(&self) -> &'static str {
        match self {
            Self::Csrf => "csrf",
            Self::Internal => "internal",
            Self::SignedOut => "signed_out",
            Self::ServerFn(_) => "server_fn",
            Self::Forbidden => "forbidden",
        }
    }
}

impl FromServerFnError for PortalError {
    type Encoder = JsonEncoding;

    fn from_server_fn_error(value: ServerFnErrorErr) -> Self {
        Self::ServerFn(value)
    }
}
