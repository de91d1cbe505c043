//! The metering of a whole (non-streamed) response, read from any body the caller hands in: when
//! the client goes away hyper drops the handler, which drops the body (cancelling the engine's
//! work), and the [`Pending`] guard still records the event. The event is recorded before the
//! response is released. Streams are metered by [`super::stream`].
//!
//! A whole answer without `usage` is billed from its content (counted by [`super::count`], the
//! one count every path uses; provenance `estimated`). An engine's error sent with HTTP 200
//! (`{"error":{..}}`, or vLLM's older `{"object":"error",..}`), or a JSON body that is no answer
//! to a streamed request, is handed back for the caller to relay as an error; it is recorded as
//! an upstream error with nothing billed. Every answer's `model` is the name the client asked for.
//!
//! The large-answer rule: an answer over [`WholeLimits::max_bytes`] bills what the client
//! received, which is nothing. The gateway stops reading at the limit (the connection is closed,
//! so an engine still writing stops), answers 502 `upstream_response_too_large`, and records an
//! upstream error with zero tokens. Why not stream it through: a whole answer must be read to
//! its end before its first byte leaves (the event is recorded first and the `model` renamed),
//! so passing it on means holding it; and why not bill the engine's usage: the tenant would pay
//! for an answer it never got. Only a JSON answer can be this large: every generating request
//! streams upstream (its assembled answer is bounded by `max_tokens`), so this is an engine
//! that ignored `stream`, or an embeddings batch whose vectors outgrow the limit
//! (`--max-answer-bytes`, which the operator sets above any answer it means to serve).

use std::time::Duration;

use bytes::Bytes;
use futures::{Stream, StreamExt};
use serde::Deserialize;
use serde_json::value::RawValue;

use super::borrowed::opt_str;
use super::context::{settle, Pending};
use super::count::{Field, OutputCounter, OutputTally, Part};
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

#[derive(Deserialize)]
struct WholeProbe<'a> {
    #[serde(default)]
    usage: Option<Usage>,
    #[serde(borrow, default)]
    model: Option<&'a RawValue>,
    #[serde(borrow, default)]
    choices: Option<&'a RawValue>,
    /// An embeddings answer's vectors.
    #[serde(borrow, default)]
    data: Option<&'a RawValue>,
    #[serde(borrow, default)]
    error: Option<&'a RawValue>,
    #[serde(borrow, default, deserialize_with = "opt_str")]
    object: Option<std::borrow::Cow<'a, str>>,
}

impl WholeProbe<'_> {
    /// The body is an engine's error, whatever its HTTP status said.
    fn is_error(&self) -> bool {
        self.error.is_some_and(|e| e.get() != "null") || self.object.as_deref() == Some("error")
    }

    /// The body is an answer (choices, or an embeddings answer's data) and no error.
    fn is_answer(&self) -> bool {
        !self.is_error() && (self.choices.is_some() || self.data.is_some())
    }
}

#[derive(Deserialize)]
struct ChoiceText<'a> {
    #[serde(borrow, default)]
    message: Option<MessageText<'a>>,
    #[serde(borrow, default, deserialize_with = "opt_str")]
    text: Option<std::borrow::Cow<'a, str>>,
}

#[derive(Deserialize)]
struct MessageText<'a> {
    #[serde(borrow, default, deserialize_with = "opt_str")]
    content: Option<std::borrow::Cow<'a, str>>,
    #[serde(borrow, default, deserialize_with = "opt_str")]
    reasoning_content: Option<std::borrow::Cow<'a, str>>,
    #[serde(borrow, default)]
    tool_calls: Option<&'a RawValue>,
}

/// Completion tokens of an answer that reported no usage, counted from its content by `counter`
/// (the one count of [`super::count`], as a stream's output is counted).
fn estimate_completion(choices: Option<&RawValue>, counter: &OutputCounter) -> u64 {
    let Some(list) =
        choices.and_then(|c| serde_json::from_str::<Vec<ChoiceText<'_>>>(c.get()).ok())
    else {
        return 0;
    };
    let mut tally = OutputTally::default();
    for (i, c) in list.iter().enumerate() {
        let i = u32::try_from(i).unwrap_or(u32::MAX);
        if let Some(t) = &c.text {
            tally.push(Part::content(i), t);
        }
        let Some(m) = &c.message else { continue };
        if let Some(t) = &m.content {
            tally.push(Part::content(i), t);
        }
        if let Some(t) = &m.reasoning_content {
            let part = Part {
                choice: i,
                field: Field::Reasoning,
            };
            tally.push(part, t);
        }
        if let Some(calls) = m.tool_calls {
            super::meter::tally_tool_calls(&mut tally, i, calls);
        }
    }
    tally.tokens(counter)
}

/// How reading a whole body ended, when it did not end well.
enum Broken {
    Status(UsageStatus),
    /// Over the limit.
    TooLarge,
}

/// How a whole answer ended; in every case its event is recorded.
#[derive(Debug)]
pub enum WholeOutcome {
    /// The answer, metered, with `model` rewritten to the name the client asked for.
    Answer(Bytes),
    /// A streamed request answered with something that is not an answer: the engine's error body.
    EngineError(Vec<u8>),
    /// Over [`WholeLimits::max_bytes`]: nothing relayed, nothing billed (the module doc's rule).
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
                if buf.len() + b.len() > limits.max_bytes {
                    // INVARIANT: an answer over the limit bills what the client received:
                    // nothing (test: protocol::an_oversized_answer_bills_what_the_client_received).
                    break Err(Broken::TooLarge);
                }
                buf.extend_from_slice(&b);
            }
            Some(Err(_)) => break Err(Broken::Status(UsageStatus::UpstreamError)),
            None => break Ok(()),
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
            let answer = probe.as_ref().is_some_and(WholeProbe::is_answer);
            let error = probe.as_ref().is_some_and(WholeProbe::is_error);
            if error || (limits.stream_requested && !answer) {
                // The engine's error (sent with 200), or a streamed request answered with
                // something that is not an answer: passed on in the envelope; it produced nothing
                // to bill (tests: protocol::a_json_error_to_a_streamed_request_is_passed_on,
                // sse_framing::a_json_error_with_200_is_an_upstream_error).
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
                estimate_completion(probe.choices, &ctx.counter)
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
        Err(Broken::TooLarge) => {
            tracing::warn!(
                limit = limits.max_bytes,
                "upstream answer over the size limit; not relayed, not billed"
            );
            let mut ctx = ctx;
            ctx.estimate_prompt = Box::new(|| 0);
            settle(ctx, None, false, 0, UsageStatus::UpstreamError).await;
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
    fn completion_is_estimated_from_the_content() {
        let c =
            r#"[{"message":{"content":" w1 w2 w3","reasoning_content":"r1 r2"}},{"text":"a b"}]"#;
        let raw: &RawValue = serde_json::from_str(c).unwrap();
        let words = OutputCounter::default();
        assert_eq!(estimate_completion(Some(raw), &words), 7);
        assert_eq!(estimate_completion(None, &words), 0);
    }
}
