//! `/admin/audit`: every admin and owner action (who, what, when, from where), newest first; a
//! GET form filters by tenant and action, "Older" pages by id (no OFFSET).

use leptos::prelude::*;
use leptos_meta::Title;
use leptos_router::hooks::use_query_map;

use super::{admin_audit, AuditItem, AuditParams, AuditView, ACTION_CHOICES};
use crate::admin::page::enc;
use crate::frame::{framed, Guarded, WIDE};
use crate::model::{Access, PageState};
use crate::PRODUCT;

#[component]
pub fn AuditPage() -> impl IntoView {
    view! {
        <Title text=format!("Audit log · {PRODUCT}")/>
        <Guarded access=Access::Admin content=page/>
    }
}

fn page(state: PageState) -> AnyView {
    let q = use_query_map().get_untracked();
    let params = AuditParams {
        tenant: q.get("tenant"),
        action: q.get("action"),
        before: q.get("before"),
    };
    let first_page = params.before.as_deref().is_none_or(str::is_empty);
    framed(
        state,
        WIDE,
        "Audit log",
        admin_audit(params),
        move |v, _| body(v, first_page),
    )
}

/// `/admin/audit?...` with the filters and, for another page, a cursor.
fn link(f: &AuditParams, before: Option<&str>) -> String {
    let query = [
        ("tenant", f.tenant.as_deref()),
        ("action", f.action.as_deref()),
        ("before", before),
    ]
    .iter()
    .filter_map(|(k, v)| v.map(|v| format!("{k}={}", enc(v))))
    .collect::<Vec<_>>()
    .join("&");
    if query.is_empty() {
        "/admin/audit".into()
    } else {
        format!("/admin/audit?{query}")
    }
}

/// The `<option>`s of an action filter, the current one selected.
pub(crate) fn action_options(choices: &[(&'static str, &'static str)], current: &str) -> AnyView {
    std::iter::once(("", "All actions"))
        .chain(choices.iter().copied())
        .map(|(value, label)| {
            let selected = value == current;
            view! { <option value=value selected=selected>{label}</option> }
        })
        .collect_view()
        .into_any()
}

/// An audit row's detail as `key: value` lines.
fn detail_view(rows: Vec<(String, String)>) -> AnyView {
    if rows.is_empty() {
        return view! { <span class="muted">"–"</span> }.into_any();
    }
    view! {
        <dl class="kv">
            {rows
                .into_iter()
                .map(|(k, v)| view! { <dt>{k}</dt><dd>{v}</dd> })
                .collect_view()}
        </dl>
    }
    .into_any()
}

/// The audit table (with a tenant column on the operator's view, without on a tenant's own).
pub(crate) fn audit_table(items: Vec<AuditItem>, with_tenant: bool) -> AnyView {
    let rows = items
        .into_iter()
        .map(|i| {
            let action = i.action.clone();
            view! {
                <tr data-audit-id=i.id.to_string() data-action=action>
                    <td class="mono">{i.at}</td>
                    <td>{i.actor}</td>
                    {with_tenant.then(|| view! { <td>{i.tenant}</td> })}
                    <td><code>{i.action}</code></td>
                    <td>{i.target}</td>
                    <td class="detail">{detail_view(i.detail)}</td>
                    <td class="mono">{i.source_ip}</td>
                </tr>
            }
        })
        .collect_view();
    view! {
        <div class="scroll">
        <table class="log audit">
            <thead><tr><th>"Time (UTC)"</th><th>"Who"</th>
                {with_tenant.then(|| view! { <th>"Tenant"</th> })}
                <th>"Action"</th><th>"Target"</th><th>"Detail"</th><th>"From"</th></tr></thead>
            <tbody>{rows}</tbody>
        </table>
        </div>
    }
    .into_any()
}

fn body(v: AuditView, first_page: bool) -> AnyView {
    let f = v.filter.clone();
    let older = v.older.as_deref().map(|c| link(&f, Some(c)));
    let newest = (!first_page).then(|| link(&f, None));
    let current = f.action.clone().unwrap_or_default();
    let actions = action_options(ACTION_CHOICES, &current);
    let empty = v.items.is_empty();
    view! {
        {v.notice.map(|m| view! { <p class="notice" role="status">{m}</p> })}
        <form class="filters" method="get" action="/admin/audit">
            <label>"Tenant"<input type="text" name="tenant" placeholder="handle"
                value=f.tenant.clone().unwrap_or_default()/></label>
            <label>"Action"<select name="action">{actions}</select></label>
            <button type="submit">"Filter"</button>
        </form>
        <p class="muted">"Newest first. Times are UTC. The log cannot be changed or deleted."</p>
        {empty.then(|| view! { <p class="muted">"No recorded actions match."</p> })}
        {audit_table(v.items, true)}
        <nav class="pager">
            {newest.map(|href| view! { <a href=href>"← Newest"</a> })}
            {older.map(|href| view! { <a class="older" rel="next" href=href>"Older →"</a> })}
        </nav>
    }
    .into_any()
}
