//! The `/v1` handlers. Each request gets a UUIDv7 request id, returned as `x-request-id` (also
//! on errors) and sent upstream; it is the usage event's idempotency key.

use std::time::Instant;

use axum::body::Body;
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use serde_json::json;
use time::OffsetDateTime;
use tokio::sync::{mpsc, oneshot};
use uuid::Uuid;

use super::error::GatewayError;
use super::request::{self, Endpoint};
use super::upstream_error;
use super::Gateway;
use crate::metering::meter::StreamMeter;
use crate::metering::relay::{self, MeterContext};
use crate::metering::usage::{Provenance, UsageEvent, UsageStatus};

/// How much of an upstream error body is read.
const MAX_ERROR_BODY: usize = 64 * 1024;
/// Chunks buffered between the metering task and a slow client.
const CLIENT_CHANNEL: usize = 32;

pub async fn chat_completions(
    State(gw): State<Gateway>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    with_request_id(|id| handle(gw, Endpoint::Chat, headers, body, id)).await
}

pub async fn completions(
    State(gw): State<Gateway>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    with_request_id(|id| handle(gw, Endpoint::Completions, headers, body, id)).await
}

pub async fn models(State(gw): State<Gateway>, headers: HeaderMap) -> Response {
    let principal = match gw.keys.authenticate(&headers).await {
        Ok(p) => p,
        Err(e) => return e.into_response(),
    };
    let snapshot = gw.routes.snapshot();
    let data: Vec<_> = snapshot
        .visible(principal.tenant_id)
        .into_iter()
        .map(|r| {
            let owned_by = if r.owner.is_some() {
                principal.tenant_name.as_str()
            } else {
                "tokenfactory"
            };
            json!({"id": r.served_name, "object": "model", "created": r.created, "owned_by": owned_by})
        })
        .collect();
    axum::Json(json!({"object": "list", "data": data})).into_response()
}

pub async fn unknown_route() -> Response {
    (
        StatusCode::NOT_FOUND,
        axum::Json(json!({"error": {"message": "Unknown request URL. Supported: /v1/chat/completions, /v1/completions, /v1/models.", "type": "invalid_request_error", "param": null, "code": "unknown_url"}})),
    )
        .into_response()
}

async fn with_request_id<F, Fut>(f: F) -> Response
where
    F: FnOnce(Uuid) -> Fut,
    Fut: std::future::Future<Output = Result<Response, GatewayError>>,
{
    let id = Uuid::now_v7();
    let mut response = f(id).await.unwrap_or_else(IntoResponse::into_response);
    if let Ok(v) = HeaderValue::from_str(&id.to_string()) {
        response.headers_mut().insert("x-request-id", v);
    }
    response
}

async fn handle(
    gw: Gateway,
    endpoint: Endpoint,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
    request_id: Uuid,
) -> Result<Response, GatewayError> {
    let principal = gw.keys.authenticate(&headers).await?;
    let body = body.map_err(|e| {
        if e.status() == StatusCode::PAYLOAD_TOO_LARGE {
            GatewayError::PayloadTooLarge(gw.max_body_bytes)
        } else {
            GatewayError::bad_request(e.body_text(), None)
        }
    })?;
    let req = request::parse(&body)?;
    let route = gw
        .routes
        .snapshot()
        .get(principal.tenant_id, &req.model)
        .cloned()
        .ok_or_else(|| GatewayError::ModelNotFound(req.model.clone()))?;
    let upstream_body = request::upstream_body(&req, &route, principal.tenant_id)?;

    let started = Instant::now();
    let event = UsageEvent {
        request_id,
        tenant_id: principal.tenant_id,
        api_key_id: Some(principal.key_id),
        served_name: route.served_name.clone(),
        base_model: route.base.clone(),
        adapter: route.adapter.map(|_| route.upstream_model.clone()),
        graph: route.graph.clone(),
        price_key: route.price_key.clone(),
        prompt_tokens: 0,
        cached_tokens: 0,
        completion_tokens: 0,
        provenance: Provenance::Estimated,
        status: UsageStatus::Ok,
        stream: req.stream,
        ttft_ms: None,
        duration_ms: 0,
        started_at: OffsetDateTime::now_utc(),
    };
    let stream = req.stream;
    let wants = req.wants;
    let ctx = MeterContext {
        event,
        started,
        estimate_prompt: Box::new(move || request::estimate_prompt_tokens(endpoint, &req.body)),
        sink: gw.sink.clone(),
        cut: gw.cut.clone(),
    };

    let send = route
        .upstream
        .client
        .post(route.upstream.url(endpoint.path()))
        .header(header::CONTENT_TYPE, "application/json")
        .header("x-request-id", request_id.to_string())
        .body(upstream_body)
        .send();
    let upstream = match tokio::time::timeout(route.upstream.first_byte_timeout, send).await {
        Ok(Ok(r)) => r,
        Ok(Err(e)) => {
            tracing::warn!(%request_id, upstream = %route.upstream.base_url, error = %e, "upstream unreachable");
            ctx.settle(None, false, 0, UsageStatus::UpstreamError, None).await;
            return Err(GatewayError::UpstreamUnavailable);
        }
        Err(_) => {
            ctx.settle(None, false, 0, UsageStatus::UpstreamError, None).await;
            return Err(GatewayError::UpstreamTimeout);
        }
    };
    if !upstream.status().is_success() {
        let status = upstream.status();
        let body = read_bounded(upstream, MAX_ERROR_BODY).await;
        let err = upstream_error::reshape(status, &body);
        // Refused before generating anything: the engine produced no tokens to bill.
        let mut ctx = ctx;
        ctx.estimate_prompt = Box::new(|| 0);
        ctx.settle(None, false, 0, UsageStatus::UpstreamError, None).await;
        return Err(err);
    }

    if stream {
        let (tx, rx) = mpsc::channel(CLIENT_CHANNEL);
        gw.tracker
            .spawn(relay::relay_stream(upstream, tx, StreamMeter::new(wants), ctx));
        let body = Body::from_stream(tokio_stream_from(rx));
        Ok(Response::builder()
            .header(header::CONTENT_TYPE, "text/event-stream")
            .header(header::CACHE_CONTROL, "no-cache")
            .body(body)
            .unwrap_or_else(|_| GatewayError::UpstreamUnavailable.into_response()))
    } else {
        let (tx, rx) = oneshot::channel();
        gw.tracker
            .spawn(relay::relay_whole(upstream, tx, ctx, gw.max_body_bytes.max(64 << 20)));
        let whole = rx.await.map_err(|_| GatewayError::UpstreamUnavailable)?;
        let mut response = Response::new(Body::from(whole.body));
        *response.status_mut() = whole.status;
        response.headers_mut().insert(
            header::CONTENT_TYPE,
            whole
                .content_type
                .unwrap_or(HeaderValue::from_static("application/json")),
        );
        Ok(response)
    }
}

fn tokio_stream_from(
    mut rx: mpsc::Receiver<Result<Bytes, std::io::Error>>,
) -> impl futures::Stream<Item = Result<Bytes, std::io::Error>> {
    futures::stream::poll_fn(move |cx| rx.poll_recv(cx))
}

async fn read_bounded(resp: reqwest::Response, max: usize) -> Vec<u8> {
    use futures::StreamExt;
    let mut out = Vec::new();
    let mut body = resp.bytes_stream();
    while let Some(Ok(b)) = body.next().await {
        let room = max.saturating_sub(out.len());
        out.extend_from_slice(&b[..b.len().min(room)]);
        if out.len() >= max {
            break;
        }
    }
    out
}
