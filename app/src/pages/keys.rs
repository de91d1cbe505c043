//! `/keys`: the tenant's api keys.

use leptos::prelude::*;
use leptos_meta::Title;

use super::{Flash, Guarded, TopBar};
use crate::model::{Access, PageState};
use crate::PRODUCT;

#[component]
pub fn KeysPage() -> impl IntoView {
    view! {
        <Title text=format!("API keys · {PRODUCT}")/>
        <Guarded access=Access::Tenant content=page/>
    }
}

fn page(state: PageState) -> AnyView {
    view! {
        <TopBar viewer=state.viewer csrf=state.csrf/>
        <main class="content">
            <Flash message=state.flash/>
            <h1>"API keys"</h1>
        </main>
    }
    .into_any()
}
