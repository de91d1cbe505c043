//! The portal's Content-Security-Policy.

use leptos::prelude::use_context;

/// The Content-Security-Policy of every portal response: same-origin resources only, no plugins,
/// no framing, forms only to the portal. Scripts: Leptos appends small inert inline scripts (its
/// hydration bookkeeping) to every rendered page; they carry the request's nonce, which a page's
/// policy allows, so no other script can run. Responses that are not pages allow no script.
pub fn content_security_policy(nonce: Option<&str>) -> String {
    let scripts = nonce.map_or_else(|| "'none'".to_owned(), |n| format!("'nonce-{n}'"));
    format!(
        "default-src 'self'; script-src {scripts}; object-src 'none'; base-uri 'none'; \
         form-action 'self'; frame-ancestors 'none'"
    )
}

/// Sets the page's Content-Security-Policy with the nonce Leptos put on its scripts.
pub fn set_page_policy() {
    let (Some(nonce), Some(res)) = (
        leptos::nonce::use_nonce(),
        use_context::<leptos_axum::ResponseOptions>(),
    ) else {
        return;
    };
    let policy = content_security_policy(Some(&nonce.to_string()));
    if let Ok(value) = http::HeaderValue::from_str(&policy) {
        res.insert_header(http::header::CONTENT_SECURITY_POLICY, value);
    }
}
