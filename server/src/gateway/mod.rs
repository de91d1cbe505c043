//! The OpenAI-compatible request path: auth -> resolve -> (admit) -> (hold while an idle model
//! wakes) -> forward -> meter.

pub mod activity;
pub mod auth;
pub(crate) mod body;
pub(crate) mod envelope;
pub(crate) mod error;
pub(crate) mod exchange;
mod handlers;
pub(crate) mod hold;
pub(crate) mod options;
pub mod rate_headers;
pub(crate) mod request;
pub mod resolve;
pub(crate) mod state;
pub mod upstream;
pub mod upstream_conn;
pub(crate) mod upstream_error;
pub mod upstream_wire;

use axum::routing::{get, post};
use axum::Router;

pub use options::GatewayOptions;
pub use state::{Gateway, GatewayInner};

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
        .route(
            "/v1/responses",
            post(handlers::responses).fallback(only("POST")),
        )
        .route(
            "/v1/messages",
            post(handlers::messages).fallback(only("POST")),
        )
        .route(
            "/v1/embeddings",
            post(handlers::embeddings).fallback(only("POST")),
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
