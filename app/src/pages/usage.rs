//! `/usage`: the tenant's usage.

use leptos::prelude::*;
use leptos_meta::Title;

use super::{Flash, Guarded, TopBar};
use crate::model::{Access, PageState};
use crate::PRODUCT;

#[component]
pub fn UsagePage() -> impl IntoView {
    view! {
        <Title text=format!("Usage · {PRODUCT}")/>
        <Guarded access=Access::Tenant content=page/>
    }
}

fn page(state: PageState) -> AnyView {
    view! {
        <TopBar viewer=state.viewer csrf=state.csrf/>
        <main class="content">
            <Flash message=state.flash/>
            <h1>"Usage"</h1>
        </main>
    }
    .into_any()
}
