//! `/invoices` and `/invoices/{id}`: the tenant's monthly (UTC) invoices, the open month's draft
//! computed live from its rated lines, the prepaid credit left, and one invoice with its lines
//! per model (fresh input, cached input, output), its credit and adjustment entries and its
//! totals, its usage by endpoint (the same lines split by the API that served them), with a CSV
//! download (`/invoices/{id}.csv`). Read-only for every tenant role; another
//! tenant's invoice id answers 404 inside the page's frame, like an unknown one.

use leptos::prelude::*;
use leptos_meta::Title;
use leptos_router::hooks::use_params_map;

use super::{
    fetch_invoice, fetch_invoices, DocumentView, EndpointView, EntryView, GrantView, InvoiceDetail,
    InvoiceRow, InvoicesView, SaveBillingAddress, MAX_BILLING_ADDRESS,
};
use crate::frame::{framed, missing, CsrfField, Guarded, Head, WIDE};
use crate::model::{Access, PageState};
use crate::money::{format_micros, group_thousands};
use crate::PRODUCT;

#[component]
pub fn InvoicesPage() -> impl IntoView {
    view! {
        <Title text=format!("Invoices · {PRODUCT}")/>
        <Guarded access=Access::Tenant content=list_page/>
    }
}

#[component]
pub fn InvoicePage() -> impl IntoView {
    view! {
        <Title text=format!("Invoice · {PRODUCT}")/>
        <Guarded access=Access::Tenant content=detail_page/>
    }
}

fn list_page(state: PageState) -> AnyView {
    framed(state, WIDE, "Invoices", fetch_invoices(), list)
}

fn n(v: i64) -> String {
    group_thousands(u64::try_from(v).unwrap_or(0))
}

/// `draft`, `draft (live)`, `issued` or `credit note`.
fn status_label(r: &InvoiceRow) -> String {
    let base = if r.kind == "credit_note" {
        format!("credit note, {}", r.status)
    } else {
        r.status.clone()
    };
    if r.live {
        format!("{base} (live)")
    } else {
        base
    }
}

fn invoice_row(r: InvoiceRow) -> AnyView {
    let href = format!("/invoices/{}", r.id);
    let csv = format!("/invoices/{}.csv", r.id);
    let status = status_label(&r);
    let class = format!("invoice-row status-{}", r.status);
    view! {
        <tr class=class data-id=r.id.clone() data-month=r.month.clone()>
            <td><a href=href>{r.month.clone()}</a></td>
            <td class="number mono">{r.number.clone().unwrap_or_else(|| "–".to_owned())}</td>
            <td class="status">{status}</td>
            <td class="num usage">{format_micros(r.usage_micros)}</td>
            <td class="num credit">{format_micros(r.credit_micros)}</td>
            <td class="num adjustment">{format_micros(r.adjustment_micros)}</td>
            <td class="num total">{format_micros(r.total_micros)}</td>
            <td>{r.issued_at.unwrap_or_else(|| "–".to_owned())}</td>
            <td><a href=csv download="">"CSV"</a></td>
        </tr>
    }
    .into_any()
}

fn grant_row(g: GrantView) -> AnyView {
    let expires = match (g.expires_at, g.expired) {
        (None, _) => "never".to_owned(),
        (Some(t), true) => format!("{t} (expired)"),
        (Some(t), false) => t,
    };
    view! {
        <tr class="grant">
            <td class="num">{format_micros(g.amount_micros)}</td>
            <td class="num remaining">{format_micros(g.remaining_micros)}</td>
            <td class="num">{g.priority}</td>
            <td>{expires}</td>
            <td>{g.note}</td>
        </tr>
    }
    .into_any()
}

/// Where invoices are addressed: a form for owners, the address for everyone else.
fn billing_panel(address: String, can_manage: bool, csrf: String) -> AnyView {
    let shown = if address.is_empty() {
        "No billing address yet: invoices are addressed to the tenant's name only.".to_owned()
    } else {
        address.clone()
    };
    if !can_manage {
        return view! {
            <section class="panel billing">
                <h2>"Billing address"</h2>
                <p class="address" id="billing-address">{shown}</p>
                <p class="muted">"Only the tenant's owners change it."</p>
            </section>
        }
        .into_any();
    }
    let save = ServerAction::<SaveBillingAddress>::new();
    view! {
        <section class="panel billing">
            <h2>"Billing address"</h2>
            <ActionForm action=save attr:class="stack">
                <CsrfField token=csrf/>
                <label for="billing-address">"Invoices are addressed to your tenant's name and \
                    this address (company, street, city, country, tax number)"</label>
                <textarea id="billing-address" name="address" rows="4"
                    maxlength=MAX_BILLING_ADDRESS.to_string()>{address}</textarea>
                <p class="muted">"Invoices issued from now on carry it; an issued invoice keeps \
                    the address it was issued with."</p>
                <button type="submit">"Save billing address"</button>
            </ActionForm>
        </section>
    }
    .into_any()
}

fn list(v: InvoicesView, csrf: String) -> AnyView {
    let empty = v.rows.is_empty();
    let grants = v.grants;
    let billing = billing_panel(v.billing_address, v.can_manage, csrf);
    view! {
        <section class="panel credit">
            <h2>"Prepaid credit"</h2>
            <p class="balance">"Remaining: " <strong id="credit-balance">{format_micros(v.balance_micros)}</strong></p>
            <p class="muted">"Credit burns down before charges are invoiced (lowest priority \
                number first, then the earliest expiry) and raises this month's spend limit by \
                what is left."</p>
            {(!grants.is_empty()).then(|| view! {
                <table class="list grants">
                    <thead><tr>
                        <th class="num">"Granted"</th><th class="num">"Remaining"</th>
                        <th class="num">"Priority"</th><th>"Expires (UTC)"</th><th>"Note"</th>
                    </tr></thead>
                    <tbody>{grants.into_iter().map(grant_row).collect_view()}</tbody>
                </table>
            })}
        </section>
        {billing}
        <p class="muted">"One invoice per calendar month (UTC). The open month's draft is \
            computed from the usage rated so far; an issued invoice never changes (a correction \
            is a credit note and a new invoice)."</p>
        {if empty {
            view! { <p class="muted">"No invoices yet."</p> }.into_any()
        } else {
            ().into_any()
        }}
        <div class="scroll">
        <table class="list invoices">
            <thead>
                <tr>
                    <th>"Month"</th><th>"Number"</th><th>"Status"</th><th class="num">"Usage"</th>
                    <th class="num">"Credits"</th><th class="num">"Adjustments"</th>
                    <th class="num">"Total"</th><th>"Issued (UTC)"</th><th>"Download"</th>
                </tr>
            </thead>
            <tbody>{v.rows.into_iter().map(invoice_row).collect_view()}</tbody>
        </table>
        </div>
    }
    .into_any()
}

fn detail_page(state: PageState) -> AnyView {
    let id = use_params_map()
        .get_untracked()
        .get("id")
        .unwrap_or_default();
    let back = Head::Back("/invoices", "← Invoices");
    framed(state, WIDE, back, fetch_invoice(id), |d, _| match d {
        Some(d) => detail(d, Links::Tenant),
        None => not_found(),
    })
}

/// Unknown, malformed or another tenant's id.
fn not_found() -> AnyView {
    missing(
        "Invoice not found",
        "No invoice of this tenant has that id.",
    )
}

fn usage_row(e: EntryView) -> AnyView {
    let model = e.description.clone();
    view! {
        <tr class="entry usage" data-model=model>
            <td>{e.description}</td>
            <td class="num events">{n(e.events)}</td>
            <td class="num fresh">{n(e.fresh_tokens)}</td>
            <td class="num cached">{n(e.cached_tokens)}</td>
            <td class="num output">{n(e.output_tokens)}</td>
            <td class="num amount">{format_micros(e.amount_micros)}</td>
        </tr>
    }
    .into_any()
}

/// The API a request called, as the usage page names it.
fn endpoint_label(endpoint: &str) -> &'static str {
    crate::usage::ENDPOINTS
        .iter()
        .find(|(v, _)| *v == endpoint)
        .map_or("Other", |(_, label)| *label)
}

fn endpoint_row(e: EndpointView) -> AnyView {
    let endpoint = e.endpoint.clone();
    view! {
        <tr class="endpoint" data-endpoint=endpoint>
            <td>{endpoint_label(&e.endpoint)}</td>
            <td class="num events">{n(e.events)}</td>
            <td class="num fresh">{n(e.fresh_tokens)}</td>
            <td class="num cached">{n(e.cached_tokens)}</td>
            <td class="num output">{n(e.output_tokens)}</td>
            <td class="num reasoning">{n(e.reasoning_tokens)}</td>
            <td class="num amount">{format_micros(e.amount_micros)}</td>
        </tr>
    }
    .into_any()
}

/// The usage split by endpoint (nothing when there is no usage): the same lines as the entries,
/// so its amounts add up to the usage subtotal.
fn by_endpoint(endpoints: Vec<EndpointView>, usage_micros: i64) -> Option<AnyView> {
    if endpoints.is_empty() {
        return None;
    }
    Some(
        view! {
            <h2>"Usage by endpoint"</h2>
            <div class="scroll">
            <table class="usage by-endpoint">
                <thead>
                    <tr>
                        <th>"Endpoint"</th><th class="num">"Requests"</th>
                        <th class="num">"Fresh input tokens"</th><th class="num">"Cached input tokens"</th>
                        <th class="num">"Output tokens"</th><th class="num">"of which reasoning"</th>
                        <th class="num">"Amount"</th>
                    </tr>
                </thead>
                <tbody>{endpoints.into_iter().map(endpoint_row).collect_view()}</tbody>
                <tfoot>
                    <tr class="totals"><th colspan="6">"Usage"</th>
                        <td class="num" id="endpoint-usage-total">{format_micros(usage_micros)}</td></tr>
                </tfoot>
            </table>
            </div>
        }
        .into_any(),
    )
}

fn other_row(e: EntryView) -> AnyView {
    let label = if e.kind == "credit" {
        "Credit"
    } else {
        "Adjustment"
    };
    let class = format!("entry {}", e.kind);
    view! {
        <tr class=class>
            <td colspan="5">{label} ": " {e.description}</td>
            <td class="num amount">{format_micros(e.amount_micros)}</td>
        </tr>
    }
    .into_any()
}

/// Where an invoice page's links go: the tenant's own pages (with the CSV download), or the
/// operator's (`/admin/invoices/{id}`; exports are the operator's CSV).
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Links {
    Tenant,
    Admin,
}

/// Lines of an address block.
fn address(lines: Vec<String>) -> AnyView {
    lines
        .into_iter()
        .map(|l| view! { <span class="line">{l}</span> })
        .collect_view()
        .into_any()
}

/// The document's head: number, parties, period, issue and due dates.
fn document(doc: DocumentView, r: &InvoiceRow, base: &str) -> AnyView {
    let number = doc
        .number
        .unwrap_or_else(|| "assigned when issued".to_owned());
    let due = doc
        .due
        .unwrap_or_else(|| format!("{} days after issue", doc.due_days));
    view! {
        <section class="document">
            <div class="parties">
                <div class="party from"><h2>"From"</h2>
                    <address id="invoice-issuer">{address(doc.issuer)}</address></div>
                <div class="party bill-to"><h2>"Bill to"</h2>
                    <address id="invoice-bill-to">{address(doc.bill_to)}</address></div>
            </div>
            <dl class="facts">
                <dt>"Number"</dt><dd id="invoice-number" class="mono">{number}</dd>
                <dt>"Period (UTC)"</dt>
                <dd id="invoice-period">{r.month.clone()} ": " {doc.covers_from} " to "
                    {doc.covers_until} " (events started in that interval)"</dd>
                <dt>"Issued (UTC)"</dt>
                <dd>{r.issued_at.clone().unwrap_or_else(|| "not yet".to_owned())}</dd>
                <dt>"Due (UTC)"</dt><dd id="invoice-due">{due}</dd>
                <dt>"Status"</dt><dd class="status">{status_label(r)}</dd>
                {r.corrects.clone().map(|c| view! {
                    <dt>"Corrects"</dt><dd><a class="mono" href=format!("{base}/{c}")>{c.clone()}</a></dd>
                })}
            </dl>
        </section>
    }
    .into_any()
}

pub(crate) fn detail(d: InvoiceDetail, links: Links) -> AnyView {
    let r = d.row;
    let heading = match (r.kind.as_str(), &r.number) {
        ("credit_note", Some(n)) => format!("Credit note {n}"),
        ("credit_note", None) => format!("Credit note {}", r.month),
        (_, Some(n)) => format!("Invoice {n}"),
        (_, None) => format!("Invoice {} (draft)", r.month),
    };
    let (usage, other): (Vec<EntryView>, Vec<EntryView>) =
        d.entries.into_iter().partition(|e| e.kind == "usage");
    let csv = (links == Links::Tenant).then(|| {
        let href = format!("/invoices/{}.csv", r.id);
        view! { <a class="button" href=href download="">"Download CSV"</a> }
    });
    let base = match links {
        Links::Tenant => "/invoices",
        Links::Admin => "/admin/invoices",
    };
    let live_note = r.live.then(|| {
        view! {
            <p class="notice" role="status">"The month is open: these figures are computed now \
                from the usage rated so far and will change until the invoice is issued."</p>
        }
    });
    let head = document(d.document, &r, base);
    let empty = usage.is_empty();
    let endpoints = by_endpoint(d.endpoints, r.usage_micros);
    view! {
        <h1>{heading}</h1>
        {live_note}
        {head}
        <p class="no-print actions-line">{csv} <span class="muted">"Printable: your browser's Print \
            (Ctrl+P) leaves out the navigation and buttons."</span></p>
        <div class="scroll">
        <table class="usage invoice">
            <thead>
                <tr>
                    <th>"Model"</th><th class="num">"Requests"</th>
                    <th class="num">"Fresh input tokens"</th><th class="num">"Cached input tokens"</th>
                    <th class="num">"Output tokens"</th><th class="num">"Amount"</th>
                </tr>
            </thead>
            <tbody>
                {empty.then(|| view! { <tr><td colspan="6" class="muted">"No usage."</td></tr> })}
                {usage.into_iter().map(usage_row).collect_view()}
                {other.into_iter().map(other_row).collect_view()}
            </tbody>
            <tfoot>
                <tr class="subtotal usage-total"><th colspan="5">"Usage"</th>
                    <td class="num">{format_micros(r.usage_micros)}</td></tr>
                <tr class="subtotal credit-total"><th colspan="5">"Credits applied"</th>
                    <td class="num">{format_micros(r.credit_micros)}</td></tr>
                <tr class="subtotal adjustment-total"><th colspan="5">"Adjustments"</th>
                    <td class="num">{format_micros(r.adjustment_micros)}</td></tr>
                <tr class="totals"><th colspan="5">"Total"</th>
                    <td class="num" id="invoice-total">{format_micros(r.total_micros)}</td></tr>
            </tfoot>
        </table>
        </div>
        <p class="muted">"Each line is rated once per request at the price in effect when it \
            started, rounded half-up to the micro-unit; the amounts of a model are their sum."</p>
        {endpoints}
    }
    .into_any()
}
