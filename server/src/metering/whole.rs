//! The metering of a whole (non-streamed) response, read from any body the caller hands in: when
//! the client goes away hyper drops the handler, which drops the body (cancelling the engine's
//! work), and the [`Pending`] guard still records the event. The event is recorded before the
//! response is released. Streams are metered by [`super::stream`].
//!
//! A whole answer without `usage` is billed from its content (counted in words by the gateway,
//! provenance `estimated`); one over the size limit is read on (bounded) so the engine's usage at
//! its end is still billed; a JSON answer to a streamed request is either the engine's error
//! (handed back for the caller to pass on) or an answer that ignored `stream`, relayed whole.
//! Every answer's `model` is the name the client asked for.

use std::time::Duration;

use bytes::Bytes;
use futures::{Stream, StreamExt};
use serde::Deserialize;
use serde_json::value::RawValue;

use super::context::{settle, Pending};
use crate::usage::{Usage, UsageStatus};

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

/// Completion tokens of an answer that reported no usage, counted from its content in words (the
/// simulator's tokenizer; what the stream path counts from its chunks).
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

/// How a whole answer ended; in every case its event is recorded.
#[derive(Debug)]
pub enum WholeOutcome {
    /// The answer, metered, with `model` rewritten to the name the client asked for.
    Answer(Bytes),
    /// A streamed request answered with something that is not an answer: the engine's error body.
    EngineError(Vec<u8>),
    /// Over [`WholeLimits::max_bytes`] (billed with the engine's usage found at its end, if any).
    TooLarge,
    /// Broken, cut, silent too long, or the accounting was already handed on.
    Broken,
}

/// Reads a non-streamed response body, meters it and records the event. The accounting stays in
/// `pending` while the body is read, so a hang-up then is still recorded.
pub async fn read_whole<B, E>(
    mut body: B,
    pending: &mut Pending,
    limits: WholeLimits,
) -> WholeOutcome
where
    B: Stream<Item = Result<Bytes, E>> + Unpin,
{
    let cut = pending.cut();
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
        return WholeOutcome::Broken;
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
                return WholeOutcome::EngineError(buf);
            }
            let Some(probe) = probe else {
                settle(ctx, None, true, 0, UsageStatus::Ok).await;
                return WholeOutcome::Answer(Bytes::from(buf));
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
            WholeOutcome::Answer(body)
        }
        Err(Broken::TooLarge(usage)) => {
            tracing::warn!(bytes = total, "upstream answer over the size limit");
            settle(ctx, usage, usage.is_some(), 0, UsageStatus::UpstreamError).await;
            WholeOutcome::TooLarge
        }
        Err(Broken::Status(status)) => {
            settle(ctx, None, false, 0, status).await;
            WholeOutcome::Broken
        }
    }
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
