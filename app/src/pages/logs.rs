//! `/logs`: the tenant's request log.

use leptos::prelude::*;
use leptos_meta::Title;

use super::{Flash, Guarded, TopBar};
use crate::model::{Access, PageState};
use crate::PRODUCT;

#[component]
pub fn LogsPage() -> impl IntoView {
    view! {
        <Title text=format!("Request log · {PRODUCT}")/>
        <Guarded access=Access::Tenant content=page/>
    }
}

fn page(state: PageState) -> AnyView {
    view! {
        <TopBar viewer=state.viewer csrf=state.csrf/>
        <main class="content">
            <Flash message=state.flash/>
            <h1>"Request log"</h1>
        </main>
    }
    .into_any()
}
