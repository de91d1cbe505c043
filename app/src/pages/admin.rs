//! The admin home: empty for now.

use leptos::prelude::*;
use leptos_meta::Title;

use super::{Flash, Guarded, TopBar};
use crate::api::{Access, PageState};
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
        </main>
    }
    .into_any()
}
