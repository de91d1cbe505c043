//! The tenant home: empty for now apart from who is signed in, for which tenant.

use leptos::prelude::*;
use leptos_meta::Title;

use super::{Flash, Guarded, TopBar};
use crate::model::{Access, PageState};
use crate::PRODUCT;

/// `/`: signed-in tenant members; admins go to `/admin`, everyone else to `/login`.
#[component]
pub fn HomePage() -> impl IntoView {
    view! {
        <Title text=PRODUCT/>
        <Guarded access=Access::Tenant content=home/>
    }
}

fn home(state: PageState) -> AnyView {
    let tenant = state.viewer.as_ref().and_then(|v| v.tenant.clone());
    let email = state.viewer.as_ref().map(|v| v.email.clone());
    view! {
        <TopBar viewer=state.viewer csrf=state.csrf/>
        <main class="content">
            <Flash message=state.flash/>
            <h1>{tenant}</h1>
            <p>"Signed in as " <strong>{email}</strong> "."</p>
            <p class="muted">"Keys, models, usage and invoices will appear here."</p>
        </main>
    }
    .into_any()
}
