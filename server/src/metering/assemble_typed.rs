//! A non-streamed Responses or Anthropic Messages answer assembled from the engine's event
//! stream (see [`super::assemble`] for why every request streams upstream).
//! - Responses: the answer is the `response` object of the final `response.completed` (or
//!   `response.incomplete`) event, exactly as the engine sent it (model already renamed).
//! - Anthropic: `message_start`'s message, its content blocks built from `content_block_start`
//!   and the deltas (text, thinking, tool input JSON), `stop_reason`, `stop_sequence` and the
//!   usage merged from `message_delta`.

use std::borrow::Cow;

use serde::Deserialize;
use serde_json::value::RawValue;
use serde_json::{Map, Value};

use super::assembly_failure::Failure;
use super::borrowed::{from_event, opt_str};
use super::typed::Dialect;

/// The answer being built.
#[derive(Debug)]
pub struct TypedAssembler {
    dialect: Dialect,
    /// Anthropic: the message.
    answer: Option<Map<String, Value>>,
    /// Responses: the final response, as the engine wrote it.
    response: Option<Box<RawValue>>,
    /// Anthropic's content blocks by index, with the tool input JSON text so far.
    blocks: Vec<(Map<String, Value>, String)>,
    done: bool,
    error: Option<Option<String>>,
}

impl TypedAssembler {
    pub fn new(dialect: Dialect) -> Self {
        Self {
            dialect,
            answer: None,
            response: None,
            blocks: Vec::new(),
            done: false,
            error: None,
        }
    }

    pub fn push(&mut self, data: &[u8]) {
        // The type first, borrowed: most events (a Responses stream's deltas, its `created` and
        // `in_progress` snapshots of the whole response) play no part in the answer, and
        // parsing each into a `Value` tree cost more than the rest of the request (issue 35).
        let Some(Kind { kind }) = from_event::<Kind<'_>>(data) else {
            return;
        };
        let kind = kind.unwrap_or_default();
        // Only the events an answer is built from are parsed whole (`tree`).
        match (self.dialect, kind.as_ref()) {
            (Dialect::Responses, "response.completed" | "response.incomplete") => {
                if let Some(Final { response: Some(r) }) = from_event::<Final<'_>>(data) {
                    if r.get().starts_with('{') {
                        // A copy, not a parse: the final response is the largest event of the stream.
                        self.response = Some(r.to_owned());
                        self.done = true;
                    }
                }
            }
            (Dialect::Responses, "response.failed") | (_, "error") => {
                let Some(event) = tree(data) else { return };
                let code = event
                    .get("code")
                    .or_else(|| event.get("error").and_then(|e| e.get("type")))
                    .and_then(Value::as_str)
                    .map(str::to_owned);
                self.error = Some(code);
            }
            (Dialect::Anthropic, "message_start") => {
                let Some(mut event) = tree(data) else { return };
                if let Some(Value::Object(m)) = event.remove("message") {
                    self.answer = Some(m);
                }
            }
            (Dialect::Anthropic, "content_block_start") => {
                let Some(mut event) = tree(data) else { return };
                let index = index_of(&event);
                if let Some(Value::Object(block)) = event.remove("content_block") {
                    if self.blocks.len() <= index {
                        self.blocks.resize_with(index + 1, Default::default);
                    }
                    if let Some(slot) = self.blocks.get_mut(index) {
                        slot.0 = block;
                    }
                }
            }
            (Dialect::Anthropic, "content_block_delta") => {
                let Some(event) = tree(data) else { return };
                let index = index_of(&event);
                let Some((block, json)) = self.blocks.get_mut(index) else {
                    return;
                };
                let Some(delta) = event.get("delta") else {
                    return;
                };
                for (field, target) in [("text", "text"), ("thinking", "thinking")] {
                    if let Some(t) = delta.get(field).and_then(Value::as_str) {
                        let mut s = block
                            .get(target)
                            .and_then(Value::as_str)
                            .unwrap_or_default()
                            .to_owned();
                        s.push_str(t);
                        block.insert(target.to_owned(), Value::String(s));
                    }
                }
                if let Some(t) = delta.get("signature").and_then(Value::as_str) {
                    block.insert("signature".to_owned(), Value::String(t.to_owned()));
                }
                if let Some(t) = delta.get("partial_json").and_then(Value::as_str) {
                    json.push_str(t);
                }
            }
            (Dialect::Anthropic, "message_delta") => {
                let Some(mut event) = tree(data) else { return };
                let Some(answer) = self.answer.as_mut() else {
                    return;
                };
                if let Some(Value::Object(delta)) = event.remove("delta") {
                    answer.extend(delta);
                }
                if let Some(Value::Object(usage)) = event.remove("usage") {
                    if let Some(Value::Object(u)) = answer.get_mut("usage") {
                        u.extend(usage);
                    }
                }
            }
            (Dialect::Anthropic, "message_stop") => self.done = true,
            _ => {}
        }
    }

    pub fn finish(self) -> Result<Vec<u8>, Failure> {
        if let Some(code) = self.error {
            return Err(Failure::Error(code));
        }
        if self.dialect == Dialect::Responses {
            return match (self.response, self.done) {
                (Some(r), true) => Ok(r.get().as_bytes().to_vec()),
                _ => Err(Failure::Broken),
            };
        }
        let (Some(mut answer), true) = (self.answer, self.done) else {
            return Err(Failure::Broken);
        };
        if self.dialect == Dialect::Anthropic {
            let content: Vec<Value> = self
                .blocks
                .into_iter()
                .map(|(mut block, json)| {
                    if !json.is_empty() {
                        let input = serde_json::from_str(&json).unwrap_or(Value::String(json));
                        block.insert("input".to_owned(), input);
                    }
                    Value::Object(block)
                })
                .collect();
            answer.insert("content".to_owned(), Value::Array(content));
        }
        serde_json::to_vec(&Value::Object(answer)).map_err(|_| Failure::Broken)
    }
}

/// An event parsed whole, when it is an object.
fn tree(data: &[u8]) -> Option<Map<String, Value>> {
    match from_event::<Value>(data) {
        Some(Value::Object(event)) => Some(event),
        _ => None,
    }
}

/// An event's type.
#[derive(Deserialize)]
struct Kind<'a> {
    #[serde(borrow, rename = "type", default, deserialize_with = "opt_str")]
    kind: Option<Cow<'a, str>>,
}

/// A Responses stream's final event.
#[derive(Deserialize)]
struct Final<'a> {
    #[serde(borrow, default)]
    response: Option<&'a RawValue>,
}

fn index_of(event: &Map<String, Value>) -> usize {
    event
        .get("index")
        .and_then(Value::as_u64)
        .and_then(|i| usize::try_from(i).ok())
        .unwrap_or(0)
        .min(1024)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_anthropic_message_is_rebuilt_from_its_events() {
        let mut a = TypedAssembler::new(Dialect::Anthropic);
        for e in [
            r#"{"type":"message_start","message":{"id":"msg_1","type":"message","role":"assistant","model":"m","content":[],"stop_reason":null,"usage":{"input_tokens":4,"output_tokens":1}}}"#,
            r#"{"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}"#,
            r#"{"type":"ping"}"#,
            r#"{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"Hello"}}"#,
            r#"{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":" you"}}"#,
            r#"{"type":"content_block_stop","index":0}"#,
            r#"{"type":"message_delta","delta":{"stop_reason":"end_turn","stop_sequence":null},"usage":{"output_tokens":2}}"#,
            r#"{"type":"message_stop"}"#,
        ] {
            a.push(e.as_bytes());
        }
        let v: Value = serde_json::from_slice(&a.finish().unwrap()).unwrap();
        assert_eq!(v["content"][0]["text"], "Hello you");
        assert_eq!(v["stop_reason"], "end_turn");
        assert_eq!(v["usage"]["output_tokens"], 2);
        assert_eq!(v["usage"]["input_tokens"], 4);
    }

    #[test]
    fn a_response_is_the_completed_one_and_a_cut_one_is_broken() {
        let mut a = TypedAssembler::new(Dialect::Responses);
        a.push(br#"{"type":"response.output_text.delta","delta":"x"}"#);
        a.push(br#"{"type":"response.completed","response":{"id":"resp_1","object":"response","usage":{"input_tokens":1}}}"#);
        let v: Value = serde_json::from_slice(&a.finish().unwrap()).unwrap();
        assert_eq!(v["id"], "resp_1");
        let mut a = TypedAssembler::new(Dialect::Responses);
        a.push(br#"{"type":"response.output_text.delta","delta":"x"}"#);
        assert_eq!(a.finish(), Err(Failure::Broken));
        let mut a = TypedAssembler::new(Dialect::Responses);
        a.push(br#"{"type":"error","code":"upstream_timeout","message":"m"}"#);
        assert_eq!(
            a.finish(),
            Err(Failure::Error(Some("upstream_timeout".into())))
        );
    }

    /// An event that is not UTF-8 is no answer, as the meter does not count it complete.
    #[test]
    fn a_completed_event_that_is_not_utf8_is_not_the_answer() {
        let mut a = TypedAssembler::new(Dialect::Responses);
        a.push(b"{\"type\":\"response.completed\",\"response\":{\"id\":\"resp_\xff\"}}");
        assert_eq!(a.finish(), Err(Failure::Broken));
        let mut a = TypedAssembler::new(Dialect::Responses);
        a.push(b"{\"type\":\"response.completed\",\"response\":{\"id\":\"resp_\xc3\xa9\"}}");
        let v: Value = serde_json::from_slice(&a.finish().unwrap()).unwrap();
        assert_eq!(v["id"], "resp_\u{e9}");
    }
}
