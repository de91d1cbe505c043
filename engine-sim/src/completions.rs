//! The two generation endpoints, `POST /v1/chat/completions` and `POST /v1/completions`: parse,
//! apply the fault knobs, check the model, then hand the request to the engine and answer it
//! whole or as a stream. Every request that reaches here gets exactly one ledger entry.

use std::io;
use std::sync::Arc;
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};

use crate::engine::{unix_now, Engine, Job};
use crate::faults::Knobs;
use crate::ledger::{LedgerEntry, LedgerGuard};
use crate::openai::{ApiError, CompletionRequest, Usage};
use crate::reply::{token_text, Reply};
use crate::typed_reply::{Typed, TypedReply};
use crate::{stream, tokenizer};
use serde_json::Value;

/// `POST /v1/chat/completions`.
pub async fn chat(State(sim): State<Arc<Engine>>, headers: HeaderMap, body: Bytes) -> Response {
    handle(sim, Wire::Chat, &headers, &body).await
}

/// `POST /v1/completions`.
pub async fn completions(
    State(sim): State<Arc<Engine>>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    handle(sim, Wire::Text, &headers, &body).await
}

/// `POST /v1/responses` (OpenAI Responses; nothing is stored: `store` is ignored).
pub async fn responses(
    State(sim): State<Arc<Engine>>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    handle(sim, Wire::Typed(Typed::Responses), &headers, &body).await
}

/// `POST /v1/messages` (Anthropic Messages).
pub async fn messages(State(sim): State<Arc<Engine>>, headers: HeaderMap, body: Bytes) -> Response {
    handle(sim, Wire::Typed(Typed::Anthropic), &headers, &body).await
}

/// Which wire format a generation endpoint speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Wire {
    Chat,
    Text,
    Typed(Typed),
}

async fn handle(engine: Arc<Engine>, wire: Wire, headers: &HeaderMap, body: &[u8]) -> Response {
    let chat = wire == Wire::Chat;
    let global = engine.faults();
    let entry = LedgerEntry {
        request_id: headers
            .get("x-request-id")
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned),
        traceparent: headers
            .get("traceparent")
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned),
        model: String::new(),
        adapter: None,
        cache_salt: None,
        stream: false,
        prompt_tokens: 0,
        cached_tokens: 0,
        completion_tokens: 0,
        reasoning_tokens: 0,
        cancelled: false,
        died: false,
        status: 0,
    };
    let mut guard = LedgerGuard::new(engine.ledger.clone(), entry);
    let request: CompletionRequest = match serde_json::from_slice(body) {
        Ok(request) => request,
        Err(e) => {
            delay(global.delay_ms).await;
            return fail(
                &mut guard,
                ApiError::bad_request(format!("Invalid request body: {e}"), global.flat_errors),
            );
        }
    };
    let knobs = Knobs::merge(&global, request.sim.as_ref());
    guard.entry.model.clone_from(&request.model);
    guard.entry.cache_salt.clone_from(&request.cache_salt);
    guard.entry.stream = request.stream.unwrap_or(false);
    let prompt = if let Wire::Typed(typed) = wire {
        let messages = match typed {
            Typed::Responses => {
                tokenizer::as_chat::responses(request.instructions.as_ref(), request.input.as_ref())
            }
            Typed::Anthropic => {
                tokenizer::as_chat::anthropic(request.system.as_ref(), request.messages.as_ref())
            }
        };
        let valid = match typed {
            Typed::Responses => request
                .input
                .as_ref()
                .is_some_and(|i| i.is_string() || i.is_array()),
            Typed::Anthropic => request.messages.as_ref().is_some_and(Value::is_array),
        };
        valid.then(|| tokenizer::chat_prompt_ids(&messages))
    } else if chat {
        request
            .messages
            .as_ref()
            .filter(|m| m.is_array())
            .map(tokenizer::chat_prompt_ids)
    } else {
        request
            .prompt
            .as_ref()
            .filter(|p| p.is_string() || p.is_array())
            .map(tokenizer::completion_prompt_ids)
    };
    let prompt_len = prompt.as_ref().map_or(0, Vec::len);
    guard.entry.prompt_tokens = u32::try_from(prompt_len).unwrap_or(u32::MAX);

    delay(knobs.delay_ms).await;
    if let Some(status) = knobs.fail_status {
        let error = ApiError {
            status,
            message: "Simulated engine failure.".to_owned(),
            flat: knobs.flat_errors,
        };
        guard.finish(error.status);
        return error.respond(knobs.error_with_200);
    }
    let Some(prompt_ids) = prompt else {
        let what = match wire {
            Wire::Chat | Wire::Typed(Typed::Anthropic) => "`messages` must be an array",
            Wire::Typed(Typed::Responses) => "`input` must be a string or an array",
            Wire::Text => "`prompt` must be a string or an array",
        };
        return fail(&mut guard, ApiError::bad_request(what, knobs.flat_errors));
    };
    let Some(adapter) = engine.resolve(&request.model) else {
        return fail(
            &mut guard,
            ApiError::model_not_found(&request.model, knobs.flat_errors),
        );
    };
    guard.entry.adapter = adapter;

    let limit = match wire {
        Wire::Chat => request.max_completion_tokens.or(request.max_tokens),
        Wire::Text | Wire::Typed(Typed::Anthropic) => request.max_tokens,
        Wire::Typed(Typed::Responses) => request.max_output_tokens,
    };
    // With `reasoning` set, the first half of the output counts as reasoning tokens.
    let reasoning = request.reasoning.as_ref().is_some_and(|r| !r.is_null());
    let options = request.stream_options.unwrap_or_default();
    let reply = Reply {
        id: format!(
            "{}-{}",
            if chat { "chatcmpl" } else { "cmpl" },
            uuid::Uuid::new_v4().simple()
        ),
        created: unix_now(),
        model: request.model,
        chat,
        include_usage: options.include_usage && !knobs.omit_usage,
        continuous_usage: options.include_usage
            && options.continuous_usage_stats
            && !knobs.omit_usage,
        usage_on_last_chunk: knobs.usage_on_last_chunk && !knobs.omit_usage,
        omit_usage: knobs.omit_usage,
    };
    let mut job = Job::new(engine, guard, prompt_ids, limit, &knobs);
    job.reasoning = reasoning;
    if let Wire::Typed(typed) = wire {
        let typed = TypedReply::new(typed, reply.model, reply.created);
        return if job.guard.entry.stream {
            stream::typed_response(job, typed)
        } else {
            whole_typed(job, typed).await
        };
    }
    if job.guard.entry.stream {
        stream::response(job, reply)
    } else {
        whole(job, reply).await
    }
}

/// Generates the whole answer of a typed endpoint, then answers it.
async fn whole_typed(mut job: Job, reply: TypedReply) -> Response {
    job.prefill().await;
    let mut text = String::with_capacity(job.target as usize * 5);
    while job.produced() < job.target {
        if job.dies_now() {
            job.guard.entry.died = true;
            job.guard.finish(0);
            return broken_connection();
        }
        job.wait_next().await;
        token_text(job.produced(), &mut text);
        job.commit();
    }
    let body = reply.whole(&text, job.finish_reason, job.counts());
    job.guard.finish(200);
    let mut response = (StatusCode::OK, body).into_response();
    response.headers_mut().insert(
        axum::http::header::CONTENT_TYPE,
        axum::http::HeaderValue::from_static("application/json"),
    );
    response
}

/// Generates the whole completion, then answers it (or breaks the connection on a death).
async fn whole(mut job: Job, reply: Reply) -> Response {
    job.prefill().await;
    let mut text = String::with_capacity(job.target as usize * 5);
    while job.produced() < job.target {
        if job.dies_now() {
            job.guard.entry.died = true;
            job.guard.finish(0);
            return broken_connection();
        }
        job.wait_next().await;
        token_text(job.produced(), &mut text);
        job.commit();
    }
    let entry = &job.guard.entry;
    let usage = Usage::new(
        entry.prompt_tokens,
        entry.cached_tokens,
        entry.completion_tokens,
    );
    let body = reply.whole(&text, job.finish_reason, usage);
    job.guard.finish(200);
    let mut response = (StatusCode::OK, body).into_response();
    response.headers_mut().insert(
        axum::http::header::CONTENT_TYPE,
        axum::http::HeaderValue::from_static("application/json"),
    );
    response
}

/// A response whose body fails before its first byte: hyper then drops the connection without
/// flushing the status line, so the client sees the connection close with no response.
fn broken_connection() -> Response {
    let body = futures::stream::once(async {
        Err::<Bytes, _>(io::Error::other("simulated engine death"))
    });
    Response::new(Body::from_stream(body))
}

fn fail(guard: &mut LedgerGuard, error: ApiError) -> Response {
    guard.finish(error.status);
    error.into_response()
}

async fn delay(ms: u64) {
    if ms > 0 {
        tokio::time::sleep(Duration::from_millis(ms)).await;
    }
}
