//! What operators do to billing: set prices, put tenants in tiers, build, issue, adjust and
//! correct invoices, grant credit and re-rate. The one code path behind `tokenfactory admin`
//! (actor `cli`) and the admin pages (`/admin/prices`, `/admin/invoices`; actor the signed-in
//! admin), as [`crate::operator`] is for tenants and keys: each action and its `audit_log` row
//! commit in one transaction. The money and the SQL are `db::billing`'s; nothing here computes an
//! amount.

use serde_json::{json, Value};
use sqlx::{PgConnection, PgPool};
use time::format_description::well_known::Rfc3339;
use time::{Date, OffsetDateTime};
use uuid::Uuid;

use crate::accounts::AccountError;
use crate::db::{billing as db, invoicing};
use crate::money::Rates;
use crate::operator::{record, Actor};

fn rfc3339(t: OffsetDateTime) -> String {
    t.format(&Rfc3339).unwrap_or_default()
}

fn foreign_key_violation(e: &sqlx::Error) -> bool {
    e.as_database_error()
        .and_then(|d| d.code())
        .is_some_and(|c| c == "23503")
}

/// One price to set: a model or base (the events' price key), a tier and three rates per
/// million tokens in micro-units.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewPrice {
    pub price_key: String,
    pub tier: String,
    pub rates: Rates,
}

/// Sets prices from `effective_from` on: a new version of the book holding the latest
/// version's prices with these changed (a price is never edited), audited as `prices.set`.
/// Refused ([`AccountError::Invalid`]) for a negative rate, an empty key, an unknown tier, or a
/// time not after the latest version's (versions only go forward).
pub async fn set_prices(
    pool: &PgPool,
    actor: &Actor<'_>,
    effective_from: OffsetDateTime,
    prices: &[NewPrice],
) -> Result<i64, AccountError> {
    if prices.is_empty() {
        return Err(AccountError::Invalid("no price given".into()));
    }
    for p in prices {
        let r = p.rates;
        if r.fresh_per_m < 0 || r.cached_per_m < 0 || r.output_per_m < 0 {
            return Err(AccountError::Invalid(
                "prices are micro-units per million tokens, never negative".into(),
            ));
        }
        if p.price_key.trim().is_empty() || p.tier.trim().is_empty() {
            return Err(AccountError::Invalid(
                "a price names a model or base and a tier".into(),
            ));
        }
    }
    let mut tx = pool.begin().await?;
    let rows: Vec<(&str, &str, Rates)> = prices
        .iter()
        .map(|p| (p.price_key.as_str(), p.tier.as_str(), p.rates))
        .collect();
    let version = match db::set_prices(&mut *tx, effective_from, &rows, actor.name).await {
        Ok(Some(v)) => v,
        Ok(None) => {
            return Err(AccountError::Invalid(
                "prices only change going forward: the time must be after the latest version's"
                    .into(),
            ))
        }
        Err(e) if foreign_key_violation(&e) => {
            return Err(AccountError::Invalid("no such tier".into()))
        }
        Err(e) => return Err(e.into()),
    };
    let detail: Vec<Value> = prices
        .iter()
        .map(|p| {
            json!({
                "price_key": p.price_key,
                "tier": p.tier,
                "fresh_input_per_m": p.rates.fresh_per_m,
                "cached_input_per_m": p.rates.cached_per_m,
                "output_per_m": p.rates.output_per_m,
            })
        })
        .collect();
    record(
        &mut tx,
        actor,
        None,
        "prices.set",
        &format!("version {version}"),
        json!({ "version": version, "effective_from": rfc3339(effective_from), "prices": detail }),
    )
    .await?;
    tx.commit().await?;
    Ok(version)
}

/// Adds a tier (nothing if it exists), audited as `tier.add`.
pub async fn add_tier(pool: &PgPool, actor: &Actor<'_>, name: &str) -> Result<(), AccountError> {
    let mut tx = pool.begin().await?;
    match db::add_tier(&mut *tx, name).await {
        Ok(()) => {}
        Err(e)
            if e.as_database_error()
                .and_then(|d| d.code())
                .is_some_and(|c| c == "23514") =>
        {
            return Err(AccountError::Invalid(
                "a tier is 1 to 63 of a-z, 0-9, '-' and '_'".into(),
            ))
        }
        Err(e) => return Err(e.into()),
    }
    record(&mut tx, actor, None, "tier.add", name, json!({})).await?;
    tx.commit().await?;
    Ok(())
}

/// Puts a tenant in a tier (its events from now on are rated at that tier's prices, falling
/// back to `standard` where the tier has none), audited as `tenant.tier`.
pub async fn set_tenant_tier(
    pool: &PgPool,
    actor: &Actor<'_>,
    tenant: Uuid,
    tenant_name: &str,
    tier: &str,
) -> Result<(), AccountError> {
    let mut tx = pool.begin().await?;
    match db::set_tenant_tier(&mut *tx, tenant, tier).await {
        Ok(true) => {}
        Ok(false) => return Err(AccountError::NotFound(format!("tenant {tenant_name}"))),
        Err(e) if foreign_key_violation(&e) => {
            return Err(AccountError::NotFound(format!("tier {tier}")))
        }
        Err(e) => return Err(e.into()),
    }
    record(
        &mut tx,
        actor,
        Some(tenant),
        "tenant.tier",
        tenant_name,
        json!({ "tier": tier }),
    )
    .await?;
    tx.commit().await?;
    Ok(())
}

/// (Re)builds a tenant's draft for the UTC month starting `month` from `run`, audited as
/// `invoice.build`. The scheduler (`server::billing::rater`) builds drafts too, without an audit
/// row: it only refreshes derived figures.
pub async fn build_draft(
    pool: &PgPool,
    actor: &Actor<'_>,
    tenant: Uuid,
    month: Date,
    run: i64,
) -> Result<db::Draft, AccountError> {
    let mut tx = pool.begin().await?;
    let draft = db::build_draft(&mut *tx, tenant, month, run).await?;
    if let db::Draft::Built(id) = draft {
        record(
            &mut tx,
            actor,
            Some(tenant),
            "invoice.build",
            &id.to_string(),
            json!({ "month": month.to_string(), "run": run }),
        )
        .await?;
    }
    tx.commit().await?;
    Ok(draft)
}

/// The invoice an action is about; `NotFound` when there is none.
async fn about(tx: &mut PgConnection, id: Uuid) -> Result<db::Invoice, AccountError> {
    invoicing::by_id(&mut *tx, id)
        .await?
        .ok_or_else(|| AccountError::NotFound(format!("invoice {id}")))
}

/// Issues a draft, audited as `invoice.issue`: from then on the database refuses any change to
/// it or its entries. `Invalid` when it is not a draft.
pub async fn issue(
    pool: &PgPool,
    actor: &Actor<'_>,
    invoice: Uuid,
) -> Result<db::Invoice, AccountError> {
    let mut tx = pool.begin().await?;
    about(&mut tx, invoice).await?;
    if !db::issue(&mut *tx, invoice, actor.name).await? {
        return Err(AccountError::Invalid(format!("{invoice} is not a draft")));
    }
    // Read after issuing: a rebuild that held the tenant's lock may have changed the total.
    let inv = about(&mut tx, invoice).await?;
    record(
        &mut tx,
        actor,
        Some(inv.tenant_id),
        "invoice.issue",
        &invoice.to_string(),
        json!({ "month": inv.period_start.to_string(), "total_micros": inv.total_micros }),
    )
    .await?;
    tx.commit().await?;
    Ok(inv)
}

/// Adds an adjustment entry (positive charges, negative refunds) to a draft, audited as
/// `invoice.adjust`. `Invalid` when it is not a draft or the description is empty.
pub async fn adjust(
    pool: &PgPool,
    actor: &Actor<'_>,
    invoice: Uuid,
    description: &str,
    amount_micros: i64,
) -> Result<(), AccountError> {
    if description.trim().is_empty() {
        return Err(AccountError::Invalid(
            "an adjustment says what it is for".into(),
        ));
    }
    let mut tx = pool.begin().await?;
    let inv = about(&mut tx, invoice).await?;
    if !db::adjust(&mut *tx, invoice, description.trim(), amount_micros).await? {
        return Err(AccountError::Invalid(format!("{invoice} is not a draft")));
    }
    record(
        &mut tx,
        actor,
        Some(inv.tenant_id),
        "invoice.adjust",
        &invoice.to_string(),
        json!({ "description": description.trim(), "amount_micros": amount_micros }),
    )
    .await?;
    tx.commit().await?;
    Ok(())
}

/// Corrects an issued invoice with an issued credit note (see `db::billing::correct`), audited
/// as `invoice.correct`; returns the credit note.
pub async fn correct(
    pool: &PgPool,
    actor: &Actor<'_>,
    invoice: Uuid,
) -> Result<Uuid, AccountError> {
    let mut tx = pool.begin().await?;
    let inv = about(&mut tx, invoice).await?;
    let Some(note) = db::correct(&mut *tx, invoice, actor.name).await? else {
        return Err(AccountError::Invalid(format!(
            "{invoice} is not an issued, uncorrected invoice"
        )));
    };
    record(
        &mut tx,
        actor,
        Some(inv.tenant_id),
        "invoice.correct",
        &invoice.to_string(),
        json!({ "credit_note": note.to_string() }),
    )
    .await?;
    tx.commit().await?;
    Ok(note)
}

/// A prepaid credit grant to make.
#[derive(Debug, Clone)]
pub struct NewGrant<'a> {
    pub tenant: Uuid,
    pub tenant_name: &'a str,
    pub amount_micros: i64,
    /// Lower burns first.
    pub priority: i32,
    pub expires_at: Option<OffsetDateTime>,
    pub note: &'a str,
}

/// Grants prepaid credit, audited as `credit.grant`; returns the grant. `Invalid` for an amount
/// that is not positive.
pub async fn grant_credit(
    pool: &PgPool,
    actor: &Actor<'_>,
    g: &NewGrant<'_>,
) -> Result<Uuid, AccountError> {
    if g.amount_micros <= 0 {
        return Err(AccountError::Invalid("a grant is a positive amount".into()));
    }
    let mut tx = pool.begin().await?;
    let id = db::grant_credit(
        &mut *tx,
        g.tenant,
        g.amount_micros,
        g.priority,
        g.expires_at,
        g.note,
        actor.name,
    )
    .await?;
    record(
        &mut tx,
        actor,
        Some(g.tenant),
        "credit.grant",
        g.tenant_name,
        json!({
            "grant": id.to_string(),
            "amount_micros": g.amount_micros,
            "priority": g.priority,
            "expires_at": g.expires_at.map(rfc3339),
            "note": g.note,
        }),
    )
    .await?;
    tx.commit().await?;
    Ok(id)
}

/// Re-rates a tenant's events started in `[start, end)` under `version` (a new run; earlier runs
/// kept), audited as `billing.rerate` once the run is complete. Returns the run.
pub async fn rerate(
    pool: &PgPool,
    actor: &Actor<'_>,
    tenant: Uuid,
    tenant_name: &str,
    start: OffsetDateTime,
    end: OffsetDateTime,
    version: i64,
) -> Result<i64, AccountError> {
    if end <= start {
        return Err(AccountError::Invalid(
            "the period ends after it starts".into(),
        ));
    }
    // Rating a period runs many batches, each its own transaction (as the live rater's); the
    // audit row follows the finished run.
    let run = db::rerate(pool, tenant, start, end, version, actor.name).await?;
    let mut conn = pool.acquire().await?;
    record(
        &mut conn,
        actor,
        Some(tenant),
        "billing.rerate",
        tenant_name,
        json!({
            "run": run,
            "version": version,
            "since": rfc3339(start),
            "until": rfc3339(end),
        }),
    )
    .await?;
    Ok(run)
}
