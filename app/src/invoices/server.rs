//! Server half of `/invoices`: the tenant's invoices from `tf_core::db::invoicing` (the tenant id
//! always from the session), the open month's draft as `build_draft` would build it now (nothing
//! stored), one invoice's entries, the credit grants, and the CSV of one invoice. Months are UTC
//! calendar months; money stays integer micro-units until a page formats it.

use sqlx::PgPool;
use tf_core::db::billing::{self, Entry, Invoice};
use tf_core::db::documents::{self, Document};
use tf_core::db::invoicing::{self, EndpointUsage, Summary};
use tf_core::period::month_of;
use time::macros::format_description;
use time::{Date, OffsetDateTime};
use uuid::Uuid;

use super::{
    DocumentView, EndpointView, EntryView, GrantView, InvoiceDetail, InvoiceRow, InvoicesView,
    CURRENT,
};
use crate::error::PortalError;
use crate::money::format_micros;
use crate::ssr::{member, session, Portal};

/// Invoices listed at most (a tenant has one a month, plus corrections).
const MAX_LISTED: i64 = 240;

const MINUTE: &[time::format_description::BorrowedFormatItem<'static>] =
    format_description!("[year]-[month]-[day] [hour]:[minute]");
const MONTH: &[time::format_description::BorrowedFormatItem<'static>] =
    format_description!("[year]-[month]");

fn minute(t: OffsetDateTime) -> String {
    t.format(MINUTE).unwrap_or_default()
}

fn month(d: Date) -> String {
    d.format(MONTH).unwrap_or_default()
}

fn row_of(s: Summary) -> InvoiceRow {
    InvoiceRow {
        id: s.id.to_string(),
        month: month(s.period_start),
        kind: s.kind,
        status: s.status,
        live: false,
        usage_micros: s.usage_micros,
        credit_micros: s.credit_micros,
        adjustment_micros: s.adjustment_micros,
        total_micros: s.total_micros,
        issued_at: s.issued_at.map(minute),
        corrects: s.corrects.map(|c| c.to_string()),
        number: s.number,
    }
}

/// Subtotal of the entries of one kind (an invoice has a handful of entries).
fn subtotal(entries: &[Entry], kind: &str) -> i64 {
    entries
        .iter()
        .filter(|e| e.kind == kind)
        .fold(0_i64, |sum, e| sum.saturating_add(e.amount_micros))
}

fn row_with_entries(i: &Invoice, entries: &[Entry], live: bool) -> InvoiceRow {
    InvoiceRow {
        id: if live {
            CURRENT.to_owned()
        } else {
            i.id.to_string()
        },
        month: month(i.period_start),
        kind: i.kind.clone(),
        status: i.status.clone(),
        live,
        usage_micros: subtotal(entries, "usage"),
        credit_micros: subtotal(entries, "credit"),
        adjustment_micros: subtotal(entries, "adjustment"),
        total_micros: i.total_micros,
        issued_at: i.issued_at.map(minute),
        corrects: i.corrects.map(|c| c.to_string()),
        number: None,
    }
}

const DAY: &[time::format_description::BorrowedFormatItem<'static>] =
    format_description!("[year]-[month]-[day]");

/// The page's view of an invoice's document fields.
fn document_view(i: &Invoice, d: Document) -> DocumentView {
    let lines = |s: String| s.lines().map(str::to_owned).collect();
    DocumentView {
        number: d.number,
        issuer: lines(d.issuer),
        bill_to: lines(d.bill_to),
        covers_from: minute(i.covers_from),
        covers_until: minute(i.covers_until),
        due: d.due_at.map(|t| t.format(DAY).unwrap_or_default()),
        due_days: d.due_days,
    }
}

/// An invoice's page: its row (numbered when issued), document fields, entries and usage by
/// endpoint.
fn detail_of(
    i: &Invoice,
    d: Document,
    entries: Vec<Entry>,
    endpoints: Vec<EndpointUsage>,
    live: bool,
) -> InvoiceDetail {
    let mut row = row_with_entries(i, &entries, live);
    row.number.clone_from(&d.number);
    InvoiceDetail {
        row,
        document: document_view(i, d),
        entries: entries.into_iter().map(entry_view).collect(),
        endpoints: endpoints.into_iter().map(endpoint_view).collect(),
    }
}

fn endpoint_view(e: EndpointUsage) -> EndpointView {
    EndpointView {
        endpoint: e.endpoint,
        events: e.events,
        fresh_tokens: e.fresh_tokens,
        cached_tokens: e.cached_tokens,
        output_tokens: e.output_tokens,
        reasoning_tokens: e.reasoning_tokens,
        amount_micros: e.amount_micros,
    }
}

/// A usage entry is shown by its description, the model the requests named (an adapter's own
/// name, not its base's price key, so each model of the invoice has a line of its own).
fn entry_view(e: Entry) -> EntryView {
    EntryView {
        description: e.description,
        kind: e.kind,
        events: e.events,
        fresh_tokens: e.fresh_tokens,
        cached_tokens: e.cached_tokens,
        output_tokens: e.output_tokens,
        amount_micros: e.amount_micros,
    }
}

/// The open month's draft as it would be built now (from the runs its draft keeps, else the
/// live run); `None` when the month already has an issued invoice.
async fn live_draft(
    pool: &PgPool,
    tenant: Uuid,
    now: OffsetDateTime,
) -> sqlx::Result<Option<invoicing::Preview>> {
    invoicing::preview_draft(pool, tenant, month_of(now)).await
}

/// What `/invoices` shows for `tenant` at `now`.
pub async fn list(pool: &PgPool, tenant: Uuid, now: OffsetDateTime) -> sqlx::Result<InvoicesView> {
    let open = month_of(now);
    let mut rows = Vec::new();
    let live = live_draft(pool, tenant, now).await?;
    let live_id = live.as_ref().map(|p| p.invoice.id);
    if let Some(p) = &live {
        rows.push(row_with_entries(&p.invoice, &p.entries, true));
    }
    for s in invoicing::summaries(pool, Some(tenant), MAX_LISTED).await? {
        // The stored draft of the open month is the live row, computed afresh.
        let replaced = Some(s.id) == live_id
            || (s.period_start == open && s.status == "draft" && s.kind == "invoice");
        if !replaced {
            rows.push(row_of(s));
        }
    }
    let balance_micros = billing::credit_balance(pool, tenant).await?;
    let grants = billing::credit_grants(pool, tenant)
        .await?
        .into_iter()
        .map(|g| GrantView {
            amount_micros: g.amount_micros,
            remaining_micros: g.remaining_micros,
            priority: g.priority,
            expired: g.expires_at.is_some_and(|e| e <= now),
            expires_at: g.expires_at.map(minute),
            note: g.note,
        })
        .collect();
    Ok(InvoicesView {
        rows,
        balance_micros,
        grants,
        billing_address: documents::billing_address(pool, tenant).await?,
        can_manage: false,
    })
}

/// One of `tenant`'s invoices by the id in its URL ([`CURRENT`]: the open month's live draft);
/// `None` for anything else, another tenant's invoice included.
pub async fn detail(
    pool: &PgPool,
    tenant: Uuid,
    id: &str,
    now: OffsetDateTime,
) -> sqlx::Result<Option<InvoiceDetail>> {
    let id = id.trim();
    if id == CURRENT {
        let Some(p) = live_draft(pool, tenant, now).await? else {
            return Ok(None);
        };
        let d = documents::of_draft(pool, tenant).await?;
        return Ok(Some(detail_of(&p.invoice, d, p.entries, p.endpoints, true)));
    }
    let Ok(id) = Uuid::parse_str(id) else {
        return Ok(None);
    };
    let Some(i) = billing::invoice(pool, tenant, id).await? else {
        return Ok(None);
    };
    let entries = billing::invoice_entries(pool, tenant, id).await?;
    let endpoints = invoicing::usage_by_endpoint(pool, tenant, id).await?;
    let Some(d) = documents::of_invoice(pool, Some(tenant), id).await? else {
        return Ok(None);
    };
    Ok(Some(detail_of(&i, d, entries, endpoints, false)))
}

/// One CSV field of our own making: quoted when it holds a comma, quote or line break.
fn quote(s: &str) -> String {
    if s.contains([',', '"', '\n', '\r']) {
        format!("\"{}\"", s.replace('"', "\"\""))
    } else {
        s.to_owned()
    }
}

/// One CSV field of text someone typed (an adjustment's description): [`quote`]d, and a leading
/// `'` when a spreadsheet would take it for a formula.
fn field(s: &str) -> String {
    if s.starts_with(['=', '+', '-', '@']) {
        quote(&format!("'{s}"))
    } else {
        quote(s)
    }
}

/// The CSV of one invoice: a header, one row per entry as the detail page lists them (usage per
/// model with its three quantities, credits, adjustments), then the total. Amounts are integer
/// micro-units and, beside them, as shown on the page. The last column is the document number
/// (empty on a draft), appended so that readers of the earlier columns are unaffected.
pub fn csv(d: &InvoiceDetail) -> String {
    let mut out = String::from(
        "invoice,month,status,kind,description,events,fresh_input_tokens,cached_input_tokens,\
         output_tokens,amount_micros,amount,invoice_number\n",
    );
    let r = &d.row;
    let number = r.number.as_deref().unwrap_or_default();
    let mut line = |kind: &str, e: Option<&EntryView>, amount: i64| {
        let cells = [
            field(&r.id),
            field(&r.month),
            field(&r.status),
            field(kind),
            field(e.map_or("total", |e| e.description.as_str())),
            e.map_or(String::new(), |e| e.events.to_string()),
            e.map_or(String::new(), |e| e.fresh_tokens.to_string()),
            e.map_or(String::new(), |e| e.cached_tokens.to_string()),
            e.map_or(String::new(), |e| e.output_tokens.to_string()),
            amount.to_string(),
            quote(&format_micros(amount)),
            field(number),
        ];
        out.push_str(&cells.join(","));
        out.push('\n');
    };
    for e in &d.entries {
        line(&e.kind, Some(e), e.amount_micros);
    }
    line("total", None, r.total_micros);
    out
}

/// The CSV's file name: the document number once issued, else the tenant and month.
fn csv_name(tenant: &str, d: &InvoiceDetail) -> String {
    match &d.row.number {
        Some(n) => format!("invoice-{n}.csv"),
        None => format!("invoice-{tenant}-{}.csv", d.row.month),
    }
}

/// What a GET of `/invoices/{id}.csv` gets.
pub enum Download {
    /// The file: its name and contents.
    Csv { filename: String, body: String },
    /// Nobody signed in: to the login.
    SignedOut,
    /// Signed in without a tenant (an admin).
    Forbidden,
    /// No such invoice of the session's tenant.
    NotFound,
}

/// The CSV of the session tenant's invoice `id` (as in the page's URL). Must run inside
/// [`crate::ssr::model_form::in_portal`].
pub async fn download(id: &str) -> Result<Download, PortalError> {
    let portal = Portal::current()?;
    let s = session::current().await?;
    if session::signed_in(&portal, &s).await?.is_none() {
        return Ok(Download::SignedOut);
    }
    let Some(m) = member::current(&portal, &s).await? else {
        return Ok(Download::Forbidden);
    };
    let found = detail(
        &portal.deps.pool,
        m.tenant.id,
        id,
        OffsetDateTime::now_utc(),
    )
    .await
    .map_err(|e| crate::ssr::internal("loading an invoice for its CSV", e))?;
    Ok(match found {
        Some(d) => Download::Csv {
            filename: csv_name(&m.tenant.name, &d),
            body: csv(&d),
        },
        None => Download::NotFound,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fields_are_quoted_and_formulas_defused() {
        assert_eq!(field("llama"), "llama");
        assert_eq!(field("a,b"), "\"a,b\"");
        assert_eq!(field("say \"hi\""), "\"say \"\"hi\"\"\"");
        assert_eq!(field("=1+1"), "'=1+1");
        assert_eq!(field("-refund"), "'-refund");
        assert_eq!(quote("-$1,000.00"), "\"-$1,000.00\"");
    }
}
