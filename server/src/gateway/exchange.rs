//! One upstream exchange, run on the handler's own task (no task or channel per request): send
//! the request, wait for the answer's head, and hand back an error, a metered stream or a whole
//! metered response. The accounting never depends on the client staying: until the exchange hands
//! its [`MeterContext`] on, a [`Pending`] guard holds it, and if the client hangs up (hyper drops
//! the handler) the guard records the abort on the tracker; the upstream request is dropped with
//! the handler, which cancels it.
//!
//! Shutdown's cut reaches a request still waiting for the engine's response head too: it is
//! recorded `interrupted` (zero tokens, like a hang-up then) and answered 503.

use std::sync::Arc;

use bytes::Bytes;
use futures::FutureExt;

use super::error::GatewayError;
use super::request::Endpoint;
use super::upstream::Upstream;
use super::upstream_conn::UpstreamResponse;
use super::upstream_error;
use crate::metering::meter::{ClientWants, StreamMeter};
use crate::metering::relay::{self, MeterContext, Reply, WholeLimits};
use crate::metering::stream::{MeteredStream, Silence};
use crate::metering::usage::{Usage, UsageStatus};

/// How much of an upstream error body is read.
const MAX_ERROR_BODY: usize = 64 * 1024;

/// What the exchange needs besides the accounting.
pub struct Exchange {
    pub upstream: Arc<Upstream>,
    pub endpoint: Endpoint,
    pub body: Bytes,
    pub stream: bool,
    pub wants: ClientWants,
    pub max_body_bytes: usize,
}

/// A request's accounting while the exchange runs. Dropped with it still inside (the client hung
/// up), it records a client abort on the tracker.
pub struct Pending {
    ctx: Option<MeterContext>,
    /// The engine answered: a later abort bills the estimated prompt (the engine had it).
    answered: bool,
}

impl Pending {
    pub fn new(ctx: MeterContext) -> Self {
        Self {
            ctx: Some(ctx),
            answered: false,
        }
    }

    /// The shutdown deadline's token (cancelled when streams and bodies still reading are cut).
    pub fn cut(&self) -> tokio_util::sync::CancellationToken {
        self.ctx.as_ref().map(|c| c.cut.clone()).unwrap_or_default()
    }

    /// Hands the context on (to a metered stream, or to [`settle`]).
    pub fn take(&mut self) -> Option<MeterContext> {
        self.ctx.take()
    }
}

impl Drop for Pending {
    fn drop(&mut self) {
        let Some(mut ctx) = self.ctx.take() else {
            return;
        };
        if !self.answered {
            // INVARIANT: never bill more than the engine produced. Hung up before the engine
            // answered, the gateway cannot prove the engine ever had the request (it may still
            // be in flight), so the event records the abort with zero tokens: under-billing is
            // the safe side. Test: reconciliation::every_event_matches_the_engine_ledger.
            ctx.estimate_prompt = Box::new(|| 0);
        }
        let tracker = ctx.tracker.clone();
        match tokio::runtime::Handle::try_current() {
            Ok(handle) => {
                tracker.spawn_on(
                    ctx.settle(None, false, 0, UsageStatus::ClientAbort, None)
                        .map(drop),
                    &handle,
                );
            }
            Err(_) => tracing::error!("usage event dropped: no runtime to record it on"),
        }
    }
}

/// Records the event without letting a hang-up cancel it: inline when recording completes at
/// once (the usual case: the journal appends on the caller's task), else on the tracker, awaited.
pub async fn settle(
    ctx: MeterContext,
    usage: Option<Usage>,
    usage_final: bool,
    generated: u64,
    status: UsageStatus,
) {
    let request_id = ctx.event.request_id;
    let tracker = ctx.tracker.clone();
    let mut record = ctx
        .settle(usage, usage_final, generated, status, None)
        .map(drop)
        .boxed();
    if (&mut record).now_or_never().is_some() {
        return;
    }
    if let Err(e) = tracker.spawn(record).await {
        tracing::error!(%request_id, error = %e, "recording a usage event failed");
    }
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
            x.upstream.send(x.endpoint, request_id, x.body),
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
    pending.answered = true;
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
    // A streamed request answered with JSON (an engine's error, or an answer that ignored
    // `stream`) is read whole; anything else is taken as the stream.
    let json = upstream
        .headers
        .get(http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.to_ascii_lowercase().contains("json"));
    if x.stream && !json {
        // From here the stream's body owns the accounting (its `Drop` records a hang-up).
        match pending.take() {
            Some(ctx) => {
                let meter = StreamMeter::new(x.wants).with_served_model(&ctx.event.served_name);
                let silence = Silence {
                    first: chunk_timeout.max(x.upstream.first_byte_timeout),
                    between: chunk_timeout,
                };
                Reply::Stream(Box::new(MeteredStream::new(upstream, meter, ctx, silence)))
            }
            None => Reply::Failed(GatewayError::UpstreamUnavailable),
        }
    } else {
        let limits = WholeLimits {
            max_bytes: x.max_body_bytes,
            read_timeout: chunk_timeout,
            stream_requested: x.stream,
        };
        relay::relay_whole(upstream, &mut pending, limits).await
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
