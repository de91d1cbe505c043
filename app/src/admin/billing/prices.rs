//! `/admin/prices`: the price book in effect now (per model or base and tier: fresh input, cached
//! input and output per million tokens), every version with its effective-from time, the form
//! that appends a version (a change is a new version, never an edit), the tiers and each
//! tenant's tier. Forms are plain POSTs with the CSRF token; works with JavaScript off.

use leptos::prelude::*;
use leptos_meta::Title;

use super::{
    admin_prices, AdminAddTier, AdminSetPrice, AdminSetTier, PriceItem, PricesView, TenantTierItem,
    VersionItem,
};
use crate::frame::{framed, CsrfField, Guarded, WIDE};
use crate::model::{Access, PageState};
use crate::money::format_micros;
use crate::PRODUCT;

#[component]
pub fn PricesPage() -> impl IntoView {
    view! {
        <Title text=format!("Prices · {PRODUCT}")/>
        <Guarded access=Access::Admin content=page/>
    }
}

fn page(state: PageState) -> AnyView {
    framed(state, WIDE, "Prices", admin_prices(), body)
}

fn price_table(prices: Vec<PriceItem>, class: &'static str) -> AnyView {
    view! {
        <table class=format!("list prices {class}")>
            <thead><tr>
                <th>"Model or base"</th><th>"Tier"</th>
                <th class="num">"Fresh input / M"</th><th class="num">"Cached input / M"</th>
                <th class="num">"Output / M"</th>
            </tr></thead>
            <tbody>
                {prices.into_iter().map(|p| {
                    let (key, tier) = (p.price_key.clone(), p.tier.clone());
                    view! {
                    <tr class="price" data-key=key data-tier=tier>
                        <td>{p.price_key}</td><td>{p.tier}</td>
                        <td class="num fresh">{format_micros(p.fresh_per_m)}</td>
                        <td class="num cached">{format_micros(p.cached_per_m)}</td>
                        <td class="num output">{format_micros(p.output_per_m)}</td>
                    </tr>
                }}).collect_view()}
            </tbody>
        </table>
    }
    .into_any()
}

fn version_item(v: VersionItem) -> AnyView {
    let state = if v.current {
        " (in effect now)"
    } else if v.scheduled {
        " (scheduled)"
    } else {
        ""
    };
    let summary = format!(
        "Version {} from {} UTC{state}, by {}: {}",
        v.id,
        v.effective_from,
        if v.created_by.is_empty() {
            "–"
        } else {
            v.created_by.as_str()
        },
        v.note
    );
    view! {
        <details class="version" data-version=v.id.to_string()>
            <summary>{summary}</summary>
            {price_table(v.prices, "")}
        </details>
    }
    .into_any()
}

fn tier_options(tiers: &[String], current: &str) -> AnyView {
    tiers
        .iter()
        .map(|x| {
            let selected = x == current;
            view! { <option value=x.clone() selected=selected>{x.clone()}</option> }
        })
        .collect_view()
        .into_any()
}

fn price_form(keys: Vec<String>, tiers: &[String], csrf: String) -> AnyView {
    let save = ServerAction::<AdminSetPrice>::new();
    let options = tier_options(tiers, "standard");
    let keys = keys
        .into_iter()
        .map(|k| view! { <option value=k.clone()>{k.clone()}</option> })
        .collect_view();
    view! {
        <section class="panel">
            <h2>"Set a price"</h2>
            <ActionForm action=save attr:class="limits price-form">
                <CsrfField token=csrf/>
                <label>"Model or base"<select name="price_key" required>{keys}</select></label>
                <label>"Tier"<select name="tier">{options}</select></label>
                <label>"Fresh input per million ($, e.g. 2.50)"
                    <input type="text" inputmode="decimal" name="fresh_per_m" size="12"/></label>
                <label>"Cached input per million ($)"
                    <input type="text" inputmode="decimal" name="cached_per_m" size="12"/></label>
                <label>"Output per million ($)"
                    <input type="text" inputmode="decimal" name="output_per_m" size="12"/></label>
                <label>"Effective from (UTC, empty: now; never in the past)"
                    <input type="datetime-local" name="effective_from"/></label>
                <button type="submit">"Add price version"</button>
            </ActionForm>
            <p class="muted">"A change is a new version holding every price of the latest one \
                with this one changed; it applies to requests started from its time on. Versions \
                start now or later, never before an event already recorded. Correcting the past \
                is what re-rating is for: re-rate the tenant and period under a version \
                (tokenfactory admin rerate) and build its invoice from that run \
                (/admin/invoices). Amounts are dollars, stored exactly as micro-units."</p>
        </section>
    }
    .into_any()
}

fn tier_row(t: TenantTierItem, tiers: &[String], csrf: String) -> AnyView {
    let set = ServerAction::<AdminSetTier>::new();
    let options = tier_options(tiers, &t.tier);
    let (name, hidden) = (t.name.clone(), t.name.clone());
    view! {
        <tr data-tenant=name>
            <td>{t.name}</td>
            <td>{t.display_name}</td>
            <td class="tier">{t.tier}</td>
            <td class="actions">
                <ActionForm action=set attr:class="inline">
                    <CsrfField token=csrf/>
                    <input type="hidden" name="tenant" value=hidden/>
                    <select name="tier" aria-label="Tier">{options}</select>
                    <button type="submit" class="secondary">"Set tier"</button>
                </ActionForm>
            </td>
        </tr>
    }
    .into_any()
}

fn tiers_panel(v_tiers: Vec<String>, tenants: Vec<TenantTierItem>, csrf: String) -> AnyView {
    let add = ServerAction::<AdminAddTier>::new();
    let rows = tenants
        .into_iter()
        .map(|t| tier_row(t, &v_tiers, csrf.clone()))
        .collect_view();
    view! {
        <section class="panel">
            <h2>"Tiers"</h2>
            <p>"Tiers: " {v_tiers.join(", ")}</p>
            <ActionForm action=add attr:class="inline">
                <CsrfField token=csrf.clone()/>
                <label>"New tier"<input type="text" name="name" maxlength="63" placeholder="enterprise"/></label>
                <button type="submit" class="secondary">"Add tier"</button>
            </ActionForm>
            <p class="muted">"A tenant's requests are rated at its tier's price for the model, or \
                the standard tier's where its tier has none."</p>
            <div class="scroll">
            <table class="list tenant-tiers">
                <thead><tr><th>"Tenant"</th><th>"Name"</th><th>"Tier"</th>
                    <th><span class="visually-hidden">"Change"</span></th></tr></thead>
                <tbody>{rows}</tbody>
            </table>
            </div>
        </section>
    }
    .into_any()
}

fn body(v: PricesView, csrf: String) -> AnyView {
    let current = v.versions.iter().find(|x| x.current).cloned();
    let heading = current.as_ref().map_or_else(
        || "No price version is in effect yet.".to_owned(),
        |c| format!("Version {} in effect since {} UTC", c.id, c.effective_from),
    );
    view! {
        <section class="panel">
            <h2>"In effect now"</h2>
            <p class="current-version">{heading}</p>
            {current.map(|c| price_table(c.prices, "current"))}
        </section>
        {price_form(v.keys, &v.tiers, csrf.clone())}
        <section class="panel">
            <h2>{format!("Versions ({})", v.versions.len())}</h2>
            {v.versions.into_iter().map(version_item).collect_view()}
        </section>
        {tiers_panel(v.tiers, v.tenants, csrf)}
    }
    .into_any()
}
