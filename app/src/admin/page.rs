//! The admin home (`/admin`: the sections and this replica's journal), the admin not-found page
//! and the pieces the admin feature pages share. Every admin page is guarded by
//! [`Access::Admin`]: a tenant user gets the 403 page, a visitor the login.

use leptos::prelude::*;
use leptos_meta::Title;

use crate::frame::{Flash, Guarded, TopBar};
use crate::model::{Access, OpsSnapshot, PageState};
use crate::PRODUCT;

/// `/admin`: admins only; tenant members get 403, visitors go to `/login`.
#[component]
pub fn AdminPage() -> impl IntoView {
    view! {
        <Title text=format!("Administration · {PRODUCT}")/>
        <Guarded access=Access::Admin content=admin/>
    }
}

fn admin(state: PageState) -> AnyView {
    view! {
        <TopBar viewer=state.viewer csrf=state.csrf/>
        <main class="content">
            <Flash message=state.flash/>
            <h1>"Administration"</h1>
            <ul class="sections">
                {crate::frame::ADMIN_NAV
                    .iter()
                    .map(|(href, label)| view! { <li><a href=*href>{*label}</a></li> })
                    .collect_view()}
            </ul>
            {state.ops.map(ops_table)}
        </main>
    }
    .into_any()
}

/// The usage journal of the replica that rendered the page.
fn ops_table(ops: OpsSnapshot) -> AnyView {
    let backlog = if ops.backlog_bytes == 0 {
        "none".to_owned()
    } else {
        format!("{} bytes, oldest {} ms", ops.backlog_bytes, ops.ship_lag_ms)
    };
    view! {
        <section class="panel">
            <h2>"Usage journal (this replica)"</h2>
            <table class="facts">
                <tr><th>"Events journaled"</th><td>{ops.journaled}</td></tr>
                <tr><th>"Events shipped to PostgreSQL"</th><td>{ops.shipped}</td></tr>
                <tr><th>"Backlog"</th><td class="backlog">{backlog}</td></tr>
                <tr><th>"Failed shipping attempts"</th><td>{ops.ship_failures}</td></tr>
            </table>
            <p class="muted"><a href="/admin/ops">"Every replica"</a></p>
        </section>
    }
    .into_any()
}

/// Any other path under `/admin/`: the login for visitors, 403 for tenant users, 404 for admins.
#[component]
pub fn AdminNotFound() -> impl IntoView {
    view! { <Guarded access=Access::Admin content=not_found/> }
}

fn not_found(state: PageState) -> AnyView {
    crate::frame::not_found(state)
}

/// Percent-encodes a query-string value.
pub(crate) fn enc(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'a'..=b'z' | b'A'..=b'Z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// A secret made for someone (a first user's or a reset password), shown this once.
pub(crate) fn password_panel(email: String, secret: String) -> AnyView {
    view! {
        <section class="panel secret" aria-live="polite">
            <h2>"Password for " {email}</h2>
            <p><strong>"Copy it now and hand it over: it will not be shown again."</strong></p>
            <div class="secret-line">
                <code id="new-password" class="secret-value">{secret}</code>
            </div>
        </section>
    }
    .into_any()
}
