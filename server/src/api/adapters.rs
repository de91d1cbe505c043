//! `/api/v1/adapters`: list, upload (multipart `name`, `base`, then the files
//! `adapter_config.json` and `adapter_model.safetensors`, streamed), detail with history, start,
//! stop, delete.

use axum::extract::{ConnectInfo, Multipart, Path, Request, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::json;

use super::error::ApiError;
use super::ApiState;
use crate::gateway::auth::Principal;
use crate::lifecycle::transitions::Command;
use crate::lifecycle::{Actor, AdapterView};

async fn principal(
    state: &ApiState,
    headers: &HeaderMap,
    extensions: &axum::http::Extensions,
) -> Result<(Principal, Actor), ApiError> {
    let client = extensions
        .get::<ConnectInfo<std::net::SocketAddr>>()
        .map(|c| c.0.ip());
    let p = state.keys.authenticate(headers, client).await?;
    let actor = Actor {
        user_id: None,
        label: format!("key:{}", p.key_id),
    };
    Ok((p, actor))
}

fn view_json(v: &AdapterView) -> serde_json::Value {
    json!({
        "id": v.id,
        "object": "adapter",
        "name": v.name,
        "served_name": v.name,
        "base": v.base,
        "version": v.version,
        "state": v.state,
        "desired": v.desired,
        "reason": v.reason,
        "engine_name": v.engine_name,
        "validation": v.validation,
        "size_bytes": v.size_bytes,
        "updated_at": v.updated_at.unix_timestamp(),
    })
}

pub async fn list(State(state): State<ApiState>, req: Request) -> Result<Response, ApiError> {
    let (p, _) = principal(&state, req.headers(), req.extensions()).await?;
    let data: Vec<_> = state
        .lifecycle
        .list(p.tenant_id)
        .await?
        .iter()
        .map(view_json)
        .collect();
    Ok(Json(json!({"object": "list", "data": data})).into_response())
}

pub async fn detail(
    State(state): State<ApiState>,
    Path(name): Path<String>,
    req: Request,
) -> Result<Response, ApiError> {
    let (p, _) = principal(&state, req.headers(), req.extensions()).await?;
    let (view, history) = state.lifecycle.detail(p.tenant_id, &name).await?;
    let mut body = view_json(&view);
    body["history"] = history
        .iter()
        .map(|h| {
            json!({"from": h.from_state, "to": h.to_state, "reason": h.reason,
                   "at": h.at.unix_timestamp()})
        })
        .collect();
    Ok(Json(body).into_response())
}

async fn command(
    state: ApiState,
    name: String,
    req: Request,
    command: Command,
) -> Result<Response, ApiError> {
    let (p, actor) = principal(&state, req.headers(), req.extensions()).await?;
    let view = state
        .lifecycle
        .command(p.tenant_id, &name, command, &actor)
        .await?;
    let status = if command == Command::Start {
        StatusCode::ACCEPTED
    } else {
        StatusCode::OK
    };
    Ok((status, Json(view_json(&view))).into_response())
}

pub async fn start(
    State(state): State<ApiState>,
    Path(name): Path<String>,
    req: Request,
) -> Result<Response, ApiError> {
    command(state, name, req, Command::Start).await
}

pub async fn stop(
    State(state): State<ApiState>,
    Path(name): Path<String>,
    req: Request,
) -> Result<Response, ApiError> {
    command(state, name, req, Command::Stop).await
}

pub async fn delete(
    State(state): State<ApiState>,
    Path(name): Path<String>,
    req: Request,
) -> Result<Response, ApiError> {
    command(state, name, req, Command::Delete).await
}

/// The upload: authenticated before a byte of the body is read, then read by the lifecycle's
/// one form reader (files streamed straight to storage).
pub async fn upload(State(state): State<ApiState>, req: Request) -> Result<Response, ApiError> {
    let (p, actor) = principal(&state, req.headers(), req.extensions()).await?;
    let mut form = <Multipart as axum::extract::FromRequest<()>>::from_request(req, &())
        .await
        .map_err(|e| ApiError::BadRequest(format!("expected multipart/form-data: {e}")))?;
    let view = state
        .lifecycle
        .receive(p.tenant_id, &actor, &mut form)
        .await?;
    Ok((StatusCode::CREATED, Json(view_json(&view))).into_response())
}
