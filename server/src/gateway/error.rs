//! Every error the `/v1` routes return, serialised as OpenAI's envelope
//! `{"error":{"message","type","param","code"}}`. Internal causes are logged, never shown.

use axum::http::{HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::json;

/// `retry-after` of a model that is starting (an adapter loads in seconds).
pub const MODEL_STARTING_RETRY_SECS: u64 = 2;

/// `retry-after` of a model still waking when its hold limit ran out, or whose wake failed.
pub const MODEL_WAKING_RETRY_SECS: u64 = 10;

/// Longest model name echoed in an error message.
const ECHOED_NAME_CHARS: usize = 128;

#[derive(Debug, thiserror::Error)]
pub enum GatewayError {
    /// 401: no `Authorization: Bearer` header.
    #[error("You didn't provide an API key. Send it as `Authorization: Bearer tf-...`.")]
    MissingKey,
    /// 401: the key is unknown or revoked.
    #[error("Incorrect API key provided.")]
    InvalidKey,
    /// 429: this address sent too many unknown keys lately (answered without a lookup).
    #[error("Too many requests with invalid API keys from your address. Retry later.")]
    TooManyKeyFailures(std::time::Duration),
    /// 403: the key's tenant is suspended.
    #[error("This tenant is suspended.")]
    TenantSuspended,
    /// 404: unknown model, or one this tenant may not use (same answer, so names do not leak).
    #[error("The model `{0}` does not exist or you do not have access to it.")]
    ModelNotFound(String),
    /// 400: the request is not what the API accepts.
    #[error("{message}")]
    BadRequest {
        message: String,
        param: Option<&'static str>,
    },
    /// 413: body over the configured limit.
    #[error("Request body too large (limit {0} bytes).")]
    PayloadTooLarge(usize),
    /// 408: the body arrived slower than the minimum rate.
    #[error("The request body was not received in time.")]
    BodyTimeout,
    /// The upstream answered with an error; status and body are re-shaped, not invented, and
    /// its `retry-after` is passed on.
    #[error("{message}")]
    Upstream {
        status: StatusCode,
        message: String,
        kind: String,
        code: Option<serde_json::Value>,
        retry_after: Option<HeaderValue>,
    },
    /// 502: the upstream could not be reached or broke the protocol.
    #[error("The model backend is unavailable.")]
    UpstreamUnavailable,
    /// 502: the upstream's answer was larger than the gateway relays.
    #[error("The model backend's answer exceeded the {0}-byte limit.")]
    UpstreamTooLarge(usize),
    /// 503 `service_unavailable`: shutdown cut the request before the engine answered.
    #[error("The server is restarting; the request was cut. Please retry.")]
    ShuttingDown,
    /// 405: the route exists but not for this method (the `Allow` header lists the one it takes).
    #[error("Method not allowed. This endpoint accepts {0} only.")]
    MethodNotAllowed(&'static str),
    /// 504: the upstream did not start answering in time.
    #[error("The model backend did not answer in time.")]
    UpstreamTimeout,
    /// 503: the tenant's model is being started; retry after a moment.
    #[error("The model `{0}` is starting. Retry in a few seconds.")]
    ModelStarting(String),
    /// 503 `model_waking`: held while the model's idle graph woke, longer than the hold limit.
    #[error("The model `{0}` is waking up from idle and was not ready in time. Retry shortly.")]
    ModelWaking(String),
    /// 503 `model_wake_failed`: the model's idle graph could not be woken.
    #[error("The model `{0}` could not be started. Retry later.")]
    WakeFailed(String),
    /// 503: a dependency we need for this request (the database, for an uncached key) is down.
    #[error("The service is temporarily unavailable. Please retry.")]
    ServiceUnavailable,
    /// 429 `rate_limit_error`: refused at admission (code `rate_limit_exceeded`, or
    /// `insufficient_quota` for spend), with `retry-after` and `x-ratelimit-*` headers.
    #[error("{}", super::rate_headers::message(.0))]
    RateLimited(Box<crate::quota::Refusal>),
}

impl GatewayError {
    /// Low-cardinality label for metrics.
    pub fn metric_label(&self) -> &'static str {
        match self {
            Self::MissingKey => "missing_key",
            Self::InvalidKey => "invalid_key",
            Self::TooManyKeyFailures(_) => "too_many_key_failures",
            Self::TenantSuspended => "tenant_suspended",
            Self::ModelNotFound(_) => "model_not_found",
            Self::BadRequest { .. } => "bad_request",
            Self::PayloadTooLarge(_) => "payload_too_large",
            Self::BodyTimeout => "body_timeout",
            Self::Upstream { .. } => "upstream_error",
            Self::UpstreamUnavailable => "upstream_unavailable",
            Self::UpstreamTooLarge(_) => "upstream_too_large",
            Self::ShuttingDown => "shutting_down",
            Self::MethodNotAllowed(_) => "method_not_allowed",
            Self::UpstreamTimeout => "upstream_timeout",
            Self::ServiceUnavailable => "service_unavailable",
            Self::ModelStarting(_) => "model_starting",
            Self::ModelWaking(_) => "model_waking",
            Self::WakeFailed(_) => "model_wake_failed",
            Self::RateLimited(_) => "rate_limited",
        }
    }

    /// 404 for `name`, echoed at most [`ECHOED_NAME_CHARS`] characters long (a client's
    /// megabyte-long model name is not sent back to it whole, nor logged).
    pub fn model_not_found(name: &str) -> Self {
        match name.char_indices().nth(ECHOED_NAME_CHARS) {
            None => Self::ModelNotFound(name.to_owned()),
            Some((end, _)) => Self::ModelNotFound(format!("{}…", &name[..end])),
        }
    }

    pub fn bad_request(message: impl Into<String>, param: Option<&'static str>) -> Self {
        Self::BadRequest {
            message: message.into(),
            param,
        }
    }

    pub fn status(&self) -> StatusCode {
        match self {
            Self::MissingKey | Self::InvalidKey => StatusCode::UNAUTHORIZED,
            Self::TenantSuspended => StatusCode::FORBIDDEN,
            Self::TooManyKeyFailures(_) => StatusCode::TOO_MANY_REQUESTS,
            Self::ModelNotFound(_) => StatusCode::NOT_FOUND,
            Self::BadRequest { .. } => StatusCode::BAD_REQUEST,
            Self::PayloadTooLarge(_) => StatusCode::PAYLOAD_TOO_LARGE,
            Self::BodyTimeout => StatusCode::REQUEST_TIMEOUT,
            Self::Upstream { status, .. } => *status,
            Self::UpstreamUnavailable | Self::UpstreamTooLarge(_) => StatusCode::BAD_GATEWAY,
            Self::ShuttingDown => StatusCode::SERVICE_UNAVAILABLE,
            Self::MethodNotAllowed(_) => StatusCode::METHOD_NOT_ALLOWED,
            Self::UpstreamTimeout => StatusCode::GATEWAY_TIMEOUT,
            Self::ServiceUnavailable
            | Self::ModelStarting(_)
            | Self::ModelWaking(_)
            | Self::WakeFailed(_) => StatusCode::SERVICE_UNAVAILABLE,
            Self::RateLimited(_) => StatusCode::TOO_MANY_REQUESTS,
        }
    }

    /// The envelope's `error` object.
    pub fn body(&self) -> serde_json::Value {
        let (kind, code, param): (String, serde_json::Value, Option<&str>) = match self {
            Self::MissingKey | Self::InvalidKey => (
                "authentication_error".into(),
                json!("invalid_api_key"),
                None,
            ),
            Self::TenantSuspended => ("permission_error".into(), json!("tenant_suspended"), None),
            Self::TooManyKeyFailures(_) => (
                "rate_limit_error".into(),
                json!("rate_limit_exceeded"),
                None,
            ),
            Self::ModelNotFound(_) => (
                "invalid_request_error".into(),
                json!("model_not_found"),
                Some("model"),
            ),
            Self::BadRequest { param, .. } => (
                "invalid_request_error".into(),
                serde_json::Value::Null,
                *param,
            ),
            Self::PayloadTooLarge(_) => (
                "invalid_request_error".into(),
                json!("request_too_large"),
                None,
            ),
            Self::BodyTimeout => (
                "invalid_request_error".into(),
                json!("request_timeout"),
                None,
            ),
            Self::Upstream { kind, code, .. } => {
                (kind.clone(), code.clone().unwrap_or_default(), None)
            }
            Self::UpstreamUnavailable | Self::UpstreamTimeout => {
                ("api_error".into(), serde_json::Value::Null, None)
            }
            Self::UpstreamTooLarge(_) => (
                "api_error".into(),
                json!("upstream_response_too_large"),
                None,
            ),
            Self::ShuttingDown => ("service_unavailable".into(), json!("server_shutdown"), None),
            Self::MethodNotAllowed(_) => (
                "invalid_request_error".into(),
                json!("method_not_allowed"),
                None,
            ),
            Self::ServiceUnavailable => {
                ("service_unavailable".into(), serde_json::Value::Null, None)
            }
            Self::ModelStarting(_) => (
                "service_unavailable".into(),
                json!("model_starting"),
                Some("model"),
            ),
            Self::ModelWaking(_) => (
                "service_unavailable".into(),
                json!("model_waking"),
                Some("model"),
            ),
            Self::WakeFailed(_) => (
                "service_unavailable".into(),
                json!("model_wake_failed"),
                Some("model"),
            ),
            Self::RateLimited(r) => (
                "rate_limit_error".into(),
                json!(super::rate_headers::code(r)),
                None,
            ),
        };
        json!({"error": {"message": self.to_string(), "type": kind, "param": param, "code": code}})
    }
}

impl GatewayError {
    /// The limit a 429 refusal hit, for `tf_quota_refusals_total{limit}`.
    fn limit_label(&self) -> Option<&'static str> {
        use crate::quota::answer::RefusalKind;
        match self {
            Self::TooManyKeyFailures(_) => Some("bad_keys"),
            Self::RateLimited(r) => Some(match r.kind {
                RefusalKind::Requests => "requests",
                RefusalKind::Tokens => "tokens",
                RefusalKind::Spend => "spend",
                RefusalKind::InFlight => "in_flight",
                RefusalKind::LongPrompts => "long_prompts",
            }),
            _ => None,
        }
    }

    /// Passes an upstream's `retry-after` on (only an upstream error carries one).
    pub fn with_retry_after(mut self, value: Option<HeaderValue>) -> Self {
        if let Self::Upstream { retry_after, .. } = &mut self {
            *retry_after = value;
        }
        self
    }
}

/// OpenAI's `type` for a status, used when an upstream error body does not say.
pub fn type_for_status(status: StatusCode) -> &'static str {
    match status.as_u16() {
        400 | 404 | 409 | 413 | 422 => "invalid_request_error",
        401 => "authentication_error",
        403 => "permission_error",
        429 => "rate_limit_error",
        503 => "service_unavailable",
        _ => "api_error",
    }
}

impl IntoResponse for GatewayError {
    fn into_response(self) -> Response {
        if matches!(self, Self::ServiceUnavailable | Self::UpstreamUnavailable) {
            tracing::warn!(error = self.metric_label(), "request failed");
        }
        let mut response = (self.status(), axum::Json(self.body())).into_response();
        response
            .extensions_mut()
            .insert(crate::telemetry::requests::ErrorLabel {
                code: self.metric_label(),
                limit: self.limit_label(),
            });
        if self.status() == StatusCode::UNAUTHORIZED {
            response
                .headers_mut()
                .insert("www-authenticate", HeaderValue::from_static("Bearer"));
        }
        if let Self::RateLimited(r) = &self {
            super::rate_headers::write_refusal(r, response.headers_mut());
        }
        if let Self::ModelStarting(_) = &self {
            response.headers_mut().insert(
                axum::http::header::RETRY_AFTER,
                HeaderValue::from(MODEL_STARTING_RETRY_SECS),
            );
        }
        if let Self::ModelWaking(_) | Self::WakeFailed(_) = &self {
            response.headers_mut().insert(
                axum::http::header::RETRY_AFTER,
                HeaderValue::from(MODEL_WAKING_RETRY_SECS),
            );
        }
        if let Self::TooManyKeyFailures(wait) = &self {
            response.headers_mut().insert(
                axum::http::header::RETRY_AFTER,
                HeaderValue::from(wait.as_secs().max(1)),
            );
        }
        if let Self::Upstream {
            retry_after: Some(v),
            ..
        } = &self
        {
            response
                .headers_mut()
                .insert(axum::http::header::RETRY_AFTER, v.clone());
        }
        if let Self::MethodNotAllowed(allow) = &self {
            response
                .headers_mut()
                .insert(axum::http::header::ALLOW, HeaderValue::from_static(allow));
        }
        response
    }
}
