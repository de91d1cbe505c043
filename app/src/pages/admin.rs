//! The admin home: empty for now.

use leptos::prelude::*;
use leptos_meta::Title;

use super::{Flash, Guarded, TopBar};
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
            <p class="muted">"Tenants, prices, graphs, fleet and economics will appear here."</p>
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
        </section>
    }
    .into_any()
}
