//! `/api/v1` errors in OpenAI's envelope `{"error":{"message","type","param","code"}}`.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::json;

use crate::gateway::error::GatewayError;
use crate::lifecycle::LifecycleError;

#[derive(Debug)]
pub enum ApiError {
    /// Authentication refused (same answers as `/v1`).
    Auth(GatewayError),
    Lifecycle(LifecycleError),
    BadRequest(String),
}

impl From<LifecycleError> for ApiError {
    fn from(e: LifecycleError) -> Self {
        Self::Lifecycle(e)
    }
}

impl From<GatewayError> for ApiError {
    fn from(e: GatewayError) -> Self {
        Self::Auth(e)
    }
}

fn envelope(status: StatusCode, kind: &str, code: Option<&str>, message: String) -> Response {
    (
        status,
        axum::Json(
            json!({"error": {"message": message, "type": kind, "param": null, "code": code}}),
        ),
    )
        .into_response()
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        match self {
            Self::Auth(e) => e.into_response(),
            Self::BadRequest(m) => {
                envelope(StatusCode::BAD_REQUEST, "invalid_request_error", None, m)
            }
            Self::Lifecycle(e) => {
                let message = e.to_string();
                match e {
                    LifecycleError::NotFound(_) => envelope(
                        StatusCode::NOT_FOUND,
                        "invalid_request_error",
                        Some("model_not_found"),
                        message,
                    ),
                    LifecycleError::BadRequest(_)
                    | LifecycleError::InvalidName(_)
                    | LifecycleError::UnknownBase(_) => envelope(
                        StatusCode::BAD_REQUEST,
                        "invalid_request_error",
                        None,
                        message,
                    ),
                    LifecycleError::Conflict(_) => envelope(
                        StatusCode::CONFLICT,
                        "invalid_request_error",
                        Some("conflict"),
                        message,
                    ),
                    LifecycleError::NameTaken(_) => envelope(
                        StatusCode::CONFLICT,
                        "invalid_request_error",
                        Some("name_taken"),
                        message,
                    ),
                    LifecycleError::TooLarge(_) => envelope(
                        StatusCode::PAYLOAD_TOO_LARGE,
                        "invalid_request_error",
                        Some("request_too_large"),
                        message,
                    ),
                    LifecycleError::Db(_) | LifecycleError::Io(_) => {
                        tracing::warn!(error = %message, "management API call failed");
                        envelope(
                            StatusCode::INTERNAL_SERVER_ERROR,
                            "api_error",
                            None,
                            "Internal error. Please retry.".into(),
                        )
                    }
                }
            }
        }
    }
}

pub async fn unknown_route() -> Response {
    envelope(
        StatusCode::NOT_FOUND,
        "invalid_request_error",
        Some("unknown_url"),
        "Unknown request URL.".into(),
    )
}
