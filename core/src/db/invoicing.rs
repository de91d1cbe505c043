//! Reads around invoices that the pages and the draft scheduler need beside `db::billing`: the
//! invoice lists with their usage, credit and adjustment subtotals (tenant and admin), an invoice
//! by id for an admin, the open month's draft as it would be built now (built in a transaction
//! that is rolled back, so the figures come from `billing::build_draft` itself and nothing is
//! written), the tiers, and which tenants have a month to invoice.
//!
//! Every tenant-facing read takes the tenant id and filters by it.

use sqlx::{Acquire, PgExecutor, Postgres};
use time::{Date, OffsetDateTime};
use uuid::Uuid;

use super::billing::{self, Draft, Entry, Invoice, Runs};

/// An invoice or credit note with what its entries add up to by kind (the `total_micros` is
/// their sum).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Summary {
    pub id: Uuid,
    pub tenant_id: Uuid,
    pub tenant_name: String,
    pub period_start: Date,
    /// 'invoice' or 'credit_note'.
    pub kind: String,
    pub corrects: Option<Uuid>,
    /// 'draft' or 'issued'.
    pub status: String,
    pub total_micros: i64,
    pub issued_at: Option<OffsetDateTime>,
    /// The document number (`INV-2026-000001`), given when issued.
    pub number: Option<String>,
    pub usage_micros: i64,
    /// Credits applied (zero or negative).
    pub credit_micros: i64,
    pub adjustment_micros: i64,
    /// When a draft's figures were last computed (the draft scheduler rebuilds every few minutes,
    /// so an open month's stored figures trail its events by up to that much).
    pub built_at: Option<OffsetDateTime>,
}

/// Invoices and credit notes, newest period first: one tenant's (`Some`) or every tenant's
/// (`None`, admins), at most `limit`.
pub async fn summaries(
    db: impl PgExecutor<'_>,
    tenant: Option<Uuid>,
    limit: i64,
) -> sqlx::Result<Vec<Summary>> {
    sqlx::query_as!(
        Summary,
        r#"SELECT i.id, i.tenant_id, t.name AS tenant_name, i.period_start, i.kind, i.corrects,
                  i.status, i.total_micros, i.issued_at, i.number, i.built_at,
                  COALESCE(sum(x.amount_micros) FILTER (WHERE x.kind = 'usage'), 0)::bigint
                      AS "usage_micros!",
                  COALESCE(sum(x.amount_micros) FILTER (WHERE x.kind = 'credit'), 0)::bigint
                      AS "credit_micros!",
                  COALESCE(sum(x.amount_micros) FILTER (WHERE x.kind = 'adjustment'), 0)::bigint
                      AS "adjustment_micros!"
           FROM invoices i
                JOIN tenants t ON t.id = i.tenant_id
                LEFT JOIN invoice_entries x ON x.invoice_id = i.id
           WHERE ($1::uuid IS NULL OR i.tenant_id = $1)
           GROUP BY i.id, t.name
           ORDER BY i.period_start DESC, i.created_at DESC
           LIMIT $2"#,
        tenant,
        limit,
    )
    .fetch_all(db)
    .await
}

/// Any tenant's invoice by id (admins; the tenant pages use `billing::invoice`).
pub async fn by_id(db: impl PgExecutor<'_>, id: Uuid) -> sqlx::Result<Option<Invoice>> {
    sqlx::query_as!(
        Invoice,
        r#"SELECT id, tenant_id, period_start, kind, corrects, status, run_id, total_micros,
                  issued_at, created_at,
                  COALESCE(covers_from, period_start::timestamp AT TIME ZONE 'UTC') AS "covers_from!",
                  COALESCE(covers_until, (period_start + interval '1 month') AT TIME ZONE 'UTC')
                      AS "covers_until!",
                  built_at
         FROM invoices WHERE id = $1"#,
        id
    )
    .fetch_optional(db)
    .await
}

/// The draft of `tenant`'s UTC month starting `month` as [`billing::build_draft`] would build it
/// now (from the runs the stored draft keeps, else the live run), with its entries; `None` when the month has an issued, uncorrected invoice.
/// Built inside a transaction that is rolled back: nothing is written, and the figures are the
/// ones an admin's build or the scheduler would store (one code path, no second copy of the
/// credit arithmetic). The id is the stored draft's when there is one, else a fresh one that
/// names nothing.
pub async fn preview_draft(
    db: impl Acquire<'_, Database = Postgres>,
    tenant: Uuid,
    month: Date,
) -> sqlx::Result<Option<(Invoice, Vec<Entry>)>> {
    let mut tx = db.begin().await?;
    let Draft::Built(id) = billing::build_draft(&mut *tx, tenant, month, Runs::Kept).await? else {
        tx.rollback().await?;
        return Ok(None);
    };
    let invoice = billing::invoice(&mut *tx, tenant, id).await?;
    let entries = billing::invoice_entries(&mut *tx, tenant, id).await?;
    // INVARIANT: a preview writes nothing (test: invoices_portal::
    // the_open_month_is_computed_live_and_nothing_is_stored).
    tx.rollback().await?;
    Ok(invoice.map(|i| (i, entries)))
}

/// The tenants whose UTC month starting `month` has something to invoice under `run`: rated
/// usage in it, usage after the previous month's early close, or a draft already (whose
/// adjustments a rebuild keeps).
pub async fn tenants_to_invoice(
    db: impl PgExecutor<'_>,
    run: i64,
    month: Date,
) -> sqlx::Result<Vec<Uuid>> {
    sqlx::query_scalar!(
        r#"SELECT DISTINCT tenant_id AS "tenant_id!" FROM rated_daily
           WHERE run_id = $1 AND day >= $2 AND day < ($2::date + interval '1 month')::date
           UNION
           SELECT d.tenant_id FROM period_closes p
                JOIN rated_daily d
                  ON d.tenant_id = p.tenant_id AND d.run_id = $1
                 AND d.day >= (p.closes_at AT TIME ZONE 'UTC')::date AND d.day < $2
           WHERE p.period_start = ($2::date - interval '1 month')::date
           UNION
           SELECT tenant_id FROM invoices
           WHERE period_start = $2 AND kind = 'invoice' AND status = 'draft'"#,
        run,
        month,
    )
    .fetch_all(db)
    .await
}

/// Every tier, by name.
pub async fn tiers(db: impl PgExecutor<'_>) -> sqlx::Result<Vec<String>> {
    sqlx::query_scalar!("SELECT name FROM billing_tiers ORDER BY name")
        .fetch_all(db)
        .await
}

/// A tenant and its tier.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TenantTier {
    pub id: Uuid,
    pub name: String,
    pub display_name: String,
    pub tier: String,
}

/// Every tenant with its tier, by handle.
pub async fn tenant_tiers(db: impl PgExecutor<'_>) -> sqlx::Result<Vec<TenantTier>> {
    sqlx::query_as!(
        TenantTier,
        "SELECT id, name, display_name, tier FROM tenants ORDER BY name"
    )
    .fetch_all(db)
    .await
}

/// The price keys the catalog's bases use, every adapter's own key (`adapter:<tenant>/<name>`)
/// and those already priced, for the price form.
pub async fn price_keys(db: impl PgExecutor<'_>) -> sqlx::Result<Vec<String>> {
    sqlx::query_scalar!(
        r#"SELECT price_key AS "price_key!" FROM base_models
           UNION SELECT 'adapter:' || t.name || '/' || a.name
                 FROM adapters a JOIN tenants t ON t.id = a.tenant_id
           UNION SELECT price_key FROM prices
           ORDER BY 1"#
    )
    .fetch_all(db)
    .await
}
