//! The portal session: it stores only the signed-in user's id (loaded afresh on every request, so
//! a deleted user or a suspended tenant is signed out on the next page load), and exists only
//! while somebody is signed in (the CSRF token and the flash message are cookies, see
//! [`super::cookies`]). Also the request facts the server functions need: the client's IP and how
//! a redirect must be sent.

use std::net::SocketAddr;

use axum::extract::ConnectInfo;
use http::{header::ACCEPT, request::Parts, StatusCode};
use leptos::prelude::use_context;
use leptos_axum::ResponseOptions;
use tf_core::accounts::{self, Tenant, TenantStatus, User};
use tower_sessions::Session;
use uuid::Uuid;

use super::cookies::{self, Flash};
use super::csrf;
use super::portal::{internal, Portal};
use crate::error::PortalError;
use crate::API_PREFIX;

/// Session key of the signed-in user's id (the store also files the session under it).
pub const USER_KEY: &str = "user_id";

/// Shown when a session's tenant has been suspended.
pub use crate::model::SUSPENDED;

/// The session of the current request (put there by the tower-sessions layer).
pub async fn current() -> Result<Session, PortalError> {
    leptos_axum::extract::<Session>().await.map_err(|e| {
        internal(
            "no session on the request: is the session layer applied?",
            e,
        )
    })
}

/// A signed-in user and their tenant (admins have none).
pub struct SignedIn {
    /// The user, as loaded for this request.
    pub user: User,
    /// The user's tenant, known to be active.
    pub tenant: Option<Tenant>,
}

/// Loads the session's user by id. A session whose user is gone or whose tenant is suspended is
/// ended here.
pub async fn signed_in(
    portal: &Portal,
    session: &Session,
) -> Result<Option<SignedIn>, PortalError> {
    let id: Option<Uuid> = session
        .get(USER_KEY)
        .await
        .map_err(|e| internal("reading the session", e))?;
    let Some(id) = id else { return Ok(None) };
    let found = accounts::user_by_id(&portal.deps.pool, id)
        .await
        .map_err(|e| internal("loading the session's user", e))?;
    match found {
        Some((user, tenant))
            if tenant
                .as_ref()
                .is_none_or(|t| t.status == TenantStatus::Active) =>
        {
            Ok(Some(SignedIn { user, tenant }))
        }
        Some(_) => {
            end(session).await?;
            cookies::set_flash(&cookies::jar().await?, Flash::Suspended);
            Ok(None)
        }
        None => {
            end(session).await?;
            Ok(None)
        }
    }
}

/// Signs a user in: a new session id (no fixation), only the user id stored (this is what stores
/// the session), a new CSRF token.
pub async fn sign_in(session: &Session, user_id: Uuid) -> Result<(), PortalError> {
    session
        .cycle_id()
        .await
        .map_err(|e| internal("cycling the session id", e))?;
    session
        .insert(USER_KEY, user_id)
        .await
        .map_err(|e| internal("storing the session's user", e))?;
    csrf::rotate_token(&cookies::jar().await?);
    Ok(())
}

/// Ends the session: data and the stored record are deleted, the cookie is removed.
pub async fn end(session: &Session) -> Result<(), PortalError> {
    session
        .flush()
        .await
        .map_err(|e| internal("deleting the session", e))
}

/// The client's address for throttling and audit: the socket's peer, or when that peer is a
/// trusted proxy the address it forwarded (`client_addr`), else `"unknown"` (served without
/// connect info). Parsing keeps arbitrary strings out of keys.
pub async fn client_ip() -> String {
    let Ok(ConnectInfo(peer)) = leptos_axum::extract::<ConnectInfo<SocketAddr>>().await else {
        return "unknown".to_owned();
    };
    let Ok(portal) = Portal::current() else {
        return peer.ip().to_string();
    };
    let parts = use_context::<Parts>();
    let forwarded = parts
        .iter()
        .flat_map(|p| p.headers.get_all("x-forwarded-for"))
        .filter_map(|v| v.to_str().ok());
    portal
        .deps
        .trusted_proxies
        .client(peer.ip(), forwarded)
        .to_string()
}

/// Whether the request is a plain browser request (a form post without JavaScript, a page load)
/// rather than the server-function client.
pub fn accepts_html() -> bool {
    use_context::<Parts>()
        .and_then(|p| {
            p.headers
                .get(ACCEPT)
                .and_then(|v| v.to_str().ok())
                .map(|v| v.contains("text/html"))
        })
        .unwrap_or(false)
}

/// Redirects. For a form post this is `leptos_axum::redirect` (a 302 for a plain form, a redirect
/// header for the JavaScript client). For a page render it is always a 302, whatever the client
/// accepts, so no client ever gets a 200 for a page it may not see.
pub fn redirect(path: &str) {
    leptos_axum::redirect(path);
    let rendering_page = use_context::<Parts>()
        .is_some_and(|p| !p.uri.path().starts_with(&format!("{API_PREFIX}/")));
    if rendering_page {
        if let Some(res) = use_context::<ResponseOptions>() {
            res.set_status(StatusCode::FOUND);
        }
    }
}

/// Sets the response status (for example 403 on a page the user may not see).
pub fn set_status(status: StatusCode) {
    if let Some(res) = use_context::<ResponseOptions>() {
        res.set_status(status);
    }
}
