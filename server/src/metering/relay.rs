//! The accounting of one request ([`MeterContext`]) and the metering of a whole (non-streamed)
//! response: when the client goes away hyper drops the handler, which drops the upstream response
//! (cancelling the engine's work), and the exchange's guard still records the event. The event is
//! recorded before the response is released. Streams are metered by [`super::stream`].

use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;
use futures::StreamExt;

use super::usage::{Provenance, Usage, UsageEvent, UsageSink, UsageStatus};

/// Everything needed to finish the usage event of one request.
pub struct MeterContext {
    /// The event with identity fields filled and zero tokens.
    pub event: UsageEvent,
    pub started: Instant,
    /// Prompt tokens by the base's tokenizer, computed only if the engine never reported usage.
    pub estimate_prompt: Box<dyn FnOnce() -> u64 + Send>,
    pub sink: Arc<dyn UsageSink>,
    /// Fires at the shutdown deadline: the stream is cut, billed and ended with an error event.
    pub cut: tokio_util::sync::CancellationToken,
    /// The request's hold on its limits: settled from the final event below; dropped unsettled
    /// (error path, panic) it frees its slots by itself.
    pub admitted: Option<crate::quota::Admitted>,
    /// Where a hung-up stream's accounting runs (shutdown waits for it).
    pub tracker: tokio_util::task::TaskTracker,
}

impl MeterContext {
    /// Fills in counts and outcome and hands the event to the sink.
    pub async fn settle(
        self,
        usage: Option<Usage>,
        completed: bool,
        generated_chunks: u64,
        status: UsageStatus,
        ttft_ms: Option<i32>,
    ) -> UsageEvent {
        let admitted = self.admitted;
        let mut event = self.event;
        let (prompt, cached, completion, provenance) = match usage {
            Some(u) => (
                u.prompt_tokens,
                u.cached_tokens(),
                u.completion_tokens,
                if completed {
                    Provenance::Engine
                } else {
                    Provenance::Partial
                },
            ),
            None => (
                (self.estimate_prompt)(),
                0,
                generated_chunks,
                Provenance::Estimated,
            ),
        };
        event.prompt_tokens = clamp_i64(prompt);
        event.cached_tokens = clamp_i64(cached);
        event.completion_tokens = clamp_i64(completion);
        event.provenance = provenance;
        event.status = status;
        event.ttft_ms = ttft_ms;
        event.duration_ms = i32::try_from(self.started.elapsed().as_millis()).unwrap_or(i32::MAX);
        // Quota first: the spend is queued for Redis before the event exists, and every writer
        // to PostgreSQL waits until Redis has it (`Quota::spend_flushed`), so Redis never counts
        // less than PostgreSQL has billed and the reconciler only ever raises counters.
        if let Some(admitted) = admitted {
            admitted.settle(&event).await;
        }
        if let Err(e) = self.sink.record(&event).await {
            tracing::error!(request_id = %event.request_id, error = %e, "usage event not recorded");
        }
        event
    }
}

fn clamp_i64(n: u64) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

/// What the exchange hands the handler.
pub enum Reply {
    /// No usable answer; the event is already recorded.
    Failed(crate::gateway::error::GatewayError),
    /// A stream: the handler returns it as the body.
    Stream(Box<super::stream::MeteredStream>),
    /// A whole, metered response.
    Whole(WholeResponse),
}

/// A non-streamed upstream answer, relayed whole once metered.
pub struct WholeResponse {
    pub status: http::StatusCode,
    pub content_type: Option<http::HeaderValue>,
    pub body: Bytes,
}

#[derive(serde::Deserialize)]
struct UsageProbe {
    #[serde(default)]
    usage: Option<Usage>,
}

/// Reads a non-streamed response, meters it, records the event and returns the response. The
/// accounting stays in `pending` while the body is read, so a hang-up then is still recorded.
pub async fn relay_whole(
    upstream: crate::gateway::upstream_conn::UpstreamResponse,
    pending: &mut crate::gateway::exchange::Pending,
    max_bytes: usize,
) -> Reply {
    use crate::gateway::exchange::settle;
    let status = upstream.status;
    let content_type = upstream.headers.get(http::header::CONTENT_TYPE).cloned();
    let cut = pending.cut();
    let mut body = upstream.body;
    let mut buf = Vec::new();
    let outcome: Result<(), UsageStatus> = loop {
        let next = tokio::select! {
            biased;
            () = cut.cancelled() => break Err(UsageStatus::Interrupted),
            next = body.next() => next,
        };
        match next {
            Some(Ok(b)) if buf.len() + b.len() <= max_bytes => buf.extend_from_slice(&b),
            Some(Ok(_)) | Some(Err(_)) => break Err(UsageStatus::UpstreamError),
            None => break Ok(()),
        }
    };
    drop(body);
    let Some(ctx) = pending.take() else {
        return Reply::Failed(crate::gateway::error::GatewayError::UpstreamUnavailable);
    };
    match outcome {
        Ok(()) => {
            let usage = serde_json::from_slice::<UsageProbe>(&buf)
                .ok()
                .and_then(|p| p.usage);
            settle(ctx, usage, true, UsageStatus::Ok).await;
            Reply::Whole(WholeResponse {
                status,
                content_type,
                body: Bytes::from(buf),
            })
        }
        Err(status) => {
            settle(ctx, None, false, status).await;
            Reply::Failed(crate::gateway::error::GatewayError::UpstreamUnavailable)
        }
    }
}
