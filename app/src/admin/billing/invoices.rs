//! `/admin/invoices`: every tenant's invoices with their subtotals, an Issue button on each draft
//! (draft -> issued, immutable after, with a confirmation) and an adjustment form; a form to build
//! a tenant's draft for a month now (from chosen re-rate runs), one to close a month early; and
//! the credit grant form with each tenant's balance; the invoice issuer's details. Plain
//! POSTs with the CSRF token through `tf_core::billing_ops`; works with JavaScript off.

use leptos::prelude::*;
use leptos_meta::Title;

use super::{
    admin_invoice, admin_invoices, AdminAdjustInvoice, AdminBuildInvoice, AdminClosePeriod,
    AdminGrantCredit, AdminInvoiceItem, AdminInvoicesView, AdminIssueInvoice, AdminSetIssuer,
    IssuerView, TenantCredit,
};
use crate::frame::{framed, CsrfField, Guarded, Head, WIDE};
use crate::model::{Access, PageState};
use crate::money::format_micros;
use crate::PRODUCT;

/// `/admin/invoices/{id}`: one invoice of any tenant, entry by entry (what its tenant sees).
#[component]
pub fn AdminInvoicePage() -> impl IntoView {
    view! {
        <Title text=format!("Invoice · {PRODUCT}")/>
        <Guarded access=Access::Admin content=detail_page/>
    }
}

fn detail_page(state: PageState) -> AnyView {
    let id = leptos_router::hooks::use_params_map()
        .get_untracked()
        .get("id")
        .unwrap_or_default();
    let back = Head::Back("/admin/invoices", "← All invoices");
    framed(state, WIDE, back, admin_invoice(id), |d, _| match d {
        Some(d) => view! {
            <p class="muted">"Tenant: "
                <a href=format!("/admin/tenants/{}", d.tenant)>{d.tenant.clone()}</a></p>
            {d.as_of.map(|t| view! {
                <p class="as-of" id="as-of">"Figures as of " {t} " UTC (the draft's last build; \
                    the tenant sees the open month live)."</p>
            })}
            {crate::invoices::page::detail(d.detail, crate::invoices::page::Links::Admin)}
        }
        .into_any(),
        None => not_found(),
    })
}

fn not_found() -> AnyView {
    crate::frame::missing("Invoice not found", "No invoice has that id.")
}

#[component]
pub fn AdminInvoicesPage() -> impl IntoView {
    view! {
        <Title text=format!("Invoices · {PRODUCT}")/>
        <Guarded access=Access::Admin content=page/>
    }
}

fn page(state: PageState) -> AnyView {
    framed(state, WIDE, "Invoices", admin_invoices(), body)
}

fn draft_actions(id: String, csrf: String) -> AnyView {
    let issue = ServerAction::<AdminIssueInvoice>::new();
    let adjust = ServerAction::<AdminAdjustInvoice>::new();
    let (csrf2, id2) = (csrf.clone(), id.clone());
    view! {
        <details class="confirm">
            <summary>"Issue…"</summary>
            <ActionForm action=issue>
                <CsrfField token=csrf2/>
                <input type="hidden" name="id" value=id2/>
                <p>"Issue this invoice? From then on it can never change; a correction is a \
                    credit note and a new invoice."</p>
                <button type="submit">"Issue invoice"</button>
            </ActionForm>
        </details>
        <details class="confirm">
            <summary>"Adjust…"</summary>
            <ActionForm action=adjust attr:class="inline">
                <CsrfField token=csrf/>
                <input type="hidden" name="id" value=id/>
                <label>"Description"<input type="text" name="description" maxlength="200" required/></label>
                <label>"Amount ($, negative refunds)"
                    <input type="text" inputmode="decimal" name="amount" size="12"/></label>
                <button type="submit" class="secondary">"Add adjustment"</button>
            </ActionForm>
        </details>
    }
    .into_any()
}

fn row(i: AdminInvoiceItem, csrf: String) -> AnyView {
    let kind = if i.kind == "credit_note" {
        "credit note"
    } else {
        "invoice"
    };
    let draft = i.status == "draft";
    let actions = draft.then(|| draft_actions(i.id.clone(), csrf));
    let class = format!("invoice-row status-{}", i.status);
    let tenant = i.tenant.clone();
    let href = format!("/admin/invoices/{}", i.id);
    view! {
        <tr class=class data-id=i.id data-tenant=tenant>
            <td>{i.tenant}</td>
            <td><a href=href>{i.month}</a></td>
            <td class="number mono">{i.number.unwrap_or_else(|| "–".to_owned())}</td>
            <td>{kind}</td>
            <td class="status">{i.status}</td>
            <td class="num">{format_micros(i.usage_micros)}</td>
            <td class="num">{format_micros(i.credit_micros)}</td>
            <td class="num">{format_micros(i.adjustment_micros)}</td>
            <td class="num total">{format_micros(i.total_micros)}
                {i.as_of.map(|t| view! { <span class="as-of">"as of " {t} " UTC"</span> })}</td>
            <td>{i.issued_at.unwrap_or_else(|| "–".to_owned())}</td>
            <td class="actions">{actions}</td>
        </tr>
    }
    .into_any()
}

fn tenant_options(tenants: &[TenantCredit]) -> AnyView {
    tenants
        .iter()
        .map(|t| view! { <option value=t.tenant.clone()>{t.tenant.clone()}</option> })
        .collect_view()
        .into_any()
}

fn body(v: AdminInvoicesView, csrf: String) -> AnyView {
    let build = ServerAction::<AdminBuildInvoice>::new();
    let close = ServerAction::<AdminClosePeriod>::new();
    let grant = ServerAction::<AdminGrantCredit>::new();
    let issuer = issuer_panel(v.issuer, csrf.clone());
    let empty = v.invoices.is_empty();
    let rows = v
        .invoices
        .into_iter()
        .map(|i| row(i, csrf.clone()))
        .collect_view();
    let balances = v
        .tenants
        .iter()
        .filter(|t| t.balance_micros != 0)
        .map(|t| {
            view! {
                <li data-tenant=t.tenant.clone()>{t.tenant.clone()} ": "
                    <span class="balance">{format_micros(t.balance_micros)}</span></li>
            }
        })
        .collect_view();
    let (tenants_a, tenants_b) = (tenant_options(&v.tenants), tenant_options(&v.tenants));
    let tenants_c = tenant_options(&v.tenants);
    let (csrf2, csrf3) = (csrf.clone(), csrf.clone());
    let (month_a, month_b) = (v.open_month.clone(), v.open_month.clone());
    view! {
        <section class="panel">
            <h2>"All invoices"</h2>
            <p class="muted">"Drafts are rebuilt from the rated usage every few minutes while \
                their month is open, and once more after it closes; issuing is always an \
                admin's act. A draft's figures are as of its last build (shown under its \
                total), so they can trail the tenant's live view by a few minutes."</p>
            {if empty {
                view! { <p class="muted">"No invoices yet: the first drafts are built a few \
                    minutes after usage is rated, or at once with \"Build a draft now\"."</p> }
                .into_any()
            } else {
                view! {
                    <div class="scroll">
                    <table class="list invoices">
                        <thead><tr>
                            <th>"Tenant"</th><th>"Month"</th><th>"Number"</th><th>"Kind"</th>
                            <th>"Status"</th>
                            <th class="num">"Usage"</th><th class="num">"Credits"</th>
                            <th class="num">"Adjustments"</th><th class="num">"Total"</th>
                            <th>"Issued (UTC)"</th>
                            <th><span class="visually-hidden">"Actions"</span></th>
                        </tr></thead>
                        <tbody>{rows}</tbody>
                    </table>
                    </div>
                }
                .into_any()
            }}
        </section>
        <section class="panel">
            <h2>"Build a draft now"</h2>
            <ActionForm action=build attr:class="inline">
                <CsrfField token=csrf2/>
                <label>"Tenant"<select name="tenant">{tenants_a}</select></label>
                <label>"Month (YYYY-MM, UTC)"
                    <input type="text" name="month" value=month_a size="8"/></label>
                <label>"Re-rate runs (empty: as before; live: none)"
                    <input type="text" name="runs" size="10"/></label>
                <button type="submit" class="secondary">"Build draft"</button>
            </ActionForm>
            <p class="muted">"A re-rate run counts for its part of the month, the live rating \
                for the rest; the draft keeps the runs it was built from when it is rebuilt. A \
                month is issued after its period ends and its final draft is built."</p>
        </section>
        <section class="panel">
            <h2>"Close a month early"</h2>
            <ActionForm action=close attr:class="inline close-form">
                <CsrfField token=csrf3/>
                <label>"Tenant"<select name="tenant">{tenants_c}</select></label>
                <label>"Month (YYYY-MM, UTC)"
                    <input type="text" name="month" value=month_b size="8"/></label>
                <label>"At (UTC, empty: now)"<input type="datetime-local" name="at" step="1"/></label>
                <button type="submit" class="secondary">"Close month"</button>
            </ActionForm>
            <p class="muted">"The month's invoice covers usage started before that instant; \
                usage from then on is on the next month's invoice."</p>
        </section>
        <section class="panel">
            <h2>"Grant prepaid credit"</h2>
            <ActionForm action=grant attr:class="limits credit-form">
                <CsrfField token=csrf/>
                <label>"Tenant"<select name="tenant">{tenants_b}</select></label>
                <label>"Amount ($, e.g. 50 or 0.25)"<input type="text" inputmode="decimal" name="amount" size="12"/></label>
                <label>"Priority (lower burns first)"
                    <input type="text" inputmode="numeric" name="priority" value="0" size="4"/></label>
                <label>"Expires (UTC, empty: never)"<input type="datetime-local" name="expires"/></label>
                <label>"Note"<input type="text" name="note" maxlength="200"/></label>
                <button type="submit">"Grant credit"</button>
            </ActionForm>
            <p class="muted">"Credit burns down before charges are invoiced and raises the \
                tenant's monthly spend limit by what is left. Amounts are dollars, stored \
                exactly as micro-units; a grant stops counting at its expiry instant."</p>
            <ul class="balances">{balances}</ul>
        </section>
        {issuer}
    }
    .into_any()
}

/// Who issues invoices, and the payment terms.
fn issuer_panel(i: IssuerView, csrf: String) -> AnyView {
    let save = ServerAction::<AdminSetIssuer>::new();
    view! {
        <section class="panel issuer">
            <h2>"Invoice issuer"</h2>
            <ActionForm action=save attr:class="stack">
                <CsrfField token=csrf/>
                <label for="issuer-name">"Name"</label>
                <input id="issuer-name" type="text" name="name" required maxlength="200"
                    value=i.name/>
                <label for="issuer-address">"Address (and tax number)"</label>
                <textarea id="issuer-address" name="address" rows="4" maxlength="1000">{i.address}</textarea>
                <label for="issuer-due">"Payment terms (days from issue to due)"</label>
                <input id="issuer-due" type="text" inputmode="numeric" name="due_days" size="4"
                    value=i.due_days.to_string()/>
                <button type="submit">"Save issuer"</button>
            </ActionForm>
            <p class="muted">"Copied onto each invoice when it is issued, with its number \
                (INV-year-sequence; credit notes CN-year-sequence) and the tenant's billing \
                address: later edits never change an issued invoice."</p>
        </section>
    }
    .into_any()
}
