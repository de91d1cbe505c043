//! Fault and pacing knobs: engine-wide ones ([`GlobalFaults`], changed at run time through
//! `POST /sim/faults`) and per-request ones (the request body's optional `"sim": {..}` object),
//! merged into the [`Knobs`] one request runs with. A per-request value overrides the global one.

use serde::{Deserialize, Serialize};

/// How the engine ends the lines of its SSE streams: the SSE spec allows all three, and a
/// gateway must read each (real engines and proxies in front of them differ).
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum LineEnding {
    /// `\n` (what vLLM writes).
    #[default]
    Lf,
    /// `\r\n`.
    Crlf,
    /// A lone `\r`.
    Cr,
}

impl LineEnding {
    /// The bytes that end one line.
    pub fn bytes(self) -> &'static [u8] {
        match self {
            Self::Lf => b"\n",
            Self::Crlf => b"\r\n",
            Self::Cr => b"\r",
        }
    }
}

/// Engine-wide knobs; every field is optional in JSON (missing = default).
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq)]
#[serde(default)]
pub struct GlobalFaults {
    /// Fail every completion request with this HTTP status before any token.
    pub fail_status: Option<u16>,
    /// Answer errors in Dynamo's flat shape instead of OpenAI's envelope.
    pub flat_errors: bool,
    /// Put streamed usage on the last content chunk (always) instead of a separate chunk.
    pub usage_on_last_chunk: bool,
    /// Wait this long before responding at all.
    pub delay_ms: u64,
    /// Break the response after this many content tokens (no `[DONE]`, no usage).
    pub die_after_chunks: Option<u32>,
    /// Generate exactly this many tokens, whatever max_tokens says.
    pub completion_tokens: Option<u32>,
    /// Time between two tokens, overriding the decode rate.
    pub token_interval_ms: Option<u64>,
    /// Time before the first token, overriding the configured one.
    pub ttft_ms: Option<u64>,
    /// How stream lines end.
    pub line_ending: LineEnding,
    /// Tokens per streamed delta (default 1): a real engine may put several in one chunk.
    pub tokens_per_delta: Option<u32>,
    /// Never report usage (streamed or whole), whatever `stream_options` asks: an engine that
    /// ignores `include_usage`.
    pub omit_usage: bool,
    /// After this many content tokens, send an error event inside the stream (vLLM's old
    /// `{"object":"error",..}` shape) and end it with `[DONE]`.
    pub error_after_chunks: Option<u32>,
    /// With `fail_status`: answer the error body with HTTP 200 (as some vLLM versions do).
    pub error_with_200: bool,
    /// After this many content tokens, stop sending and keep the connection open (a hung
    /// engine); generation resumes never.
    pub hang_after_chunks: Option<u32>,
}

/// The request body's `"sim"` object: the same knobs, each optional.
#[derive(Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq)]
#[serde(default)]
pub struct RequestKnobs {
    /// See [`GlobalFaults::fail_status`].
    pub fail_status: Option<u16>,
    /// See [`GlobalFaults::flat_errors`].
    pub flat_errors: Option<bool>,
    /// See [`GlobalFaults::usage_on_last_chunk`].
    pub usage_on_last_chunk: Option<bool>,
    /// See [`GlobalFaults::delay_ms`].
    pub delay_ms: Option<u64>,
    /// See [`GlobalFaults::die_after_chunks`].
    pub die_after_chunks: Option<u32>,
    /// See [`GlobalFaults::completion_tokens`].
    pub completion_tokens: Option<u32>,
    /// See [`GlobalFaults::token_interval_ms`].
    pub token_interval_ms: Option<u64>,
    /// See [`GlobalFaults::ttft_ms`].
    pub ttft_ms: Option<u64>,
    /// See [`GlobalFaults::line_ending`].
    pub line_ending: Option<LineEnding>,
    /// See [`GlobalFaults::tokens_per_delta`].
    pub tokens_per_delta: Option<u32>,
    /// See [`GlobalFaults::omit_usage`].
    pub omit_usage: Option<bool>,
    /// See [`GlobalFaults::error_after_chunks`].
    pub error_after_chunks: Option<u32>,
    /// See [`GlobalFaults::error_with_200`].
    pub error_with_200: Option<bool>,
    /// See [`GlobalFaults::hang_after_chunks`].
    pub hang_after_chunks: Option<u32>,
}

/// The knobs one request runs with, after merging.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Knobs {
    /// Status to fail with, if any.
    pub fail_status: Option<u16>,
    /// Flat error bodies.
    pub flat_errors: bool,
    /// Usage on the last content chunk.
    pub usage_on_last_chunk: bool,
    /// Delay before responding, in ms (0: none).
    pub delay_ms: u64,
    /// Content tokens after which the response dies.
    pub die_after_chunks: Option<u32>,
    /// Forced completion length.
    pub completion_tokens: Option<u32>,
    /// Forced inter-token time, in ms.
    pub token_interval_ms: Option<u64>,
    /// Forced time to first token, in ms.
    pub ttft_ms: Option<u64>,
    /// Stream line ends.
    pub line_ending: LineEnding,
    /// Tokens per streamed delta (at least 1).
    pub tokens_per_delta: u32,
    /// No usage anywhere.
    pub omit_usage: bool,
    /// Content tokens after which an in-stream error ends the stream.
    pub error_after_chunks: Option<u32>,
    /// Errors answered with HTTP 200.
    pub error_with_200: bool,
    /// Content tokens after which the stream hangs.
    pub hang_after_chunks: Option<u32>,
}

impl Knobs {
    /// Merges a request's knobs over the global ones.
    pub fn merge(global: &GlobalFaults, request: Option<&RequestKnobs>) -> Self {
        let r = request.copied().unwrap_or_default();
        Self {
            fail_status: r.fail_status.or(global.fail_status),
            flat_errors: r.flat_errors.unwrap_or(global.flat_errors),
            usage_on_last_chunk: r.usage_on_last_chunk.unwrap_or(global.usage_on_last_chunk),
            delay_ms: r.delay_ms.unwrap_or(global.delay_ms),
            die_after_chunks: r.die_after_chunks.or(global.die_after_chunks),
            completion_tokens: r.completion_tokens.or(global.completion_tokens),
            token_interval_ms: r.token_interval_ms.or(global.token_interval_ms),
            ttft_ms: r.ttft_ms.or(global.ttft_ms),
            line_ending: r.line_ending.unwrap_or(global.line_ending),
            tokens_per_delta: r
                .tokens_per_delta
                .or(global.tokens_per_delta)
                .unwrap_or(1)
                .max(1),
            omit_usage: r.omit_usage.unwrap_or(global.omit_usage),
            error_after_chunks: r.error_after_chunks.or(global.error_after_chunks),
            error_with_200: r.error_with_200.unwrap_or(global.error_with_200),
            hang_after_chunks: r.hang_after_chunks.or(global.hang_after_chunks),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn request_overrides_global() {
        let global = GlobalFaults {
            fail_status: Some(503),
            flat_errors: true,
            delay_ms: 5,
            ..Default::default()
        };
        let req: RequestKnobs =
            serde_json::from_str(r#"{"flat_errors":false,"completion_tokens":3}"#).unwrap();
        let k = Knobs::merge(&global, Some(&req));
        assert_eq!(k.fail_status, Some(503));
        assert!(!k.flat_errors);
        assert_eq!(k.delay_ms, 5);
        assert_eq!(k.completion_tokens, Some(3));
        assert!(Knobs::merge(&global, None).flat_errors);
    }

    #[test]
    fn globals_parse_partially() {
        let g: GlobalFaults =
            serde_json::from_str(r#"{"fail_status":503,"die_after_chunks":null}"#).unwrap();
        assert_eq!(
            g,
            GlobalFaults {
                fail_status: Some(503),
                ..Default::default()
            }
        );
    }
}
