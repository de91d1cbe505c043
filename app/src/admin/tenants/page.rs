//! `/admin/tenants`: every tenant, by handle, with status and this month's usage; create a tenant
//! with its first user; suspend or reactivate. Forms are plain POSTs with the CSRF token;
//! confirmations are `<details>` disclosures, so nothing needs JavaScript.

use leptos::prelude::*;
use leptos_meta::Title;
use leptos_router::hooks::use_query_map;

use super::{
    admin_tenants, AdminCreateTenant, AdminReactivateTenant, AdminSuspendTenant, TenantItem,
    TenantsView,
};
use crate::admin::count;
use crate::admin::page::{enc, password_panel};
use crate::frame::{framed, CsrfField, Guarded, WIDE};
use crate::model::{Access, PageState};
use crate::money::Decimals;
use crate::PRODUCT;

#[component]
pub fn TenantsPage() -> impl IntoView {
    view! {
        <Title text=format!("Tenants · {PRODUCT}")/>
        <Guarded access=Access::Admin content=page/>
    }
}

fn page(state: PageState) -> AnyView {
    let after = use_query_map().get_untracked().get("after");
    let first_page = after.as_deref().is_none_or(str::is_empty);
    framed(
        state,
        WIDE,
        "Tenants",
        admin_tenants(after),
        move |v, csrf| body(v, csrf, first_page),
    )
}

fn body(v: TenantsView, csrf: String, first_page: bool) -> AnyView {
    let create = ServerAction::<AdminCreateTenant>::new();
    let month = v.month.clone();
    let cost = Decimals::for_amounts(v.tenants.iter().map(|t| t.cost_micros));
    let rows = v
        .tenants
        .into_iter()
        .map(|t| row(t, cost, csrf.clone()))
        .collect_view();
    let next = v.next.map(|n| format!("/admin/tenants?after={}", enc(&n)));
    view! {
        {v.fresh.map(|f| password_panel(f.name, f.secret))}
        <section class="panel">
            <h2>"Create a tenant"</h2>
            <ActionForm action=create attr:class="inline">
                <CsrfField token=csrf.clone()/>
                <label>"Handle"<input type="text" name="name" maxlength="63" required
                    placeholder="acme"/></label>
                <label>"Display name"<input type="text" name="display_name" maxlength="200"
                    placeholder="Acme Corp"/></label>
                <label>"First user's email"<input type="email" name="email" maxlength="320"
                    required placeholder="owner@acme.example"/></label>
                <button type="submit">"Create tenant"</button>
            </ActionForm>
            <p class="muted">"The first user's password is generated and shown once."</p>
        </section>
        <section class="panel">
            <h2>"All tenants"</h2>
            <div class="scroll">
            <table class="list tenants">
                <thead>
                    <tr>
                        <th>"Handle"</th><th>"Name"</th><th>"Status"</th><th>"Created"</th>
                        <th class="num">"Users"</th><th class="num">"Live keys"</th>
                        <th class="num">{format!("Requests {month}")}</th>
                        <th class="num">"Tokens"</th><th class="num">"Cost"</th>
                        <th><span class="visually-hidden">"Actions"</span></th>
                    </tr>
                </thead>
                <tbody>{rows}</tbody>
            </table>
            </div>
            <nav class="pager">
                {(!first_page).then(|| view! { <a href="/admin/tenants">"← First"</a> })}
                {next.map(|href| view! { <a class="older" rel="next" href=href>"Next →"</a> })}
            </nav>
        </section>
    }
    .into_any()
}

fn row(t: TenantItem, cost: Decimals, csrf: String) -> AnyView {
    let href = format!("/admin/tenants/{}", t.name);
    let (status_class, status) = if t.suspended {
        ("status refused", "Suspended")
    } else {
        ("status ok", "Active")
    };
    let action = status_form(&t.name, t.suspended, "list", csrf);
    view! {
        <tr data-tenant=t.name.clone()>
            <td><a href=href>{t.name.clone()}</a></td>
            <td>{t.display_name}</td>
            <td><span class=status_class>{status}</span></td>
            <td>{t.created}</td>
            <td class="num">{count(t.users)}</td>
            <td class="num">{count(t.active_keys)}</td>
            <td class="num">{count(t.requests)}</td>
            <td class="num">{count(t.tokens)}</td>
            <td class="num">{cost.show(t.cost_micros)}</td>
            <td class="actions">{action}</td>
        </tr>
    }
    .into_any()
}

/// Suspend (with a confirmation) or reactivate; `from` says which page to come back to.
pub(crate) fn status_form(
    tenant: &str,
    suspended: bool,
    from: &'static str,
    csrf: String,
) -> AnyView {
    let tenant = tenant.to_owned();
    if suspended {
        let reactivate = ServerAction::<AdminReactivateTenant>::new();
        view! {
            <ActionForm action=reactivate>
                <CsrfField token=csrf/>
                <input type="hidden" name="tenant" value=tenant.clone()/>
                <input type="hidden" name="from" value=from/>
                <button type="submit" class="secondary">"Reactivate"</button>
            </ActionForm>
        }
        .into_any()
    } else {
        let suspend = ServerAction::<AdminSuspendTenant>::new();
        view! {
            <details class="confirm">
                <summary>"Suspend…"</summary>
                <ActionForm action=suspend>
                    <CsrfField token=csrf/>
                    <input type="hidden" name="tenant" value=tenant.clone()/>
                    <input type="hidden" name="from" value=from/>
                    <p>
                        "Suspend “" {tenant.clone()} "”? Its API keys are refused within a \
                         second and its users are signed out. Data is kept."
                    </p>
                    <button type="submit" class="danger">"Suspend tenant"</button>
                </ActionForm>
            </details>
        }
        .into_any()
    }
}
