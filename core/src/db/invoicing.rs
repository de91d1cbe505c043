//! Reads around invoices that the pages and the draft scheduler need beside `db::billing`: the
//! invoice lists with their usage, credit and adjustment subtotals (tenant and admin), an invoice
//! by id for an admin, the open month's draft as it would be built now (built in a transaction
//! that is rolled back, so the figures come from `billing::build_draft` itself and nothing is
//! written), an invoice's usage split by the endpoint that served it, the tiers, and which
//! tenants have a month to invoice.
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

/// An invoice's usage from one endpoint (`chat`, `completions`, `responses`, `embeddings`,
/// `messages`): what the invoice page shows beside its per-model entries, so a tenant sees what
/// each API it calls cost. The amounts of an invoice's endpoints add up to its usage subtotal.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EndpointUsage {
    pub endpoint: String,
    pub events: i64,
    pub fresh_tokens: i64,
    pub cached_tokens: i64,
    pub output_tokens: i64,
    /// Of `output_tokens`, the reasoning tokens the engine reported (billed as output).
    pub reasoning_tokens: i64,
    /// Negative on a credit note, as its entries are.
    pub amount_micros: i64,
}

/// One of `tenant`'s invoices (or credit notes) by endpoint: the charge lines of each of its
/// segments' runs over the segment (the lines its usage entries sum, found as
/// [`billing::invoice_lines`] finds them), grouped by the endpoint their event names. Empty for
/// another tenant's invoice. Computed when read rather than kept by the rater: one query over the
/// invoice's events through the `(tenant_id, started_at)` index of `usage_events` and the
/// primary key of `charge_lines`, so the rater does no work per line for it.
///
/// INVARIANT: the amounts sum to the invoice's usage entries, because both are sums of the same
/// charge lines (`rated_daily` is kept from them in the rater's statement) (test:
/// invoice_endpoints::the_invoice_splits_usage_by_endpoint_and_the_split_adds_up).
pub async fn usage_by_endpoint(
    db: impl PgExecutor<'_>,
    tenant: Uuid,
    id: Uuid,
) -> sqlx::Result<Vec<EndpointUsage>> {
    sqlx::query_as!(
        EndpointUsage,
        r#"SELECT e.endpoint, count(*) AS "events!", sum(c.fresh_tokens)::bigint AS "fresh_tokens!",
                  sum(c.cached_tokens)::bigint AS "cached_tokens!",
                  sum(c.output_tokens)::bigint AS "output_tokens!",
                  sum(e.reasoning_tokens)::bigint AS "reasoning_tokens!",
                  (CASE WHEN i.kind = 'credit_note' THEN -1 ELSE 1 END
                   * sum(c.amount_micros))::bigint AS "amount_micros!"
           FROM invoices i
                JOIN invoice_sources s ON s.invoice_id = i.id
                JOIN usage_events e
                  ON e.tenant_id = i.tenant_id
                 AND e.started_at >= s.covers_from AND e.started_at < s.covers_until
                JOIN charge_lines c ON c.run_id = s.run_id AND c.request_id = e.request_id
           WHERE i.tenant_id = $1 AND i.id = $2
           GROUP BY e.endpoint, i.kind
           ORDER BY e.endpoint"#,
        tenant,
        id
    )
    .fetch_all(db)
    .await
}

/// What [`preview_draft`] computed: the draft, its entries and its usage by endpoint.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Preview {
    pub invoice: Invoice,
    pub entries: Vec<Entry>,
    pub endpoints: Vec<EndpointUsage>,
}

/// The draft of `tenant`'s UTC month starting `month` as [`billing::build_draft`] would build it
/// now (from the runs the stored draft keeps, else the live run), with its entries and its usage
/// by endpoint; `None` when the month has an issued, uncorrected invoice.
/// Built inside a transaction that is rolled back: nothing is written, and the figures are the
/// ones an admin's build or the scheduler would store (one code path, no second copy of the
/// credit arithmetic). The id is the stored draft's when there is one, else a fresh one that
/// names nothing.
pub async fn preview_draft(
    db: impl Acquire<'_, Database = Postgres>,
    tenant: Uuid,
    month: Date,
) -> sqlx::Result<Option<Preview>> {
    let mut tx = db.begin().await?;
    let Draft::Built(id) = billing::build_draft(&mut *tx, tenant, month, Runs::Kept).await? else {
        tx.rollback().await?;
        return Ok(None);
    };
    let invoice = billing::invoice(&mut *tx, tenant, id).await?;
    let entries = billing::invoice_entries(&mut *tx, tenant, id).await?;
    let endpoints = usage_by_endpoint(&mut *tx, tenant, id).await?;
    // INVARIANT: a preview writes nothing (test: invoices_portal::
    // the_open_month_is_computed_live_and_nothing_is_stored).
    tx.rollback().await?;
    Ok(invoice.map(|invoice| Preview {
        invoice,
        entries,
        endpoints,
    }))
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
