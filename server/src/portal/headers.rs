//! Response headers every portal response carries (framing, content sources, referrers,
//! caching) and the two static assets, the stylesheet and the icon, compiled into the binary.

use axum::extract::Request;
use axum::http::header::{
    CACHE_CONTROL, CONTENT_SECURITY_POLICY, CONTENT_TYPE, REFERRER_POLICY, X_CONTENT_TYPE_OPTIONS,
    X_FRAME_OPTIONS,
};
use axum::http::HeaderValue;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

/// The stylesheet, from `style/main.css` at build time.
const STYLE: &str = include_str!("../../../style/main.css");

/// A plain square icon, so browsers asking for one get it instead of a 404.
const ICON: &str = "<svg xmlns='http://www.w3.org/2000/svg' viewBox='0 0 16 16'>\
<rect width='16' height='16' rx='3' fill='#2f5bd3'/></svg>";

/// Serves the icon (at the path browsers ask for by default).
pub async fn icon() -> impl IntoResponse {
    (
        [
            (CONTENT_TYPE, "image/svg+xml"),
            (CACHE_CONTROL, "public, max-age=86400"),
        ],
        ICON,
    )
}

/// Serves the stylesheet.
pub async fn stylesheet() -> impl IntoResponse {
    (
        [
            (CONTENT_TYPE, "text/css; charset=utf-8"),
            (CACHE_CONTROL, "public, max-age=3600"),
        ],
        STYLE,
    )
}

/// Adds the security headers. Responses that did not choose a cache policy get `no-store`:
/// pages hold CSRF tokens and account data.
pub async fn security_headers(req: Request, next: Next) -> Response {
    let mut res = next.run(req).await;
    let h = res.headers_mut();
    h.insert(X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    // Pages set their own policy (with their script nonce); everything else gets the base one.
    if !h.contains_key(CONTENT_SECURITY_POLICY) {
        let policy = tf_app::ssr::content_security_policy(None);
        if let Ok(value) = HeaderValue::from_str(&policy) {
            h.insert(CONTENT_SECURITY_POLICY, value);
        }
    }
    h.insert(REFERRER_POLICY, HeaderValue::from_static("same-origin"));
    h.insert(X_CONTENT_TYPE_OPTIONS, HeaderValue::from_static("nosniff"));
    if !h.contains_key(CACHE_CONTROL) {
        h.insert(CACHE_CONTROL, HeaderValue::from_static("no-store"));
    }
    res
}
