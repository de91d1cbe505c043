//! The `/models` forms: upload (`POST /models/upload`, multipart, streamed to the store), start,
//! stop and delete (`POST /models/{adapter}/start|stop|delete`). Plain axum handlers over the same
//! lifecycle service as `/api/v1/adapters`, with the portal's own checks run first
//! (`tf_app::ssr::model_form::gate`: CSRF token, signed-in member, role).
//!
//! Answers: a browser (JavaScript off) is sent back to `/models` with `303 See Other` and a flash
//! message; the page's upload script (which asks for JSON) gets `200 {"location": "/models"}` and
//! navigates there itself, so the flash is left for that page. Refusals are statuses with a short
//! page: 403 for a missing or wrong CSRF token and for a read-only member, 404 for a model the
//! tenant does not have (another tenant's name answers exactly the same), nothing changed.

use axum::extract::{FromRequest, Multipart, Path, Request, State};
use axum::http::header::{ACCEPT, CONTENT_TYPE, LOCATION};
use axum::http::{request::Parts, StatusCode};
use axum::response::{Html, IntoResponse, Response};
use axum::routing::post;
use axum::{Form, Json, Router};
use tf_app::ssr::model_flash::ModelFlash;
use tf_app::ssr::model_form::{self, Gate};
use tf_app::ssr::Portal;

use crate::lifecycle::transitions::Command;
use crate::lifecycle::{Actor, Lifecycle, LifecycleError};

/// Where every form goes back to.
const PAGE: &str = "/models";
/// A CSRF token is 64 hex characters; a longer first field is not one.
const MAX_TOKEN_BYTES: usize = 128;

#[derive(Clone)]
struct Forms {
    portal: Portal,
    lifecycle: Lifecycle,
}

/// The form routes, merged into the portal router (inside its session layer).
pub fn router(portal: Portal, lifecycle: Lifecycle) -> Router {
    Router::new()
        .route("/models/upload", post(upload))
        .route("/models/{adapter}/start", post(start))
        .route("/models/{adapter}/stop", post(stop))
        .route("/models/{adapter}/delete", post(delete))
        // Files are bounded per file by the lifecycle service and streamed, never buffered.
        .layer(axum::extract::DefaultBodyLimit::disable())
        .with_state(Forms { portal, lifecycle })
}

/// How a form ends.
enum Outcome {
    /// Done or refused in a way the page explains: back to `/models` with this message.
    Back(ModelFlash),
    /// Nobody signed in.
    Login,
    /// Refused with this status and sentence.
    Refused(StatusCode, &'static str),
}

impl Outcome {
    /// The member a passed gate let through, or the refusal. A browser's read-only member is sent
    /// back to the page (inside the portal's frame, with its navigation) with the reason; any
    /// other client gets the 403 as JSON.
    fn gate(gate: Gate, browser: bool) -> Result<tf_app::ssr::member::Member, Self> {
        match gate {
            Gate::ReadOnly if browser => Err(Self::Back(ModelFlash::ReadOnly)),
            Gate::Allowed(m) => Ok(m),
            Gate::SignedOut => Err(Self::Login),
            Gate::Csrf => Err(Self::Refused(
                StatusCode::FORBIDDEN,
                "This form has expired. Reload the page and try again.",
            )),
            Gate::ReadOnly => Err(Self::Refused(
                StatusCode::FORBIDDEN,
                "Your role is read-only: you can see the models but not change them.",
            )),
        }
    }

    fn not_found() -> Self {
        Self::Refused(StatusCode::NOT_FOUND, "No such model: nothing was changed.")
    }

    fn respond(self, wants_json: bool) -> Response {
        let to = |path: &'static str| {
            if wants_json {
                Json(serde_json::json!({ "location": path })).into_response()
            } else {
                (StatusCode::SEE_OTHER, [(LOCATION, path)]).into_response()
            }
        };
        match self {
            Self::Back(_) => to(PAGE),
            Self::Login => to("/login"),
            Self::Refused(status, message) if wants_json => {
                (status, Json(serde_json::json!({ "error": message }))).into_response()
            }
            Self::Refused(status, message) => {
                (status, Html(refusal_page(status, message))).into_response()
            }
        }
    }
}

/// A short page for a refusal, linking back (works without JavaScript).
fn refusal_page(status: StatusCode, message: &str) -> String {
    format!(
        "<!DOCTYPE html><html lang=\"en\"><head><meta charset=\"utf-8\"><title>{code} · {product}\
         </title><link rel=\"stylesheet\" href=\"{css}\"></head><body><main class=\"content\">\
         <h1>{reason}</h1><p class=\"flash\" role=\"alert\">{message}</p>\
         <p><a class=\"button\" href=\"{PAGE}\">Back to models</a></p></main></body></html>",
        code = status.as_u16(),
        product = tf_app::PRODUCT,
        css = tf_app::STYLESHEET_PATH,
        reason = status.canonical_reason().unwrap_or("Refused"),
    )
}

/// Whether a browser posted the form itself (it asks for HTML). Anything else (the page's script,
/// curl, a client library) is answered in JSON, refusals too.
fn wants_json(parts: &Parts) -> bool {
    !parts
        .headers
        .get(ACCEPT)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.contains("text/html"))
}

/// Runs `work` in the portal's context and turns its outcome into the response; a failure of a
/// dependency is logged and answered 500.
async fn answer<Fut>(forms: &Forms, parts: Parts, work: Fut) -> Response
where
    Fut: std::future::Future<Output = Result<Outcome, String>>,
{
    let json = wants_json(&parts);
    let portal = forms.portal.clone();
    let outcome: Result<Outcome, String> = model_form::in_portal(portal, parts, async move {
        let outcome = work.await?;
        if let Outcome::Back(flash) = outcome {
            model_form::flash(flash).await.map_err(|e| e.to_string())?;
        }
        Ok(outcome)
    })
    .await;
    match outcome {
        Ok(o) => o.respond(json),
        Err(e) => {
            tracing::error!(error = %e, "a /models form failed");
            Outcome::Refused(
                StatusCode::INTERNAL_SERVER_ERROR,
                "Something went wrong. Please try again.",
            )
            .respond(json)
        }
    }
}

fn actor(m: &tf_app::ssr::member::Member) -> Actor {
    Actor {
        user_id: Some(m.user.id),
        label: m.user.email.clone(),
    }
}

/// What a lifecycle refusal means on the page; `Err` for failures of a dependency.
fn outcome_of(e: LifecycleError) -> Result<Outcome, String> {
    Ok(match e {
        LifecycleError::NotFound(_) => Outcome::not_found(),
        LifecycleError::InvalidName(_) => Outcome::Back(ModelFlash::NameInvalid),
        LifecycleError::UnknownBase(_) => Outcome::Back(ModelFlash::BaseUnknown),
        LifecycleError::Conflict(_) => Outcome::Back(ModelFlash::Busy),
        LifecycleError::NameTaken(_) => Outcome::Refused(
            StatusCode::CONFLICT,
            "That name belongs to a public model every tenant can call: choose another name for \
             your adapter. Nothing was uploaded.",
        ),
        // The adapter's row is `rejected` with the precise reason, shown on the page.
        LifecycleError::TooLarge(_) => Outcome::Back(ModelFlash::Rejected),
        LifecycleError::BadRequest(_) => Outcome::Back(ModelFlash::UploadInvalid),
        e @ (LifecycleError::Db(_) | LifecycleError::Io(_)) => return Err(e.to_string()),
    })
}

/// Reads the form's first field, which must be the CSRF token (the page puts it first), at most
/// [`MAX_TOKEN_BYTES`] of it.
async fn token_field(form: &mut Multipart) -> String {
    let Ok(Some(mut field)) = form.next_field().await else {
        return String::new();
    };
    if field.name() != Some("csrf") {
        return String::new();
    }
    let mut token = Vec::new();
    while let Ok(Some(chunk)) = field.chunk().await {
        token.extend_from_slice(&chunk);
        if token.len() > MAX_TOKEN_BYTES {
            return String::new();
        }
    }
    String::from_utf8(token).unwrap_or_default()
}

async fn upload(State(forms): State<Forms>, req: Request) -> Response {
    let (parts, body) = req.into_parts();
    let req = Request::from_parts(parts.clone(), body);
    let lifecycle = forms.lifecycle.clone();
    let browser = !wants_json(&parts);
    answer(&forms, parts, async move {
        let Ok(mut form) = Multipart::from_request(req, &()).await else {
            return Ok(Outcome::Refused(
                StatusCode::BAD_REQUEST,
                "The upload form is sent as multipart/form-data.",
            ));
        };
        let token = token_field(&mut form).await;
        let gate = model_form::gate(&token).await.map_err(|e| e.to_string())?;
        let m = match Outcome::gate(gate, browser) {
            Ok(m) => m,
            Err(refused) => return Ok(refused),
        };
        match lifecycle.receive(m.tenant.id, &actor(&m), &mut form).await {
            Ok(view) if view.state == "rejected" => Ok(Outcome::Back(ModelFlash::Rejected)),
            Ok(view) => {
                tracing::info!(tenant = %m.tenant.name, model = %view.name, "adapter uploaded in the portal");
                Ok(Outcome::Back(ModelFlash::Uploaded))
            }
            Err(e) => outcome_of(e),
        }
    })
    .await
}

/// The fields of a start, stop or delete form.
#[derive(serde::Deserialize)]
struct CommandForm {
    #[serde(default)]
    csrf: String,
    /// Delete only: the ticked confirmation.
    #[serde(default)]
    confirm: Option<String>,
}

async fn command(forms: Forms, adapter: String, req: Request, command: Command) -> Response {
    let (parts, body) = req.into_parts();
    let req = Request::from_parts(parts.clone(), body);
    let lifecycle = forms.lifecycle.clone();
    let urlencoded = parts
        .headers
        .get(CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("application/x-www-form-urlencoded"));
    let browser = !wants_json(&parts);
    answer(&forms, parts, async move {
        let form = if urlencoded {
            Form::<CommandForm>::from_request(req, &())
                .await
                .ok()
                .map(|Form(f)| f)
        } else {
            None
        };
        let token = form.as_ref().map(|f| f.csrf.as_str()).unwrap_or_default();
        let gate = model_form::gate(token).await.map_err(|e| e.to_string())?;
        let m = match Outcome::gate(gate, browser) {
            Ok(m) => m,
            Err(refused) => return Ok(refused),
        };
        let confirmed = form.and_then(|f| f.confirm).is_some_and(|c| c == "yes");
        if command == Command::Delete && !confirmed {
            // Still 404 for a model the tenant does not have, so no name is confirmed to exist.
            return match lifecycle.view(m.tenant.id, &adapter).await {
                Ok(_) => Ok(Outcome::Back(ModelFlash::DeleteUnconfirmed)),
                Err(e) => outcome_of(e),
            };
        }
        match lifecycle
            .command(m.tenant.id, &adapter, command, &actor(&m))
            .await
        {
            Ok(_) => {
                tracing::info!(tenant = %m.tenant.name, model = %adapter, verb = command.verb(), "model command in the portal");
                Ok(Outcome::Back(match command {
                    Command::Start => ModelFlash::Started,
                    Command::Stop => ModelFlash::Stopped,
                    Command::Delete => ModelFlash::Deleted,
                }))
            }
            Err(e) => outcome_of(e),
        }
    })
    .await
}

async fn start(State(forms): State<Forms>, Path(adapter): Path<String>, req: Request) -> Response {
    command(forms, adapter, req, Command::Start).await
}

async fn stop(State(forms): State<Forms>, Path(adapter): Path<String>, req: Request) -> Response {
    command(forms, adapter, req, Command::Stop).await
}

async fn delete(State(forms): State<Forms>, Path(adapter): Path<String>, req: Request) -> Response {
    command(forms, adapter, req, Command::Delete).await
}
