//! How one response is shaped: the id, the endpoint (chat or text completion), the usage
//! options the client asked for, and the builders of whole bodies and stream chunks.

use bytes::Bytes;

use crate::openai::{sse_event, ChatChoice, Envelope, Message, TextChoice, Usage};

/// Shape of one response.
#[derive(Debug, Clone)]
pub struct Reply {
    /// `chatcmpl-…` / `cmpl-…`.
    pub id: String,
    /// Unix seconds.
    pub created: u64,
    /// The requested served name.
    pub model: String,
    /// Chat (true) or text completion (false).
    pub chat: bool,
    /// `stream_options.include_usage`.
    pub include_usage: bool,
    /// `stream_options.continuous_usage_stats` together with `include_usage`.
    pub continuous_usage: bool,
    /// Usage goes on the last content chunk instead of a separate chunk.
    pub usage_on_last_chunk: bool,
    /// No usage at all, not even on the whole answer (an engine that ignores the options).
    pub omit_usage: bool,
}

impl Reply {
    /// One content chunk (or the chat role chunk when `role` is set).
    pub fn chunk(
        &self,
        role: bool,
        content: &str,
        finish_reason: Option<&'static str>,
        usage: Option<Usage>,
    ) -> Bytes {
        if self.chat {
            let delta = Message {
                role: role.then_some("assistant"),
                content: Some(content),
            };
            let choice = ChatChoice {
                index: 0,
                message: None,
                delta: Some(delta),
                logprobs: None,
                finish_reason,
            };
            sse_event(&self.envelope("chat.completion.chunk", &[choice], usage))
        } else {
            let choice = TextChoice {
                index: 0,
                text: content,
                logprobs: None,
                finish_reason,
            };
            sse_event(&self.envelope("text_completion", &[choice], usage))
        }
    }

    /// The separate usage chunk: `choices: []` and the full usage.
    pub fn usage_chunk(&self, usage: Usage) -> Bytes {
        let object = if self.chat {
            "chat.completion.chunk"
        } else {
            "text_completion"
        };
        sse_event(&self.envelope::<TextChoice>(object, &[], Some(usage)))
    }

    /// A whole (non-streamed) response body.
    pub fn whole(&self, content: &str, finish_reason: &'static str, usage: Usage) -> Vec<u8> {
        let body = if self.chat {
            let message = Message {
                role: Some("assistant"),
                content: Some(content),
            };
            let choice = ChatChoice {
                index: 0,
                message: Some(message),
                delta: None,
                logprobs: None,
                finish_reason: Some(finish_reason),
            };
            serde_json::to_vec(&self.envelope(
                "chat.completion",
                &[choice],
                self.whole_usage(usage),
            ))
        } else {
            let choice = TextChoice {
                index: 0,
                text: content,
                logprobs: None,
                finish_reason: Some(finish_reason),
            };
            serde_json::to_vec(&self.envelope(
                "text_completion",
                &[choice],
                self.whole_usage(usage),
            ))
        };
        body.unwrap_or_default()
    }

    fn whole_usage(&self, usage: Usage) -> Option<Usage> {
        (!self.omit_usage).then_some(usage)
    }

    fn envelope<'a, C: serde::Serialize>(
        &'a self,
        object: &'static str,
        choices: &'a [C],
        usage: Option<Usage>,
    ) -> Envelope<'a, C> {
        Envelope {
            id: &self.id,
            object,
            created: self.created,
            model: &self.model,
            choices,
            usage,
        }
    }
}

/// The text of token `i`: a leading space and one word, so counting words gives tokens back.
pub fn token_text(i: u32, out: &mut String) {
    use std::fmt::Write;
    let _ = write!(out, " w{i}");
}
