//! The per-stream meter: looks at each SSE event once, captures usage from whichever chunk
//! carries it, and decides what the client receives. A client that did not ask for usage never
//! sees the usage chunk or per-chunk usage; a client that asked gets the engine's usage exactly as
//! sent. Events that need no change are forwarded as the engine's raw bytes.

use std::borrow::Cow;

use bytes::{Bytes, BytesMut};
use serde::Deserialize;
use serde_json::value::RawValue;

use super::sse::SseEvent;
use super::usage::Usage;

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

#[derive(Deserialize)]
struct Probe<'a> {
    #[serde(borrow, default)]
    usage: Option<&'a RawValue>,
    #[serde(borrow, default)]
    choices: Option<Vec<ChoiceProbe<'a>>>,
    #[serde(borrow, default)]
    error: Option<&'a RawValue>,
}

#[derive(Deserialize)]
struct ChoiceProbe<'a> {
    #[serde(borrow, default)]
    delta: Option<DeltaProbe<'a>>,
    #[serde(borrow, default)]
    text: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    finish_reason: Option<Cow<'a, str>>,
}

#[derive(Deserialize)]
struct DeltaProbe<'a> {
    #[serde(borrow, default)]
    content: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    reasoning_content: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    tool_calls: Option<&'a RawValue>,
}

/// What one chunk says, as far as metering cares.
struct ChunkInfo {
    /// Byte range of the top-level `usage` value inside the event's raw bytes.
    usage_span: Option<(usize, usize)>,
    usage_only: bool,
    generated: bool,
    finished: bool,
    error: bool,
}

fn inspect(raw: &Bytes, data: &Bytes) -> Option<ChunkInfo> {
    let probe: Probe<'_> = serde_json::from_slice(data).ok()?;
    let choices = probe.choices.as_deref().unwrap_or_default();
    // The usage value is located, not parsed: only the last one seen is ever parsed.
    let usage_span = probe.usage.and_then(|u| span_in(raw, u.get().as_bytes()));
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
    Some(ChunkInfo {
        usage_only: probe.choices.as_ref().is_some_and(Vec::is_empty) && usage_span.is_some(),
        finished: choices.iter().any(|c| c.finish_reason.is_some()),
        usage_span,
        generated,
        error: probe.error.is_some(),
    })
}

/// Where `part` (a slice borrowed from the event's data) sits in `raw`. The data of a one-line
/// event is a slice of `raw` itself, so the offset is pointer arithmetic, no search; a multi-line
/// event's data is a joined copy, so its value is searched for: its text cannot occur earlier in
/// the event (inside strings, quotes are escaped), so the first match is the value itself
/// (test: strips_usage_bytes_exactly).
fn span_in(raw: &[u8], part: &[u8]) -> Option<(usize, usize)> {
    let (base, at) = (raw.as_ptr() as usize, part.as_ptr() as usize);
    let start = match at.checked_sub(base) {
        Some(offset) if offset + part.len() <= raw.len() => offset,
        _ => memchr::memmem::find(raw, part)?,
    };
    Some((start, start + part.len()))
}

/// Replaces the usage value at `span` with `null`, leaving every other byte as the engine sent it.
fn strip_usage(raw: &Bytes, span: (usize, usize)) -> Bytes {
    let mut out = BytesMut::with_capacity(raw.len());
    out.extend_from_slice(&raw[..span.0]);
    out.extend_from_slice(b"null");
    out.extend_from_slice(&raw[span.1..]);
    out.freeze()
}

/// Accounting state of one stream.
#[derive(Debug, Default)]
pub struct StreamMeter {
    wants: ClientWants,
    /// The raw `usage` value of the last chunk that carried one.
    last_usage: Option<Bytes>,
    generated_chunks: u64,
    saw_done: bool,
    saw_error: bool,
    /// A finished chunk with usage held back one event, to learn whether the engine sends a
    /// separate usage chunk (then the client gets that one) or none (then this one is it).
    held: Option<(Bytes, (usize, usize))>,
}

impl StreamMeter {
    pub fn new(wants: ClientWants) -> Self {
        Self {
            wants,
            ..Self::default()
        }
    }

    /// Usage captured so far (the engine's final usage once the stream completed).
    pub fn last_usage(&self) -> Option<Usage> {
        self.last_usage
            .as_ref()
            .and_then(|raw| serde_json::from_slice(raw).ok())
    }
    /// Chunks that carried generated output (the estimate when no usage was seen).
    pub fn generated_chunks(&self) -> u64 {
        self.generated_chunks
    }
    /// Whether the engine ended the stream properly.
    pub fn completed(&self) -> bool {
        self.saw_done
    }
    /// Whether the engine reported an error inside the stream.
    pub fn saw_error(&self) -> bool {
        self.saw_error
    }

    fn release_held(&mut self, keep_usage: bool, out: &mut Vec<Outgoing>) {
        if let Some((raw, span)) = self.held.take() {
            out.push(Outgoing::Send(if keep_usage {
                raw
            } else {
                strip_usage(&raw, span)
            }));
        }
    }

    /// Takes one upstream event; appends what the client should receive to `out`.
    pub fn on_event(&mut self, event: SseEvent, out: &mut Vec<Outgoing>) {
        let Some(data) = &event.data else {
            self.release_held(false, out);
            out.push(Outgoing::Send(event.raw));
            return;
        };
        if data.as_ref() == b"[DONE]" {
            // No separate usage chunk came: the held chunk's usage is the final one.
            self.release_held(self.wants.usage, out);
            self.saw_done = true;
            out.push(Outgoing::Done(event.raw));
            return;
        }
        let Some(info) = inspect(&event.raw, data) else {
            self.release_held(false, out);
            out.push(Outgoing::Send(event.raw));
            return;
        };
        self.saw_error |= info.error;
        if let Some((start, end)) = info.usage_span {
            self.last_usage = Some(event.raw.slice(start..end));
        }
        if info.generated {
            self.generated_chunks += 1;
        }
        if info.usage_only {
            self.release_held(self.wants.continuous, out);
            if self.wants.usage {
                out.push(Outgoing::Send(event.raw));
            }
            return;
        }
        self.release_held(false, out);
        match info.usage_span {
            Some(span) if !self.wants.continuous => {
                if info.finished && self.wants.usage {
                    self.held = Some((event.raw, span));
                } else {
                    out.push(Outgoing::Send(strip_usage(&event.raw, span)));
                }
            }
            _ => out.push(Outgoing::Send(event.raw)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metering::sse::SseParser;

    fn run(engine: &str, wants: ClientWants) -> (Vec<String>, StreamMeter) {
        let mut p = SseParser::default();
        p.push(Bytes::copy_from_slice(engine.as_bytes()));
        let mut m = StreamMeter::new(wants);
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

    const U1: &str = r#"{"prompt_tokens":5,"completion_tokens":1,"total_tokens":6}"#;
    const U2: &str = r#"{"prompt_tokens":5,"completion_tokens":2,"total_tokens":7,"prompt_tokens_details":{"cached_tokens":3}}"#;

    fn chunk(content: &str, finish: &str, usage: &str) -> String {
        format!(
            "data: {{\"id\":\"c\",\"choices\":[{{\"index\":0,\"delta\":{{\"content\":\"{content}\"}},\"finish_reason\":{finish}}}],\"usage\":{usage}}}\n\n"
        )
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
                chunk(" a", "null", "null"),
                chunk(" b", "\"length\"", "null"),
                "data: [DONE]\n\n".into()
            ]
        );
        assert_eq!(m.last_usage().unwrap().completion_tokens, 2);
        assert_eq!(m.last_usage().unwrap().cached_tokens(), 3);
        assert!(m.completed());
        let (sent, _) = run(
            &engine,
            ClientWants {
                usage: true,
                continuous: false,
            },
        );
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
                chunk(" a", "null", "null"),
                chunk(" b", "\"length\"", "null"),
                "data: [DONE]\n\n".into()
            ]
        );
        assert_eq!(m.generated_chunks(), 2);
        let (sent, _) = run(
            &engine,
            ClientWants {
                usage: true,
                continuous: false,
            },
        );
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
        let (sent, m) = run(
            &engine,
            ClientWants {
                usage: true,
                continuous: false,
            },
        );
        assert_eq!(sent.concat(), engine);
        assert_eq!(m.last_usage().unwrap().completion_tokens, 2);
        let (sent, _) = run(&engine, ClientWants::default());
        assert_eq!(sent[1], chunk(" b", "\"stop\"", "null"));
    }

    #[test]
    fn usage_is_found_in_multi_line_events_too() {
        // Two `data:` lines: the data is a joined copy, not a slice of the raw bytes.
        let mut p = SseParser::default();
        p.push(Bytes::from(format!(
            "data: {{\"choices\":[],\ndata: \"usage\":{U1}}}\n\n"
        )));
        let event = p.next_event().unwrap();
        let info = inspect(&event.raw, event.data.as_ref().unwrap()).unwrap();
        let (s, e) = info.usage_span.unwrap();
        assert_eq!(&event.raw[s..e], U1.as_bytes());
    }

    #[test]
    fn strips_usage_bytes_exactly() {
        let raw = Bytes::from(format!("data: {{\"usage\":{U1},\"x\":\"usage\"}}\n\n"));
        let data = raw.slice(6..raw.len() - 2);
        let info = inspect(&raw, &data).unwrap();
        assert_eq!(
            strip_usage(&raw, info.usage_span.unwrap()),
            "data: {\"usage\":null,\"x\":\"usage\"}\n\n"
        );
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
