//! The `/api/v1` management API for developers with a key: the tenant's adapters (upload, start,
//! stop, delete, read). Same service as the portal's `/models`; errors in OpenAI's envelope; every
//! call scoped to the key's tenant, so another tenant's name answers 404 like a missing one.

mod adapters;
mod error;

use std::sync::Arc;

use axum::routing::{get, post};
use axum::Router;

use crate::gateway::auth::KeyCache;
use crate::lifecycle::Lifecycle;

#[derive(Clone)]
pub struct ApiState {
    pub keys: Arc<KeyCache>,
    pub lifecycle: Lifecycle,
}

pub fn router(state: ApiState) -> Router {
    Router::new()
        .route(
            "/api/v1/adapters",
            get(adapters::list).post(adapters::upload),
        )
        .route(
            "/api/v1/adapters/{name}",
            get(adapters::detail).delete(adapters::delete),
        )
        .route("/api/v1/adapters/{name}/start", post(adapters::start))
        .route("/api/v1/adapters/{name}/stop", post(adapters::stop))
        .route("/api/v1/{*rest}", axum::routing::any(error::unknown_route))
        // Uploads are bounded per file by the service, streamed, never buffered whole.
        .layer(axum::extract::DefaultBodyLimit::disable())
        .with_state(state)
}
