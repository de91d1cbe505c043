//! `/admin/tenants/{name}`: one tenant's usage this month (per model), its consumption, its
//! limits and each key's limits, editable (an empty field is no limit, as `none` is for
//! `tokenfactory admin limits`), and suspension.

use leptos::prelude::*;
use leptos_meta::Title;
use leptos_router::hooks::use_params_map;

use super::{
    admin_tenant, AdminKeyLimits, AdminTenantLimits, KeyLimits, LimitFields, TenantDetail,
};
use crate::admin::count;
use crate::frame::{framed, CsrfField, Guarded, Head, WIDE};
use crate::model::{Access, PageState};
use crate::money::format_micros;
use crate::PRODUCT;

#[component]
pub fn TenantPage() -> impl IntoView {
    view! {
        <Title text=format!("Tenant · {PRODUCT}")/>
        <Guarded access=Access::Admin content=page/>
    }
}

fn page(state: PageState) -> AnyView {
    let name = use_params_map()
        .get_untracked()
        .get("name")
        .unwrap_or_default();
    let back = Head::Back("/admin/tenants", "← Tenants");
    framed(state, WIDE, back, admin_tenant(name), |t, csrf| match t {
        Some(t) => body(t, csrf),
        None => crate::frame::missing("Tenant not found", "No tenant has that name."),
    })
}

fn body(t: TenantDetail, csrf: String) -> AnyView {
    let status = if t.suspended {
        view! { <span class="status refused">"Suspended"</span> }.into_any()
    } else {
        view! { <span class="status ok">"Active"</span> }.into_any()
    };
    let cost = crate::money::Decimals::for_amounts(t.models.iter().map(|m| m.cost_micros));
    let models = t
        .models
        .iter()
        .map(|m| {
            view! {
                <tr>
                    <td>{m.model.clone()}</td>
                    <td class="num">{count(m.requests)}</td>
                    <td class="num">{count(m.prompt_tokens)}</td>
                    <td class="num">{count(m.completion_tokens)}</td>
                    <td class="num">{cost.show(m.cost_micros)}</td>
                </tr>
            }
        })
        .collect_view();
    let no_usage = t.models.is_empty();
    let keys = t
        .keys
        .iter()
        .map(|k| key_row(&t.name, k, csrf.clone()))
        .collect_view();
    view! {
        <h1>{t.display_name.clone()} " " <code>{t.name.clone()}</code> " " {status}</h1>
        <section class="panel">
            <h2>"Status"</h2>
            {super::page::status_form(&t.name, t.suspended, "detail", csrf.clone())}
        </section>
        <section class="panel">
            <h2>{format!("Usage in {}", t.month)}</h2>
            {if no_usage {
                view! { <p class="muted">"No usage this month."</p> }.into_any()
            } else {
                view! {
                    <table class="list">
                        <thead><tr><th>"Model"</th><th class="num">"Requests"</th>
                            <th class="num">"Prompt tokens"</th><th class="num">"Completion tokens"</th>
                            <th class="num">"Cost"</th></tr></thead>
                        <tbody>{models}</tbody>
                    </table>
                }
                .into_any()
            }}
            <table class="facts">
                <tr><th>"Requests, last minute"</th><td>{count(t.requests_last_minute)}</td></tr>
                <tr><th>"Tokens, last minute"</th><td>{count(t.tokens_last_minute)}</td></tr>
                <tr><th>"Spend this month (billed)"</th><td>{format_micros(t.spend_micros)}</td></tr>
            </table>
        </section>
        {margins_panel(&t)}
        <section class="panel">
            <h2>"Tenant limits"</h2>
            {tenant_limits_form(&t.name, &t.limits, csrf)}
            <p class="muted">
                "Empty means no limit. Spend is dollars per calendar month (UTC), stored exactly as micro-units; caps \
                 apply per serving graph. Every server applies a change within a second."
            </p>
        </section>
        <section class="panel">
            <h2>"Key limits"</h2>
            {t.keys.is_empty().then(|| view! { <p class="muted">"This tenant has no keys."</p> })}
            <div class="scroll">
            <table class="list keys">
                <thead><tr><th>"Key"</th><th>"Name"</th><th>"Requests/min"</th>
                    <th>"Tokens/min"</th><th>"Spend/month ($)"</th><th></th></tr></thead>
                <tbody>{keys}</tbody>
            </table>
            </div>
        </section>
    }
    .into_any()
}

/// The tenant's gross margin per base this month (issue 36).
fn margins_panel(t: &TenantDetail) -> AnyView {
    let pct =
        |v: Option<i64>| v.map_or_else(|| "–".to_owned(), crate::admin::economics::chart::percent);
    let rows = t
        .margins
        .iter()
        .map(|m| {
            view! {
                <tr data-base=m.base.clone()>
                    <td><a href=format!("/admin/economics#advisor-{}", m.base)>{m.base.clone()}</a></td>
                    <td class="num">{m.days}</td>
                    <td class="num">{format_micros(m.revenue_micros)}</td>
                    <td class="num">{format_micros(m.cost_micros)}</td>
                    <td class="num">{format_micros(m.margin_micros)}</td>
                    <td class="num">{pct(m.margin_bp)}</td>
                </tr>
            }
        })
        .collect_view();
    let (revenue, cost) = t.margins.iter().fold((0i64, 0i64), |(r, c), m| {
        (
            r.saturating_add(m.revenue_micros),
            c.saturating_add(m.cost_micros),
        )
    });
    let empty = t.margins.is_empty();
    view! {
        <section class="panel gross-margin">
            <h2>{format!("Gross margin in {}", t.month)}</h2>
            {if empty {
                view! { <p class="muted">"No usage or rated revenue on any base this month."</p> }.into_any()
            } else {
                view! {
                    <table class="list">
                        <thead><tr><th>"Base"</th><th class="num">"Days"</th><th class="num">"Revenue"</th>
                            <th class="num">"Attributed GPU cost"</th><th class="num">"Gross margin"</th>
                            <th class="num">"Margin share"</th></tr></thead>
                        <tbody>{rows}</tbody>
                        <tfoot><tr class="total"><th>"All bases"</th><td></td>
                            <td class="num">{format_micros(revenue)}</td>
                            <td class="num">{format_micros(cost)}</td>
                            <td class="num">{format_micros(revenue.saturating_sub(cost))}</td>
                            <td></td></tr></tfoot>
                    </table>
                }
                .into_any()
            }}
            <p class="muted">
                "Gross margin: the tenant's rated revenue (the live rating run) less the GPU cost \
                 attributed to it, day by day as on the economics page: the used cost by the \
                 load of its tokens, the idle floor by the idle time its requests were waited \
                 for (see /admin/economics for the rule). Today counts up to now."
            </p>
        </section>
    }
    .into_any()
}

fn number(name: &'static str, label: &'static str, value: String) -> impl IntoView {
    view! {
        <label>{label}
            <input type="text" inputmode="numeric" name=name value=value size="10"
                placeholder="no limit"/>
        </label>
    }
}

fn tenant_limits_form(tenant: &str, l: &LimitFields, csrf: String) -> AnyView {
    let save = ServerAction::<AdminTenantLimits>::new();
    let tenant = tenant.to_owned();
    let l = l.clone();
    view! {
        <ActionForm action=save attr:class="limits">
            <CsrfField token=csrf/>
            <input type="hidden" name="tenant" value=tenant/>
            {number("rpm", "Requests per minute", l.rpm.clone())}
            {number("tpm", "Tokens per minute", l.tpm.clone())}
            {number("spend_limit", "Spend per month ($, e.g. 5 or 0.50)", l.spend_limit.clone())}
            {number("max_in_flight", "Max in flight", l.max_in_flight.clone())}
            {number("max_long_prompts", "Max long prompts", l.max_long_prompts.clone())}
            {number("long_prompt_tokens", "Long prompt from (tokens)", l.long_prompt_tokens.clone())}
            <button type="submit">"Save tenant limits"</button>
        </ActionForm>
    }
    .into_any()
}

fn key_row(tenant: &str, k: &KeyLimits, csrf: String) -> AnyView {
    let save = ServerAction::<AdminKeyLimits>::new();
    let tenant = tenant.to_owned();
    let k = k.clone();
    let form_id = format!("limits-{}", k.prefix);
    let field = |name: &'static str, value: String| {
        view! {
            <input type="text" inputmode="numeric" name=name value=value size="8"
                placeholder="no limit" form=form_id.clone() aria-label=name/>
        }
    };
    view! {
        <tr>
            <td class="nowrap"><code>{format!("{}…", k.prefix)}</code>
                {k.revoked.then(|| view! { " " <span class="status refused">"revoked"</span> })}</td>
            <td>{k.name.clone()}</td>
            <td>{field("rpm", k.limits.rpm.clone())}</td>
            <td>{field("tpm", k.limits.tpm.clone())}</td>
            <td>{field("spend_limit", k.limits.spend_limit.clone())}</td>
            <td>
                <ActionForm action=save attr:id=form_id.clone()>
                    <CsrfField token=csrf/>
                    <input type="hidden" name="tenant" value=tenant/>
                    <input type="hidden" name="key" value=k.prefix.clone()/>
                    <button type="submit" class="secondary">"Save"</button>
                </ActionForm>
            </td>
        </tr>
    }
    .into_any()
}
