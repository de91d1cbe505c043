//! The portal's HTTP surface: the Leptos pages (`/`, `/login`, `/admin`), their server functions
//! under `/api/`, the invoice CSV downloads (`/invoices/{id}.csv`), the stylesheet and icon, the session layer and the security headers. It owns no other
//! path, so the `/v1` router merges with it freely. Pages are rendered on the server; nothing is
//! served from the file system.

mod headers;
mod invoices;
mod models;

use axum::routing::get;
use axum::Router;
use leptos::config::LeptosOptions;
use leptos_axum::{generate_route_list, LeptosRoutes};
use sqlx::PgPool;
use tf_app::ssr::store::PortalStore;
use tf_app::ssr::{Portal, PortalDeps};
use tower_sessions::cookie::time::Duration;
use tower_sessions::cookie::SameSite;
use tower_sessions::session_store::ExpiredDeletion;
use tower_sessions::{Expiry, SessionManagerLayer};

/// Name of the session cookie.
const SESSION_COOKIE: &str = "tf_session";
/// A session ends after this long without a request.
const SESSION_IDLE: Duration = Duration::hours(12);

/// Builds the portal's router. Sessions of signed-in users are stored in `portal_sessions`, ids
/// hashed (see `tf_app::ssr::store`). Without a lifecycle service the `/models` forms are not
/// routed (a portal-only test server).
pub async fn router(deps: PortalDeps) -> anyhow::Result<Router> {
    build(deps, None)
}

/// [`router`] with the `/models` forms (upload, start, stop, delete) over `lifecycle`.
pub async fn router_with_models(
    deps: PortalDeps,
    lifecycle: crate::lifecycle::Lifecycle,
) -> anyhow::Result<Router> {
    build(deps, Some(lifecycle))
}

fn build(
    deps: PortalDeps,
    lifecycle: Option<crate::lifecycle::Lifecycle>,
) -> anyhow::Result<Router> {
    // An explicit site root: the default (".") would let a static handler serve the repository.
    // Nothing is served from it today; it only satisfies Leptos.
    let options = LeptosOptions::builder()
        .output_name("tokenfactory")
        .site_root("target/site")
        .build();
    let sessions = SessionManagerLayer::new(PortalStore::new(deps.pool.clone()))
        .with_name(SESSION_COOKIE)
        .with_http_only(true)
        .with_same_site(SameSite::Lax)
        .with_secure(deps.secure_cookies)
        .with_expiry(Expiry::OnInactivity(SESSION_IDLE));
    let portal = Portal::new(deps);
    let forms = lifecycle.map(|l| models::router(portal.clone(), l));
    let downloads = portal.clone();
    let context = move || portal.provide();
    // Registers the page routes and every server function (the latter through
    // `handle_server_fns_with_context` with the same context).
    let routes = generate_route_list(tf_app::App);
    let mut router = Router::new()
        .leptos_routes_with_context(&options, routes, context, tf_app::shell)
        .route(tf_app::STYLESHEET_PATH, get(headers::stylesheet))
        .route(tf_app::ICON_PATH, get(headers::icon))
        .with_state(options);
    if let Some(forms) = forms {
        router = router.merge(forms);
    }
    let router = router
        // Inside the session layer: the download reads the session like a page does.
        .layer(axum::middleware::from_fn_with_state(
            downloads,
            invoices::csv_download,
        ))
        .layer(sessions)
        .layer(axum::middleware::from_fn(headers::security_headers));
    Ok(router)
}

/// Deletes expired sessions; run it periodically from a background job (the store only skips
/// them when loading, it does not remove them).
pub async fn purge_expired_sessions(pool: &PgPool) -> anyhow::Result<()> {
    PortalStore::new(pool.clone()).delete_expired().await?;
    Ok(())
}
