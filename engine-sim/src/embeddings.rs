//! `POST /v1/embeddings`: deterministic vectors (a hash of each input's tokens, so a test can
//! recompute them) and vLLM's usage (`prompt_tokens`, `total_tokens`). An input is counted as a
//! completion prompt is (see [`crate::tokenizer`]): a string's words plus one BOS, token ids as
//! their length. Every request that reaches here gets exactly one ledger entry (no completion
//! tokens: nothing is generated).

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;
use base64::Engine as _;
use serde::Deserialize;
use serde_json::{json, Value};

use crate::engine::Engine;
use crate::faults::{Knobs, RequestKnobs};
use crate::ledger::{LedgerEntry, LedgerGuard};
use crate::openai::{json_response, ApiError};
use crate::tokenizer;

/// Dimensions of a vector when the request does not ask for others.
pub const DEFAULT_DIMENSIONS: usize = 8;
/// The most dimensions a request may ask for.
const MAX_DIMENSIONS: usize = 4096;

#[derive(Deserialize)]
struct EmbeddingRequest {
    model: String,
    #[serde(default)]
    input: Option<Value>,
    #[serde(default)]
    encoding_format: Option<String>,
    #[serde(default)]
    dimensions: Option<usize>,
    #[serde(default)]
    sim: Option<RequestKnobs>,
}

/// `POST /v1/embeddings`.
pub async fn embeddings(
    State(engine): State<Arc<Engine>>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let global = engine.faults();
    let entry = LedgerEntry {
        request_id: headers
            .get("x-request-id")
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
        traceparent: headers
            .get("traceparent")
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned),
    };
    let mut guard = LedgerGuard::new(engine.ledger.clone(), entry);
    let fail = |guard: &mut LedgerGuard, error: ApiError| {
        guard.finish(error.status);
        axum::response::IntoResponse::into_response(error)
    };
    let request: EmbeddingRequest = match serde_json::from_slice(&body) {
        Ok(r) => r,
        Err(e) => {
            return fail(
                &mut guard,
                ApiError::bad_request(format!("Invalid request body: {e}"), global.flat_errors),
            )
        }
    };
    let knobs = Knobs::merge(&global, request.sim.as_ref());
    guard.entry.model.clone_from(&request.model);
    if knobs.delay_ms > 0 {
        tokio::time::sleep(std::time::Duration::from_millis(knobs.delay_ms)).await;
    }
    if let Some(status) = knobs.fail_status {
        let error = ApiError {
            status,
            message: "Simulated engine failure.".to_owned(),
            flat: knobs.flat_errors,
        };
        guard.finish(error.status);
        return error.respond(knobs.error_with_200);
    }
    let inputs = match split_inputs(request.input.as_ref()) {
        Some(inputs) if !inputs.is_empty() => inputs,
        _ => {
            return fail(
                &mut guard,
                ApiError::bad_request(
                    "`input` must be a string, an array of strings, an array of token ids or an array of such arrays",
                    knobs.flat_errors,
                ),
            )
        }
    };
    let dimensions = request.dimensions.unwrap_or(DEFAULT_DIMENSIONS);
    if dimensions == 0 || dimensions > MAX_DIMENSIONS {
        return fail(
            &mut guard,
            ApiError::bad_request(
                format!("`dimensions` must be in 1..={MAX_DIMENSIONS}"),
                knobs.flat_errors,
            ),
        );
    }
    let base64 = match request.encoding_format.as_deref() {
        None | Some("float") => false,
        Some("base64") => true,
        Some(other) => {
            return fail(
                &mut guard,
                ApiError::bad_request(
                    format!("`encoding_format` {other:?} must be \"float\" or \"base64\""),
                    knobs.flat_errors,
                ),
            )
        }
    };
    let Some(adapter) = engine.resolve(&request.model) else {
        return fail(
            &mut guard,
            ApiError::model_not_found(&request.model, knobs.flat_errors),
        );
    };
    guard.entry.adapter = adapter;
    let mut prompt: u32 = 0;
    let mut data = Vec::with_capacity(inputs.len());
    for (index, ids) in inputs.iter().enumerate() {
        prompt = prompt.saturating_add(u32::try_from(ids.len()).unwrap_or(u32::MAX));
        let vector = vector(ids, dimensions);
        let embedding = if base64 {
            let bytes: Vec<u8> = vector.iter().flat_map(|f| f.to_le_bytes()).collect();
            Value::String(base64::engine::general_purpose::STANDARD.encode(bytes))
        } else {
            json!(vector)
        };
        data.push(json!({"object": "embedding", "index": index, "embedding": embedding}));
    }
    guard.entry.prompt_tokens = prompt;
    engine
        .prompt_tokens_total
        .fetch_add(u64::from(prompt), std::sync::atomic::Ordering::Relaxed);
    guard.finish(200);
    json_response(
        StatusCode::OK,
        &json!({
            "object": "list",
            "data": data,
            "model": request.model,
            "usage": {"prompt_tokens": prompt, "total_tokens": prompt},
        }),
    )
}

/// Each input's token ids (by the simulated tokenizer); `None` when `input` has another shape.
fn split_inputs(input: Option<&Value>) -> Option<Vec<Vec<u64>>> {
    match input? {
        Value::String(_) => Some(vec![tokenizer::completion_prompt_ids(input?)]),
        Value::Array(items) if items.iter().all(Value::is_u64) => {
            Some(vec![tokenizer::completion_prompt_ids(input?)])
        }
        Value::Array(items) => items
            .iter()
            .map(|item| match item {
                Value::String(_) => Some(tokenizer::completion_prompt_ids(item)),
                Value::Array(ids) if ids.iter().all(Value::is_u64) => {
                    Some(ids.iter().filter_map(Value::as_u64).collect())
                }
                _ => None,
            })
            .collect(),
        _ => None,
    }
}

/// A unit-length vector from the token ids: component `i` is the mean of a hash of each id with
/// `i`, mapped to [-1, 1], then normalised.
fn vector(ids: &[u64], dimensions: usize) -> Vec<f32> {
    let mut v: Vec<f32> = (0..dimensions as u64)
        .map(|i| {
            let sum: f64 = ids
                .iter()
                .map(|id| {
                    let h = (id ^ i.wrapping_mul(0x9e37_79b9_7f4a_7c15))
                        .wrapping_mul(0xbf58_476d_1ce4_e5b9);
                    (h >> 11) as f64 / (1u64 << 53) as f64 * 2.0 - 1.0
                })
                .sum();
            (sum / ids.len().max(1) as f64) as f32
        })
        .collect();
    let norm = v.iter().map(|x| x * x).sum::<f32>().sqrt();
    if norm > 0.0 {
        v.iter_mut().for_each(|x| *x /= norm);
    }
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_input_shape_is_counted_as_a_completion_prompt() {
        let count = |v: Value| -> Vec<usize> {
            split_inputs(Some(&v))
                .unwrap()
                .iter()
                .map(Vec::len)
                .collect()
        };
        assert_eq!(count(json!("one two")), vec![3]);
        assert_eq!(count(json!(["one two", "three"])), vec![3, 2]);
        assert_eq!(count(json!([5, 6, 7])), vec![3]);
        assert_eq!(count(json!([[5, 6], [7]])), vec![2, 1]);
        assert!(split_inputs(Some(&json!([{"a": 1}]))).is_none());
        let total: usize = count(json!(["one two", "three"])).iter().sum();
        assert_eq!(
            total as u32,
            tokenizer::completion_prompt_tokens(r#"["one two", "three"]"#)
        );
        let v = vector(&[1, 2, 3], 8);
        assert_eq!(v, vector(&[1, 2, 3], 8));
        assert!((v.iter().map(|x| x * x).sum::<f32>() - 1.0).abs() < 1e-5);
    }
}
