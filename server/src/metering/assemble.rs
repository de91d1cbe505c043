//! A non-streamed answer assembled from the engine's stream. The gateway asks every engine to
//! stream (with usage) even when the client wants one JSON answer, so an abandoned request is
//! metered exactly as an abandoned stream is: the metered stream's `Drop` cancels the engine and
//! bills the tokens it produced (issue 31: a hang-up used to be billed 0 tokens while the engine
//! generated them). The meter hands this module each chunk it parsed (one parse per event,
//! issue 35); it writes what the engine's own non-streamed answer holds, `model` being the name
//! the client asked for:
//! `id`, `object` (`chat.completion` / `text_completion`), `created`, `model`, `choices` (the
//! message or text, `finish_reason`, `logprobs` when present, tool calls merged by index) and
//! `usage`, as the stream's end reported it.

use std::borrow::Cow;
use std::collections::BTreeMap;

use serde::Serialize;
use serde_json::value::RawValue;
use serde_json::{json, Map, Value};

use super::chunk::Chunk;

/// Which answer is assembled.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Shape {
    Chat,
    Text,
    /// A typed-event stream (Responses, Anthropic): see [`super::assemble_typed`].
    Typed(super::typed::Dialect),
}

pub use super::assembly_failure::Failure;

/// One choice as it builds up. Values relayed as the engine wrote them (finish and stop reasons)
/// stay raw JSON: parsing them only to write them again cost more than the rest of a small answer.
/// They are kept by `RawValue::to_owned`, a copy; `RawValue::from_string` would parse them again.
#[derive(Debug, Default)]
struct Choice {
    role: Option<String>,
    content: Option<String>,
    reasoning: Option<String>,
    tool_calls: BTreeMap<u64, Value>,
    logprobs: Option<Map<String, Value>>,
    finish_reason: Option<Box<RawValue>>,
    stop_reason: Option<Box<RawValue>>,
}

/// The answer as it builds up from chunks.
#[derive(Debug)]
pub struct Assembler {
    shape: Shape,
    /// The name the client asked for, written as the answer's `model` in place of the engine's.
    served_model: Option<String>,
    id: Option<String>,
    created: Option<u64>,
    /// The engine's name (when no served name is set).
    model: Option<String>,
    /// A chunk named a model: the answer names one (the served name, when set).
    named: bool,
    fingerprint: Option<Box<RawValue>>,
    choices: BTreeMap<u32, Choice>,
    usage: Option<Box<RawValue>>,
    error: Option<Failure>,
}

/// The written answer: the engine's non-streamed layout, serialized straight from the assembled
/// parts (no intermediate `Value` tree).
#[derive(Serialize)]
struct Answer<'a> {
    id: &'a str,
    object: &'static str,
    created: u64,
    model: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    system_fingerprint: Option<&'a RawValue>,
    choices: Vec<OutChoice<'a>>,
    usage: Option<&'a RawValue>,
}

#[derive(Serialize)]
struct OutChoice<'a> {
    index: u32,
    #[serde(skip_serializing_if = "Option::is_none")]
    message: Option<OutMessage<'a>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    text: Option<&'a str>,
    logprobs: Option<&'a Map<String, Value>>,
    finish_reason: Option<&'a RawValue>,
    #[serde(skip_serializing_if = "Option::is_none")]
    stop_reason: Option<&'a RawValue>,
}

#[derive(Serialize)]
struct OutMessage<'a> {
    role: &'a str,
    content: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    reasoning_content: Option<&'a str>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    tool_calls: Vec<&'a Value>,
}

/// Appends `more`'s arrays to `into`'s, key by key (logprobs arrive a token's worth at a time:
/// chat's `content`, completions' `tokens`, `token_logprobs`, `top_logprobs`, `text_offset`).
fn extend_arrays(into: &mut Map<String, Value>, more: Map<String, Value>) {
    for (k, v) in more {
        match (into.get_mut(&k), v) {
            (Some(Value::Array(a)), Value::Array(b)) => a.extend(b),
            (Some(_), Value::Null) => {}
            (Some(old), v) => *old = v,
            (None, v) => {
                into.insert(k, v);
            }
        }
    }
}

/// Merges one streamed tool-call delta into the call at its index: `id`, `type` and the
/// function's `name` as first given, `arguments` concatenated.
fn merge_tool_call(calls: &mut BTreeMap<u64, Value>, delta: Value) {
    let index = delta.get("index").and_then(Value::as_u64).unwrap_or(0);
    let call = calls
        .entry(index)
        .or_insert_with(|| json!({"function": {}}));
    let (Some(call), Value::Object(delta)) = (call.as_object_mut(), delta) else {
        return;
    };
    for (k, v) in delta {
        if k == "index" || v.is_null() {
            continue;
        }
        let Value::Object(f) = v else {
            call.insert(k, v);
            continue;
        };
        if k != "function" {
            call.insert(k, Value::Object(f));
            continue;
        }
        let into = call
            .entry("function")
            .or_insert_with(|| Value::Object(Map::new()));
        let Some(into) = into.as_object_mut() else {
            continue;
        };
        for (fk, fv) in f {
            if fv.is_null() {
                continue;
            }
            if fk == "arguments" {
                if let (Some(Value::String(args)), Value::String(more)) =
                    (into.get_mut("arguments"), &fv)
                {
                    args.push_str(more);
                    continue;
                }
            }
            into.insert(fk, fv);
        }
    }
}

impl Assembler {
    pub fn new(shape: Shape) -> Self {
        Self {
            shape,
            served_model: None,
            id: None,
            created: None,
            model: None,
            named: false,
            fingerprint: None,
            choices: BTreeMap::new(),
            usage: None,
            error: None,
        }
    }

    /// Writes `served` as the answer's `model` (the engine's chunks name what it served).
    #[must_use]
    pub fn with_served_model(mut self, served: &str) -> Self {
        self.served_model = Some(served.to_owned());
        self
    }

    /// Takes one SSE `data:` payload (`[DONE]` and unreadable ones are skipped).
    pub fn push(&mut self, data: &[u8]) {
        // Every stream's end: not parsed (a failed parse allocates its error).
        if data == b"[DONE]" {
            return;
        }
        if let Some(chunk) = Chunk::parse(data) {
            self.add(chunk);
        }
    }

    /// Takes one parsed chunk.
    pub fn add(&mut self, chunk: Chunk<'_>) {
        let usage = chunk.usage();
        if let Some(e) = chunk.error {
            let code = serde_json::from_str::<Value>(e.get())
                .ok()
                .and_then(|v| v.get("code").and_then(Value::as_str).map(str::to_owned));
            self.error = Some(Failure::Error(code));
            return;
        }
        if chunk.object.as_deref() == Some("error") {
            self.error = Some(Failure::Error(None));
            return;
        }
        if self.id.is_none() {
            self.id = chunk.id.map(Cow::into_owned);
        }
        if self.created.is_none() {
            self.created = chunk.created;
        }
        if let Some(m) = chunk.model {
            // The served name once, not a copy per chunk; else the engine's, as last named.
            if self.served_model.is_some() {
                self.named = true;
            } else {
                self.model = serde_json::from_str::<String>(m.get()).ok();
            }
        }
        if let Some(f) = chunk.system_fingerprint {
            self.fingerprint = Some(f.to_owned());
        }
        if let Some(u) = usage {
            self.usage = Some(u.to_owned());
        }
        for c in chunk.choices.into_iter().flatten() {
            let choice = self.choices.entry(c.index).or_default();
            if let Some(d) = c.delta {
                if let Some(r) = d.role {
                    choice.role = Some(r.into_owned());
                }
                if let Some(t) = d.content {
                    choice.content.get_or_insert_with(String::new).push_str(&t);
                }
                if let Some(t) = d.reasoning_content {
                    choice
                        .reasoning
                        .get_or_insert_with(String::new)
                        .push_str(&t);
                }
                let calls = d
                    .tool_calls
                    .and_then(|raw| serde_json::from_str::<Vec<Value>>(raw.get()).ok());
                for call in calls.into_iter().flatten() {
                    merge_tool_call(&mut choice.tool_calls, call);
                }
            }
            if let Some(t) = c.text {
                choice.content.get_or_insert_with(String::new).push_str(&t);
            }
            if let Some(Ok(Value::Object(l))) = c.logprobs.map(|l| serde_json::from_str(l.get())) {
                extend_arrays(choice.logprobs.get_or_insert_with(Map::new), l);
            }
            if let Some(f) = c.finish_reason {
                choice.finish_reason = Some(f.to_owned());
            }
            if let Some(s) = c.stop_reason {
                choice.stop_reason = Some(s.to_owned());
            }
        }
    }

    /// The assembled answer's JSON.
    pub fn finish(self) -> Result<Vec<u8>, Failure> {
        if let Some(e) = self.error {
            return Err(e);
        }
        let Some(id) = self.id.as_deref() else {
            return Err(Failure::Broken);
        };
        let chat = self.shape == Shape::Chat;
        let choices = self
            .choices
            .iter()
            .map(|(&index, c)| OutChoice {
                index,
                message: chat.then(|| OutMessage {
                    role: c.role.as_deref().unwrap_or("assistant"),
                    content: c.content.as_deref(),
                    reasoning_content: c.reasoning.as_deref(),
                    tool_calls: c.tool_calls.values().collect(),
                }),
                text: (!chat).then(|| c.content.as_deref().unwrap_or_default()),
                logprobs: c.logprobs.as_ref(),
                finish_reason: c.finish_reason.as_deref(),
                stop_reason: c.stop_reason.as_deref(),
            })
            .collect();
        let answer = Answer {
            id,
            object: if chat {
                "chat.completion"
            } else {
                "text_completion"
            },
            created: self.created.unwrap_or(0),
            model: if self.named {
                self.served_model.as_deref()
            } else {
                self.model.as_deref()
            }
            .unwrap_or_default(),
            system_fingerprint: self.fingerprint.as_deref(),
            choices,
            usage: self.usage.as_deref(),
        };
        serde_json::to_vec(&answer).map_err(|_| Failure::Broken)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn assemble(shape: Shape, chunks: &[&str]) -> Value {
        let mut a = Assembler::new(shape);
        for c in chunks {
            a.push(c.as_bytes());
        }
        serde_json::from_slice(&a.finish().unwrap()).unwrap()
    }

    #[test]
    fn a_chat_stream_becomes_the_whole_answer() {
        let v = assemble(
            Shape::Chat,
            &[
                r#"{"id":"chatcmpl-1","object":"chat.completion.chunk","created":7,"model":"mine","choices":[{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}],"usage":null}"#,
                r#"{"id":"chatcmpl-1","object":"chat.completion.chunk","created":7,"model":"mine","choices":[{"index":0,"delta":{"content":"Hel"},"logprobs":{"content":[{"token":"Hel","logprob":-0.5}]},"finish_reason":null}]}"#,
                r#"{"id":"chatcmpl-1","object":"chat.completion.chunk","created":7,"model":"mine","choices":[{"index":0,"delta":{"content":"lo","tool_calls":[{"index":0,"id":"c1","type":"function","function":{"name":"f","arguments":"{\"a\""}}]},"logprobs":{"content":[{"token":"lo","logprob":-0.25}]},"finish_reason":null}]}"#,
                r#"{"id":"chatcmpl-1","object":"chat.completion.chunk","created":7,"model":"mine","choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":":1}"}}]},"finish_reason":"length"}]}"#,
                r#"{"id":"chatcmpl-1","object":"chat.completion.chunk","created":7,"model":"mine","choices":[],"usage":{"prompt_tokens":5,"completion_tokens":2,"total_tokens":7}}"#,
                "[DONE]",
            ],
        );
        assert_eq!(
            v,
            json!({"id":"chatcmpl-1","object":"chat.completion","created":7,"model":"mine",
                "choices":[{"index":0,"message":{"role":"assistant","content":"Hello",
                    "tool_calls":[{"id":"c1","type":"function","function":{"name":"f","arguments":"{\"a\":1}"}}]},
                    "logprobs":{"content":[{"token":"Hel","logprob":-0.5},{"token":"lo","logprob":-0.25}]},
                    "finish_reason":"length"}],
                "usage":{"prompt_tokens":5,"completion_tokens":2,"total_tokens":7}})
        );
    }

    #[test]
    fn a_completion_stream_becomes_the_whole_answer() {
        let v = assemble(
            Shape::Text,
            &[
                r#"{"id":"cmpl-1","object":"text_completion","created":9,"model":"m","choices":[{"index":1,"text":" b","logprobs":{"tokens":[" b"],"token_logprobs":[-1.0],"top_logprobs":null,"text_offset":[0]},"finish_reason":null}],"usage":null}"#,
                r#"{"id":"cmpl-1","object":"text_completion","created":9,"model":"m","choices":[{"index":0,"text":" a","logprobs":null,"finish_reason":"stop","stop_reason":null}],"usage":null}"#,
                r#"{"id":"cmpl-1","object":"text_completion","created":9,"model":"m","choices":[{"index":1,"text":" c","logprobs":{"tokens":[" c"],"token_logprobs":[-2.0],"top_logprobs":null,"text_offset":[2]},"finish_reason":"length"}],"usage":null}"#,
                r#"{"id":"cmpl-1","object":"text_completion","created":9,"model":"m","choices":[],"usage":{"prompt_tokens":1,"completion_tokens":3,"total_tokens":4}}"#,
            ],
        );
        assert_eq!(v["object"], "text_completion");
        assert_eq!(
            v["choices"][0],
            json!({"index":0,"text":" a","logprobs":null,"finish_reason":"stop"})
        );
        assert_eq!(
            v["choices"][1],
            json!({"index":1,"text":" b c","logprobs":{"tokens":[" b"," c"],"token_logprobs":[-1.0,-2.0],"top_logprobs":null,"text_offset":[0,2]},"finish_reason":"length"})
        );
        assert_eq!(v["usage"]["completion_tokens"], 3);
    }

    #[test]
    fn an_error_event_is_no_answer() {
        let mut a = Assembler::new(Shape::Chat);
        a.push(br#"{"id":"x","choices":[{"index":0,"delta":{"content":"a"}}]}"#);
        a.push(br#"{"error":{"message":"m","type":"api_error","param":null,"code":"upstream_timeout"}}"#);
        assert_eq!(
            a.finish(),
            Err(Failure::Error(Some("upstream_timeout".into())))
        );
        assert_eq!(Assembler::new(Shape::Text).finish(), Err(Failure::Broken));
        let mut a = Assembler::new(Shape::Chat);
        a.push(br#"{"id":"x","choices":[{"index":0,"delta":{"content":"a"}}]}"#);
        a.push(br#"{"object":"error","message":"m","type":"InternalServerError","param":null,"code":500}"#);
        assert_eq!(a.finish(), Err(Failure::Error(None)));
    }
}
