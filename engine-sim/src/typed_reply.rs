//! The typed-event wire formats: OpenAI Responses (`/v1/responses`) and Anthropic Messages
//! (`/v1/messages`), whole and streamed, with their usage as the real APIs report it.
//! - Responses: `usage {input_tokens, input_tokens_details.cached_tokens, output_tokens,
//!   output_tokens_details.reasoning_tokens, total_tokens}` (cached inside input, reasoning
//!   inside output), in the whole response and in the final `response.completed` event. Events:
//!   `response.created`, `response.output_text.delta` per token, `response.completed`; no
//!   `[DONE]`.
//! - Anthropic: `usage {input_tokens (EXCLUDING cached), cache_read_input_tokens,
//!   cache_creation_input_tokens, output_tokens}`. Events: `message_start` (usage with
//!   `output_tokens: 0`), `content_block_start`, `ping`, `content_block_delta` per token,
//!   `content_block_stop`, `message_delta` (stop reason, cumulative `output_tokens`),
//!   `message_stop`.

use bytes::Bytes;
use serde_json::{json, Value};

/// Which typed protocol.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Typed {
    Responses,
    Anthropic,
}

/// Token counts of a typed answer.
#[derive(Debug, Clone, Copy, Default)]
pub struct Counts {
    pub prompt: u32,
    pub cached: u32,
    pub completion: u32,
    pub reasoning: u32,
}

fn event(name: &str, data: &Value) -> Bytes {
    Bytes::from(format!("event: {name}\ndata: {data}\n\n"))
}

/// `length` / `stop` in each protocol's words.
fn stop_reason(typed: Typed, finish: &str) -> &'static str {
    match (typed, finish) {
        (Typed::Anthropic, "length") => "max_tokens",
        (Typed::Anthropic, _) => "end_turn",
        (Typed::Responses, "length") => "incomplete",
        (Typed::Responses, _) => "completed",
    }
}

fn responses_usage(c: Counts) -> Value {
    json!({
        "input_tokens": c.prompt,
        "input_tokens_details": {"cached_tokens": c.cached},
        "output_tokens": c.completion,
        "output_tokens_details": {"reasoning_tokens": c.reasoning},
        "total_tokens": c.prompt.saturating_add(c.completion),
    })
}

fn anthropic_usage(c: Counts) -> Value {
    json!({
        "input_tokens": c.prompt.saturating_sub(c.cached),
        "cache_read_input_tokens": c.cached,
        "cache_creation_input_tokens": 0,
        "output_tokens": c.completion,
    })
}

/// One typed answer being written.
#[derive(Debug, Clone)]
pub struct TypedReply {
    pub typed: Typed,
    pub id: String,
    pub model: String,
    pub created: u64,
    sequence: u64,
}

impl TypedReply {
    pub fn new(typed: Typed, model: String, created: u64) -> Self {
        let id = match typed {
            Typed::Responses => format!("resp_{}", uuid::Uuid::new_v4().simple()),
            Typed::Anthropic => format!("msg_{}", uuid::Uuid::new_v4().simple()),
        };
        Self {
            typed,
            id,
            model,
            created,
            sequence: 0,
        }
    }

    fn next_sequence(&mut self) -> u64 {
        self.sequence = self.sequence.saturating_add(1);
        self.sequence
    }

    /// The id of the Responses answer's one output item (its message).
    fn item_id(&self) -> String {
        format!("msg_{}", self.id)
    }

    /// The Responses answer's message item (no content before the text is known).
    fn item(&self, status: &str, text: Option<&str>) -> Value {
        let content = text.map_or_else(Vec::new, |t| {
            vec![json!({"type": "output_text", "text": t, "annotations": []})]
        });
        json!({"type": "message", "id": self.item_id(), "status": status, "role": "assistant",
               "content": content})
    }

    /// The Responses object (`status` in progress while streaming).
    fn response(&self, text: Option<&str>, finish: Option<&str>, c: Option<Counts>) -> Value {
        let status = finish.map_or("in_progress", |f| stop_reason(Typed::Responses, f));
        let output = text.map_or_else(Vec::new, |t| vec![self.item("completed", Some(t))]);
        json!({
            "id": self.id, "object": "response", "created_at": self.created, "status": status,
            "model": self.model, "output": output, "usage": c.map(responses_usage),
            "incomplete_details": (status == "incomplete").then(|| json!({"reason": "max_output_tokens"})),
            "error": null, "store": false,
        })
    }

    /// The Anthropic message.
    fn message(&self, text: Option<&str>, finish: Option<&str>, c: Counts) -> Value {
        let content = text.map_or_else(Vec::new, |t| vec![json!({"type": "text", "text": t})]);
        json!({
            "id": self.id, "type": "message", "role": "assistant", "model": self.model,
            "content": content, "stop_reason": finish.map(|f| stop_reason(Typed::Anthropic, f)),
            "stop_sequence": null, "usage": anthropic_usage(c),
        })
    }

    /// A whole (non-streamed) answer.
    pub fn whole(&self, text: &str, finish: &str, c: Counts) -> Vec<u8> {
        let body = match self.typed {
            Typed::Responses => self.response(Some(text), Some(finish), Some(c)),
            Typed::Anthropic => self.message(Some(text), Some(finish), c),
        };
        serde_json::to_vec(&body).unwrap_or_default()
    }

    /// The events before the first token (the prompt is known: Anthropic reports it here).
    pub fn start(&mut self, c: Counts) -> Bytes {
        match self.typed {
            Typed::Responses => {
                // As OpenAI (and Dynamo's frontend) send them: the SDKs' stream helpers need the
                // output item and its content part announced before the first text delta.
                let mut out = Vec::new();
                for kind in ["response.created", "response.in_progress"] {
                    let seq = self.next_sequence();
                    out.extend_from_slice(&event(
                        kind,
                        &json!({"type": kind, "sequence_number": seq,
                                "response": self.response(None, None, None)}),
                    ));
                }
                let seq = self.next_sequence();
                out.extend_from_slice(&event(
                    "response.output_item.added",
                    &json!({"type": "response.output_item.added", "sequence_number": seq,
                            "output_index": 0, "item": self.item("in_progress", None)}),
                ));
                let seq = self.next_sequence();
                out.extend_from_slice(&event(
                    "response.content_part.added",
                    &json!({"type": "response.content_part.added", "sequence_number": seq,
                            "item_id": self.item_id(), "output_index": 0, "content_index": 0,
                            "part": {"type": "output_text", "text": "", "annotations": []}}),
                ));
                Bytes::from(out)
            }
            Typed::Anthropic => {
                let start = Counts { completion: 0, ..c };
                let mut out = Vec::new();
                out.extend_from_slice(&event(
                    "message_start",
                    &json!({"type": "message_start", "message": self.message(None, None, start)}),
                ));
                out.extend_from_slice(&event(
                    "content_block_start",
                    &json!({"type": "content_block_start", "index": 0,
                            "content_block": {"type": "text", "text": ""}}),
                ));
                out.extend_from_slice(&event("ping", &json!({"type": "ping"})));
                Bytes::from(out)
            }
        }
    }

    /// One token's event.
    pub fn delta(&mut self, text: &str) -> Bytes {
        match self.typed {
            Typed::Responses => {
                let seq = self.next_sequence();
                event(
                    "response.output_text.delta",
                    &json!({"type": "response.output_text.delta", "sequence_number": seq,
                            "item_id": self.item_id(), "output_index": 0,
                            "content_index": 0, "delta": text}),
                )
            }
            Typed::Anthropic => event(
                "content_block_delta",
                &json!({"type": "content_block_delta", "index": 0,
                        "delta": {"type": "text_delta", "text": text}}),
            ),
        }
    }

    /// The events after the last token: the stream's end, with the final usage.
    pub fn end(&mut self, text: &str, finish: &str, c: Counts) -> Bytes {
        match self.typed {
            Typed::Responses => {
                let mut out = Vec::new();
                let seq = self.next_sequence();
                out.extend_from_slice(&event(
                    "response.output_text.done",
                    &json!({"type": "response.output_text.done", "sequence_number": seq,
                            "item_id": self.item_id(), "output_index": 0, "content_index": 0,
                            "text": text}),
                ));
                let seq = self.next_sequence();
                out.extend_from_slice(&event(
                    "response.content_part.done",
                    &json!({"type": "response.content_part.done", "sequence_number": seq,
                            "item_id": self.item_id(), "output_index": 0, "content_index": 0,
                            "part": {"type": "output_text", "text": text, "annotations": []}}),
                ));
                let seq = self.next_sequence();
                out.extend_from_slice(&event(
                    "response.output_item.done",
                    &json!({"type": "response.output_item.done", "sequence_number": seq,
                            "output_index": 0, "item": self.item("completed", Some(text))}),
                ));
                let seq = self.next_sequence();
                let kind = if finish == "length" {
                    "response.incomplete"
                } else {
                    "response.completed"
                };
                out.extend_from_slice(&event(
                    kind,
                    &json!({"type": kind, "sequence_number": seq,
                            "response": self.response(Some(text), Some(finish), Some(c))}),
                ));
                Bytes::from(out)
            }
            Typed::Anthropic => {
                let mut out = Vec::new();
                out.extend_from_slice(&event(
                    "content_block_stop",
                    &json!({"type": "content_block_stop", "index": 0}),
                ));
                out.extend_from_slice(&event(
                    "message_delta",
                    &json!({"type": "message_delta",
                            "delta": {"stop_reason": stop_reason(Typed::Anthropic, finish), "stop_sequence": null},
                            "usage": {"output_tokens": c.completion}}),
                ));
                out.extend_from_slice(&event("message_stop", &json!({"type": "message_stop"})));
                Bytes::from(out)
            }
        }
    }
}
