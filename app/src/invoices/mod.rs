//! Server functions of the tenant's `/invoices` pages: the session tenant's invoices (the open
//! month's draft computed live from its rated lines), one invoice with its entries, and the
//! prepaid credit left. Read-only for every tenant role; always scoped by the session's tenant,
//! so another tenant's invoice id answers exactly like an unknown one. The CSV download of an
//! invoice (`/invoices/{id}.csv`) is a plain route in the server over [`crate::invoices::server`].

pub mod page;
#[cfg(feature = "ssr")]
pub mod server;

use leptos::prelude::*;
use serde::{Deserialize, Serialize};

use crate::error::PortalError;

/// The id in the URL of the open month's live draft: `/invoices/current`.
pub const CURRENT: &str = "current";

/// One invoice or credit note of the list, or the head of the detail page.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct InvoiceRow {
    /// What the detail page's URL takes: the invoice id, or [`CURRENT`] for the live draft.
    pub id: String,
    /// `YYYY-MM` (UTC calendar month).
    pub month: String,
    /// `invoice` or `credit_note`.
    pub kind: String,
    /// `draft` or `issued`.
    pub status: String,
    /// Computed now from the rated lines rather than read from a stored invoice.
    pub live: bool,
    pub usage_micros: i64,
    /// Credits applied (zero or negative).
    pub credit_micros: i64,
    pub adjustment_micros: i64,
    pub total_micros: i64,
    /// `YYYY-MM-DD HH:MM` UTC.
    pub issued_at: Option<String>,
    /// The invoice a credit note corrects, or the one a new invoice replaces.
    pub corrects: Option<String>,
    /// The document number (`INV-2026-000001`), given when issued.
    pub number: Option<String>,
}

/// The invoice as a document: who issues it, who it is billed to, what it covers and when it is
/// due. Fixed on the invoice when it is issued; a draft shows what it would be issued with now.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct DocumentView {
    /// `None` for a draft (numbered when issued).
    pub number: Option<String>,
    /// "From": the issuer's name and address, one entry per line.
    pub issuer: Vec<String>,
    /// "Bill to": the tenant's name and billing address, one entry per line.
    pub bill_to: Vec<String>,
    /// The events it covers by start time, `YYYY-MM-DD HH:MM` UTC: from (inclusive) to (exclusive).
    pub covers_from: String,
    pub covers_until: String,
    /// `YYYY-MM-DD` UTC; `None` for a draft.
    pub due: Option<String>,
    /// Days from issue to the due date a draft will get.
    pub due_days: i32,
}

/// An entry of an invoice: usage of one model (or base) with its three quantities, a credit or
/// an adjustment.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct EntryView {
    /// `usage`, `credit` or `adjustment`.
    pub kind: String,
    pub description: String,
    pub events: i64,
    pub fresh_tokens: i64,
    pub cached_tokens: i64,
    pub output_tokens: i64,
    pub amount_micros: i64,
}

/// An invoice's usage from one endpoint (`chat`, `completions`, `responses`, `embeddings`,
/// `messages`): the same charge lines as the usage entries, split by the API that served them.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct EndpointView {
    pub endpoint: String,
    pub events: i64,
    pub fresh_tokens: i64,
    pub cached_tokens: i64,
    pub output_tokens: i64,
    /// Of `output_tokens`, reasoning tokens (billed as output).
    pub reasoning_tokens: i64,
    pub amount_micros: i64,
}

/// A prepaid credit grant as the tenant sees it.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct GrantView {
    pub amount_micros: i64,
    /// What issued invoices have not burned.
    pub remaining_micros: i64,
    pub priority: i32,
    /// `YYYY-MM-DD HH:MM` UTC; `None`: never expires.
    pub expires_at: Option<String>,
    pub expired: bool,
    pub note: String,
}

/// What `/invoices` shows.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct InvoicesView {
    /// Newest month first; the open month's draft first of all, computed live.
    pub rows: Vec<InvoiceRow>,
    /// Prepaid credit left now: unexpired grants less what issued invoices burned.
    pub balance_micros: i64,
    pub grants: Vec<GrantView>,
    /// Where the tenant's invoices are addressed (lines), and whether the viewer may change it
    /// (owners).
    pub billing_address: String,
    pub can_manage: bool,
}

/// What `/invoices/{id}` shows.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct InvoiceDetail {
    pub row: InvoiceRow,
    pub document: DocumentView,
    /// Usage entries first (per model), then credits, then adjustments.
    pub entries: Vec<EntryView>,
    /// The usage split by endpoint; the amounts add up to `row.usage_micros`.
    #[serde(default)]
    pub endpoints: Vec<EndpointView>,
}

/// The session tenant's invoices and credit.
#[server(prefix = "/api", endpoint = "invoices", input = leptos::server_fn::codec::GetUrl)]
pub async fn fetch_invoices() -> Result<InvoicesView, PortalError> {
    use crate::invoices::server as invoices;
    use crate::ssr::{internal, member, session, Portal};

    let portal = Portal::current()?;
    let s = session::current().await?;
    // One lookup for the tenant and the viewer's role; no tenant (signed out, an admin): 403.
    let Some(m) = member::current(&portal, &s).await? else {
        session::set_status(http::StatusCode::FORBIDDEN);
        return Err(PortalError::Forbidden);
    };
    let mut view = invoices::list(
        &portal.deps.pool,
        m.tenant.id,
        time::OffsetDateTime::now_utc(),
    )
    .await
    .map_err(|e| internal("loading the invoices", e))?;
    view.can_manage = m.role.manages_tenant();
    Ok(view)
}

/// Longest billing address (the column's CHECK).
pub const MAX_BILLING_ADDRESS: usize = 1000;

/// Sets where the tenant's invoices are addressed (owners), audited as
/// `tenant.billing_address`. Invoices issued from then on carry it; issued ones keep theirs.
#[server(prefix = "/api", endpoint = "save_billing_address")]
pub async fn save_billing_address(
    #[server(default)] csrf: String,
    #[server(default)] address: String,
) -> Result<(), PortalError> {
    use crate::ssr::cookies::Flash;
    use crate::ssr::form::{back, tenant_form, TenantForm};
    use crate::ssr::{internal, session};
    use tf_core::accounts::AccountError;

    const BACK: &str = "/invoices";
    let Some(TenantForm {
        portal,
        jar,
        member: m,
        ..
    }) = tenant_form(&csrf, BACK, tf_core::TenantRole::manages_tenant).await?
    else {
        return Ok(());
    };
    let ip = session::client_ip().await;
    match tf_core::billing_ops::set_billing_address(
        &portal.deps.pool,
        &m.actor(&ip),
        m.tenant.id,
        &address,
    )
    .await
    {
        Ok(()) => back(&jar, BACK, Some(Flash::BillingSaved)),
        Err(AccountError::Invalid(_)) => back(&jar, BACK, Some(Flash::BillingInvalid)),
        Err(e) => Err(internal("saving a billing address", e)),
    }
}

/// One of the session tenant's invoices; `None` for an unknown id, a malformed one or another
/// tenant's.
#[server(prefix = "/api", endpoint = "invoice", input = leptos::server_fn::codec::GetUrl)]
pub async fn fetch_invoice(id: String) -> Result<Option<InvoiceDetail>, PortalError> {
    use crate::invoices::server as invoices;
    use crate::ssr::{internal, Portal};
    use crate::usage::server as usage;

    let portal = Portal::current()?;
    let tenant = usage::session_tenant(&portal).await?;
    invoices::detail(
        &portal.deps.pool,
        tenant,
        &id,
        time::OffsetDateTime::now_utc(),
    )
    .await
    .map_err(|e| internal("loading an invoice", e))
}
