//! OpenAI-compatible wire types as vLLM speaks them: the request fields the simulator reads, the
//! response and stream-chunk shapes it writes, and vLLM's (or Dynamo's flat) error bodies.

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::faults::RequestKnobs;

/// `stream_options` of a request.
#[derive(Deserialize, Clone, Copy, Debug, Default)]
#[serde(default)]
pub struct StreamOptions {
    /// Send a final usage chunk.
    pub include_usage: bool,
    /// With `include_usage`: running usage on every chunk (vLLM extension).
    pub continuous_usage_stats: bool,
}

/// The fields of a chat or completion request the simulator reads; others are ignored.
#[derive(Deserialize, Debug)]
pub struct CompletionRequest {
    /// Served name: a base or a loaded LoRA.
    pub model: String,
    /// Chat messages (chat endpoint).
    #[serde(default)]
    pub messages: Option<Value>,
    /// Prompt (completions endpoint).
    #[serde(default)]
    pub prompt: Option<Value>,
    /// Responses' input (a string or items).
    #[serde(default)]
    pub input: Option<Value>,
    /// Responses' system prompt.
    #[serde(default)]
    pub instructions: Option<Value>,
    /// Anthropic's system prompt (a string or text blocks).
    #[serde(default)]
    pub system: Option<Value>,
    /// Responses' completion limit.
    #[serde(default)]
    pub max_output_tokens: Option<u32>,
    /// Responses' reasoning options: when set, half the output is reasoning.
    #[serde(default)]
    pub reasoning: Option<Value>,
    /// Completion length limit.
    #[serde(default)]
    pub max_tokens: Option<u32>,
    /// Chat's newer name for the limit; wins over `max_tokens`.
    #[serde(default)]
    pub max_completion_tokens: Option<u32>,
    /// Stream as SSE.
    #[serde(default)]
    pub stream: Option<bool>,
    /// Streaming usage options.
    #[serde(default)]
    pub stream_options: Option<StreamOptions>,
    /// Prefix-cache isolation key.
    #[serde(default)]
    pub cache_salt: Option<String>,
    /// Per-request simulator knobs.
    #[serde(default)]
    pub sim: Option<RequestKnobs>,
}

/// Token accounting of a response.
#[derive(Serialize, Clone, Copy, Debug, PartialEq, Eq)]
pub struct Usage {
    /// Prompt tokens.
    pub prompt_tokens: u32,
    /// Generated tokens.
    pub completion_tokens: u32,
    /// Their sum.
    pub total_tokens: u32,
    /// Cached-prompt details.
    pub prompt_tokens_details: PromptDetails,
}

/// `usage.prompt_tokens_details`.
#[derive(Serialize, Clone, Copy, Debug, PartialEq, Eq)]
pub struct PromptDetails {
    /// Prompt tokens served from the prefix cache.
    pub cached_tokens: u32,
}

impl Usage {
    /// Usage for these counts.
    pub fn new(prompt_tokens: u32, cached_tokens: u32, completion_tokens: u32) -> Self {
        Self {
            prompt_tokens,
            completion_tokens,
            total_tokens: prompt_tokens.saturating_add(completion_tokens),
            prompt_tokens_details: PromptDetails { cached_tokens },
        }
    }
}

/// A whole (non-streamed) response or one stream chunk; `choices` holds the endpoint's shape.
#[derive(Serialize, Debug)]
pub struct Envelope<'a, C: Serialize> {
    /// `chatcmpl-…` or `cmpl-…`.
    pub id: &'a str,
    /// `chat.completion`, `chat.completion.chunk` or `text_completion`.
    pub object: &'static str,
    /// Unix seconds.
    pub created: u64,
    /// The requested name.
    pub model: &'a str,
    /// Zero or one choice.
    pub choices: &'a [C],
    /// Serialised as `null` when absent, like vLLM's chunks.
    pub usage: Option<Usage>,
}

/// A chat message (whole response) or delta (chunk).
#[derive(Serialize, Debug)]
pub struct Message<'a> {
    /// `assistant`, only on the whole message and the first chunk.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub role: Option<&'static str>,
    /// Text.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub content: Option<&'a str>,
}

/// One chat choice (`message` for a whole response, `delta` for a chunk).
#[derive(Serialize, Debug)]
pub struct ChatChoice<'a> {
    /// Always 0.
    pub index: u32,
    /// Whole-response message.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub message: Option<Message<'a>>,
    /// Chunk delta.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub delta: Option<Message<'a>>,
    /// Always null.
    pub logprobs: Option<()>,
    /// `length` or `stop` on the last content, else null.
    pub finish_reason: Option<&'static str>,
}

/// One text-completion choice.
#[derive(Serialize, Debug)]
pub struct TextChoice<'a> {
    /// Always 0.
    pub index: u32,
    /// Text.
    pub text: &'a str,
    /// Always null.
    pub logprobs: Option<()>,
    /// `length` or `stop` on the last content, else null.
    pub finish_reason: Option<&'static str>,
}

/// An error the engine answers with; rendered as vLLM's envelope or Dynamo's flat body.
#[derive(Debug, Clone)]
pub struct ApiError {
    /// HTTP status.
    pub status: u16,
    /// Human message.
    pub message: String,
    /// Flat (Dynamo) instead of enveloped (vLLM) body.
    pub flat: bool,
}

impl ApiError {
    /// A 400 `BadRequestError`.
    pub fn bad_request(message: impl Into<String>, flat: bool) -> Self {
        Self {
            status: 400,
            message: message.into(),
            flat,
        }
    }

    /// A 404 for an unknown model, with vLLM's message.
    pub fn model_not_found(model: &str, flat: bool) -> Self {
        Self {
            status: 404,
            message: format!("The model `{model}` does not exist."),
            flat,
        }
    }

    /// The error `type` vLLM uses for a status.
    pub fn kind(status: u16) -> &'static str {
        match status {
            400 | 422 => "BadRequestError",
            401 => "AuthenticationError",
            403 => "PermissionDeniedError",
            404 => "NotFoundError",
            409 => "ConflictError",
            429 => "RateLimitError",
            503 => "ServiceUnavailableError",
            _ if status >= 500 => "InternalServerError",
            _ => "BadRequestError",
        }
    }

    /// The body as JSON.
    pub fn body(&self) -> Value {
        let kind = Self::kind(self.status);
        if self.flat {
            serde_json::json!({"message": self.message, "type": kind, "code": self.status})
        } else {
            serde_json::json!({"error": {"message": self.message, "type": kind, "param": null, "code": self.status}})
        }
    }
}

impl ApiError {
    /// The error as answered: with its status, or (`with_200`, a fault some vLLM versions have)
    /// with HTTP 200 and vLLM's older `{"object":"error",..}` body (Dynamo's flat one if flat).
    pub fn respond(self, with_200: bool) -> Response {
        if !with_200 {
            return self.into_response();
        }
        let body = if self.flat {
            self.body()
        } else {
            serde_json::json!({"object": "error", "message": self.message, "type": Self::kind(self.status), "param": null, "code": self.status})
        };
        json_response(StatusCode::OK, &body)
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let status = StatusCode::from_u16(self.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        json_response(status, &self.body())
    }
}

/// A JSON response from anything serialisable.
pub fn json_response<T: Serialize + ?Sized>(status: StatusCode, body: &T) -> Response {
    let bytes = serde_json::to_vec(body).unwrap_or_default();
    let mut response = (status, bytes).into_response();
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    response
}

/// One SSE event: `data: <compact json>\n\n`.
pub fn sse_event<T: Serialize + ?Sized>(value: &T) -> bytes::Bytes {
    let mut out = Vec::with_capacity(256);
    out.extend_from_slice(b"data: ");
    // Serialising these plain structs cannot fail.
    let _ = serde_json::to_writer(&mut out, value);
    out.extend_from_slice(b"\n\n");
    bytes::Bytes::from(out)
}

/// The stream terminator.
pub const SSE_DONE: &[u8] = b"data: [DONE]\n\n";
