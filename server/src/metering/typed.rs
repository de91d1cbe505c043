//! Streams of typed events (OpenAI Responses, Anthropic Messages): every event names its `type`
//! in its JSON (and an `event:` line), usage arrives in particular events, and there is no
//! `[DONE]`. The events reach the client as the engine sent them (usage is part of these
//! protocols, never stripped), except the `model` of the events that carry the whole response
//! or message, which becomes the name the client asked for.
//!
//! Usage:
//! - Responses: `response.completed` (also `response.incomplete`, `response.failed`) carries the
//!   whole response with `usage {input_tokens, input_tokens_details.cached_tokens, output_tokens,
//!   output_tokens_details.reasoning_tokens}`: final. Cached is part of input, reasoning part of
//!   output, as in chat's usage.
//! - Anthropic: `message_start` carries `usage {input_tokens, cache_read_input_tokens,
//!   cache_creation_input_tokens, output_tokens}` and `message_delta` the cumulative
//!   `output_tokens` (and, from newer engines, the input figures again); `message_stop` ends it.
//!   Anthropic's `input_tokens` EXCLUDES cached: the prompt is the sum of the three.
//!
//! A stream cut before its final usage is billed from what was produced: the prompt the engine
//! reported (Anthropic's `message_start`) or the gateway's estimate, and as completion the larger
//! of the engine's running count and the tokens of the output it delivered, counted by
//! [`super::count`] (the base's tokenizer, else words) from the deltas' text, however many
//! tokens each delta holds.

use bytes::Bytes;
use serde::Deserialize;
use serde_json::value::RawValue;

use super::borrowed::{from_event, opt_str};
use super::count::{Field, OutputCounter, OutputTally, Part};
use super::edit;
use crate::endpoint::Endpoint;
use crate::usage::{CompletionDetails, PromptDetails, Usage};

/// Which event protocol an engine stream speaks.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Dialect {
    /// Chat and completions chunks: `data: {json}` and a final `data: [DONE]`.
    #[default]
    Chunks,
    /// OpenAI Responses.
    Responses,
    /// Anthropic Messages.
    Anthropic,
}

impl Dialect {
    pub fn of(endpoint: Endpoint) -> Self {
        match endpoint {
            Endpoint::Responses => Self::Responses,
            Endpoint::Messages => Self::Anthropic,
            Endpoint::Chat | Endpoint::Completions | Endpoint::Embeddings => Self::Chunks,
        }
    }

    /// The SSE error event a client of this dialect receives when the gateway ends its stream
    /// early (`code`: the gateway's reason, `kind`: the error type).
    pub fn error_event(self, kind: &str, code: &str, message: &str) -> Bytes {
        let text = match self {
            Self::Chunks => format!(
                "data: {}\n\n",
                serde_json::json!({"error": {"message": message, "type": kind, "param": null, "code": code}})
            ),
            Self::Responses => format!(
                "event: error\ndata: {}\n\n",
                serde_json::json!({"type": "error", "code": code, "message": message, "param": null})
            ),
            Self::Anthropic => {
                let kind = if kind == "service_unavailable" {
                    "overloaded_error"
                } else {
                    "api_error"
                };
                format!(
                    "event: error\ndata: {}\n\n",
                    serde_json::json!({"type": "error", "error": {"type": kind, "message": message}})
                )
            }
        };
        Bytes::from(text)
    }
}

#[derive(Deserialize)]
struct Event<'a> {
    #[serde(borrow, rename = "type", default, deserialize_with = "opt_str")]
    kind: Option<std::borrow::Cow<'a, str>>,
    /// Responses: the whole response (created, in_progress, completed, ...).
    #[serde(borrow, default)]
    response: Option<Holder<'a>>,
    /// Anthropic `message_start`: the message.
    #[serde(borrow, default)]
    message: Option<Holder<'a>>,
    /// Anthropic `message_delta`'s usage.
    #[serde(default)]
    usage: Option<AnthropicUsage>,
    /// Text deltas: Responses' `delta` is a string; Anthropic's an object.
    #[serde(borrow, default)]
    delta: Option<&'a RawValue>,
}

#[derive(Deserialize)]
struct Holder<'a> {
    #[serde(borrow, default)]
    model: Option<&'a RawValue>,
    #[serde(default)]
    usage: Option<Box<RawValue>>,
}

#[derive(Deserialize, Default, Clone, Copy)]
struct ResponsesUsage {
    #[serde(default)]
    input_tokens: u64,
    #[serde(default)]
    output_tokens: u64,
    #[serde(default)]
    input_tokens_details: Option<Cached>,
    #[serde(default)]
    output_tokens_details: Option<Reasoning>,
}

#[derive(Deserialize, Default, Clone, Copy)]
struct Cached {
    #[serde(default)]
    cached_tokens: Option<u64>,
}

#[derive(Deserialize, Default, Clone, Copy)]
struct Reasoning {
    #[serde(default)]
    reasoning_tokens: Option<u64>,
}

/// Anthropic's usage; every figure optional (`message_delta` may carry only `output_tokens`).
#[derive(Deserialize, Default, Clone, Copy)]
struct AnthropicUsage {
    #[serde(default)]
    input_tokens: Option<u64>,
    #[serde(default)]
    output_tokens: Option<u64>,
    #[serde(default)]
    cache_read_input_tokens: Option<u64>,
    #[serde(default)]
    cache_creation_input_tokens: Option<u64>,
}

fn usage(prompt: u64, cached: u64, completion: u64, reasoning: u64) -> Usage {
    Usage {
        prompt_tokens: prompt,
        completion_tokens: completion,
        prompt_tokens_details: Some(PromptDetails {
            cached_tokens: Some(cached),
        }),
        completion_tokens_details: Some(CompletionDetails {
            reasoning_tokens: Some(reasoning),
        }),
    }
}

/// What one typed event means to the meter.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Seen {
    /// Where the response's or message's `model` is in the raw bytes.
    pub model: Option<edit::Span>,
    /// The event carried output (a non-empty text, reasoning or arguments delta).
    pub generated: bool,
}

/// The accounting of one typed-event stream.
#[derive(Debug, Default)]
pub struct TypedMeter {
    /// Anthropic's prompt figures (input, cache read, cache creation) as last reported.
    prompt: Option<(u64, u64, u64)>,
    /// Anthropic's running output count.
    output: u64,
    /// The final usage (Responses' completed response; Anthropic's at `message_stop`).
    fin: Option<Usage>,
    completed: bool,
    error: bool,
    generated: u64,
    /// How the output text is counted, and the text so far.
    counter: OutputCounter,
    tally: OutputTally,
}

impl TypedMeter {
    /// Reads one event's data (`raw`: the whole event, for locating the model).
    pub fn on_data(&mut self, dialect: Dialect, raw: &[u8], data: &[u8]) -> Seen {
        let Some(event) = from_event::<Event<'_>>(data) else {
            return Seen::default();
        };
        let kind = event.kind.as_deref().unwrap_or_default();
        let holder = event.response.as_ref().or(event.message.as_ref());
        let model = holder
            .and_then(|h| h.model)
            .and_then(|m| edit::locate(raw, data, m.get().as_bytes()));
        let generated = output_delta(kind, event.delta, &mut self.tally);
        if generated {
            self.generated += 1;
        }
        match (dialect, kind) {
            (
                Dialect::Responses,
                "response.completed" | "response.incomplete" | "response.failed",
            ) => {
                let u: ResponsesUsage = holder
                    .and_then(|h| h.usage.as_ref())
                    .and_then(|u| serde_json::from_str(u.get()).ok())
                    .unwrap_or_default();
                self.fin = Some(usage(
                    u.input_tokens,
                    u.input_tokens_details
                        .and_then(|d| d.cached_tokens)
                        .unwrap_or(0),
                    u.output_tokens,
                    u.output_tokens_details
                        .and_then(|d| d.reasoning_tokens)
                        .unwrap_or(0),
                ));
                self.completed = true;
                self.error |= kind == "response.failed";
            }
            (Dialect::Responses, "error") | (Dialect::Anthropic, "error") => self.error = true,
            // Dynamo's frontend also puts its running usage on every `content_block_delta`
            // (and the engine's prompt count, where its `message_start` had an estimate).
            (Dialect::Anthropic, "message_start" | "message_delta" | "content_block_delta") => {
                let u = if kind == "message_start" {
                    holder
                        .and_then(|h| h.usage.as_ref())
                        .and_then(|u| serde_json::from_str::<AnthropicUsage>(u.get()).ok())
                } else {
                    event.usage
                };
                if let Some(u) = u {
                    self.anthropic_usage(u);
                }
            }
            (Dialect::Anthropic, "message_stop") => {
                self.completed = true;
                self.fin = self.running();
            }
            _ => {}
        }
        Seen { model, generated }
    }

    fn anthropic_usage(&mut self, u: AnthropicUsage) {
        let (input, read, created) = self.prompt.unwrap_or_default();
        if u.input_tokens.is_some()
            || u.cache_read_input_tokens.is_some()
            || u.cache_creation_input_tokens.is_some()
            || self.prompt.is_none()
        {
            self.prompt = Some((
                u.input_tokens.unwrap_or(input),
                u.cache_read_input_tokens.unwrap_or(read),
                u.cache_creation_input_tokens.unwrap_or(created),
            ));
        }
        if let Some(out) = u.output_tokens {
            // Cumulative: the largest count seen is the latest.
            self.output = self.output.max(out);
        }
    }

    /// Anthropic's running usage: the prompt as reported (input + cache read + cache creation;
    /// cached = cache read), the output as counted so far.
    fn running(&self) -> Option<Usage> {
        let (input, read, created) = self.prompt?;
        let prompt = input.saturating_add(read).saturating_add(created);
        Some(usage(
            prompt,
            read,
            self.output.max(self.generated_tokens()),
            0,
        ))
    }

    /// The usage to bill: the final one, else (a cut stream) the running one.
    pub fn usage(&self) -> Option<Usage> {
        self.fin.or_else(|| self.running())
    }

    pub fn usage_final(&self) -> bool {
        self.fin.is_some()
    }

    pub fn completed(&self) -> bool {
        self.completed
    }

    pub fn saw_error(&self) -> bool {
        self.error
    }

    pub fn generated(&self) -> u64 {
        self.generated
    }

    /// Tokens of the output delivered, by the counter.
    pub fn generated_tokens(&self) -> u64 {
        self.tally.tokens(&self.counter)
    }

    pub fn set_counter(&mut self, counter: OutputCounter) {
        self.counter = counter;
    }
}

/// Whether an event is a non-empty output delta: Responses' text, reasoning, refusal and
/// function-argument deltas (a string `delta`); Anthropic's `content_block_delta` (text,
/// thinking, tool input). Its text goes to `tally`.
fn output_delta(kind: &str, delta: Option<&RawValue>, tally: &mut OutputTally) -> bool {
    let Some(delta) = delta else {
        return false;
    };
    let part = |field| Part { choice: 0, field };
    if kind.starts_with("response.") && kind.ends_with(".delta") {
        let Ok(text) = serde_json::from_str::<std::borrow::Cow<'_, str>>(delta.get()) else {
            return false;
        };
        let field = if kind.contains("reasoning") {
            Field::Reasoning
        } else if kind.contains("arguments") {
            Field::Tool
        } else {
            Field::Content
        };
        tally.push(part(field), &text);
        return !text.is_empty();
    }
    if kind == "content_block_delta" {
        #[derive(Deserialize)]
        struct Block<'a> {
            #[serde(borrow, default, deserialize_with = "opt_str")]
            text: Option<std::borrow::Cow<'a, str>>,
            #[serde(borrow, default, deserialize_with = "opt_str")]
            thinking: Option<std::borrow::Cow<'a, str>>,
            #[serde(borrow, default, deserialize_with = "opt_str")]
            partial_json: Option<std::borrow::Cow<'a, str>>,
        }
        let Ok(b) = serde_json::from_str::<Block<'_>>(delta.get()) else {
            return false;
        };
        let mut any = false;
        for (text, field) in [
            (b.text, Field::Content),
            (b.thinking, Field::Reasoning),
            (b.partial_json, Field::Tool),
        ] {
            if let Some(t) = text {
                any |= !t.is_empty();
                tally.push(part(field), &t);
            }
        }
        return any;
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    fn feed(dialect: Dialect, events: &[&str]) -> TypedMeter {
        let mut m = TypedMeter::default();
        for e in events {
            m.on_data(dialect, e.as_bytes(), e.as_bytes());
        }
        m
    }

    #[test]
    fn responses_usage_comes_from_the_completed_response() {
        let m = feed(
            Dialect::Responses,
            &[
                r#"{"type":"response.created","response":{"id":"resp_1","model":"m","usage":null}}"#,
                r#"{"type":"response.output_text.delta","delta":" a"}"#,
                r#"{"type":"response.output_text.delta","delta":""}"#,
                r#"{"type":"response.completed","response":{"id":"resp_1","model":"m","usage":{"input_tokens":9,"input_tokens_details":{"cached_tokens":4},"output_tokens":5,"output_tokens_details":{"reasoning_tokens":2},"total_tokens":14}}}"#,
            ],
        );
        let u = m.usage().unwrap();
        assert_eq!(
            (
                u.prompt_tokens,
                u.cached_tokens(),
                u.completion_tokens,
                u.reasoning_tokens()
            ),
            (9, 4, 5, 2)
        );
        assert!(m.completed() && m.usage_final() && !m.saw_error());
        assert_eq!(m.generated(), 1);
        // Cut before `response.completed`: no usage, the deltas are the count.
        let m = feed(
            Dialect::Responses,
            &[r#"{"type":"response.output_text.delta","delta":" a"}"#; 3],
        );
        assert_eq!((m.usage(), m.generated(), m.completed()), (None, 3, false));
        // Several tokens in one delta: billed tokens, not deltas.
        let m = feed(
            Dialect::Responses,
            &[r#"{"type":"response.output_text.delta","delta":" a b c"}"#; 2],
        );
        assert_eq!((m.generated(), m.generated_tokens()), (2, 6));
    }

    #[test]
    fn anthropic_input_excludes_cached_and_output_is_cumulative() {
        let start = r#"{"type":"message_start","message":{"id":"msg_1","model":"m","usage":{"input_tokens":3,"cache_read_input_tokens":6,"cache_creation_input_tokens":1,"output_tokens":1}}}"#;
        let delta =
            r#"{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":" w"}}"#;
        let m = feed(
            Dialect::Anthropic,
            &[
                start,
                delta,
                delta,
                r#"{"type":"message_delta","delta":{"stop_reason":"end_turn"},"usage":{"output_tokens":2}}"#,
                r#"{"type":"message_stop"}"#,
            ],
        );
        let u = m.usage().unwrap();
        assert_eq!(
            (u.prompt_tokens, u.cached_tokens(), u.completion_tokens),
            (10, 6, 2)
        );
        assert!(m.usage_final() && m.completed());
        // Cut after three deltas: the engine's prompt, the deltas delivered.
        let m = feed(Dialect::Anthropic, &[start, delta, delta, delta]);
        let u = m.usage().unwrap();
        assert_eq!((u.prompt_tokens, u.completion_tokens), (10, 3));
        assert!(!m.usage_final() && !m.completed());
        // Dynamo 1.6: `message_start` estimates the prompt (7), each delta carries the engine's
        // running usage (input 11): a cut stream bills the engine's figures.
        let m = feed(
            Dialect::Anthropic,
            &[
                r#"{"type":"message_start","message":{"model":"m","usage":{"input_tokens":7}}}"#,
                r#"{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"x"},"usage":{"input_tokens":11,"output_tokens":1,"cache_creation_input_tokens":0,"total_tokens":12}}"#,
            ],
        );
        let u = m.usage().unwrap();
        assert_eq!((u.prompt_tokens, u.completion_tokens), (11, 1));
    }

    #[test]
    fn the_model_is_located_in_the_holder() {
        let raw = b"event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"model\":\"engine-m\"}}\n\n";
        let at = raw.windows(6).position(|w| w == b"data: ").unwrap() + 6;
        let data = &raw[at..raw.len() - 2];
        let mut m = TypedMeter::default();
        let seen = m.on_data(Dialect::Anthropic, raw, data);
        let (s, e) = seen.model.unwrap();
        assert_eq!(&raw[s..e], b"\"engine-m\"");
    }
}
