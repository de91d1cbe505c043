//! `/api/v1/adapters`: list, upload (multipart `name`, `base`, then the files
//! `adapter_config.json` and `adapter_model.safetensors`, streamed), detail with history, start,
//! stop, delete.

use axum::extract::{ConnectInfo, Multipart, Path, Request, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use futures::TryStreamExt;
use serde_json::json;

use super::error::ApiError;
use super::ApiState;
use crate::gateway::auth::Principal;
use crate::lifecycle::transitions::Command;
use crate::lifecycle::validate::{CONFIG_FILE, WEIGHTS_FILE};
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

/// The upload: authenticated before a byte of the body is read; `name` and `base` must come
/// before the files (a form sends its fields in order), so the files stream straight to storage.
pub async fn upload(State(state): State<ApiState>, req: Request) -> Result<Response, ApiError> {
    let (p, actor) = principal(&state, req.headers(), req.extensions()).await?;
    let mut form = <Multipart as axum::extract::FromRequest<()>>::from_request(req, &())
        .await
        .map_err(|e| ApiError::BadRequest(format!("expected multipart/form-data: {e}")))?;
    let (mut name, mut base, mut upload) = (None::<String>, None::<String>, None);
    let mut got = (false, false);
    loop {
        let field = match form.next_field().await {
            Ok(Some(f)) => f,
            Ok(None) => break,
            Err(e) => {
                return Err(ApiError::BadRequest(format!(
                    "malformed multipart body: {e}"
                )))
            }
        };
        let field_name = field.name().unwrap_or_default().to_owned();
        match field_name.as_str() {
            "name" | "base" => {
                let text = field
                    .text()
                    .await
                    .map_err(|e| ApiError::BadRequest(e.to_string()))?;
                if field_name == "name" {
                    name = Some(text.trim().to_owned());
                } else {
                    base = Some(text.trim().to_owned());
                }
            }
            CONFIG_FILE | WEIGHTS_FILE => {
                if upload.is_none() {
                    let (Some(n), Some(b)) = (&name, &base) else {
                        return Err(ApiError::BadRequest(
                            "send the `name` and `base` fields before the files".into(),
                        ));
                    };
                    upload = Some(
                        state
                            .lifecycle
                            .begin_upload(p.tenant_id, n, b, &actor)
                            .await?,
                    );
                }
                let Some(u) = upload.as_mut() else {
                    continue;
                };
                let client_name = field.file_name().map(str::to_owned);
                let body = field.map_err(|e| e.to_string());
                let file = if field_name == CONFIG_FILE {
                    got.0 = true;
                    CONFIG_FILE
                } else {
                    got.1 = true;
                    WEIGHTS_FILE
                };
                state
                    .lifecycle
                    .put_file(u, file, client_name.as_deref(), Box::pin(body))
                    .await?;
            }
            other => {
                return Err(ApiError::BadRequest(format!(
                    "unexpected field `{other}`: send name, base, {CONFIG_FILE} and {WEIGHTS_FILE}"
                )))
            }
        }
    }
    let Some(upload) = upload else {
        return Err(ApiError::BadRequest(format!(
            "send the fields name and base and the files {CONFIG_FILE} and {WEIGHTS_FILE}"
        )));
    };
    if !(got.0 && got.1) {
        state
            .lifecycle
            .reject(&upload, "the upload was incomplete: both files are needed")
            .await?;
        return Err(ApiError::BadRequest(format!(
            "send the fields name and base and the files {CONFIG_FILE} and {WEIGHTS_FILE}"
        )));
    };
    let view = state.lifecycle.finish(&upload).await?;
    Ok((StatusCode::CREATED, Json(view_json(&view))).into_response())
}
