//! Each endpoint's error envelope. OpenAI's (`{"error":{"message","type","param","code"}}`,
//! [`GatewayError`]'s own) for every `/v1` route but Anthropic Messages, whose clients parse
//! `{"type":"error","error":{"type","message"}}`. Status and headers (`retry-after`, the
//! rate-limit headers, `www-authenticate`) are the same for both.

use axum::body::Body;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::json;

use super::error::GatewayError;
use crate::endpoint::Endpoint;

/// The error as `endpoint`'s clients expect it.
pub fn render(endpoint: Endpoint, e: GatewayError) -> Response {
    if endpoint != Endpoint::Messages {
        return e.into_response();
    }
    let message = e.to_string();
    let mut response = e.into_response();
    let body = json!({
        "type": "error",
        "error": {"type": anthropic_type(response.status()), "message": message},
    });
    *response.body_mut() = Body::from(body.to_string());
    response
}

/// Anthropic's error `type` for a status (its documented list).
fn anthropic_type(status: StatusCode) -> &'static str {
    match status.as_u16() {
        400 | 405 | 408 | 422 => "invalid_request_error",
        401 => "authentication_error",
        403 => "permission_error",
        404 => "not_found_error",
        413 => "request_too_large",
        429 => "rate_limit_error",
        503 | 529 => "overloaded_error",
        _ => "api_error",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn messages_errors_are_in_anthropics_envelope() {
        let r = render(Endpoint::Messages, GatewayError::model_not_found("nope"));
        assert_eq!(r.status(), StatusCode::NOT_FOUND);
        let body = axum::body::to_bytes(r.into_body(), 1 << 16).await.unwrap();
        let v: serde_json::Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(v["type"], "error");
        assert_eq!(v["error"]["type"], "not_found_error");
        assert!(v["error"]["message"].as_str().unwrap().contains("nope"));
        let r = render(Endpoint::Chat, GatewayError::InvalidKey);
        let body = axum::body::to_bytes(r.into_body(), 1 << 16).await.unwrap();
        let v: serde_json::Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(v["error"]["code"], "invalid_api_key");
    }
}
