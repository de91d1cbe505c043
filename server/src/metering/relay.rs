//! The accounting of one request ([`MeterContext`]) and the metering of a whole (non-streamed)
//! response: when the client goes away hyper drops the handler, which drops the upstream response
//! (cancelling the engine's work), and the exchange's guard still records the event. The event is
//! recorded before the response is released. Streams are metered by [`super::stream`].
//!
//! A whole answer without `usage` is billed from its content (the base's tokenizer, provenance
//! `estimated`); one over the size limit is read on (bounded) so the engine's usage at its end is
//! still billed; a JSON answer to a streamed request is either the engine's error, passed on in
//! OpenAI's envelope, or an answer that ignored `stream`, relayed whole. Every answer's `model`
//! is the name the client asked for.

use std::sync::Arc;
use std::time::Instant;

use std::time::Duration;

use bytes::Bytes;
use futures::StreamExt;
use serde::Deserialize;
use serde_json::value::RawValue;

use super::usage::{Provenance, Usage, UsageEvent, UsageSink, UsageStatus};
use crate::gateway::error::GatewayError;

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
    /// Fills in counts and outcome and hands the event to the sink. `usage_final`: `usage` is the
    /// engine's final count (else its last running one); `generated`: completion tokens counted
    /// by the gateway, billed when the engine reported no usage.
    pub async fn settle(
        self,
        usage: Option<Usage>,
        usage_final: bool,
        generated: u64,
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
                if usage_final {
                    Provenance::Engine
                } else {
                    Provenance::Partial
                },
            ),
            None => (
                (self.estimate_prompt)(),
                0,
                generated,
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
            let tokens = event.prompt_tokens.saturating_add(event.completion_tokens);
            admitted.settle(u64::try_from(tokens).unwrap_or(0)).await;
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
    Failed(GatewayError),
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

/// How a whole answer is read.
#[derive(Debug, Clone, Copy)]
pub struct WholeLimits {
    /// Largest body relayed.
    pub max_bytes: usize,
    /// Longest silence between two reads of the body.
    pub read_timeout: Duration,
    /// The client asked for a stream (the engine answered JSON instead).
    pub stream_requested: bool,
}

/// How much of an oversized body's end is kept to find the engine's usage in it.
const TAIL_BYTES: usize = 64 * 1024;
/// How far past the limit an oversized body is read for its usage before it is closed.
const OVERSIZE_READ_FACTOR: usize = 4;

#[derive(Deserialize)]
struct WholeProbe<'a> {
    #[serde(default)]
    usage: Option<Usage>,
    #[serde(borrow, default)]
    model: Option<&'a RawValue>,
    #[serde(borrow, default)]
    choices: Option<&'a RawValue>,
}

#[derive(Deserialize)]
struct ChoiceText<'a> {
    #[serde(borrow, default)]
    message: Option<MessageText<'a>>,
    #[serde(borrow, default)]
    text: Option<std::borrow::Cow<'a, str>>,
}

#[derive(Deserialize)]
struct MessageText<'a> {
    #[serde(borrow, default)]
    content: Option<std::borrow::Cow<'a, str>>,
    #[serde(borrow, default)]
    reasoning_content: Option<std::borrow::Cow<'a, str>>,
    #[serde(borrow, default)]
    tool_calls: Option<&'a RawValue>,
}

/// Completion tokens of an answer that reported no usage, counted from its content with the
/// base's tokenizer (what the stream path counts from its chunks).
fn estimate_completion(choices: Option<&RawValue>) -> u64 {
    use tf_engine_sim::tokenizer::count_text;
    let Some(list) =
        choices.and_then(|c| serde_json::from_str::<Vec<ChoiceText<'_>>>(c.get()).ok())
    else {
        return 0;
    };
    list.iter()
        .map(|c| {
            let text = c.text.as_deref().map_or(0, count_text);
            let message = c.message.as_ref().map_or(0, |m| {
                m.content.as_deref().map_or(0, count_text)
                    + m.reasoning_content.as_deref().map_or(0, count_text)
                    + m.tool_calls.map_or(0, |t| count_text(t.get()))
            });
            u64::from(text) + u64::from(message)
        })
        .sum()
}

/// The engine's `usage` near the end of a body too large to parse whole (engines write it last).
fn usage_in_tail(tail: &[u8]) -> Option<Usage> {
    const KEY: &[u8] = b"\"usage\"";
    let at = memchr::memmem::rfind(tail, KEY)?;
    if at > 0 && tail.get(at - 1) == Some(&b'\\') {
        return None;
    }
    let rest = tail.get(at + KEY.len()..)?;
    let colon = rest.iter().position(|b| !b.is_ascii_whitespace())?;
    if rest.get(colon) != Some(&b':') {
        return None;
    }
    let mut de = serde_json::Deserializer::from_slice(rest.get(colon + 1..)?);
    Usage::deserialize(&mut de).ok()
}

/// How reading a whole body ended, when it did not end well.
enum Broken {
    Status(UsageStatus),
    /// Over the limit: the engine's usage found at its end, if any.
    TooLarge(Option<Usage>),
}

/// Reads a non-streamed response, meters it, records the event and returns the response. The
/// accounting stays in `pending` while the body is read, so a hang-up then is still recorded.
pub async fn relay_whole(
    upstream: crate::gateway::upstream_conn::UpstreamResponse,
    pending: &mut crate::gateway::exchange::Pending,
    limits: WholeLimits,
) -> Reply {
    use crate::gateway::exchange::settle;
    let status = upstream.status;
    let content_type = upstream.headers.get(http::header::CONTENT_TYPE).cloned();
    let cut = pending.cut();
    let mut body = upstream.body;
    let mut buf = Vec::new();
    let mut total = 0usize;
    let mut oversize: Option<Vec<u8>> = None;
    let outcome: Result<(), Broken> = loop {
        let next = tokio::select! {
            biased;
            () = cut.cancelled() => break Err(Broken::Status(UsageStatus::Interrupted)),
            next = tokio::time::timeout(limits.read_timeout, body.next()) => next,
        };
        let Ok(next) = next else {
            tracing::warn!("upstream fell silent mid-body; cut");
            break Err(Broken::Status(UsageStatus::UpstreamError));
        };
        match next {
            Some(Ok(b)) => {
                total += b.len();
                if let Some(tail) = oversize.as_mut() {
                    // INVARIANT: an answer over the limit still bills the engine's usage (test:
                    // protocol::an_oversized_answer_bills_the_engine_usage).
                    tail.extend_from_slice(&b);
                    if tail.len() > 2 * TAIL_BYTES {
                        tail.drain(..tail.len() - TAIL_BYTES);
                    }
                    if total > limits.max_bytes.saturating_mul(OVERSIZE_READ_FACTOR) {
                        break Err(Broken::TooLarge(usage_in_tail(tail)));
                    }
                } else if buf.len() + b.len() <= limits.max_bytes {
                    buf.extend_from_slice(&b);
                } else {
                    buf.extend_from_slice(&b);
                    let keep = buf.len().saturating_sub(TAIL_BYTES);
                    oversize = Some(buf.split_off(keep));
                    buf = Vec::new();
                }
            }
            Some(Err(_)) => break Err(Broken::Status(UsageStatus::UpstreamError)),
            None => match &oversize {
                Some(tail) => break Err(Broken::TooLarge(usage_in_tail(tail))),
                None => break Ok(()),
            },
        }
    };
    drop(body);
    let Some(ctx) = pending.take() else {
        return Reply::Failed(GatewayError::UpstreamUnavailable);
    };
    match outcome {
        Ok(()) => {
            let served = ctx.event.served_name.clone();
            let probe = serde_json::from_slice::<WholeProbe<'_>>(&buf).ok();
            let answer = probe.as_ref().is_some_and(|p| p.choices.is_some());
            if limits.stream_requested && !answer {
                // A streamed request answered with something that is not an answer: the engine's
                // error, passed on in the envelope; it produced nothing to bill (test:
                // protocol::a_json_error_to_a_streamed_request_is_passed_on).
                let mut ctx = ctx;
                ctx.estimate_prompt = Box::new(|| 0);
                settle(ctx, None, false, 0, UsageStatus::UpstreamError).await;
                return Reply::Failed(crate::gateway::upstream_error::reshape(status, &buf));
            }
            let Some(probe) = probe else {
                settle(ctx, None, true, 0, UsageStatus::Ok).await;
                return whole(status, content_type, Bytes::from(buf));
            };
            let generated = if probe.usage.is_none() {
                estimate_completion(probe.choices)
            } else {
                0
            };
            let model = probe
                .model
                .and_then(|m| super::edit::locate(&buf, &buf, m.get().as_bytes()));
            let usage = probe.usage;
            settle(ctx, usage, true, generated, UsageStatus::Ok).await;
            let buf = Bytes::from(buf);
            let body = match (model, serde_json::to_vec(&served)) {
                (Some(span), Ok(name)) => super::edit::apply(&buf, Some((span, &name)), None),
                _ => buf,
            };
            whole(status, content_type, body)
        }
        Err(Broken::TooLarge(usage)) => {
            tracing::warn!(bytes = total, "upstream answer over the size limit");
            settle(ctx, usage, usage.is_some(), 0, UsageStatus::UpstreamError).await;
            Reply::Failed(GatewayError::UpstreamTooLarge(limits.max_bytes))
        }
        Err(Broken::Status(status)) => {
            settle(ctx, None, false, 0, status).await;
            Reply::Failed(GatewayError::UpstreamUnavailable)
        }
    }
}

fn whole(status: http::StatusCode, content_type: Option<http::HeaderValue>, body: Bytes) -> Reply {
    Reply::Whole(WholeResponse {
        status,
        content_type,
        body,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn usage_is_found_at_the_end_of_a_truncated_body() {
        let tail = br#"w1 w2 \"usage\" w3"}}],"usage": {"prompt_tokens":7,"completion_tokens":40,"total_tokens":47}}"#;
        let u = usage_in_tail(tail).unwrap();
        assert_eq!((u.prompt_tokens, u.completion_tokens), (7, 40));
        assert_eq!(usage_in_tail(br#"w1 w2 \"usage\": 3"#), None);
    }

    #[test]
    fn completion_is_estimated_from_the_content() {
        let c =
            r#"[{"message":{"content":" w1 w2 w3","reasoning_content":"r1 r2"}},{"text":"a b"}]"#;
        let raw: &RawValue = serde_json::from_str(c).unwrap();
        assert_eq!(estimate_completion(Some(raw)), 7);
        assert_eq!(estimate_completion(None), 0);
    }
}
