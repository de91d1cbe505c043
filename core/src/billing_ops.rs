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
use crate::db::{billing as db, documents, invoicing, periods};
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

/// What a refused backdated price says: the past is corrected by re-rating, not by the book.
pub const FORWARD_ONLY: &str = "a price version starts now or later (and after the last \
    recorded event): to correct charges already rated, re-rate the tenant and period under a \
    version (`tokenfactory admin rerate`, /admin/invoices) and build the invoice from that run";

/// Sets prices from `effective_from` on (`None`: now): a new version of the book holding the
/// latest version's prices with these changed (a price is never edited), audited as
/// `prices.set`. Refused ([`AccountError::Invalid`]) for a negative rate, an empty key, an
/// unknown tier, a time before now or at or before the start of the last recorded event (a
/// backdated version would disagree with lines already rated and invoiced: [`FORWARD_ONLY`]),
/// or not after the latest version's (versions only go forward).
pub async fn set_prices(
    pool: &PgPool,
    actor: &Actor<'_>,
    effective_from: Option<OffsetDateTime>,
    prices: &[NewPrice],
) -> Result<(i64, OffsetDateTime), AccountError> {
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
    for p in prices {
        let key = p.price_key.as_str();
        if key.starts_with(db::ADAPTER_KEY_PREFIX) && !db::adapter_key_exists(&mut *tx, key).await?
        {
            return Err(AccountError::Invalid(format!(
                "no adapter {key:?}: an adapter's price key is adapter:<tenant>/<adapter name>"
            )));
        }
    }
    // One writer of the book at a time, so the last event read below stays the last one checked.
    sqlx::query!("SELECT name FROM price_books WHERE name = 'default' FOR UPDATE")
        .fetch_one(&mut *tx)
        .await?;
    let clock = sqlx::query!(
        r#"SELECT clock_timestamp() AS "now!", (SELECT max(started_at) FROM usage_events) AS last"#
    )
    .fetch_one(&mut *tx)
    .await?;
    let first_allowed = match clock.last {
        Some(last) if last >= clock.now => last + time::Duration::microseconds(1),
        _ => clock.now,
    };
    let effective_from = match effective_from {
        None => first_allowed,
        Some(t) if t < first_allowed => return Err(AccountError::Invalid(FORWARD_ONLY.into())),
        Some(t) => t,
    };
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
    Ok((version, effective_from))
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

/// The name the draft scheduler acts under in the audit log.
pub const SCHEDULER: Actor<'static> = Actor {
    user_id: None,
    name: "scheduler",
    source_ip: None,
};

/// (Re)builds a tenant's draft for the UTC month starting `month` from `runs` (see
/// `db::billing::build_draft`), audited as `invoice.build` with the segments it was built from
/// and the total; the scheduler's rebuilds too (actor [`SCHEDULER`]), so every figure an
/// invoice ever showed can be traced. A run that cannot be used is `Invalid`, naming it.
pub async fn build_draft(
    pool: &PgPool,
    actor: &Actor<'_>,
    tenant: Uuid,
    month: Date,
    runs: db::Runs<'_>,
) -> Result<db::Draft, AccountError> {
    let mut tx = pool.begin().await?;
    let draft = db::build_draft(&mut *tx, tenant, month, runs).await?;
    match draft {
        db::Draft::Built(id) => {
            let sources: Vec<Value> = periods::sources(&mut *tx, id)
                .await?
                .into_iter()
                .map(
                    |s| json!({ "run": s.run, "from": rfc3339(s.from), "until": rfc3339(s.until) }),
                )
                .collect();
            let total = about(&mut tx, id).await?.total_micros;
            record(
                &mut tx,
                actor,
                Some(tenant),
                "invoice.build",
                &id.to_string(),
                json!({ "month": month.to_string(), "sources": sources, "total_micros": total }),
            )
            .await?;
        }
        db::Draft::RunRefused(run) => {
            return Err(AccountError::Invalid(format!(
                "run {run} cannot be used for {month}: a draft takes this tenant's re-rates \
                 that touch the month's period and do not overlap each other"
            )))
        }
        db::Draft::AlreadyIssued(_) => {}
    }
    tx.commit().await?;
    Ok(draft)
}

/// Closes `tenant`'s month starting `month` early at `at`, audited as `period.close`: the
/// month's invoice covers usage started before `at`, the next month's invoice what starts from
/// `at` on. `Invalid` when the month is issued, already closed, or `at` is not inside it.
pub async fn close_period(
    pool: &PgPool,
    actor: &Actor<'_>,
    tenant: Uuid,
    tenant_name: &str,
    month: Date,
    at: OffsetDateTime,
) -> Result<(), AccountError> {
    let mut tx = pool.begin().await?;
    match periods::close(&mut tx, tenant, month, at, actor.name).await? {
        periods::Close::Closed => {}
        periods::Close::AlreadyClosed(when) => {
            return Err(AccountError::Invalid(format!(
                "{month} was already closed at {}",
                rfc3339(when)
            )))
        }
        periods::Close::Issued(id) => {
            return Err(AccountError::Invalid(format!(
                "{month} is invoiced by issued invoice {id}: its period is over"
            )))
        }
        periods::Close::KeptRerate(run) => {
            return Err(AccountError::Invalid(format!(
                "the draft of {month} is built from re-rate run {run}, which covers part of it \
                 after {}: build the draft without that run (or from a re-rate ending at the \
                 close) first",
                rfc3339(at)
            )))
        }
        periods::Close::NextIssued(id) => {
            return Err(AccountError::Invalid(format!(
                "the next month is invoiced by issued invoice {id}: closing {month} early would                  move usage onto no invoice (correct that invoice with a credit note first)"
            )))
        }
        periods::Close::OutsideMonth => {
            return Err(AccountError::Invalid(format!(
                "{} is not inside {month}: a close ends the month early",
                rfc3339(at)
            )))
        }
    }
    record(
        &mut tx,
        actor,
        Some(tenant),
        "period.close",
        tenant_name,
        json!({ "month": month.to_string(), "closes_at": rfc3339(at) }),
    )
    .await?;
    tx.commit().await?;
    Ok(())
}

/// The invoice an action is about; `NotFound` when there is none.
async fn about(tx: &mut PgConnection, id: Uuid) -> Result<db::Invoice, AccountError> {
    invoicing::by_id(&mut *tx, id)
        .await?
        .ok_or_else(|| AccountError::NotFound(format!("invoice {id}")))
}

/// Issues a draft, audited as `invoice.issue`: from then on the database refuses any change to
/// it or its entries. `Invalid` when it is not a draft, its period has not ended, or it was not
/// built since (the final draft).
pub async fn issue(
    pool: &PgPool,
    actor: &Actor<'_>,
    invoice: Uuid,
) -> Result<db::Invoice, AccountError> {
    let mut tx = pool.begin().await?;
    about(&mut tx, invoice).await?;
    match db::issue(&mut *tx, invoice, actor.name).await? {
        db::Issue::Issued => {}
        db::Issue::NotDraft => {
            return Err(AccountError::Invalid(format!("{invoice} is not a draft")))
        }
        db::Issue::Open(until) => {
            return Err(AccountError::Invalid(format!(
                "the period is open until {}: issue it after it ends (or close it early)",
                rfc3339(until)
            )))
        }
        db::Issue::NotFinal(until) => {
            return Err(AccountError::Invalid(format!(
                "the draft was built before its period ended ({}): build the final draft first",
                rfc3339(until)
            )))
        }
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
/// that is not positive or an expiry already past.
pub async fn grant_credit(
    pool: &PgPool,
    actor: &Actor<'_>,
    g: &NewGrant<'_>,
) -> Result<Uuid, AccountError> {
    if g.amount_micros <= 0 {
        return Err(AccountError::Invalid("a grant is a positive amount".into()));
    }
    if g.expires_at.is_some_and(|e| e <= OffsetDateTime::now_utc()) {
        return Err(AccountError::Invalid(
            "the expiry is in the past: that grant would count for nothing".into(),
        ));
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

/// Text typed into a multi-line form field, as stored: line ends as `\n`, each line's trailing
/// blanks and the whole text's surrounding blank lines dropped.
fn lines_of(text: &str) -> String {
    let lines: Vec<&str> = text.lines().map(str::trim_end).collect();
    lines.join("\n").trim_matches('\n').to_owned()
}

/// Sets who issues invoices (the "From" of every invoice issued from now on; issued ones keep
/// theirs), audited as `invoice.issuer` with what it replaced. Refused for an empty name, a name
/// over 200 or an address over 1,000 characters, or terms outside 0 to 365 days.
pub async fn set_issuer(
    pool: &PgPool,
    actor: &Actor<'_>,
    new: &documents::Issuer,
) -> Result<(), AccountError> {
    let new = documents::Issuer {
        name: new.name.trim().to_owned(),
        address: lines_of(&new.address),
        due_days: new.due_days,
    };
    if new.name.is_empty() || new.name.chars().count() > 200 {
        return Err(AccountError::Invalid(
            "the issuer's name is 1 to 200 characters".into(),
        ));
    }
    if new.address.chars().count() > 1000 {
        return Err(AccountError::Invalid(
            "the issuer's address is at most 1,000 characters".into(),
        ));
    }
    if !(0..=365).contains(&new.due_days) {
        return Err(AccountError::Invalid(
            "payment terms are 0 to 365 days".into(),
        ));
    }
    let mut tx = pool.begin().await?;
    let was = documents::set_issuer(&mut tx, &new).await?;
    record(
        &mut tx,
        actor,
        None,
        "invoice.issuer",
        &new.name,
        json!({
            "from": { "name": was.name, "address": was.address, "due_days": was.due_days },
            "to": { "name": new.name, "address": new.address, "due_days": new.due_days },
        }),
    )
    .await?;
    tx.commit().await?;
    Ok(())
}

/// Sets where a tenant's invoices are addressed (the "Bill to" of invoices issued from now on),
/// audited as `tenant.billing_address`. Owners do this for their own tenant in the portal; the
/// tenant id comes from their session. Refused over 1,000 characters.
pub async fn set_billing_address(
    pool: &PgPool,
    actor: &Actor<'_>,
    tenant: Uuid,
    address: &str,
) -> Result<(), AccountError> {
    let address = lines_of(address);
    if address.chars().count() > 1000 {
        return Err(AccountError::Invalid(
            "a billing address is at most 1,000 characters".into(),
        ));
    }
    let mut tx = pool.begin().await?;
    let Some(was) = documents::set_billing_address(&mut tx, tenant, &address).await? else {
        return Err(AccountError::NotFound("tenant".into()));
    };
    record(
        &mut tx,
        actor,
        Some(tenant),
        "tenant.billing_address",
        "billing address",
        json!({ "from": was, "to": address }),
    )
    .await?;
    tx.commit().await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::lines_of;

    #[test]
    fn typed_lines_are_normalised() {
        assert_eq!(lines_of("Acme\r\n1 Main St  \r\n\r\n"), "Acme\n1 Main St");
        assert_eq!(lines_of("\n\nx\n"), "x");
        assert_eq!(lines_of(""), "");
    }
}
