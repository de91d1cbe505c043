//! One upstream exchange, run as its own task so that a client hanging up never cancels the
//! accounting: the task sends the request, waits for the answer's head, and hands the handler
//! either an error, a metered stream or a whole response, metering all the way. A client gone
//! before the head arrives cancels the upstream request and is still recorded.

use std::time::Duration;

use tokio::sync::oneshot;

use super::error::GatewayError;
use super::upstream_error;
use crate::metering::meter::{ClientWants, StreamMeter};
use crate::metering::relay::{self, MeterContext, Reply};
use crate::metering::stream::MeteredStream;
use crate::metering::usage::UsageStatus;

/// How much of an upstream error body is read.
const MAX_ERROR_BODY: usize = 64 * 1024;

/// What the exchange needs besides the request.
pub struct Exchange {
    pub request: reqwest::RequestBuilder,
    pub first_byte_timeout: Duration,
    pub stream: bool,
    pub wants: ClientWants,
    pub max_body_bytes: usize,
}

pub async fn run(x: Exchange, mut ctx: MeterContext, mut reply: oneshot::Sender<Reply>) {
    let request_id = ctx.event.request_id;
    let answered = tokio::select! {
        biased;
        () = reply.closed() => None,
        r = tokio::time::timeout(x.first_byte_timeout, x.request.send()) => Some(r),
    };
    let upstream = match answered {
        None => {
            // INVARIANT: never bill more than the engine produced. Hung up before the engine
            // answered, the gateway cannot prove the engine ever had the request (it may still be
            // in flight), so the event records the abort with zero tokens: under-billing is the
            // safe side. Test: reconciliation::every_event_matches_the_engine_ledger.
            ctx.estimate_prompt = Box::new(|| 0);
            ctx.settle(None, false, 0, UsageStatus::ClientAbort, None)
                .await;
            return;
        }
        Some(Ok(Ok(r))) => r,
        Some(Ok(Err(e))) => {
            tracing::warn!(%request_id, error = %e, "upstream unreachable");
            ctx.estimate_prompt = Box::new(|| 0);
            ctx.settle(None, false, 0, UsageStatus::UpstreamError, None)
                .await;
            let _ = reply.send(Reply::Failed(GatewayError::UpstreamUnavailable));
            return;
        }
        Some(Err(_)) => {
            ctx.estimate_prompt = Box::new(|| 0);
            ctx.settle(None, false, 0, UsageStatus::UpstreamError, None)
                .await;
            let _ = reply.send(Reply::Failed(GatewayError::UpstreamTimeout));
            return;
        }
    };
    if !upstream.status().is_success() {
        let status = upstream.status();
        let body = read_bounded(upstream, MAX_ERROR_BODY).await;
        // Refused before generating anything: the engine produced no tokens to bill.
        ctx.estimate_prompt = Box::new(|| 0);
        ctx.settle(None, false, 0, UsageStatus::UpstreamError, None)
            .await;
        let _ = reply.send(Reply::Failed(upstream_error::reshape(status, &body)));
        return;
    }
    if x.stream {
        // If the handler is gone, the stream comes back and is dropped: it records a client abort.
        let _ = reply.send(Reply::Stream(Box::new(MeteredStream::new(
            upstream,
            StreamMeter::new(x.wants),
            ctx,
        ))));
    } else {
        relay::relay_whole(upstream, reply, ctx, x.max_body_bytes).await;
    }
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
