//! Reading an upload form: `name` and `base` first (a form sends its fields in order), then the
//! files, each streamed straight to the store as it arrives. Both surfaces (the API and the
//! portal) read their uploads here. A form that stops short of both files leaves the adapter
//! `rejected` with the reason.

use axum::extract::Multipart;
use futures::TryStreamExt;
use uuid::Uuid;

use super::service::{Actor, AdapterView, Lifecycle, LifecycleError};
use super::validate::{CONFIG_FILE, WEIGHTS_FILE};

/// The longest `name` or `base` field read: both are short names, and a text field is read
/// into memory (files never are).
const MAX_TEXT_BYTES: usize = 1024;

/// A text field, refused past [`MAX_TEXT_BYTES`].
async fn bounded_text(
    mut field: axum::extract::multipart::Field<'_>,
) -> Result<String, LifecycleError> {
    let name = field.name().unwrap_or_default().to_owned();
    let mut bytes = Vec::new();
    while let Some(chunk) = field
        .chunk()
        .await
        .map_err(|e| LifecycleError::BadRequest(e.to_string()))?
    {
        bytes.extend_from_slice(&chunk);
        if bytes.len() > MAX_TEXT_BYTES {
            return Err(LifecycleError::BadRequest(format!(
                "the field `{name}` is longer than {MAX_TEXT_BYTES} bytes"
            )));
        }
    }
    String::from_utf8(bytes)
        .map_err(|_| LifecycleError::BadRequest(format!("the field `{name}` is not UTF-8")))
}

fn missing() -> LifecycleError {
    LifecycleError::BadRequest(format!(
        "send the fields name and base and the files {CONFIG_FILE} and {WEIGHTS_FILE}"
    ))
}

impl Lifecycle {
    /// Receives a multipart upload (`name`, `base`, then the files `adapter_config.json` and
    /// `adapter_model.safetensors`), streaming each file to the store: the one reader of upload
    /// forms, for the API and the portal alike.
    pub async fn receive(
        &self,
        tenant: Uuid,
        actor: &Actor,
        form: &mut Multipart,
    ) -> Result<AdapterView, LifecycleError> {
        receive(self, tenant, actor, form).await
    }
}

async fn receive(
    lifecycle: &Lifecycle,
    tenant: Uuid,
    actor: &Actor,
    form: &mut Multipart,
) -> Result<AdapterView, LifecycleError> {
    let (mut name, mut base, mut upload) = (None::<String>, None::<String>, None);
    let mut got = (false, false);
    loop {
        let field = match form.next_field().await {
            Ok(Some(f)) => f,
            Ok(None) => break,
            Err(e) => {
                if let Some(u) = &upload {
                    lifecycle
                        .reject(u, "the upload was interrupted before both files arrived")
                        .await?;
                }
                return Err(LifecycleError::BadRequest(format!(
                    "malformed multipart body: {e}"
                )));
            }
        };
        let field_name = field.name().unwrap_or_default().to_owned();
        match field_name.as_str() {
            "name" | "base" => {
                let text = bounded_text(field).await?;
                if field_name == "name" {
                    name = Some(text.trim().to_owned());
                } else {
                    base = Some(text.trim().to_owned());
                }
            }
            CONFIG_FILE | WEIGHTS_FILE => {
                if upload.is_none() {
                    let (Some(n), Some(b)) = (&name, &base) else {
                        return Err(LifecycleError::BadRequest(
                            "send the `name` and `base` fields before the files".into(),
                        ));
                    };
                    upload = Some(lifecycle.begin_upload(tenant, n, b, actor).await?);
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
                lifecycle
                    .put_file(u, file, client_name.as_deref(), Box::pin(body))
                    .await?;
            }
            other => {
                if let Some(u) = &upload {
                    lifecycle
                        .reject(u, &format!("the upload had an unexpected field `{other}`"))
                        .await?;
                }
                return Err(LifecycleError::BadRequest(format!(
                    "unexpected field `{other}`: send name, base, {CONFIG_FILE} and {WEIGHTS_FILE}"
                )));
            }
        }
    }
    let Some(upload) = upload else {
        return Err(missing());
    };
    if !(got.0 && got.1) {
        let absent = if got.0 { WEIGHTS_FILE } else { CONFIG_FILE };
        lifecycle
            .reject(
                &upload,
                &format!("the upload was incomplete: {absent} is missing (both files are needed)"),
            )
            .await?;
        return Err(missing());
    }
    lifecycle.finish(&upload).await
}
