//! `/audit`: the tenant's own audit log (owners). A GET form filters by action, "Older" pages by
//! id; works with JavaScript off.

use leptos::prelude::*;
use leptos_meta::Title;
use leptos_router::hooks::use_query_map;

use super::{choices, tenant_audit, TenantAuditParams, TenantAuditView};
use crate::admin::audit::page::{action_options, audit_table};
use crate::admin::page::enc;
use crate::frame::{framed, Guarded, WIDE};
use crate::model::{Access, PageState};
use crate::PRODUCT;

#[component]
pub fn TenantAuditPage() -> impl IntoView {
    view! {
        <Title text=format!("Audit log · {PRODUCT}")/>
        <Guarded access=Access::Tenant content=page/>
    }
}

fn page(state: PageState) -> AnyView {
    let q = use_query_map().get_untracked();
    let params = TenantAuditParams {
        action: q.get("action"),
        before: q.get("before"),
    };
    let first_page = params.before.as_deref().is_none_or(str::is_empty);
    framed(
        state,
        WIDE,
        "Audit log",
        tenant_audit(params),
        move |v, _| body(v, first_page),
    )
}

/// `/audit?...` with the action filter and, for another page, a cursor.
fn link(action: Option<&str>, before: Option<&str>) -> String {
    let query = [("action", action), ("before", before)]
        .iter()
        .filter_map(|(k, v)| v.map(|v| format!("{k}={}", enc(v))))
        .collect::<Vec<_>>()
        .join("&");
    if query.is_empty() {
        "/audit".into()
    } else {
        format!("/audit?{query}")
    }
}

fn body(v: TenantAuditView, first_page: bool) -> AnyView {
    let TenantAuditView::Shown {
        action,
        items,
        older,
        notice,
    } = v
    else {
        return view! {
            <p class="flash" role="alert" id="not-owner">
                "Only the tenant's owners can read its audit log."
            </p>
        }
        .into_any();
    };
    let older = older.as_deref().map(|c| link(action.as_deref(), Some(c)));
    let newest = (!first_page).then(|| link(action.as_deref(), None));
    let options = action_options(choices(), action.as_deref().unwrap_or(""));
    let empty = items.is_empty();
    view! {
        {notice.map(|m| view! { <p class="notice" role="status">{m}</p> })}
        <form class="filters" method="get" action="/audit">
            <label>"Action"<select name="action">{options}</select></label>
            <button type="submit">"Filter"</button>
        </form>
        <p class="muted">"What the tenant's members and the operator did to this tenant: keys, \
            members, models, body logging, settings. Newest first; times are UTC. The log cannot \
            be changed or deleted."</p>
        {empty.then(|| view! { <p class="muted">"No recorded actions match."</p> })}
        {audit_table(items, false)}
        <nav class="pager">
            {newest.map(|href| view! { <a href=href>"← Newest"</a> })}
            {older.map(|href| view! { <a class="older" rel="next" href=href>"Older →"</a> })}
        </nav>
    }
    .into_any()
}
