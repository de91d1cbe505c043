//! One upstream exchange, run on the handler's own task (no task or channel per request): send
//! the request, wait for the answer's head, and hand back an error, a metered stream or a whole
//! metered response. The accounting never depends on the client staying: until the exchange hands
//! its [`MeterContext`] on, a [`Pending`] guard (metering's) holds it, and if the client hangs up
//! (hyper drops the handler) the guard records the abort on the tracker; the upstream request is
//! dropped with the handler, which cancels it.
//!
//! Shutdown's cut reaches a request still waiting for the engine's response head too: it is
//! recorded `interrupted` (zero tokens, like a hang-up then) and answered 503.

use std::sync::Arc;

use bytes::Bytes;

use super::error::GatewayError;
use super::upstream::Upstream;
use super::upstream_conn::{UpstreamBody, UpstreamFailure, UpstreamResponse};
use super::upstream_error;
use crate::endpoint::Endpoint;
use crate::metering::assemble::{self, Failure, Shape};
use crate::metering::context::{settle, MeterContext, Pending};
use crate::metering::meter::{ClientWants, StreamMeter};
use crate::metering::stream::{EngineBody, MeteredStream, Silence};
use crate::metering::typed::Dialect;
use crate::metering::whole::{self, WholeLimits, WholeOutcome};
use crate::metering::whole_answer;
use crate::usage::UsageStatus;

/// How much of an upstream error body is read.
const MAX_ERROR_BODY: usize = 64 * 1024;

/// What the exchange needs besides the accounting.
pub struct Exchange {
    pub upstream: Arc<Upstream>,
    /// The W3C `traceparent` sent upstream (traces on), so the engine's spans join the trace.
    pub traceparent: Option<http::HeaderValue>,
    pub endpoint: Endpoint,
    pub body: Bytes,
    /// The client asked for a stream. The engine is always asked for one (with usage), and a
    /// non-streamed answer is assembled from it (`metering::assemble`), so a client that hangs
    /// up is billed what the engine produced, as a stream's is.
    pub stream: bool,
    pub wants: ClientWants,
    /// Largest whole JSON answer relayed (`--max-answer-bytes`); a larger one is not relayed and
    /// not billed (`metering::whole`'s large-answer rule).
    pub max_answer_bytes: usize,
}

/// What the exchange hands the handler.
pub enum Reply {
    /// No usable answer; the event is already recorded.
    Failed(GatewayError),
    /// A stream: the handler returns it as the body.
    Stream(Box<MeteredStream<UpstreamBody>>),
    /// A whole, metered response.
    Whole(WholeResponse),
}

/// A non-streamed upstream answer, relayed whole once metered.
pub struct WholeResponse {
    pub status: http::StatusCode,
    pub content_type: Option<http::HeaderValue>,
    pub body: Bytes,
}

pub async fn run(x: Exchange, ctx: MeterContext) -> Reply {
    let request_id = ctx.event.request_id;
    let mut pending = Pending::new(ctx);
    let cut = pending.cut();
    let answered = tokio::select! {
        biased;
        () = cut.cancelled() => None,
        answered = tokio::time::timeout(
            x.upstream.first_byte_timeout,
            x.upstream
                .send_traced(x.endpoint, request_id, x.traceparent.as_ref(), x.body),
        ) => Some(answered),
    };
    let failed = |pending: &mut Pending| {
        let mut ctx = pending.take()?;
        ctx.estimate_prompt = Box::new(|| 0);
        Some(ctx)
    };
    let upstream = match answered {
        Some(Ok(Ok(r))) => r,
        Some(Ok(Err(e))) => {
            tracing::warn!(%request_id, error = %e, "upstream unreachable");
            if let Some(ctx) = failed(&mut pending) {
                settle(ctx, None, false, 0, UsageStatus::UpstreamError).await;
            }
            return Reply::Failed(GatewayError::UpstreamUnavailable);
        }
        Some(Err(_)) => {
            if let Some(ctx) = failed(&mut pending) {
                settle(ctx, None, false, 0, UsageStatus::UpstreamError).await;
            }
            return Reply::Failed(GatewayError::UpstreamTimeout);
        }
        None => {
            // INVARIANT: a request cut while the engine had not answered is recorded (zero
            // tokens: the engine may never have had it) and answered 503 (test:
            // protocol::shutdown_while_waiting_for_the_engine_is_recorded_and_answered).
            if let Some(ctx) = failed(&mut pending) {
                settle(ctx, None, false, 0, UsageStatus::Interrupted).await;
            }
            return Reply::Failed(GatewayError::ShuttingDown);
        }
    };
    pending.mark_answered();
    let chunk_timeout = x.upstream.chunk_timeout;
    if !upstream.status.is_success() {
        let status = upstream.status;
        let retry_after = upstream.headers.get(http::header::RETRY_AFTER).cloned();
        let body = read_bounded(upstream, MAX_ERROR_BODY, chunk_timeout).await;
        // Refused before generating anything: the engine produced no tokens to bill.
        if let Some(ctx) = failed(&mut pending) {
            settle(ctx, None, false, 0, UsageStatus::UpstreamError).await;
        }
        return Reply::Failed(upstream_error::reshape(status, &body).with_retry_after(retry_after));
    }
    // Every request streams upstream. An answer in JSON (an engine's error, or an answer that
    // ignored `stream`) is read whole; anything else is taken as the stream.
    let json = upstream
        .headers
        .get(http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.to_ascii_lowercase().contains("json"));
    if !json {
        // From here the stream's body owns the accounting (its `Drop` records a hang-up).
        let Some(ctx) = pending.take() else {
            return Reply::Failed(GatewayError::UpstreamUnavailable);
        };
        // A whole answer needs the stream's usage; the running one is not part of it.
        let wants = if x.stream {
            x.wants
        } else {
            ClientWants {
                usage: true,
                continuous: false,
            }
        };
        let dialect = Dialect::of(x.endpoint);
        let shape = match x.endpoint {
            Endpoint::Chat => Shape::Chat,
            Endpoint::Completions | Endpoint::Embeddings => Shape::Text,
            Endpoint::Responses | Endpoint::Messages => Shape::Typed(dialect),
        };
        let meter = StreamMeter::new(wants)
            .with_dialect(dialect)
            .with_counter(ctx.counter.clone());
        let meter = if !x.stream && dialect == Dialect::Chunks {
            // One parse per event serves the meter and the answer; no chunk is relayed, so the
            // served name is the answer's alone.
            meter.assembling(
                assemble::Assembler::new(shape).with_served_model(&ctx.event.served_name),
            )
        } else {
            meter.with_served_model(&ctx.event.served_name)
        };
        let silence = Silence {
            first: chunk_timeout.max(x.upstream.first_byte_timeout),
            between: chunk_timeout,
        };
        let stream = MeteredStream::new(upstream.body, meter, ctx, silence);
        if x.stream {
            return Reply::Stream(Box::new(stream));
        }
        // INVARIANT: a client that hangs up meanwhile drops this future and the stream with it,
        // which cancels the engine and bills what it produced (test:
        // hang_up::an_abandoned_whole_answer_bills_the_engine_ledger).
        match whole_answer::collect(stream, shape).await {
            Ok(body) => Reply::Whole(WholeResponse {
                status: http::StatusCode::OK,
                content_type: Some(http::HeaderValue::from_static("application/json")),
                body,
            }),
            Err(Failure::Error(code)) => Reply::Failed(match code.as_deref() {
                Some("upstream_timeout") => GatewayError::UpstreamTimeout,
                Some("server_shutdown") => GatewayError::ShuttingDown,
                _ => GatewayError::UpstreamUnavailable,
            }),
            Err(Failure::Broken) => Reply::Failed(GatewayError::UpstreamUnavailable),
        }
    } else {
        let limits = WholeLimits {
            max_bytes: x.max_answer_bytes,
            read_timeout: chunk_timeout,
            // Embeddings are asked for JSON: their JSON is the answer, not an engine's error.
            stream_requested: x.endpoint.generates(),
        };
        let status = upstream.status;
        let content_type = upstream.headers.get(http::header::CONTENT_TYPE).cloned();
        // Boxed: a JSON answer where a stream was asked for is rare, and its reader's state
        // (a few KiB) inline would be moved with every exchange's future.
        match Box::pin(whole::read_whole(upstream.body, &mut pending, limits)).await {
            WholeOutcome::Answer(body) => Reply::Whole(WholeResponse {
                status,
                content_type,
                body,
            }),
            WholeOutcome::EngineError(body) => {
                Reply::Failed(upstream_error::reshape(status, &body))
            }
            WholeOutcome::TooLarge => {
                Reply::Failed(GatewayError::UpstreamTooLarge(limits.max_bytes))
            }
            WholeOutcome::Broken => Reply::Failed(GatewayError::UpstreamUnavailable),
        }
    }
}

impl EngineBody for UpstreamBody {
    type Error = UpstreamFailure;
    fn half_close(&mut self) {
        UpstreamBody::half_close(self);
    }
}

/// Reads at most `max` bytes of an error body, waiting at most `silence` between reads.
async fn read_bounded(resp: UpstreamResponse, max: usize, silence: std::time::Duration) -> Vec<u8> {
    use futures::StreamExt;
    let mut out = Vec::new();
    let mut body = resp.body;
    while let Ok(Some(Ok(b))) = tokio::time::timeout(silence, body.next()).await {
        let room = max.saturating_sub(out.len());
        out.extend_from_slice(&b[..b.len().min(room)]);
        if out.len() >= max {
            break;
        }
    }
    out
}
