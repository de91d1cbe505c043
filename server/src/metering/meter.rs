//! The per-stream meter: looks at each SSE event once, captures usage from whichever chunk
//! carries it, and decides what the client receives. A client that did not ask for usage never
//! sees the usage chunk or a `usage` member (OpenAI omits it); a client that asked gets the
//! engine's usage exactly as sent, and `usage: null` on chunks whose running usage it did not
//! ask for. Every chunk's `model` is the name the client asked for. Events that need no change
//! are forwarded as the engine's raw bytes; the others are byte-span edits ([`super::edit`]).

use std::borrow::Cow;

use bytes::Bytes;
use serde::Deserialize;
use serde_json::value::RawValue;

use super::assemble::Assembler;
use super::borrowed::{from_event, opt_str};
use super::chunk::Chunk;
use super::count::{Field, OutputCounter, OutputTally, Part};
use super::edit::{self, Span, UsageEdit};
use super::sse::SseEvent;
use super::typed::{Dialect, TypedMeter};
use crate::usage::Usage;

/// Most distinct finish reasons kept per stream (an engine names a handful at most).
pub const MAX_FINISH_REASONS: usize = 8;

/// What the client asked for in `stream_options`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ClientWants {
    pub usage: bool,
    pub continuous: bool,
}

/// What to send to the client.
#[derive(Debug, PartialEq, Eq)]
pub enum Outgoing {
    Send(Bytes),
    /// The stream's final bytes (`[DONE]`): the event must be recorded before they leave.
    Done(Bytes),
}

/// The text of a streamed tool call: its function's name and arguments pieces.
#[derive(Deserialize)]
pub(crate) struct ToolCallProbe<'a> {
    #[serde(borrow, default)]
    function: Option<FunctionProbe<'a>>,
}

#[derive(Deserialize)]
struct FunctionProbe<'a> {
    #[serde(borrow, default, deserialize_with = "opt_str")]
    name: Option<Cow<'a, str>>,
    #[serde(borrow, default, deserialize_with = "opt_str")]
    arguments: Option<Cow<'a, str>>,
}

/// Adds a `tool_calls` value's names and arguments to `tally` as `choice`'s tool text.
pub(crate) fn tally_tool_calls(tally: &mut OutputTally, choice: u32, calls: &RawValue) {
    let part = Part {
        choice,
        field: Field::Tool,
    };
    let Ok(calls) = serde_json::from_str::<Vec<ToolCallProbe<'_>>>(calls.get()) else {
        return;
    };
    for f in calls.iter().filter_map(|c| c.function.as_ref()) {
        if let Some(name) = &f.name {
            // A name is a word of its own, not glued to the arguments before it.
            tally.push(part, " ");
            tally.push(part, name);
            tally.push(part, " ");
        }
        if let Some(args) = &f.arguments {
            tally.push(part, args);
        }
    }
}

/// What one chunk says, as far as metering cares.
struct ChunkInfo {
    /// Byte range of the top-level `usage` value inside the event's raw bytes (`null` included).
    usage_span: Option<Span>,
    /// The usage value is not `null`.
    has_usage: bool,
    /// Byte range of the top-level `model` value.
    model_span: Option<Span>,
    /// No choices (`[]` or no `choices` key at all) and a usage value: the usage chunk.
    usage_only: bool,
    generated: bool,
    finished: bool,
    /// The finish reasons this chunk's choices give (empty for almost every chunk).
    finish_reasons: Vec<String>,
    error: bool,
}

/// What `chunk` says; its output text goes to `tally` when given (the engine reported no usage
/// yet).
fn inspect(
    chunk: &Chunk<'_>,
    raw: &Bytes,
    data: &Bytes,
    tally: Option<&mut OutputTally>,
) -> ChunkInfo {
    let choices = chunk.choices();
    if let Some(tally) = tally {
        for c in choices {
            if let Some(t) = &c.text {
                tally.push(Part::content(c.index), t);
            }
            let Some(d) = &c.delta else { continue };
            if let Some(t) = &d.content {
                tally.push(Part::content(c.index), t);
            }
            if let Some(t) = &d.reasoning_content {
                let part = Part {
                    choice: c.index,
                    field: Field::Reasoning,
                };
                tally.push(part, t);
            }
            if let Some(calls) = d.tool_calls {
                tally_tool_calls(tally, c.index, calls);
            }
        }
    }
    // Values are located, not parsed: only the last usage seen is ever parsed.
    let usage_span = chunk
        .usage
        .and_then(|u| edit::locate(raw, data, u.get().as_bytes()));
    let has_usage = chunk.usage().is_some();
    let model_span = chunk
        .model
        .and_then(|m| edit::locate(raw, data, m.get().as_bytes()));
    let generated = choices.iter().any(|c| {
        c.text.as_deref().is_some_and(|t| !t.is_empty())
            || c.delta.as_ref().is_some_and(|d| {
                d.content.as_deref().is_some_and(|t| !t.is_empty())
                    || d.reasoning_content
                        .as_deref()
                        .is_some_and(|t| !t.is_empty())
                    || d.tool_calls.is_some()
            })
    });
    ChunkInfo {
        // INVARIANT: a chunk without `choices` is a usage chunk, not a content chunk (test:
        // usage_chunk_without_choices_is_the_usage_chunk).
        usage_only: choices.is_empty() && has_usage,
        finished: choices.iter().any(|c| c.finish_reason.is_some()),
        finish_reasons: choices
            .iter()
            .filter_map(|c| c.finish_reason().map(Cow::into_owned))
            .collect(),
        usage_span,
        has_usage,
        model_span,
        generated,
        // INVARIANT: both vLLM error shapes end the stream as an engine error, never as output
        // (test: sse_framing::an_error_inside_a_stream_is_not_billed_as_output).
        error: chunk.is_error(),
    }
}

/// A finished chunk with usage, held back one event.
#[derive(Debug)]
struct Held {
    raw: Bytes,
    model: Option<Span>,
    usage: Span,
}

/// Accounting state of one stream.
#[derive(Debug, Default)]
pub struct StreamMeter {
    wants: ClientWants,
    /// The served name as a JSON string, written into every chunk's `model`.
    served_model: Option<Bytes>,
    /// The raw `usage` value of the last chunk that carried one.
    last_usage: Option<Bytes>,
    /// The last usage came from the usage chunk or a finished chunk: the engine's final count.
    usage_final: bool,
    generated_chunks: u64,
    saw_done: bool,
    saw_error: bool,
    /// The distinct finish reasons seen, first ones first (a trace attribute; bounded).
    finish_reasons: Vec<String>,
    /// A finished chunk with usage held back one event, to learn whether the engine sends a
    /// separate usage chunk (then the client gets that one) or none (then this one is it).
    held: Option<Held>,
    /// Comments and data-less events that arrived while a chunk was held, sent after it.
    behind_held: Vec<Bytes>,
    /// The event protocol: chunks (chat, completions) or typed events (Responses, Anthropic),
    /// whose accounting is `typed`'s.
    dialect: Dialect,
    typed: TypedMeter,
    /// How output text is counted when the engine reports no usage.
    counter: OutputCounter,
    /// The output text, kept only until the engine reports usage.
    tally: OutputTally,
    /// A whole answer is being assembled: each chunk goes there once parsed, and nothing but the
    /// stream's end is sent on (the client gets the assembled answer, not the chunks).
    assembler: Option<Box<Assembler>>,
}

impl StreamMeter {
    pub fn new(wants: ClientWants) -> Self {
        Self {
            wants,
            ..Self::default()
        }
    }

    /// Meters a stream of `dialect` (the default: chunks).
    #[must_use]
    pub fn with_dialect(mut self, dialect: Dialect) -> Self {
        self.dialect = dialect;
        self
    }

    /// Counts output by `counter` (the base's tokenizer) when the engine reports no usage.
    #[must_use]
    pub fn with_counter(mut self, counter: OutputCounter) -> Self {
        self.typed.set_counter(counter.clone());
        self.counter = counter;
        self
    }

    /// Assembles a whole answer from the chunks as they are metered (one parse per event for
    /// both): the stream then yields only its end (`[DONE]` or an error event), and the answer is
    /// taken with [`Self::take_assembler`]. Chunk dialect only.
    #[must_use]
    pub fn assembling(mut self, assembler: Assembler) -> Self {
        self.assembler = Some(Box::new(assembler));
        self
    }

    /// The answer assembled so far (see [`Self::assembling`]).
    pub fn take_assembler(&mut self) -> Option<Assembler> {
        self.assembler.take().map(|a| *a)
    }

    /// The stream's event protocol.
    pub fn dialect(&self) -> Dialect {
        self.dialect
    }

    /// Writes `served` (the name the client asked for) into every chunk's `model`.
    pub fn with_served_model(mut self, served: &str) -> Self {
        self.served_model = serde_json::to_vec(served).ok().map(Bytes::from);
        self
    }

    /// Usage captured so far (the engine's final usage once the stream completed).
    pub fn last_usage(&self) -> Option<Usage> {
        if self.dialect != Dialect::Chunks {
            return self.typed.usage();
        }
        self.last_usage.as_ref().and_then(|raw| from_event(raw))
    }
    /// Whether the usage captured is the engine's final count (the usage chunk, or usage on a
    /// finished chunk), not a running count of a stream that ended early.
    pub fn usage_final(&self) -> bool {
        if self.dialect != Dialect::Chunks {
            return self.typed.usage_final();
        }
        self.usage_final && self.last_usage.is_some()
    }
    /// What was relayed so far, for the in-flight record: the engine's running counts when it
    /// sends them, else the generated chunks.
    pub fn progress(&self) -> crate::journal::inflight::Progress {
        match self.last_usage() {
            Some(u) => crate::journal::inflight::Progress {
                prompt: Some(u.prompt_tokens),
                cached: Some(u.cached_tokens()),
                completion: u.completion_tokens,
            },
            None => crate::journal::inflight::Progress {
                prompt: None,
                cached: None,
                completion: self.generated_tokens(),
            },
        }
    }

    /// Completion tokens counted from the output text (billed when the engine reported no usage;
    /// 0 once it did, the text being dropped then).
    pub fn generated_tokens(&self) -> u64 {
        if self.dialect != Dialect::Chunks {
            return self.typed.generated_tokens();
        }
        self.tally.tokens(&self.counter)
    }

    /// Chunks (or typed deltas) that carried generated output.
    pub fn generated_chunks(&self) -> u64 {
        if self.dialect != Dialect::Chunks {
            return self.typed.generated();
        }
        self.generated_chunks
    }
    /// Whether the engine ended the stream properly.
    pub fn completed(&self) -> bool {
        if self.dialect != Dialect::Chunks {
            return self.typed.completed();
        }
        self.saw_done
    }
    /// Whether the engine reported an error inside the stream.
    pub fn saw_error(&self) -> bool {
        if self.dialect != Dialect::Chunks {
            return self.typed.saw_error();
        }
        self.saw_error
    }
    /// The distinct finish reasons the engine gave (`stop`, `length`, ...), at most
    /// [`MAX_FINISH_REASONS`].
    pub fn finish_reasons(&self) -> &[String] {
        &self.finish_reasons
    }

    /// How a chunk's usage is changed when the client must not see it.
    fn hidden(&self) -> UsageEdit {
        if self.wants.usage {
            UsageEdit::Null
        } else {
            UsageEdit::Remove
        }
    }

    fn emit(&self, raw: &Bytes, model: Option<Span>, usage: Option<(Span, UsageEdit)>) -> Bytes {
        let model = model.zip(self.served_model.as_deref());
        edit::apply(raw, model, usage)
    }

    fn release_held(&mut self, keep_usage: bool, out: &mut Vec<Outgoing>) {
        if let Some(held) = self.held.take() {
            let usage = if keep_usage {
                UsageEdit::Keep
            } else {
                self.hidden()
            };
            out.push(Outgoing::Send(self.emit(
                &held.raw,
                held.model,
                Some((held.usage, usage)),
            )));
        }
        out.extend(self.behind_held.drain(..).map(Outgoing::Send));
    }

    /// An event the meter does not read (a comment or keep-alive, or data that is no chunk): it
    /// says nothing about a held chunk, so it waits behind it; a whole answer sends none.
    fn pass_on(&mut self, raw: Bytes, out: &mut Vec<Outgoing>) {
        if self.assembler.is_some() {
            return;
        }
        if self.held.is_some() {
            self.behind_held.push(raw);
        } else {
            out.push(Outgoing::Send(raw));
        }
    }

    /// The engine's body ended without `[DONE]`: a held chunk's usage was the final one.
    pub fn on_end(&mut self, out: &mut Vec<Outgoing>) {
        self.release_held(self.wants.usage, out);
    }

    /// Takes one upstream event; appends what the client should receive to `out`.
    pub fn on_event(&mut self, event: SseEvent, out: &mut Vec<Outgoing>) {
        if self.dialect != Dialect::Chunks {
            self.on_typed_event(event, out);
            return;
        }
        let Some(data) = &event.data else {
            self.pass_on(event.raw, out);
            return;
        };
        if data.as_ref() == b"[DONE]" {
            // No separate usage chunk came: the held chunk's usage is the final one.
            self.release_held(self.wants.usage, out);
            self.saw_done = true;
            out.push(Outgoing::Done(event.raw));
            return;
        }
        let Some(chunk) = Chunk::parse(data) else {
            self.pass_on(event.raw, out);
            return;
        };
        let tally = self.last_usage.is_none().then_some(&mut self.tally);
        let info = inspect(&chunk, &event.raw, data, tally);
        if let Some(assembler) = &mut self.assembler {
            assembler.add(chunk);
        }
        self.saw_error |= info.error;
        for reason in info.finish_reasons {
            if self.finish_reasons.len() < MAX_FINISH_REASONS
                && !self.finish_reasons.contains(&reason)
            {
                self.finish_reasons.push(reason);
            }
        }
        if let (true, Some((start, end))) = (info.has_usage, info.usage_span) {
            if self.last_usage.is_none() {
                self.tally.clear();
            }
            self.last_usage = Some(event.raw.slice(start..end));
            self.usage_final = info.usage_only || info.finished;
        } else if info.generated {
            // Output after the last count: that count is no longer the final one.
            self.usage_final = false;
        }
        if info.generated {
            self.generated_chunks += 1;
        }
        if self.assembler.is_some() {
            return;
        }
        if info.usage_only {
            self.release_held(self.wants.continuous, out);
            if self.wants.usage {
                out.push(Outgoing::Send(self.emit(&event.raw, info.model_span, None)));
            }
            return;
        }
        self.release_held(false, out);
        let usage = match info.usage_span {
            Some(span) if !self.wants.continuous => {
                if info.finished && info.has_usage && self.wants.usage {
                    self.held = Some(Held {
                        raw: event.raw,
                        model: info.model_span,
                        usage: span,
                    });
                    return;
                }
                Some((span, self.hidden()))
            }
            _ => None,
        };
        out.push(Outgoing::Send(self.emit(
            &event.raw,
            info.model_span,
            usage,
        )));
    }
}

impl StreamMeter {
    /// A typed event goes to the client as sent, its holder's `model` renamed; the event that
    /// completes the stream (`response.completed`, `message_stop`) is its final bytes, released
    /// only once the event is recorded.
    fn on_typed_event(&mut self, event: SseEvent, out: &mut Vec<Outgoing>) {
        let Some(data) = &event.data else {
            out.push(Outgoing::Send(event.raw));
            return;
        };
        let was_complete = self.typed.completed();
        let seen = self.typed.on_data(self.dialect, &event.raw, data);
        let bytes = self.emit(&event.raw, seen.model, None);
        if self.typed.completed() && !was_complete {
            out.push(Outgoing::Done(bytes));
        } else {
            out.push(Outgoing::Send(bytes));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metering::sse::SseParser;

    fn run_meter(engine: &str, mut m: StreamMeter) -> (Vec<String>, StreamMeter) {
        let mut p = SseParser::default();
        p.push(Bytes::copy_from_slice(engine.as_bytes()));
        let mut out = Vec::new();
        while let Some(e) = p.next_event() {
            m.on_event(e, &mut out);
        }
        let sent = out
            .into_iter()
            .map(|o| match o {
                Outgoing::Send(b) | Outgoing::Done(b) => String::from_utf8(b.to_vec()).unwrap(),
            })
            .collect();
        (sent, m)
    }

    fn run(engine: &str, wants: ClientWants) -> (Vec<String>, StreamMeter) {
        run_meter(engine, StreamMeter::new(wants))
    }

    const ASKED: ClientWants = ClientWants {
        usage: true,
        continuous: false,
    };
    const U1: &str = r#"{"prompt_tokens":5,"completion_tokens":1,"total_tokens":6}"#;
    const U2: &str = r#"{"prompt_tokens":5,"completion_tokens":2,"total_tokens":7,"prompt_tokens_details":{"cached_tokens":3}}"#;

    fn chunk(content: &str, finish: &str, usage: &str) -> String {
        format!(
            "data: {{\"id\":\"c\",\"choices\":[{{\"index\":0,\"delta\":{{\"content\":\"{content}\"}},\"finish_reason\":{finish}}}],\"usage\":{usage}}}\n\n"
        )
    }

    /// A chunk as OpenAI sends it to a client that did not ask for usage: no `usage` member.
    fn bare(content: &str, finish: &str) -> String {
        format!(
            "data: {{\"id\":\"c\",\"choices\":[{{\"index\":0,\"delta\":{{\"content\":\"{content}\"}},\"finish_reason\":{finish}}}]}}\n\n"
        )
    }

    #[test]
    fn finish_reasons_are_kept_once_each() {
        let two = "data: {\"id\":\"c\",\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"stop\"},{\"index\":1,\"delta\":{},\"finish_reason\":\"length\"}]}\n\n";
        let engine = [
            chunk(" a", "null", "null"),
            chunk(" b", "\"length\"", "null"),
            two.into(),
            "data: [DONE]\n\n".into(),
        ]
        .concat();
        let (_, m) = run(&engine, ClientWants::default());
        assert_eq!(m.finish_reasons(), ["length", "stop"]);
    }

    #[test]
    fn separate_usage_chunk_reaches_only_clients_that_asked() {
        let usage_chunk = format!("data: {{\"id\":\"c\",\"choices\":[],\"usage\":{U2}}}\n\n");
        let engine = [
            chunk(" a", "null", "null"),
            chunk(" b", "\"length\"", "null"),
            usage_chunk.clone(),
            "data: [DONE]\n\n".into(),
        ]
        .concat();
        let (sent, m) = run(&engine, ClientWants::default());
        assert_eq!(
            sent,
            vec![
                bare(" a", "null"),
                bare(" b", "\"length\""),
                "data: [DONE]\n\n".into()
            ]
        );
        assert_eq!(m.last_usage().unwrap().completion_tokens, 2);
        assert_eq!(m.last_usage().unwrap().cached_tokens(), 3);
        assert!(m.completed() && m.usage_final());
        let (sent, _) = run(&engine, ASKED);
        assert_eq!(sent.concat(), engine);
    }

    #[test]
    fn forced_continuous_usage_is_stripped_bytes_exactly() {
        let engine = [
            chunk(" a", "null", U1),
            chunk(" b", "\"length\"", U2),
            format!("data: {{\"id\":\"c\",\"choices\":[],\"usage\":{U2}}}\n\n"),
            "data: [DONE]\n\n".into(),
        ]
        .concat();
        let (sent, m) = run(&engine, ClientWants::default());
        assert_eq!(
            sent,
            vec![
                bare(" a", "null"),
                bare(" b", "\"length\""),
                "data: [DONE]\n\n".into()
            ]
        );
        assert_eq!(m.generated_chunks(), 2);
        let (sent, _) = run(&engine, ASKED);
        assert_eq!(
            sent[2],
            format!("data: {{\"id\":\"c\",\"choices\":[],\"usage\":{U2}}}\n\n")
        );
        assert_eq!(sent[1], chunk(" b", "\"length\"", "null"));
        let (sent, _) = run(
            &engine,
            ClientWants {
                usage: true,
                continuous: true,
            },
        );
        assert_eq!(sent.concat(), engine);
    }

    #[test]
    fn usage_on_last_content_chunk_is_kept_for_clients_that_asked() {
        let engine = [
            chunk(" a", "null", "null"),
            chunk(" b", "\"stop\"", U2),
            "data: [DONE]\n\n".into(),
        ]
        .concat();
        let (sent, m) = run(&engine, ASKED);
        assert_eq!(sent.concat(), engine);
        assert_eq!(m.last_usage().unwrap().completion_tokens, 2);
        let (sent, _) = run(&engine, ClientWants::default());
        assert_eq!(sent[1], bare(" b", "\"stop\""));
    }

    #[test]
    fn usage_chunk_without_choices_is_the_usage_chunk() {
        // Some engines omit `choices` on the usage chunk instead of sending `[]`.
        let usage_chunk = format!("data: {{\"id\":\"c\",\"usage\":{U2}}}\n\n");
        let engine = [
            chunk(" a", "\"stop\"", "null"),
            usage_chunk.clone(),
            "data: [DONE]\n\n".into(),
        ]
        .concat();
        let (sent, m) = run(&engine, ASKED);
        assert_eq!(sent.concat(), engine);
        assert!(m.usage_final());
        let (sent, _) = run(&engine, ClientWants::default());
        assert_eq!(
            sent,
            vec![bare(" a", "\"stop\""), "data: [DONE]\n\n".into()]
        );
    }

    #[test]
    fn comments_before_done_leave_the_held_usage_alone() {
        let engine = [
            chunk(" a", "null", "null"),
            chunk(" b", "\"stop\"", U2),
            ": keep-alive\n\n".into(),
            "event: ping\n\n".into(),
            "data: [DONE]\n\n".into(),
        ]
        .concat();
        let (sent, _) = run(&engine, ASKED);
        assert_eq!(sent.concat(), engine, "the final usage is not stripped");
        let (sent, _) = run(&engine, ClientWants::default());
        assert_eq!(
            sent.concat(),
            [
                bare(" a", "null"),
                bare(" b", "\"stop\""),
                ": keep-alive\n\nevent: ping\n\ndata: [DONE]\n\n".into()
            ]
            .concat()
        );
    }

    #[test]
    fn every_chunk_carries_the_served_model_name() {
        let c = |model: &str, usage: &str| {
            format!("data: {{\"id\":\"c\",\"model\":\"{model}\",\"choices\":[{{\"index\":0,\"delta\":{{\"content\":\" a\"}},\"finish_reason\":null}}],\"usage\":{usage}}}\n\n")
        };
        let u = |model: &str| {
            format!(
                "data: {{\"id\":\"c\",\"model\":\"{model}\",\"choices\":[],\"usage\":{U2}}}\n\n"
            )
        };
        let engine = [
            c("acme--bot--v1", U1),
            u("acme--bot--v1"),
            "data: [DONE]\n\n".into(),
        ]
        .concat();
        let meter = StreamMeter::new(ASKED).with_served_model("bot");
        let (sent, _) = run_meter(&engine, meter);
        assert_eq!(
            sent,
            vec![c("bot", "null"), u("bot"), "data: [DONE]\n\n".into()]
        );
        let meter = StreamMeter::new(ClientWants::default()).with_served_model("bot");
        let (sent, _) = run_meter(&engine, meter);
        assert_eq!(
            sent[0],
            "data: {\"id\":\"c\",\"model\":\"bot\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\" a\"},\"finish_reason\":null}]}\n\n"
        );
    }

    #[test]
    fn running_usage_before_an_error_is_not_final() {
        let engine = [
            chunk(" a", "null", U1),
            "data: {\"error\":{\"message\":\"boom\"}}\n\n".into(),
            "data: [DONE]\n\n".into(),
        ]
        .concat();
        let (_, m) = run(&engine, ClientWants::default());
        assert!(m.saw_error() && m.completed());
        assert!(!m.usage_final(), "a running count is partial");
        let (_, m) = run(&chunk(" a", "\"stop\"", U1), ClientWants::default());
        assert!(m.usage_final());
    }

    /// Issue 35: a meter that assembles as it meters gives the answer assembling the chunks it
    /// would have sent gives (one parse per event instead of two), sends only the stream's end,
    /// and meters the same.
    #[test]
    fn assembling_while_metering_gives_the_answer_of_the_chunks_sent() {
        use crate::metering::assemble::{Assembler, Shape};
        let running = |n: u32| {
            format!(
                r#"{{"prompt_tokens":5,"completion_tokens":{n},"total_tokens":{}}}"#,
                5 + n
            )
        };
        let head = r#"data: {"id":"c1","object":"chat.completion.chunk","created":7,"model":"engine-lora","#;
        let engine = [
            format!("{head}\"choices\":[{{\"index\":0,\"delta\":{{\"role\":\"assistant\",\"content\":\"\"}},\"finish_reason\":null}}],\"usage\":{}}}\n\n", running(0)),
            ": keep-alive\n\n".into(),
            format!("{head}\"choices\":[{{\"index\":0,\"delta\":{{\"content\":\"Hel\"}},\"logprobs\":{{\"content\":[{{\"token\":\"Hel\"}}]}},\"finish_reason\":null}}],\"usage\":{}}}\n\n", running(1)),
            format!("{head}\"choices\":[{{\"index\":0,\"delta\":{{\"content\":\"lo\",\"tool_calls\":[{{\"index\":0,\"id\":\"t\",\"function\":{{\"name\":\"f\",\"arguments\":\"{{}}\"}}}}]}},\"logprobs\":{{\"content\":[{{\"token\":\"lo\"}}]}},\"finish_reason\":\"length\"}}],\"usage\":{}}}\n\n", running(2)),
            format!("{head}\"choices\":[],\"usage\":{U2}}}\n\n"),
            "data: [DONE]\n\n".into(),
        ]
        .concat();
        let wants = ClientWants {
            usage: true,
            continuous: false,
        };
        let (sent, by_chunks) =
            run_meter(&engine, StreamMeter::new(wants).with_served_model("mine"));
        let mut from_sent = Assembler::new(Shape::Chat);
        for event in &sent {
            if let Some(data) = event.strip_prefix("data: ") {
                from_sent.push(data.trim_end().as_bytes());
            }
        }
        let assembling = StreamMeter::new(wants)
            .with_served_model("mine")
            .assembling(Assembler::new(Shape::Chat).with_served_model("mine"));
        let (ends, mut fused) = run_meter(&engine, assembling);
        assert_eq!(ends, vec!["data: [DONE]\n\n".to_owned()]);
        let answer = fused.take_assembler().unwrap().finish().unwrap();
        assert_eq!(answer, from_sent.finish().unwrap());
        let answer: serde_json::Value = serde_json::from_slice(&answer).unwrap();
        assert_eq!(answer["model"], "mine");
        assert_eq!(answer["choices"][0]["message"]["content"], "Hello");
        assert_eq!(answer["usage"]["completion_tokens"], 2);
        assert_eq!(fused.last_usage(), by_chunks.last_usage());
        assert_eq!(fused.usage_final(), by_chunks.usage_final());
        assert_eq!(fused.generated_chunks(), by_chunks.generated_chunks());
        assert_eq!(fused.finish_reasons(), ["length".to_owned()]);
    }

    #[test]
    fn usage_is_found_in_multi_line_events_too() {
        // Two `data:` lines: the data is a joined copy, not a slice of the raw bytes.
        let mut p = SseParser::default();
        p.push(Bytes::from(format!(
            "data: {{\"choices\":[],\ndata: \"usage\":{U1}}}\n\n"
        )));
        let event = p.next_event().unwrap();
        let data = event.data.as_ref().unwrap();
        let info = inspect(&Chunk::parse(data).unwrap(), &event.raw, data, None);
        let (s, e) = info.usage_span.unwrap();
        assert_eq!(&event.raw[s..e], U1.as_bytes());
    }

    #[test]
    fn strips_usage_bytes_exactly() {
        let raw = Bytes::from(format!("data: {{\"usage\":{U1},\"x\":\"usage\"}}\n\n"));
        let data = raw.slice(6..raw.len() - 2);
        let info = inspect(&Chunk::parse(&data).unwrap(), &raw, &data, None);
        let span = info.usage_span.unwrap();
        assert_eq!(
            edit::apply(&raw, None, Some((span, UsageEdit::Null))),
            "data: {\"usage\":null,\"x\":\"usage\"}\n\n"
        );
        assert_eq!(
            edit::apply(&raw, None, Some((span, UsageEdit::Remove))),
            "data: {\"x\":\"usage\"}\n\n"
        );
    }

    #[test]
    fn output_without_usage_is_counted_in_tokens_not_chunks() {
        // Three tokens per delta, no usage anywhere (an engine that ignores include_usage).
        let engine = [
            bare(" w1 w2 w3", "null"),
            bare(" w4 w5 w6", "null"),
            bare(" w7", "\"stop\""),
            "data: [DONE]\n\n".into(),
        ]
        .concat();
        let (_, m) = run(&engine, ClientWants::default());
        assert_eq!((m.generated_chunks(), m.generated_tokens()), (3, 7));
        assert_eq!(m.last_usage(), None);
        assert_eq!(m.progress().completion, 7);
        // Once the engine counts, its count is billed and the text is not kept.
        let engine = [bare(" w1 w2 w3", "null"), chunk(" w4", "\"stop\"", U2)].concat();
        let (_, m) = run(&engine, ClientWants::default());
        assert_eq!(m.generated_tokens(), 0);
        assert_eq!(m.last_usage().unwrap().completion_tokens, 2);
    }

    #[test]
    fn vllms_old_error_object_is_an_engine_error() {
        let engine = [
            bare(" w1", "null"),
            "data: {\"object\":\"error\",\"message\":\"boom\",\"type\":\"InternalServerError\",\"param\":null,\"code\":500}\n\n".into(),
            "data: [DONE]\n\n".into(),
        ]
        .concat();
        let (_, m) = run(&engine, ClientWants::default());
        assert!(m.saw_error() && m.completed());
        assert_eq!(m.generated_tokens(), 1, "the error's message is not output");
    }

    #[test]
    fn comments_and_errors_pass_through() {
        let engine = ": ping\n\ndata: {\"error\":{\"message\":\"boom\"}}\n\n";
        let (sent, m) = run(engine, ClientWants::default());
        assert_eq!(sent.concat(), engine);
        assert!(m.saw_error());
        assert!(!m.completed());
    }
}
