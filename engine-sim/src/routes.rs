//! The HTTP surface: the router, and the small endpoints around generation: `/health`, `/metrics`,
//! `/v1/models`, LoRA management (vLLM's and Dynamo's APIs) and the `/sim/*` test controls
//! (ledger and global faults).

use std::sync::Arc;

use axum::extract::{DefaultBodyLimit, Path, State};
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{delete, get, post};
use axum::{Json, Router};
use serde::Deserialize;
use serde_json::{json, Value};

use crate::completions;
use crate::engine::Engine;
use crate::faults::GlobalFaults;
use crate::openai::{json_response, ApiError};

/// Largest request body accepted (a very long prompt still fits).
const MAX_BODY: usize = 64 * 1024 * 1024;

/// All routes of a simulated engine.
pub fn router(sim: Arc<Engine>) -> Router {
    Router::new()
        .route("/v1/chat/completions", post(completions::chat))
        .route("/v1/completions", post(completions::completions))
        .route("/v1/responses", post(completions::responses))
        .route("/v1/messages", post(completions::messages))
        .route("/v1/embeddings", post(crate::embeddings::embeddings))
        .route("/v1/models", get(models))
        .route("/health", get(|| async { StatusCode::OK }))
        .route("/metrics", get(metrics))
        .route("/v1/load_lora_adapter", post(load_lora))
        .route("/v1/unload_lora_adapter", post(unload_lora))
        .route("/v1/loras", post(dynamo_load_lora))
        .route("/v1/loras/{name}", delete(dynamo_unload_lora))
        .route("/sim/ledger", get(ledger).delete(clear_ledger))
        .route("/sim/faults", get(get_faults).post(set_faults))
        .layer(DefaultBodyLimit::max(MAX_BODY))
        .with_state(sim)
}

/// The engine's token counters in Prometheus text, under vLLM's names (what
/// `tokenfactory admin economics measure-peak` reads from a real engine too).
async fn metrics(State(sim): State<Arc<Engine>>) -> Response {
    use std::sync::atomic::Ordering;
    let model = sim.config.models.first().map_or("", String::as_str);
    let body = format!(
        "# TYPE vllm:prompt_tokens_total counter\n\
         vllm:prompt_tokens_total{{model_name=\"{model}\"}} {}\n\
         # TYPE vllm:generation_tokens_total counter\n\
         vllm:generation_tokens_total{{model_name=\"{model}\"}} {}\n",
        sim.prompt_tokens_total.load(Ordering::Relaxed),
        sim.generation_tokens_total.load(Ordering::Relaxed),
    );
    (
        [(
            header::CONTENT_TYPE,
            HeaderValue::from_static("text/plain; version=0.0.4"),
        )],
        body,
    )
        .into_response()
}

async fn models(State(sim): State<Arc<Engine>>) -> Response {
    let engine = &sim;
    let created = engine.created;
    let mut data: Vec<Value> = engine
        .config
        .models
        .iter()
        .map(|m| json!({"id": m, "object": "model", "created": created, "owned_by": "vllm", "root": m, "parent": null}))
        .collect();
    let parent = engine.config.models.first();
    data.extend(engine.loras.list().into_iter().map(|(name, path)| {
        json!({"id": name, "object": "model", "created": created, "owned_by": "vllm", "root": path, "parent": parent})
    }));
    json_response(StatusCode::OK, &json!({"object": "list", "data": data}))
}

#[derive(Deserialize)]
struct LoadLora {
    lora_name: String,
    #[serde(default)]
    lora_path: String,
}

#[derive(Deserialize)]
struct UnloadLora {
    lora_name: String,
}

#[derive(Deserialize)]
struct DynamoLora {
    lora_name: String,
    #[serde(default)]
    source: Option<DynamoSource>,
}

#[derive(Deserialize)]
struct DynamoSource {
    #[serde(default)]
    uri: String,
}

fn lora_error(sim: &Engine, status: u16, message: String) -> Response {
    ApiError {
        status,
        message,
        flat: sim.faults().flat_errors,
    }
    .into_response()
}

fn parse<T: for<'de> Deserialize<'de>>(sim: &Engine, body: &[u8]) -> Result<T, ApiError> {
    serde_json::from_slice(body).map_err(|e| ApiError {
        status: 400,
        message: format!("Invalid request body: {e}"),
        flat: sim.faults().flat_errors,
    })
}

async fn load_lora(State(sim): State<Arc<Engine>>, body: axum::body::Bytes) -> Response {
    let req: LoadLora = match parse(&sim, &body) {
        Ok(req) => req,
        Err(error) => return error.into_response(),
    };
    let engine = &sim;
    let name = req.lora_name;
    if engine.config.models.contains(&name) || !engine.loras.insert(&name, &req.lora_path) {
        return lora_error(
            &sim,
            400,
            format!("The lora adapter '{name}' has already been loaded."),
        );
    }
    (
        StatusCode::OK,
        format!("Success: LoRA adapter '{name}' added successfully."),
    )
        .into_response()
}

async fn unload_lora(State(sim): State<Arc<Engine>>, body: axum::body::Bytes) -> Response {
    let req: UnloadLora = match parse(&sim, &body) {
        Ok(req) => req,
        Err(error) => return error.into_response(),
    };
    let name = req.lora_name;
    if !sim.loras.remove(&name) {
        return lora_error(
            &sim,
            404,
            format!("The lora adapter '{name}' cannot be found."),
        );
    }
    (
        StatusCode::OK,
        format!("Success: LoRA adapter '{name}' removed successfully."),
    )
        .into_response()
}

async fn dynamo_load_lora(State(sim): State<Arc<Engine>>, body: axum::body::Bytes) -> Response {
    let req: DynamoLora = match parse(&sim, &body) {
        Ok(req) => req,
        Err(error) => return error.into_response(),
    };
    let engine = &sim;
    if engine.config.models.contains(&req.lora_name) {
        return lora_error(
            &sim,
            400,
            format!("'{}' is a base model name.", req.lora_name),
        );
    }
    let uri = req.source.map(|s| s.uri).unwrap_or_default();
    engine.loras.upsert(&req.lora_name, &uri);
    json_response(
        StatusCode::OK,
        &json!({"status": "success", "lora_name": req.lora_name}),
    )
}

async fn dynamo_unload_lora(State(sim): State<Arc<Engine>>, Path(name): Path<String>) -> Response {
    if !sim.loras.remove(&name) {
        return lora_error(
            &sim,
            404,
            format!("The lora adapter '{name}' cannot be found."),
        );
    }
    json_response(
        StatusCode::OK,
        &json!({"status": "success", "lora_name": name}),
    )
}

async fn ledger(State(sim): State<Arc<Engine>>) -> Response {
    let mut out = Vec::new();
    for entry in sim.ledger.snapshot() {
        // Serialising a plain struct cannot fail.
        let _ = serde_json::to_writer(&mut out, &entry);
        out.push(b'\n');
    }
    let mut response = (StatusCode::OK, out).into_response();
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/x-ndjson"),
    );
    response
}

async fn clear_ledger(State(sim): State<Arc<Engine>>) -> StatusCode {
    sim.ledger.clear();
    StatusCode::NO_CONTENT
}

async fn get_faults(State(sim): State<Arc<Engine>>) -> Json<GlobalFaults> {
    Json(sim.faults())
}

async fn set_faults(State(sim): State<Arc<Engine>>, body: axum::body::Bytes) -> Response {
    match parse::<GlobalFaults>(&sim, &body) {
        Ok(faults) => {
            sim.set_faults(faults);
            Json(faults).into_response()
        }
        Err(error) => error.into_response(),
    }
}
