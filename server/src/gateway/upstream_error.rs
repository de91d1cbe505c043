//! Re-shaping an upstream's error answer into OpenAI's envelope. vLLM answers
//! `{"error":{...}}` (or `{"object":"error","message",...}` in older versions), Dynamo's frontend a
//! flat `{"message","type","code"}`, FastAPI `{"detail":...}`; anything else becomes a message.

use axum::http::StatusCode;
use serde_json::Value;

use super::error::{type_for_status, GatewayError};

/// Builds the error a client sees for an upstream's non-2xx answer.
pub fn reshape(status: StatusCode, body: &[u8]) -> GatewayError {
    let parsed: Option<Value> = serde_json::from_slice(body).ok();
    let inner = parsed.as_ref().map(|v| match v.get("error") {
        Some(e @ Value::Object(_)) => e,
        _ => v,
    });
    let field = |name: &str| inner.and_then(|o| o.get(name));
    let message = field("message")
        .and_then(Value::as_str)
        .map(str::to_owned)
        .or_else(|| {
            parsed
                .as_ref()
                .and_then(|v| v.get("error"))
                .and_then(Value::as_str)
                .map(str::to_owned)
        })
        .or_else(|| {
            field("detail").map(|d| d.as_str().map_or_else(|| d.to_string(), str::to_owned))
        })
        .unwrap_or_else(|| {
            let text = String::from_utf8_lossy(body);
            let text = text.trim();
            if text.is_empty() {
                format!("The model backend answered {status}.")
            } else {
                text.chars().take(500).collect()
            }
        });
    // Engines name types after exceptions (NotFoundError); clients expect OpenAI's names.
    let kind = type_for_status(status).to_owned();
    let code = field("code")
        .filter(|c| c.is_string())
        .cloned()
        .or_else(|| {
            (status == StatusCode::NOT_FOUND).then(|| Value::String("model_not_found".into()))
        });
    GatewayError::Upstream {
        status: if status.is_client_error() || status.is_server_error() {
            status
        } else {
            StatusCode::BAD_GATEWAY
        },
        message,
        kind,
        code,
        retry_after: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn body(e: &GatewayError) -> Value {
        e.body()
    }

    #[test]
    fn flat_dynamo_errors_become_envelopes() {
        let e = reshape(
            StatusCode::NOT_FOUND,
            br#"{"message":"Model not found: x","type":"Not Found","code":404}"#,
        );
        assert_eq!(e.status(), StatusCode::NOT_FOUND);
        let b = body(&e);
        assert_eq!(b["error"]["message"], "Model not found: x");
        assert_eq!(b["error"]["type"], "invalid_request_error");
        assert_eq!(b["error"]["code"], "model_not_found");
    }

    #[test]
    fn vllm_envelopes_keep_their_message() {
        let e = reshape(
            StatusCode::BAD_REQUEST,
            br#"{"error":{"message":"max_tokens too large","type":"BadRequestError","param":null,"code":400}}"#,
        );
        let b = body(&e);
        assert_eq!(b["error"]["message"], "max_tokens too large");
        assert_eq!(b["error"]["type"], "invalid_request_error");
        let e = reshape(StatusCode::INTERNAL_SERVER_ERROR, b"boom");
        assert_eq!(body(&e)["error"]["message"], "boom");
        assert_eq!(body(&e)["error"]["type"], "api_error");
    }
}
