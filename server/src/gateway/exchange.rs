//! One upstream exchange, run on the handler's own task (no task or channel per request): send
//! the request, wait for the answer's head, and hand back an error, a metered stream or a whole
//! metered response. The accounting never depends on the client staying: until the exchange hands
//! its [`MeterContext`] on, a [`Pending`] guard holds it, and if the client hangs up (hyper drops
//! the handler) the guard records the abort on the tracker; the upstream request is dropped with
//! the handler, which cancels it.

use std::sync::Arc;

use bytes::Bytes;
use futures::FutureExt;

use super::error::GatewayError;
use super::request::Endpoint;
use super::upstream::Upstream;
use super::upstream_conn::UpstreamResponse;
use super::upstream_error;
use crate::metering::meter::{ClientWants, StreamMeter};
use crate::metering::relay::{self, MeterContext, Reply};
use crate::metering::stream::MeteredStream;
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
pub async fn settle(ctx: MeterContext, usage: Option<Usage>, completed: bool, status: UsageStatus) {
    let request_id = ctx.event.request_id;
    let tracker = ctx.tracker.clone();
    let mut record = ctx
        .settle(usage, completed, 0, status, None)
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
    let answered = tokio::time::timeout(
        x.upstream.first_byte_timeout,
        x.upstream.send(x.endpoint, request_id, x.body),
    )
    .await;
    let failed = |pending: &mut Pending| {
        let mut ctx = pending.take()?;
        ctx.estimate_prompt = Box::new(|| 0);
        Some(ctx)
    };
    let upstream = match answered {
        Ok(Ok(r)) => r,
        Ok(Err(e)) => {
            tracing::warn!(%request_id, error = %e, "upstream unreachable");
            if let Some(ctx) = failed(&mut pending) {
                settle(ctx, None, false, UsageStatus::UpstreamError).await;
            }
            return Reply::Failed(GatewayError::UpstreamUnavailable);
        }
        Err(_) => {
            if let Some(ctx) = failed(&mut pending) {
                settle(ctx, None, false, UsageStatus::UpstreamError).await;
            }
            return Reply::Failed(GatewayError::UpstreamTimeout);
        }
    };
    pending.answered = true;
    if !upstream.status.is_success() {
        let status = upstream.status;
        let body = read_bounded(upstream, MAX_ERROR_BODY).await;
        // Refused before generating anything: the engine produced no tokens to bill.
        if let Some(ctx) = failed(&mut pending) {
            settle(ctx, None, false, UsageStatus::UpstreamError).await;
        }
        return Reply::Failed(upstream_error::reshape(status, &body));
    }
    if x.stream {
        // From here the stream's body owns the accounting (its `Drop` records a hang-up).
        match pending.take() {
            Some(ctx) => Reply::Stream(Box::new(MeteredStream::new(
                upstream,
                StreamMeter::new(x.wants),
                ctx,
            ))),
            None => Reply::Failed(GatewayError::UpstreamUnavailable),
        }
    } else {
        relay::relay_whole(upstream, &mut pending, x.max_body_bytes).await
    }
}

async fn read_bounded(resp: UpstreamResponse, max: usize) -> Vec<u8> {
    use futures::StreamExt;
    let mut out = Vec::new();
    let mut body = resp.body;
    while let Some(Ok(b)) = body.next().await {
        let room = max.saturating_sub(out.len());
        out.extend_from_slice(&b[..b.len().min(room)]);
        if out.len() >= max {
            break;
        }
    }
    out
}
