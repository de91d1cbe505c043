//! `/invite/{token}`: the page an invitation link opens. The invitee sees which tenant and role
//! they are joining, sets a password and is signed in. An unknown, used, withdrawn or expired
//! link says so and offers nothing.

use leptos::prelude::*;
use leptos_meta::Title;
use leptos_router::hooks::use_params_map;

use super::{invitation_info, AcceptInvitation};
use crate::frame::{load_failed, CsrfField, Flash, Guarded};
use crate::model::{Access, PageState};
use crate::PRODUCT;

#[component]
pub fn InvitePage() -> impl IntoView {
    view! {
        <Title text=format!("Join · {PRODUCT}")/>
        <Guarded access=Access::Public content=page/>
    }
}

fn page(state: PageState) -> AnyView {
    let token = use_params_map()
        .get_untracked()
        .get("token")
        .unwrap_or_default();
    let csrf = state.csrf;
    view! {
        <main class="login">
          <section class="card">
            <h1>"Join " {PRODUCT}</h1>
            <Flash message=state.flash/>
            <Suspense fallback=|| ()>
                {Suspend::new(async move {
                    match invitation_info(token.clone()).await {
                        Ok(Some(info)) => {
                            let accept = ServerAction::<AcceptInvitation>::new();
                            view! {
                                <p>
                                    "You are invited to " <strong>{info.tenant}</strong> " as "
                                    {info.role} ", with the email " <strong>{info.email}</strong> "."
                                </p>
                                <ActionForm action=accept>
                                    <CsrfField token=csrf/>
                                    <input type="hidden" name="token" value=token/>
                                    <label for="password">"Choose a password (10 characters or more)"</label>
                                    <input id="password" type="password" name="password"
                                        minlength="10" autocomplete="new-password" required/>
                                    <label for="confirm">"Repeat it"</label>
                                    <input id="confirm" type="password" name="confirm"
                                        minlength="10" autocomplete="new-password" required/>
                                    <button type="submit">"Join"</button>
                                </ActionForm>
                            }
                            .into_any()
                        }
                        Ok(None) => view! {
                            <p class="flash" role="alert">
                                "This invitation link is not valid: it was used, withdrawn or has \
                                 expired. Ask the tenant's owner for a new one."
                            </p>
                            <p><a href="/login">"Sign in"</a></p>
                        }
                        .into_any(),
                        Err(e) => load_failed(&e),
                    }
                })}
            </Suspense>
          </section>
        </main>
    }
    .into_any()
}
