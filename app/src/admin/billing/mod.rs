//! `/admin/prices` and `/admin/invoices` (issue 16): the price book and its versions with the
//! form that appends a version, tiers and the tenants in them, and every tenant's invoices with
//! the forms that build a draft, issue it, adjust it and grant credit. Every change goes through
//! `tf_core::billing_ops`, the code path of `tokenfactory admin prices|invoices|credit`, which
//! writes the audit row in the action's transaction. Money is integer micro-units as typed.

pub mod invoices;
pub mod prices;
#[cfg(feature = "ssr")]
pub mod server;

use leptos::prelude::*;
use serde::{Deserialize, Serialize};

use crate::error::PortalError;

/// One price of a version: a model or base and a tier, three rates per million tokens.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PriceItem {
    pub price_key: String,
    pub tier: String,
    pub fresh_per_m: i64,
    pub cached_per_m: i64,
    pub output_per_m: i64,
}

/// A version of the price book with its prices.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct VersionItem {
    pub id: i64,
    /// `YYYY-MM-DD HH:MM:SS` UTC.
    pub effective_from: String,
    pub note: String,
    pub created_by: String,
    /// The version in effect now.
    pub current: bool,
    /// Not in effect yet.
    pub scheduled: bool,
    pub prices: Vec<PriceItem>,
}

/// A tenant and its tier.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TenantTierItem {
    pub name: String,
    pub display_name: String,
    pub tier: String,
}

/// Everything `/admin/prices` shows.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PricesView {
    /// Newest first.
    pub versions: Vec<VersionItem>,
    pub tiers: Vec<String>,
    pub tenants: Vec<TenantTierItem>,
    /// Models and bases of the catalog (the price form's suggestions).
    pub keys: Vec<String>,
}

/// One invoice of the admin list.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct AdminInvoiceItem {
    pub id: String,
    pub tenant: String,
    /// `YYYY-MM`.
    pub month: String,
    pub kind: String,
    pub status: String,
    pub usage_micros: i64,
    pub credit_micros: i64,
    pub adjustment_micros: i64,
    pub total_micros: i64,
    pub issued_at: Option<String>,
    /// The document number, once issued.
    pub number: Option<String>,
    /// A draft's figures are its last build's: `YYYY-MM-DD HH:MM:SS` (UTC) of that build.
    #[serde(default)]
    pub as_of: Option<String>,
}

/// Who issues invoices (the "From" of the invoices issued from now on).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct IssuerView {
    pub name: String,
    pub address: String,
    /// Payment terms: days from issue to due.
    pub due_days: i32,
}

/// A tenant's credit, for the grant form's side.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TenantCredit {
    pub tenant: String,
    pub balance_micros: i64,
}

/// Everything `/admin/invoices` shows.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct AdminInvoicesView {
    /// Every tenant's invoices, newest month first (at most a few hundred).
    pub invoices: Vec<AdminInvoiceItem>,
    /// Every tenant's handle with its remaining credit.
    pub tenants: Vec<TenantCredit>,
    /// `YYYY-MM`, the open month (the build form's default).
    pub open_month: String,
    pub issuer: IssuerView,
}

/// What `/admin/invoices/{id}` shows: whose invoice, and the invoice as its tenant sees it.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct AdminInvoiceDetail {
    /// The tenant's handle.
    pub tenant: String,
    pub detail: crate::invoices::InvoiceDetail,
    /// A stored draft's last build (`YYYY-MM-DD HH:MM:SS`, UTC): what its figures are as of.
    #[serde(default)]
    pub as_of: Option<String>,
}

/// Any tenant's stored invoice with its entries; `None` for an unknown or malformed id.
#[server(prefix = "/api", endpoint = "admin_invoice", input = leptos::server_fn::codec::GetUrl)]
pub async fn admin_invoice(
    #[server(default)] id: String,
) -> Result<Option<AdminInvoiceDetail>, PortalError> {
    use crate::admin::server as admin;
    use crate::invoices::server as invoices;
    use crate::ssr::{internal, Portal};

    let portal = Portal::current()?;
    admin::required(&portal).await?;
    let pool = &portal.deps.pool;
    let Ok(uuid) = uuid::Uuid::parse_str(id.trim()) else {
        return Ok(None);
    };
    let failed = |e| internal("loading an invoice", e);
    let Some((tenant_id, tenant)) = tf_core::db::billing::invoice_tenant(pool, uuid)
        .await
        .map_err(failed)?
    else {
        return Ok(None);
    };
    let detail = invoices::detail(pool, tenant_id, &id, time::OffsetDateTime::now_utc())
        .await
        .map_err(failed)?;
    let as_of = tf_core::db::invoicing::by_id(pool, uuid)
        .await
        .map_err(failed)?
        .filter(|i| i.status == "draft")
        .and_then(|i| i.built_at)
        .map(crate::admin::billing::server::as_of);
    Ok(detail.map(|detail| AdminInvoiceDetail {
        tenant,
        detail,
        as_of,
    }))
}

/// The price book, its versions, tiers and tenants' tiers.
#[server(prefix = "/api", endpoint = "admin_prices", input = leptos::server_fn::codec::GetUrl)]
pub async fn admin_prices() -> Result<PricesView, PortalError> {
    use crate::admin::billing::server as billing_admin;
    use crate::admin::server as admin;
    use crate::ssr::{internal, Portal};

    let portal = Portal::current()?;
    admin::required(&portal).await?;
    billing_admin::prices(&portal.deps.pool, time::OffsetDateTime::now_utc())
        .await
        .map_err(|e| internal("loading the price book", e))
}

/// Appends a price version (effective now, or from the given UTC time) changing one price.
#[server(prefix = "/api", endpoint = "admin_set_price")]
pub async fn admin_set_price(
    #[server(default)] csrf: String,
    #[server(default)] price_key: String,
    #[server(default)] tier: String,
    #[server(default)] fresh_per_m: String,
    #[server(default)] cached_per_m: String,
    #[server(default)] output_per_m: String,
    #[server(default)] effective_from: String,
) -> Result<(), PortalError> {
    use crate::admin::economics::server as economics;
    use crate::ssr::admin_flash::AdminFlash;
    use crate::ssr::internal;
    use tf_core::accounts::AccountError;
    use tf_core::billing_ops::{self, NewPrice};
    use tf_core::money::Rates;

    const BACK: &str = "/admin/prices";
    let Some(f) = super::form(&csrf, BACK).await? else {
        return Ok(());
    };
    let now = time::OffsetDateTime::now_utc();
    // Currency per million tokens (`2.50`, `$0.15`), exactly into micro-units.
    let number = |s: &str| tf_core::money::parse_money(s).ok().filter(|n| *n >= 0);
    // Empty: now (the server's clock at the insert, after the last event); else a stated time.
    let from = if effective_from.trim().is_empty() {
        Some(None)
    } else {
        economics::parse_from(&effective_from, now).map(Some)
    };
    let parsed = (
        number(&fresh_per_m),
        number(&cached_per_m),
        number(&output_per_m),
        from,
    );
    let (Some(fresh), Some(cached), Some(output), Some(from)) = parsed else {
        return f.back(BACK, Some(AdminFlash::PriceInvalid));
    };
    // Only a known model or base: a typo would price nothing, silently.
    let known = tf_core::db::invoicing::price_keys(&f.portal.deps.pool)
        .await
        .map_err(|e| internal("loading the price keys", e))?;
    if !known.iter().any(|k| k == price_key.trim()) {
        return f.back(BACK, Some(AdminFlash::PriceInvalid));
    }
    let price = NewPrice {
        price_key: price_key.trim().to_owned(),
        tier: tier.trim().to_owned(),
        rates: Rates {
            fresh_per_m: fresh,
            cached_per_m: cached,
            output_per_m: output,
        },
    };
    match billing_ops::set_prices(&f.portal.deps.pool, &f.actor(), from, &[price]).await {
        Ok(_) => f.back(BACK, Some(AdminFlash::PriceSaved)),
        Err(AccountError::Invalid(why)) if why == billing_ops::FORWARD_ONLY => {
            f.back(BACK, Some(AdminFlash::PriceBackdated))
        }
        Err(AccountError::Invalid(_)) => f.back(BACK, Some(AdminFlash::PriceInvalid)),
        Err(e) => Err(internal("setting a price", e)),
    }
}

/// Sets who issues invoices and the payment terms, audited as `invoice.issuer`.
#[server(prefix = "/api", endpoint = "admin_set_issuer")]
pub async fn admin_set_issuer(
    #[server(default)] csrf: String,
    #[server(default)] name: String,
    #[server(default)] address: String,
    #[server(default)] due_days: String,
) -> Result<(), PortalError> {
    use crate::ssr::admin_flash::AdminFlash;
    use crate::ssr::internal;
    use tf_core::accounts::AccountError;
    use tf_core::db::documents::Issuer;

    const BACK: &str = "/admin/invoices";
    let Some(f) = super::form(&csrf, BACK).await? else {
        return Ok(());
    };
    let Ok(due_days) = due_days.trim().parse::<i32>() else {
        return f.back(BACK, Some(AdminFlash::IssuerInvalid));
    };
    let issuer = Issuer {
        name,
        address,
        due_days,
    };
    match tf_core::billing_ops::set_issuer(&f.portal.deps.pool, &f.actor(), &issuer).await {
        Ok(()) => f.back(BACK, Some(AdminFlash::IssuerSaved)),
        Err(AccountError::Invalid(_)) => f.back(BACK, Some(AdminFlash::IssuerInvalid)),
        Err(e) => Err(internal("saving the invoice issuer", e)),
    }
}

/// Puts a tenant in a tier.
#[server(prefix = "/api", endpoint = "admin_set_tier")]
pub async fn admin_set_tier(
    #[server(default)] csrf: String,
    #[server(default)] tenant: String,
    #[server(default)] tier: String,
) -> Result<(), PortalError> {
    use crate::ssr::admin_flash::AdminFlash;
    use crate::ssr::internal;
    use tf_core::accounts::{self, AccountError};
    use tf_core::billing_ops;

    const BACK: &str = "/admin/prices";
    let Some(f) = super::form(&csrf, BACK).await? else {
        return Ok(());
    };
    let pool = &f.portal.deps.pool;
    let t = match accounts::find_tenant(pool, tenant.trim()).await {
        Ok(t) => t,
        Err(AccountError::NotFound(_)) => return f.back(BACK, Some(AdminFlash::NoSuchTenant)),
        Err(e) => return Err(internal("finding a tenant", e)),
    };
    match billing_ops::set_tenant_tier(pool, &f.actor(), t.id, &t.name, tier.trim()).await {
        Ok(()) => f.back(BACK, Some(AdminFlash::TierSaved)),
        Err(AccountError::NotFound(_) | AccountError::Invalid(_)) => {
            f.back(BACK, Some(AdminFlash::TierInvalid))
        }
        Err(e) => Err(internal("setting a tenant's tier", e)),
    }
}

/// Adds a tier.
#[server(prefix = "/api", endpoint = "admin_add_tier")]
pub async fn admin_add_tier(
    #[server(default)] csrf: String,
    #[server(default)] name: String,
) -> Result<(), PortalError> {
    use crate::ssr::admin_flash::AdminFlash;
    use crate::ssr::internal;
    use tf_core::accounts::AccountError;

    const BACK: &str = "/admin/prices";
    let Some(f) = super::form(&csrf, BACK).await? else {
        return Ok(());
    };
    match tf_core::billing_ops::add_tier(&f.portal.deps.pool, &f.actor(), name.trim()).await {
        Ok(()) => f.back(BACK, Some(AdminFlash::TierSaved)),
        Err(AccountError::Invalid(_)) => f.back(BACK, Some(AdminFlash::TierInvalid)),
        Err(e) => Err(internal("adding a tier", e)),
    }
}

/// Every tenant's invoices and credit.
#[server(prefix = "/api", endpoint = "admin_invoices", input = leptos::server_fn::codec::GetUrl)]
pub async fn admin_invoices() -> Result<AdminInvoicesView, PortalError> {
    use crate::admin::billing::server as billing_admin;
    use crate::admin::server as admin;
    use crate::ssr::{internal, Portal};

    let portal = Portal::current()?;
    admin::required(&portal).await?;
    billing_admin::invoices(&portal.deps.pool, time::OffsetDateTime::now_utc())
        .await
        .map_err(|e| internal("loading the invoices", e))
}

/// (Re)builds a tenant's draft for a month (`YYYY-MM`). `runs`: empty keeps the re-rates the
/// draft was built from, `live` drops them, else re-rate run ids (comma or space separated),
/// each over its part of the month, the live run over the rest.
#[server(prefix = "/api", endpoint = "admin_build_invoice")]
pub async fn admin_build_invoice(
    #[server(default)] csrf: String,
    #[server(default)] tenant: String,
    #[server(default)] month: String,
    #[server(default)] runs: String,
) -> Result<(), PortalError> {
    use crate::admin::billing::server as billing_admin;
    use crate::ssr::admin_flash::AdminFlash;
    use crate::ssr::internal;
    use tf_core::accounts::{self, AccountError};
    use tf_core::db::billing::{Draft, Runs};

    const BACK: &str = "/admin/invoices";
    let Some(f) = super::form(&csrf, BACK).await? else {
        return Ok(());
    };
    let pool = &f.portal.deps.pool;
    let Some(month) = billing_admin::parse_month(&month) else {
        return f.back(BACK, Some(AdminFlash::InvoiceInvalid));
    };
    let t = match accounts::find_tenant(pool, tenant.trim()).await {
        Ok(t) => t,
        Err(AccountError::NotFound(_)) => return f.back(BACK, Some(AdminFlash::NoSuchTenant)),
        Err(e) => return Err(internal("finding a tenant", e)),
    };
    let typed = runs.trim();
    let chosen: Option<Vec<i64>> = if typed == "live" {
        Some(Vec::new())
    } else {
        typed
            .split([',', ' '])
            .filter(|r| !r.is_empty())
            .map(|r| r.parse::<i64>().ok())
            .collect()
    };
    let Some(chosen) = chosen else {
        return f.back(BACK, Some(AdminFlash::RunRefused));
    };
    let runs = if typed.is_empty() {
        Runs::Kept
    } else {
        Runs::Chosen(&chosen)
    };
    match tf_core::billing_ops::build_draft(pool, &f.actor(), t.id, month, runs).await {
        Ok(Draft::Built(_)) => f.back(BACK, Some(AdminFlash::DraftBuilt)),
        Ok(Draft::AlreadyIssued(_)) => f.back(BACK, Some(AdminFlash::MonthIssued)),
        Ok(Draft::RunRefused(_)) | Err(AccountError::Invalid(_)) => {
            f.back(BACK, Some(AdminFlash::RunRefused))
        }
        Err(e) => Err(internal("building a draft", e)),
    }
}

/// Closes a tenant's month (`YYYY-MM`) early at a UTC instant: usage started from then on is on
/// the next month's invoice.
#[server(prefix = "/api", endpoint = "admin_close_period")]
pub async fn admin_close_period(
    #[server(default)] csrf: String,
    #[server(default)] tenant: String,
    #[server(default)] month: String,
    #[server(default)] at: String,
) -> Result<(), PortalError> {
    use crate::admin::billing::server as billing_admin;
    use crate::admin::economics::server as economics;
    use crate::ssr::admin_flash::AdminFlash;
    use crate::ssr::internal;
    use tf_core::accounts::{self, AccountError};

    const BACK: &str = "/admin/invoices";
    let Some(f) = super::form(&csrf, BACK).await? else {
        return Ok(());
    };
    let pool = &f.portal.deps.pool;
    let now = time::OffsetDateTime::now_utc();
    let (Some(month), Some(at)) = (
        billing_admin::parse_month(&month),
        economics::parse_from(&at, now),
    ) else {
        return f.back(BACK, Some(AdminFlash::CloseInvalid));
    };
    let t = match accounts::find_tenant(pool, tenant.trim()).await {
        Ok(t) => t,
        Err(AccountError::NotFound(_)) => return f.back(BACK, Some(AdminFlash::NoSuchTenant)),
        Err(e) => return Err(internal("finding a tenant", e)),
    };
    match tf_core::billing_ops::close_period(pool, &f.actor(), t.id, &t.name, month, at).await {
        Ok(()) => f.back(BACK, Some(AdminFlash::PeriodClosed)),
        Err(AccountError::Invalid(_)) => f.back(BACK, Some(AdminFlash::CloseInvalid)),
        Err(e) => Err(internal("closing a period", e)),
    }
}

/// Issues a draft: immutable from then on (the database refuses any change).
#[server(prefix = "/api", endpoint = "admin_issue_invoice")]
pub async fn admin_issue_invoice(
    #[server(default)] csrf: String,
    #[server(default)] id: String,
) -> Result<(), PortalError> {
    use crate::ssr::admin_flash::AdminFlash;
    use crate::ssr::internal;
    use tf_core::accounts::AccountError;

    const BACK: &str = "/admin/invoices";
    let Some(f) = super::form(&csrf, BACK).await? else {
        return Ok(());
    };
    let Ok(id) = uuid::Uuid::parse_str(id.trim()) else {
        return f.back(BACK, Some(AdminFlash::NoSuchInvoice));
    };
    match tf_core::billing_ops::issue(&f.portal.deps.pool, &f.actor(), id).await {
        Ok(_) => f.back(BACK, Some(AdminFlash::InvoiceIssued)),
        Err(AccountError::NotFound(_)) => f.back(BACK, Some(AdminFlash::NoSuchInvoice)),
        Err(AccountError::Invalid(why)) if why.contains("not a draft") => {
            f.back(BACK, Some(AdminFlash::InvoiceNotDraft))
        }
        Err(AccountError::Invalid(_)) => f.back(BACK, Some(AdminFlash::PeriodOpen)),
        Err(e) => Err(internal("issuing an invoice", e)),
    }
}

/// Adds an adjustment (micro-units; negative refunds) to a draft.
#[server(prefix = "/api", endpoint = "admin_adjust_invoice")]
pub async fn admin_adjust_invoice(
    #[server(default)] csrf: String,
    #[server(default)] id: String,
    #[server(default)] description: String,
    #[server(default)] amount: String,
) -> Result<(), PortalError> {
    use crate::ssr::admin_flash::AdminFlash;
    use crate::ssr::internal;
    use tf_core::accounts::AccountError;

    const BACK: &str = "/admin/invoices";
    let Some(f) = super::form(&csrf, BACK).await? else {
        return Ok(());
    };
    let parsed = (
        uuid::Uuid::parse_str(id.trim()).ok(),
        tf_core::money::parse_money(&amount)
            .ok()
            .filter(|a| *a != 0),
    );
    let (Some(id), Some(amount)) = parsed else {
        return f.back(BACK, Some(AdminFlash::InvoiceInvalid));
    };
    let pool = &f.portal.deps.pool;
    match tf_core::billing_ops::adjust(pool, &f.actor(), id, &description, amount).await {
        Ok(()) => f.back(BACK, Some(AdminFlash::AdjustmentSaved)),
        Err(AccountError::NotFound(_)) => f.back(BACK, Some(AdminFlash::NoSuchInvoice)),
        Err(AccountError::Invalid(_)) => f.back(BACK, Some(AdminFlash::InvoiceInvalid)),
        Err(e) => Err(internal("adjusting an invoice", e)),
    }
}

/// Grants a tenant prepaid credit (micro-units), with a priority and an optional expiry.
#[server(prefix = "/api", endpoint = "admin_grant_credit")]
pub async fn admin_grant_credit(
    #[server(default)] csrf: String,
    #[server(default)] tenant: String,
    #[server(default)] amount: String,
    #[server(default)] priority: String,
    #[server(default)] expires: String,
    #[server(default)] note: String,
) -> Result<(), PortalError> {
    use crate::admin::economics::server as economics;
    use crate::ssr::admin_flash::AdminFlash;
    use crate::ssr::internal;
    use tf_core::accounts::{self, AccountError};
    use tf_core::billing_ops::{self, NewGrant};

    const BACK: &str = "/admin/invoices";
    let Some(f) = super::form(&csrf, BACK).await? else {
        return Ok(());
    };
    let now = time::OffsetDateTime::now_utc();
    let priority = if priority.trim().is_empty() {
        Some(0)
    } else {
        priority.trim().parse::<i32>().ok()
    };
    let expires = if expires.trim().is_empty() {
        Some(None)
    } else {
        economics::parse_from(&expires, now).map(Some)
    };
    let parsed = (
        tf_core::money::parse_money(&amount).ok().filter(|a| *a > 0),
        priority,
        expires,
    );
    let (Some(amount), Some(priority), Some(expires_at)) = parsed else {
        return f.back(BACK, Some(AdminFlash::CreditInvalid));
    };
    let pool = &f.portal.deps.pool;
    let t = match accounts::find_tenant(pool, tenant.trim()).await {
        Ok(t) => t,
        Err(AccountError::NotFound(_)) => return f.back(BACK, Some(AdminFlash::NoSuchTenant)),
        Err(e) => return Err(internal("finding a tenant", e)),
    };
    let grant = NewGrant {
        tenant: t.id,
        tenant_name: &t.name,
        amount_micros: amount,
        priority,
        expires_at,
        note: note.trim(),
    };
    match billing_ops::grant_credit(pool, &f.actor(), &grant).await {
        Ok(_) => f.back(BACK, Some(AdminFlash::CreditGranted)),
        Err(AccountError::Invalid(_)) => f.back(BACK, Some(AdminFlash::CreditInvalid)),
        Err(e) => Err(internal("granting credit", e)),
    }
}
