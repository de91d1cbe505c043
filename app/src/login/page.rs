//! The login page: email, password and the CSRF token, posted to the `login` server function.
//! Refusals come back here as a flash message.

use leptos::prelude::*;
use leptos_meta::Title;

use super::Login;
use crate::frame::{CsrfField, Flash, Guarded};
use crate::model::{Access, PageState};
use crate::PRODUCT;

/// `/login`: open to anyone; signed-in users are sent home.
#[component]
pub fn LoginPage() -> impl IntoView {
    view! {
        <Title text=format!("Sign in · {PRODUCT}")/>
        <Guarded access=Access::Public content=login_card/>
    }
}

fn login_card(state: PageState) -> AnyView {
    let login = ServerAction::<Login>::new();
    view! {
        <main class="login">
            <section class="card">
                <h1>{PRODUCT}</h1>
                <p class="muted">"Sign in to your account."</p>
                <Flash message=state.flash/>
                <ActionForm action=login>
                    <CsrfField token=state.csrf/>
                    <label for="email">"Email"</label>
                    <input
                        id="email"
                        type="email"
                        name="email"
                        autocomplete="username"
                        required
                        autofocus
                    />
                    <label for="password">"Password"</label>
                    <input
                        id="password"
                        type="password"
                        name="password"
                        autocomplete="current-password"
                        required
                    />
                    <button type="submit">"Sign in"</button>
                </ActionForm>
            </section>
        </main>
    }
    .into_any()
}
