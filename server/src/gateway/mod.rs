//! The OpenAI-compatible request path: auth -> resolve -> (admit) -> forward -> meter.

pub mod auth;
pub mod body;
pub mod engine_policy;
pub mod error;
pub mod exchange;
mod handlers;
pub mod rate_headers;
pub mod request;
pub mod resolve;
pub mod upstream;
pub mod upstream_conn;
pub(crate) mod upstream_error;

use std::sync::Arc;

use axum::routing::{get, post};
use axum::Router;
use tokio_util::task::TaskTracker;

use crate::metering::usage::UsageSink;
use auth::KeyCache;
use resolve::RouteTable;

/// Shared state of the request path, cheap to clone.
#[derive(Clone)]
pub struct Gateway(Arc<GatewayInner>);

pub struct GatewayInner {
    /// API key -> tenant, cached.
    pub keys: Arc<KeyCache>,
    /// Served name -> upstream, as an atomically swapped snapshot.
    pub routes: Arc<RouteTable>,
    /// Where finished usage events go.
    pub sink: Arc<dyn UsageSink>,
    /// Metering tasks run here so shutdown can wait for them.
    pub tracker: TaskTracker,
    /// Cancelled at the shutdown deadline to cut streams still running.
    pub cut: tokio_util::sync::CancellationToken,
    /// Largest request body accepted, and largest non-streamed response read.
    pub max_body_bytes: usize,
    /// How long a request body may take to arrive.
    pub body_timing: body::BodyTiming,
    /// Admission: rate limits, spend and concurrency caps, shared through Redis.
    pub quota: crate::quota::Quota,
}

impl Gateway {
    pub fn new(inner: GatewayInner) -> Self {
        Self(Arc::new(inner))
    }
}

impl std::ops::Deref for Gateway {
    type Target = GatewayInner;
    fn deref(&self) -> &GatewayInner {
        &self.0
    }
}

/// The `/v1` routes.
pub fn router(gateway: Gateway) -> Router {
    Router::new()
        .route(
            "/v1/chat/completions",
            post(handlers::chat_completions).fallback(only("POST")),
        )
        .route(
            "/v1/completions",
            post(handlers::completions).fallback(only("POST")),
        )
        .route("/v1/models", get(handlers::models).fallback(only("GET")))
        .route("/v1/{*rest}", axum::routing::any(handlers::unknown_route))
        // `body::read` applies the limit itself, after authentication.
        .layer(axum::extract::DefaultBodyLimit::disable())
        .with_state(gateway)
}

/// The answer to a known `/v1` route called with another method: 405 in the OpenAI envelope
/// (axum's default is an empty body). Test: protocol::wrong_methods_get_the_envelope.
fn only(
    allow: &'static str,
) -> impl Fn() -> std::future::Ready<axum::response::Response> + Clone + Send + Sync + 'static {
    move || {
        std::future::ready(axum::response::IntoResponse::into_response(
            error::GatewayError::MethodNotAllowed(allow),
        ))
    }
}
