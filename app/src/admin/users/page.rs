//! `/admin/users`: every portal user (admins and tenant users) with tenant, role and creation
//! time; reset a user's password (the new one shown once) or end their sessions.

use leptos::prelude::*;
use leptos_meta::Title;
use leptos_router::hooks::use_query_map;

use super::{admin_users, AdminEndSessions, AdminResetPassword, UserItem, UsersView};
use crate::admin::page::{enc, password_panel};
use crate::frame::{framed, CsrfField, Guarded, WIDE};
use crate::model::{Access, PageState};
use crate::PRODUCT;

#[component]
pub fn UsersPage() -> impl IntoView {
    view! {
        <Title text=format!("Users · {PRODUCT}")/>
        <Guarded access=Access::Admin content=page/>
    }
}

fn page(state: PageState) -> AnyView {
    let after = use_query_map().get_untracked().get("after");
    let first_page = after.as_deref().is_none_or(str::is_empty);
    framed(state, WIDE, "Users", admin_users(after), move |v, csrf| {
        body(v, csrf, first_page)
    })
}

fn body(v: UsersView, csrf: String, first_page: bool) -> AnyView {
    let rows = v
        .users
        .into_iter()
        .map(|u| row(u, csrf.clone()))
        .collect_view();
    let next = v.next.map(|n| format!("/admin/users?after={}", enc(&n)));
    view! {
        {v.fresh.map(|f| password_panel(f.name, f.secret))}
        <section class="panel">
            <div class="scroll">
            <table class="list users">
                <thead>
                    <tr><th>"Email"</th><th>"Role"</th><th>"Tenant"</th><th>"Created"</th>
                        <th class="num">"Sessions"</th>
                        <th><span class="visually-hidden">"Actions"</span></th></tr>
                </thead>
                <tbody>{rows}</tbody>
            </table>
            </div>
            <nav class="pager">
                {(!first_page).then(|| view! { <a href="/admin/users">"← First"</a> })}
                {next.map(|href| view! { <a class="older" rel="next" href=href>"Next →"</a> })}
            </nav>
        </section>
    }
    .into_any()
}

fn row(u: UserItem, csrf: String) -> AnyView {
    let tenant = u.tenant.clone().map(|t| {
        let href = format!("/admin/tenants/{t}");
        view! { <a href=href>{t}</a> }
    });
    let reset = ServerAction::<AdminResetPassword>::new();
    let end = ServerAction::<AdminEndSessions>::new();
    let (reset_csrf, reset_id, reset_email) = (csrf.clone(), u.id.clone(), u.email.clone());
    let reset_form = (!u.you).then(move || {
        view! {
            <details class="confirm">
                <summary>"Reset password…"</summary>
                <ActionForm action=reset>
                    <CsrfField token=reset_csrf/>
                    <input type="hidden" name="user" value=reset_id/>
                    <p>"A new password is generated and shown once; " {reset_email}
                        "'s sessions end."</p>
                    <button type="submit" class="danger">"Reset password"</button>
                </ActionForm>
            </details>
        }
    });
    view! {
        <tr data-user=u.email.clone()>
            <td>{u.email.clone()}{u.you.then_some(" (you)")}</td>
            <td>{u.role}</td>
            <td>{tenant}</td>
            <td>{u.created}</td>
            <td class="num">{u.sessions}</td>
            <td class="actions">
                {reset_form}
                <ActionForm action=end>
                    <CsrfField token=csrf/>
                    <input type="hidden" name="user" value=u.id/>
                    <button type="submit" class="secondary">"End sessions"</button>
                </ActionForm>
            </td>
        </tr>
    }
    .into_any()
}
