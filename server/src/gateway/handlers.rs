//! The `/v1` handlers. Each request gets a UUIDv7 request id, returned as `x-request-id` (also
//! on errors) and sent upstream; it is the usage event's idempotency key.

use std::sync::Arc;
use std::time::Instant;

use axum::body::Body;
use std::net::SocketAddr;

use axum::extract::{ConnectInfo, Request, State};
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use serde_json::json;
use time::OffsetDateTime;
use tracing::Instrument;
use uuid::Uuid;

use super::body;
use super::error::GatewayError;
use super::exchange::{self, Exchange, Reply};
use super::request;
use super::Gateway;
use crate::endpoint::Endpoint;
use crate::metering::context::{settle, MeterContext, Pending};
use crate::telemetry::logs::InSpan;
use crate::telemetry::requests::{ErrorLabel, ModelSeries};
use crate::telemetry::traces;
use crate::usage::{Provenance, UsageEvent, UsageStatus};

// The body is taken unread: the key is checked from the headers first, so an unauthenticated
// client never gets a byte of its body buffered (`body::read` then applies the size limit and the
// minimum rate).
pub async fn chat_completions(State(gw): State<Gateway>, req: Request) -> Response {
    serve(gw, Endpoint::Chat, req).await
}

pub async fn completions(State(gw): State<Gateway>, req: Request) -> Response {
    serve(gw, Endpoint::Completions, req).await
}

pub async fn embeddings(State(gw): State<Gateway>, req: Request) -> Response {
    serve(gw, Endpoint::Embeddings, req).await
}

pub async fn responses(State(gw): State<Gateway>, req: Request) -> Response {
    serve(gw, Endpoint::Responses, req).await
}

pub async fn messages(State(gw): State<Gateway>, req: Request) -> Response {
    serve(gw, Endpoint::Messages, req).await
}

/// The TCP peer, for the key-failure limiter (which counts the client a trusted proxy names
/// instead) and the traceparent trust; absent when served without one, as in a router driven
/// directly.
fn peer_addr(extensions: &axum::http::Extensions) -> Option<std::net::IpAddr> {
    extensions
        .get::<ConnectInfo<SocketAddr>>()
        .map(|c| c.0.ip())
}

pub async fn models(State(gw): State<Gateway>, req: Request) -> Response {
    let response = list_models(&gw, req).await;
    gw.metrics.answered(
        crate::telemetry::requests::MODELS,
        None,
        response.status().as_u16(),
        response.extensions().get::<ErrorLabel>().copied(),
    );
    response
}

async fn list_models(gw: &Gateway, req: Request) -> Response {
    let peer = peer_addr(req.extensions());
    let principal = match gw.keys.authenticate(req.headers(), peer).await {
        Ok(p) => p,
        Err(e) => return e.into_response(),
    };
    let snapshot = gw.routes.snapshot();
    let data: Vec<_> = snapshot
        .visible(principal.tenant_id)
        .into_iter()
        // A starting model is not usable yet.
        .filter(|r| !r.starting)
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
        axum::Json(json!({"error": {"message": "Unknown request URL. Supported: /v1/chat/completions, /v1/completions, /v1/responses, /v1/embeddings, /v1/messages, /v1/models.", "type": "invalid_request_error", "param": null, "code": "unknown_url"}})),
    )
        .into_response()
}

/// Runs one request inside its `request` span (every log line of the handler names its id; with
/// traces on, it is the request's trace span), counts its answer for `/metrics`, and returns the
/// id as `x-request-id`.
async fn serve(gw: Gateway, endpoint: Endpoint, req: Request) -> Response {
    let id = Uuid::now_v7();
    // The `otel.*` fields are recorded only with traces on, so log lines are unchanged without.
    let span = tracing::info_span!(
        "request",
        request_id = %id,
        otel.name = tracing::field::Empty,
        otel.kind = tracing::field::Empty,
        otel.status_code = tracing::field::Empty,
    );
    if traces::on() {
        open_trace(&gw, &span, endpoint, &req);
    }
    let mut model = None;
    // Boxed: `handle`'s future (admission, the exchange, the meter) is several KiB, and an
    // unstarted future is moved whole, so inline it was copied each time axum moved and boxed the
    // handler's future; boxed here it is built in place, once (test: the_handler_future_is_small).
    let mut response = async {
        Box::pin(handle(gw.clone(), endpoint, req, id, &mut model))
            .await
            .unwrap_or_else(|e| super::envelope::render(endpoint, e))
    }
    .instrument(span.clone())
    .await;
    let error = response.extensions().get::<ErrorLabel>().copied();
    gw.metrics.answered(
        endpoint.index(),
        model.as_deref(),
        response.status().as_u16(),
        error,
    );
    if traces::on() {
        close_trace(&span, response.status(), error);
    }
    let mut text = Uuid::encode_buffer();
    if let Ok(v) = HeaderValue::from_str(id.hyphenated().encode_lower(&mut text)) {
        response.headers_mut().insert("x-request-id", v);
    }
    response
}

/// The GenAI operation name of an endpoint (OpenTelemetry's `gen_ai.operation.name` values).
fn operation(endpoint: Endpoint) -> &'static str {
    match endpoint {
        // Responses and Anthropic Messages are conversations too: the semantic conventions'
        // `chat` (`gen_ai.system` is not set: the engine behind is the same for every endpoint).
        Endpoint::Chat | Endpoint::Responses | Endpoint::Messages => "chat",
        Endpoint::Completions => "text_completion",
        Endpoint::Embeddings => "embeddings",
    }
}

/// Starts the request's trace: kind server, the operation, and the caller's trace when the peer
/// is one whose `traceparent` is trusted (`--trust-traceparent-from`); from anyone else the
/// header is ignored, so a client cannot join or forge another trace.
fn open_trace(gw: &Gateway, span: &tracing::Span, endpoint: Endpoint, req: &Request) {
    use tracing_opentelemetry::OpenTelemetrySpanExt;
    span.record("otel.kind", "server");
    span.record("otel.name", operation(endpoint));
    span.set_attribute("gen_ai.operation.name", operation(endpoint));
    if peer_addr(req.extensions()).is_some_and(|p| gw.trust_traceparent_from.trusts(p)) {
        traces::adopt_parent(span, req.headers());
    }
}

/// The answer's status on the request's span; a 5xx is an error of the service.
fn close_trace(span: &tracing::Span, status: StatusCode, error: Option<ErrorLabel>) {
    use tracing_opentelemetry::OpenTelemetrySpanExt;
    span.set_attribute("http.response.status_code", i64::from(status.as_u16()));
    if let Some(e) = error {
        span.set_attribute("error.type", e.code);
    }
    if status.is_server_error() {
        span.record("otel.status_code", "error");
    }
}

async fn handle(
    gw: Gateway,
    endpoint: Endpoint,
    req: Request,
    request_id: Uuid,
    model: &mut Option<Arc<ModelSeries>>,
) -> Result<Response, GatewayError> {
    let (parts, body) = req.into_parts();
    let headers = parts.headers;
    let principal = gw
        .keys
        .authenticate(&headers, peer_addr(&parts.extensions))
        .instrument(traces::span(|| tracing::info_span!("auth")))
        .await?;
    let body = body::read(&headers, body, gw.max_body_bytes, gw.body_timing).await?;
    let req = request::parse(&body)?;
    req.refuse_engine_state(endpoint)?;
    let route = gw
        .routes
        .snapshot()
        .get(principal.tenant_id, &req.model)
        .cloned()
        .ok_or_else(|| GatewayError::model_not_found(&req.model))?;
    *model = Some(gw.metrics.model(&route.base));
    if !endpoint.serves(route.kind) {
        return Err(wrong_kind(endpoint, &route.served_name));
    }
    let span = tracing::Span::current();
    if traces::on() {
        use opentelemetry::trace::TraceContextExt;
        use tracing_opentelemetry::OpenTelemetrySpanExt;
        // The GenAI span name; the span has started (its `auth` child did), so it is renamed
        // on the OpenTelemetry span itself.
        span.context()
            .span()
            .update_name(format!("{} {}", operation(endpoint), route.served_name));
        span.set_attribute("gen_ai.request.model", route.served_name.clone());
        span.set_attribute("tf.tenant.id", principal.tenant_id.to_string());
    }
    if route.starting {
        return Err(GatewayError::ModelStarting(route.served_name.clone()));
    }
    if req.stream && !endpoint.generates() {
        return Err(GatewayError::bad_request(
            "Embeddings are not streamed: 'stream' must be false or absent.",
            Some("stream"),
        ));
    }
    let (stream, wants, raw) = (req.stream, req.wants, body.clone());
    let default_cap = gw.quota.default_max_tokens();

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
        reasoning_tokens: 0,
        endpoint,
        provenance: Provenance::Estimated,
        status: UsageStatus::Ok,
        stream,
        ttft_ms: None,
        duration_ms: 0,
        started_at: OffsetDateTime::now_utc(),
    };
    let admit = crate::quota::AdmitRequest {
        request_id,
        tenant: principal.tenant_id,
        key: principal.key_id,
        graph: &route.graph,
        price_key: &route.price_key,
        own_price_key: route.own_price_key.as_deref(),
        // The same integer the engine reads: the request's own, else the cap sent upstream.
        // Embeddings generate nothing: no completion to reserve for.
        max_tokens: Some(if endpoint.generates() {
            req.max_tokens(endpoint).unwrap_or(default_cap)
        } else {
            0
        }),
        sequences: req.sequences(),
    };
    // Computed at most once, for admission and the in-flight record.
    let prompt_estimate = std::sync::OnceLock::new();
    let estimate =
        || *prompt_estimate.get_or_init(|| req.admission_prompt_tokens(endpoint, &route.policy));
    let admitted = match gw
        .quota
        .admit(admit, estimate)
        .instrument(traces::span(|| tracing::info_span!("admission")))
        .await
    {
        Ok(admitted) => admitted,
        Err(refusal) => {
            crate::metering::refusal::record_refusal(gw.sink.as_ref(), event, started).await;
            return Err(GatewayError::RateLimited(Box::new(refusal)));
        }
    };
    // The only work capture costs a tenant that did not opt in: this bool check. It never
    // touches the usage event or the metered stream (they are read as without it).
    let capture = principal
        .body_logging
        .then(|| gw.bodies.start(principal.tenant_id, request_id, &body));
    let limit_headers = admitted.as_ref().map(crate::quota::Admitted::rate_status);
    let tokenizer = route.policy.tokenizer.clone();
    let ctx = MeterContext {
        event,
        started,
        counter: crate::metering::count::OutputCounter::new(tokenizer.clone()),
        estimate_prompt: Box::new(move || {
            request::estimate_prompt_tokens(endpoint, &raw, tokenizer.as_deref())
        }),
        sink: gw.sink.clone(),
        cut: gw.cut.clone(),
        admitted,
        tracker: gw.tracker.clone(),
        holds: Some(route.activity.begin(route.adapter_activity.as_ref())),
        first_token: None,
        inflight: None,
        // The in-flight record starts once the engine answers (`Pending::mark_answered`): a
        // request refused, held or lost before the engine had it is never billed from the log.
        inflight_start: gw.inflight.clone().map(|log| (log, estimate())),
        span: if traces::on() {
            span
        } else {
            tracing::Span::none()
        },
    };
    let cold = route.asleep;
    let (route, ctx) = if cold {
        let (route, mut ctx) = hold(&gw, principal.tenant_id, &req.model, route, ctx)
            .instrument(traces::span(|| tracing::info_span!("hold")))
            .await?;
        // The cold time to first token: the first content chunk (the meter calls this; every
        // request streams upstream, a whole answer is assembled from the stream).
        let metrics = gw.fleet_metrics.clone();
        ctx.first_token = Some(Box::new(move |ttft| metrics.cold_ttft(ttft)));
        (route, ctx)
    } else {
        (route, ctx)
    };
    let upstream_body =
        req.upstream_body(endpoint, true, &route, principal.tenant_id, default_cap)?;

    // The engine's side of the trace hangs under this span (its `traceparent`), which lasts
    // until the engine's stream ends.
    let upstream_span = traces::span(|| {
        tracing::info_span!(
            "upstream",
            otel.kind = "client",
            server.address = %route.upstream.base_url,
        )
    });
    let x = Exchange {
        traceparent: traces::traceparent(&upstream_span),
        upstream: route.upstream.clone(),
        endpoint,
        body: Bytes::from(upstream_body),
        stream,
        wants,
        max_answer_bytes: gw.max_answer_bytes,
    };
    let reply = exchange::run(x, ctx)
        .instrument(upstream_span.clone())
        .await;
    let mut response = match reply {
        Reply::Failed(e) => {
            if let Some(c) = capture {
                c.finish(&Bytes::new());
            }
            super::envelope::render(endpoint, e)
        }
        Reply::Stream(stream) => {
            // The body is polled after this handler returns: its log lines keep the request span
            // (the upstream span's parent, when traces are on).
            let stream = if upstream_span.is_none() {
                InSpan::current(Box::into_pin(stream))
            } else {
                InSpan::new(Box::into_pin(stream), upstream_span)
            };
            let body = match capture {
                None => Body::from_stream(stream),
                Some(c) => Body::from_stream(c.stream(stream)),
            };
            Response::builder()
                .header(header::CONTENT_TYPE, "text/event-stream")
                .header(header::CACHE_CONTROL, "no-cache")
                .body(body)
                .unwrap_or_else(|_| GatewayError::UpstreamUnavailable.into_response())
        }
        Reply::Whole(whole) => {
            if let Some(c) = capture {
                c.finish(&whole.body);
            }
            let mut response = Response::new(Body::from(whole.body));
            *response.status_mut() = whole.status;
            response.headers_mut().insert(
                header::CONTENT_TYPE,
                whole
                    .content_type
                    .unwrap_or(HeaderValue::from_static("application/json")),
            );
            response
        }
    };
    if let Some(h) = limit_headers {
        super::rate_headers::apply(&h, response.headers_mut());
    }
    Ok(response)
}

/// The 400 for a name whose base is the other kind (a chat model on `/v1/embeddings`, an
/// embedding model elsewhere): said before anything is forwarded or admitted, so nothing is
/// billed. The name is one the tenant may use, so saying what it is leaks nothing.
fn wrong_kind(endpoint: Endpoint, name: &str) -> GatewayError {
    let message = if endpoint.generates() {
        format!("The model '{name}' is an embedding model: call it on /v1/embeddings.")
    } else {
        format!("The model '{name}' is not an embedding model: /v1/embeddings serves embedding models only.")
    };
    GatewayError::bad_request(message, Some("model"))
}

/// Holds an admitted request while its model's graph wakes (`super::hold`). A client that hangs
/// up meanwhile is recorded as an abort with zero tokens (the accounting guard's drop); a hold
/// that ends without the graph serving is recorded with zero tokens and answered 503: nothing is
/// billed for a request the engine never saw.
async fn hold(
    gw: &Gateway,
    tenant: Uuid,
    name: &str,
    asleep: std::sync::Arc<super::resolve::Route>,
    ctx: MeterContext,
) -> Result<(std::sync::Arc<super::resolve::Route>, MeterContext), GatewayError> {
    let _held = gw.metrics.held(&asleep.graph);
    let mut pending = Pending::new(ctx);
    let held = super::hold::until_awake(&gw.routes, tenant, name, &asleep, gw.hold_limit).await;
    let Some(mut ctx) = pending.take() else {
        return Err(GatewayError::ServiceUnavailable);
    };
    match held {
        Ok(route) => Ok((route, ctx)),
        Err(e) => {
            ctx.estimate_prompt = Box::new(|| 0);
            settle(ctx, None, false, 0, UsageStatus::UpstreamError).await;
            Err(e)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn future_size<A, B, F>(_: fn(A, B) -> F) -> usize {
        std::mem::size_of::<F>()
    }

    /// The future axum moves and boxes per request holds no more than the request's span and its
    /// boxed `handle` (about 1 KiB in a debug build; 8 KiB with `handle` inline, see `serve`).
    #[test]
    fn the_handler_future_is_small() {
        for size in [
            future_size(chat_completions),
            future_size(completions),
            future_size(responses),
            future_size(messages),
            future_size(embeddings),
        ] {
            assert!(size <= 2048, "a handler's future is {size} bytes");
        }
    }
}
