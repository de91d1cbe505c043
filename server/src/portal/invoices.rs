//! `GET /invoices/{id}.csv`: one of the session tenant's invoices as a CSV attachment
//! (`tf_app::invoices::server::csv`, the same entries the detail page shows). The router cannot
//! route a parameter with a suffix, and `/invoices/{id}` is the page's route, so this is a layer
//! in front of the page routes that answers exactly the paths ending in `.csv` and lets every
//! other request through. Signed out: to the login; an admin (no tenant): 403; an unknown id or
//! another tenant's: 404, nothing shown.

use axum::extract::{Request, State};
use axum::http::header::{CACHE_CONTROL, CONTENT_DISPOSITION, CONTENT_TYPE, LOCATION};
use axum::http::{Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use tf_app::invoices::server::{self as invoices, Download};
use tf_app::ssr::model_form::in_portal;
use tf_app::ssr::Portal;

/// The id part of `/invoices/{id}.csv`, when the path is one.
fn csv_target(path: &str) -> Option<&str> {
    let id = path.strip_prefix("/invoices/")?.strip_suffix(".csv")?;
    (!id.is_empty() && !id.contains('/')).then_some(id)
}

/// The layer's function: answers `GET /invoices/{id}.csv`, passes anything else on.
pub async fn csv_download(State(portal): State<Portal>, req: Request, next: Next) -> Response {
    let target = (req.method() == Method::GET)
        .then(|| csv_target(req.uri().path()).map(str::to_owned))
        .flatten();
    let Some(id) = target else {
        return next.run(req).await;
    };
    let (parts, _body) = req.into_parts();
    let found = in_portal(portal, parts, async move { invoices::download(&id).await }).await;
    match found {
        Ok(Download::Csv { filename, body }) => (
            [
                (CONTENT_TYPE, "text/csv; charset=utf-8".to_owned()),
                (
                    CONTENT_DISPOSITION,
                    format!("attachment; filename=\"{}\"", filename.replace('"', "")),
                ),
                (CACHE_CONTROL, "no-store".to_owned()),
            ],
            body,
        )
            .into_response(),
        Ok(Download::SignedOut) => (StatusCode::SEE_OTHER, [(LOCATION, "/login")]).into_response(),
        Ok(Download::Forbidden) => (StatusCode::FORBIDDEN, "Forbidden").into_response(),
        Ok(Download::NotFound) => (StatusCode::NOT_FOUND, "No such invoice").into_response(),
        Err(e) => {
            tracing::error!(error = %e, "invoice CSV failed");
            (StatusCode::INTERNAL_SERVER_ERROR, "Something went wrong").into_response()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::csv_target;

    #[test]
    fn only_csv_paths_of_one_invoice_are_taken() {
        assert_eq!(csv_target("/invoices/abc.csv"), Some("abc"));
        assert_eq!(csv_target("/invoices/current.csv"), Some("current"));
        assert_eq!(csv_target("/invoices/abc"), None);
        assert_eq!(csv_target("/invoices/.csv"), None);
        assert_eq!(csv_target("/invoices/a/b.csv"), None);
        assert_eq!(csv_target("/invoicesx/a.csv"), None);
    }
}
