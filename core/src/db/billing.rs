//! Billing, the exact side of money: versioned prices, the set-based rater, re-rating runs,
//! monthly invoices and prepaid credits. Rating happens in SQL (`billing_rate_batch`, migration
//! 20261206100000_billing.sql): one statement per batch joins the events to the price version in
//! effect at their start, inserts the charge lines and updates the daily rollup, so a month's
//! invoice sums at most ~31 x price keys rows instead of every line.
//!
//! API (every tenant-facing read takes the tenant id and filters by it):
//!
//! | function | what |
//! | --- | --- |
//! | [`live_run`], [`rate_batch`], [`drain`] | the continuous run and rating batches (the rater task) |
//! | [`queue_status`] | what waits to be rated (the rating-lag gauges) |
//! | [`versions`], [`prices_at`], [`prices_of_version`], [`set_price`], [`set_prices`] | price book (append-only, forward only) |
//! | [`add_tier`], [`set_tenant_tier`] | tiers |
//! | [`rerate`], [`runs_of`] | a new run for a tenant and period under one version |
//! | [`build_draft`], [`issue`], [`adjust`], [`correct`] | invoices (admin); periods and sources are [`periods`]' |
//! | [`invoices`], [`invoice`], [`invoice_entries`], [`invoice_lines`] | tenant's list, detail, CSV lines |
//! | [`grant_credit`], [`credit_grants`], [`credit_balance`], [`credit_balances`] | prepaid credit |
//! | [`rated_usage`] | export pages of the live run's lines (CSV, CloudEvents, Lago) |

use sqlx::{Acquire, PgExecutor, PgPool, Postgres};
use time::{Date, OffsetDateTime};
use uuid::Uuid;

use super::periods;
use crate::money::Rates;

/// The id of the continuous ('live') rating run.
pub async fn live_run(pool: &PgPool) -> sqlx::Result<i64> {
    sqlx::query_scalar!("SELECT id FROM rating_runs WHERE kind = 'live'")
        .fetch_one(pool)
        .await
}

/// Rates up to `limit` events of `run`; returns how many events it took up (0: none left).
/// Idempotent: an event already rated in the run is skipped.
pub async fn rate_batch(pool: &PgPool, run: i64, limit: i32) -> sqlx::Result<i64> {
    let n = sqlx::query_scalar!(r#"SELECT billing_rate_batch($1, $2) AS "n!""#, run, limit)
        .fetch_one(pool)
        .await?;
    Ok(i64::from(n))
}

/// The live run's work list: how many events wait (counted up to `cap`, so a huge backlog costs a
/// bounded index scan) and the oldest one's request id (a UUIDv7: when its request started).
/// Both read through `rating_queue`'s primary key.
pub async fn queue_status(pool: &PgPool, cap: i64) -> sqlx::Result<(i64, Option<Uuid>)> {
    let row = sqlx::query!(
        r#"SELECT (SELECT count(*) FROM (SELECT 1 FROM rating_queue LIMIT $1) q) AS "depth!",
                  (SELECT request_id FROM rating_queue ORDER BY request_id LIMIT 1) AS oldest"#,
        cap
    )
    .fetch_one(pool)
    .await?;
    Ok((row.depth, row.oldest))
}

/// Rates batches of `run` until none is left; returns the events taken up.
pub async fn drain(pool: &PgPool, run: i64, batch: i32) -> sqlx::Result<i64> {
    let mut total = 0;
    loop {
        let n = rate_batch(pool, run, batch).await?;
        if n == 0 {
            return Ok(total);
        }
        total += n;
    }
}

/// A version of the default price book.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Version {
    pub id: i64,
    pub effective_from: OffsetDateTime,
    pub note: String,
    pub created_by: String,
    pub created_at: OffsetDateTime,
}

/// Every version of the default book, oldest first.
pub async fn versions(db: impl PgExecutor<'_>) -> sqlx::Result<Vec<Version>> {
    sqlx::query_as!(
        Version,
        "SELECT id, effective_from, note, created_by, created_at FROM price_versions
         WHERE book = 'default' ORDER BY effective_from"
    )
    .fetch_all(db)
    .await
}

/// One price of a version.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Price {
    pub version_id: i64,
    pub price_key: String,
    pub tier: String,
    pub rates: Rates,
}

/// The prices of `version`, by key and tier.
pub async fn prices_of_version(db: impl PgExecutor<'_>, version: i64) -> sqlx::Result<Vec<Price>> {
    let rows = sqlx::query!(
        "SELECT version_id, price_key, tier, fresh_input_per_m, cached_input_per_m, output_per_m
         FROM prices WHERE version_id = $1 ORDER BY price_key, tier",
        version
    )
    .fetch_all(db)
    .await?;
    Ok(rows
        .into_iter()
        .map(|r| Price {
            version_id: r.version_id,
            price_key: r.price_key,
            tier: r.tier,
            rates: Rates {
                fresh_per_m: r.fresh_input_per_m,
                cached_per_m: r.cached_input_per_m,
                output_per_m: r.output_per_m,
            },
        })
        .collect())
}

/// The version in effect at `at` (none before the first) and its prices.
pub async fn prices_at(
    pool: &PgPool,
    at: OffsetDateTime,
) -> sqlx::Result<Option<(i64, Vec<Price>)>> {
    let version = sqlx::query_scalar!(
        "SELECT id FROM price_versions WHERE book = 'default' AND effective_from <= $1
         ORDER BY effective_from DESC LIMIT 1",
        at
    )
    .fetch_optional(pool)
    .await?;
    match version {
        Some(v) => Ok(Some((v, prices_of_version(pool, v).await?))),
        None => Ok(None),
    }
}

/// How an adapter's own price key starts: `adapter:<tenant>/<served name>` (migration
/// 20261215100001_adapter_prices.sql). Its requests are priced by it where a version holds it,
/// else by their base's key.
pub const ADAPTER_KEY_PREFIX: &str = "adapter:";

/// The price key of `tenant`'s adapter served as `served_name`.
pub fn adapter_price_key(tenant: &str, served_name: &str) -> String {
    format!("{ADAPTER_KEY_PREFIX}{tenant}/{served_name}")
}

/// Whether an adapter has this own price key (a price for a key no adapter has would apply to
/// nothing).
pub async fn adapter_key_exists(db: impl PgExecutor<'_>, key: &str) -> sqlx::Result<bool> {
    sqlx::query_scalar!(
        r#"SELECT EXISTS (SELECT 1 FROM adapters a JOIN tenants t ON t.id = a.tenant_id
                          WHERE 'adapter:' || t.name || '/' || a.name = $1) AS "exists!""#,
        key
    )
    .fetch_one(db)
    .await
}

/// Sets the price of `price_key` for `tier` from `effective_from` on; see [`set_prices`].
pub async fn set_price(
    db: impl Acquire<'_, Database = Postgres>,
    effective_from: OffsetDateTime,
    price_key: &str,
    tier: &str,
    rates: Rates,
    by: &str,
) -> sqlx::Result<Option<i64>> {
    set_prices(db, effective_from, &[(price_key, tier, rates)], by).await
}

/// Sets prices (key, tier, rates) from `effective_from` on: one new version holding the prices
/// of the latest version with these changed (a price is never edited). Versions only go forward:
/// None, and nothing written, unless `effective_from` is after the latest version's (a version
/// dated before a later one would leave the later one without the change). A version dated in
/// the past does not change lines already rated: re-rate to apply it.
pub async fn set_prices(
    db: impl Acquire<'_, Database = Postgres>,
    effective_from: OffsetDateTime,
    prices: &[(&str, &str, Rates)],
    by: &str,
) -> sqlx::Result<Option<i64>> {
    let mut tx = db.begin().await?;
    // One writer of the book at a time.
    sqlx::query!("SELECT name FROM price_books WHERE name = 'default' FOR UPDATE")
        .fetch_one(&mut *tx)
        .await?;
    let latest = sqlx::query_scalar!(
        "SELECT max(effective_from) FROM price_versions WHERE book = 'default'"
    )
    .fetch_one(&mut *tx)
    .await?;
    if latest.is_some_and(|l| l >= effective_from) {
        return Ok(None);
    }
    let keys: Vec<String> = prices.iter().map(|p| p.0.to_owned()).collect();
    let tiers: Vec<String> = prices.iter().map(|p| p.1.to_owned()).collect();
    let note = prices
        .iter()
        .map(|(k, t, _)| format!("{k}/{t}"))
        .collect::<Vec<_>>()
        .join(", ");
    let version = sqlx::query_scalar!(
        "INSERT INTO price_versions (book, effective_from, created_by, note)
         VALUES ('default', $1, $2, 'set ' || $3) RETURNING id",
        effective_from,
        by,
        note,
    )
    .fetch_one(&mut *tx)
    .await?;
    sqlx::query!(
        "INSERT INTO prices (version_id, price_key, tier, fresh_input_per_m, cached_input_per_m, output_per_m)
         SELECT $1, p.price_key, p.tier, p.fresh_input_per_m, p.cached_input_per_m, p.output_per_m
         FROM prices p
         WHERE p.version_id = (SELECT id FROM price_versions WHERE book = 'default' AND effective_from < $2
                               ORDER BY effective_from DESC LIMIT 1)
           AND NOT EXISTS (SELECT 1 FROM unnest($3::text[], $4::text[]) AS c(price_key, tier)
                           WHERE c.price_key = p.price_key AND c.tier = p.tier)",
        version,
        effective_from,
        &keys,
        &tiers,
    )
    .execute(&mut *tx)
    .await?;
    for (price_key, tier, rates) in prices {
        sqlx::query!(
            "INSERT INTO prices (version_id, price_key, tier, fresh_input_per_m, cached_input_per_m, output_per_m)
             VALUES ($1, $2, $3, $4, $5, $6)",
            version,
            price_key,
            tier,
            rates.fresh_per_m,
            rates.cached_per_m,
            rates.output_per_m,
        )
        .execute(&mut *tx)
        .await?;
    }
    tx.commit().await?;
    Ok(Some(version))
}

/// Adds a tier (nothing if it exists).
pub async fn add_tier(db: impl PgExecutor<'_>, name: &str) -> sqlx::Result<()> {
    sqlx::query!(
        "INSERT INTO billing_tiers (name) VALUES ($1) ON CONFLICT DO NOTHING",
        name
    )
    .execute(db)
    .await?;
    Ok(())
}

/// Puts a tenant in a tier; false when the tenant does not exist.
pub async fn set_tenant_tier(
    db: impl PgExecutor<'_>,
    tenant: Uuid,
    tier: &str,
) -> sqlx::Result<bool> {
    let done = sqlx::query!("UPDATE tenants SET tier = $2 WHERE id = $1", tenant, tier)
        .execute(db)
        .await?;
    Ok(done.rows_affected() == 1)
}

/// Starts a re-rate of `tenant`'s events started in `[start, end)` under `version` and rates it
/// fully: a new run, earlier runs kept for audit, events untouched. Returns the run.
pub async fn rerate(
    pool: &PgPool,
    tenant: Uuid,
    start: OffsetDateTime,
    end: OffsetDateTime,
    version: i64,
    by: &str,
) -> sqlx::Result<i64> {
    let run = sqlx::query_scalar!(
        "INSERT INTO rating_runs (kind, tenant_id, period_start, period_end, price_version_id, created_by)
         VALUES ('rerate', $1, $2, $3, $4, $5) RETURNING id",
        tenant,
        start,
        end,
        version,
        by,
    )
    .fetch_one(pool)
    .await?;
    drain(pool, run, 50_000).await?;
    Ok(run)
}

/// A rating run with its totals for a tenant.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Run {
    pub id: i64,
    pub kind: String,
    pub period_start: Option<OffsetDateTime>,
    pub period_end: Option<OffsetDateTime>,
    pub price_version_id: Option<i64>,
    pub created_by: String,
    pub created_at: OffsetDateTime,
    pub events: i64,
    pub amount_micros: i64,
}

/// The runs that rated `tenant`'s events (the live one first), with the tenant's totals in each.
pub async fn runs_of(pool: &PgPool, tenant: Uuid) -> sqlx::Result<Vec<Run>> {
    sqlx::query_as!(
        Run,
        r#"SELECT r.id, r.kind, r.period_start, r.period_end, r.price_version_id, r.created_by,
                  r.created_at,
                  COALESCE((SELECT sum(d.events) FROM rated_daily d
                            WHERE d.run_id = r.id AND d.tenant_id = $1), 0)::bigint AS "events!",
                  COALESCE((SELECT sum(d.amount_micros) FROM rated_daily d
                            WHERE d.run_id = r.id AND d.tenant_id = $1), 0)::bigint AS "amount_micros!"
           FROM rating_runs r
           WHERE r.kind = 'live' OR r.tenant_id = $1
           ORDER BY r.id"#,
        tenant
    )
    .fetch_all(pool)
    .await
}

/// What [`build_draft`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Draft {
    /// The month's draft (new or rebuilt).
    Built(Uuid),
    /// The month has an issued invoice that no credit note corrects: correct it first.
    AlreadyIssued(Uuid),
    /// This run cannot be used: not a re-rate of this tenant, outside the month's period, or
    /// overlapping another chosen run (nothing written).
    RunRefused(i64),
}

/// Which re-rates a draft is built from; the live run covers the rest of the period.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Runs<'a> {
    /// The ones the month's draft was built from (none for a new draft): what the scheduler's
    /// rebuilds use, so an admin's choice is never reverted behind their back.
    Kept,
    /// These re-rate runs (empty: the live run alone).
    Chosen(&'a [i64]),
}

/// (Re)builds the draft invoice of `tenant` for the UTC month starting `month`: over the month's
/// period ([`periods::period`]: the calendar month unless closed early), each segment's lines
/// from its run ([`periods::plan`]: the chosen re-rates, the live run for the rest), one usage
/// entry per price key, the adjustments already on the draft kept, then credit entries burning
/// the tenant's grants (lowest priority number first, then earliest expiry) down to zero at most.
/// A grant counts unless it has expired by the time of the build (its instant, not its month);
/// what it has left is what issued invoices have not burned. The draft records its segments and
/// when it was built (issuing needs a build after the period's end).
pub async fn build_draft(
    db: impl Acquire<'_, Database = Postgres>,
    tenant: Uuid,
    month: Date,
    runs: Runs<'_>,
) -> sqlx::Result<Draft> {
    let mut tx = db.begin().await?;
    // One builder per tenant at a time (two would race on the draft).
    let issued = periods::lock_month(&mut tx, tenant, month).await?;
    if let Some(id) = issued {
        return Ok(Draft::AlreadyIssued(id));
    }
    let live = sqlx::query_scalar!("SELECT id FROM rating_runs WHERE kind = 'live'")
        .fetch_one(&mut *tx)
        .await?;
    let chosen = match runs {
        Runs::Chosen(r) => r.to_vec(),
        Runs::Kept => periods::chosen_runs(&mut *tx, tenant, month).await?,
    };
    let found = periods::rerates(&mut *tx, &chosen).await?;
    if let Some(missing) = chosen.iter().find(|r| !found.iter().any(|f| f.run == **r)) {
        return Ok(Draft::RunRefused(*missing));
    }
    let period = periods::period(&mut *tx, tenant, month).await?;
    let segments = match periods::plan(tenant, period, live, &found) {
        Ok(s) => s,
        Err(run) => return Ok(Draft::RunRefused(run)),
    };
    let existing = sqlx::query_scalar!(
        "SELECT id FROM invoices WHERE tenant_id = $1 AND period_start = $2 AND kind = 'invoice'
           AND status = 'draft'",
        tenant,
        month,
    )
    .fetch_optional(&mut *tx)
    .await?;
    let id = match existing {
        Some(id) => {
            sqlx::query!(
                "DELETE FROM invoice_entries WHERE invoice_id = $1 AND kind <> 'adjustment'",
                id
            )
            .execute(&mut *tx)
            .await?;
            sqlx::query!("DELETE FROM invoice_sources WHERE invoice_id = $1", id)
                .execute(&mut *tx)
                .await?;
            sqlx::query!(
                "UPDATE invoices SET run_id = $2, covers_from = $3, covers_until = $4,
                                     built_at = clock_timestamp()
                 WHERE id = $1",
                id,
                live,
                period.0,
                period.1,
            )
            .execute(&mut *tx)
            .await?;
            id
        }
        None => {
            let id = Uuid::now_v7();
            // A month corrected by a credit note: the new invoice names the one it replaces.
            sqlx::query!(
                "INSERT INTO invoices (id, tenant_id, period_start, run_id, corrects, covers_from,
                                       covers_until, built_at)
                 VALUES ($1, $2, $3, $4,
                         (SELECT i.id FROM invoices i
                          WHERE i.tenant_id = $2 AND i.period_start = $3 AND i.kind = 'invoice'
                            AND i.status = 'issued' ORDER BY i.issued_at DESC LIMIT 1),
                         $5, $6, clock_timestamp())",
                id,
                tenant,
                month,
                live,
                period.0,
                period.1,
            )
            .execute(&mut *tx)
            .await?;
            id
        }
    };
    for s in segments.iter().filter(|s| s.run != live) {
        catch_up_rerate(&mut tx, s.run).await?;
    }
    let seg_runs: Vec<i64> = segments.iter().map(|s| s.run).collect();
    let seg_from: Vec<OffsetDateTime> = segments.iter().map(|s| s.from).collect();
    let seg_until: Vec<OffsetDateTime> = segments.iter().map(|s| s.until).collect();
    sqlx::query!(
        "INSERT INTO invoice_sources (invoice_id, run_id, covers_from, covers_until)
         SELECT $1, * FROM unnest($2::bigint[], $3::timestamptz[], $4::timestamptz[])",
        id,
        &seg_runs,
        &seg_from,
        &seg_until,
    )
    .execute(&mut *tx)
    .await?;
    // Per segment: whole UTC days from the run's daily rollup, the partial days at its edges
    // from its lines (found through the events' (tenant, started_at) index).
    sqlx::query!(
        r#"WITH seg AS (
               SELECT s.run_id, s.covers_from AS t0, s.covers_until AS t1,
                      CASE WHEN date_trunc('day', s.covers_from, 'UTC') = s.covers_from
                           THEN s.covers_from
                           ELSE date_trunc('day', s.covers_from, 'UTC') + interval '24 hours'
                      END AS d0,
                      date_trunc('day', s.covers_until, 'UTC') AS d1
               FROM invoice_sources s WHERE s.invoice_id = $1
           ), used AS (
               SELECT d.price_key, d.served_name, d.events, d.fresh_tokens, d.cached_tokens, d.output_tokens,
                      d.amount_micros
               FROM seg JOIN rated_daily d
                 ON d.run_id = seg.run_id AND d.tenant_id = $2
                AND d.day >= (seg.d0 AT TIME ZONE 'UTC')::date
                AND d.day < (seg.d1 AT TIME ZONE 'UTC')::date
               UNION ALL
               SELECT c.price_key, c.served_name, 1, c.fresh_tokens, c.cached_tokens, c.output_tokens,
                      c.amount_micros
               FROM seg JOIN usage_events e
                 ON e.tenant_id = $2 AND e.started_at >= seg.t0
                AND e.started_at < LEAST(seg.t1, seg.d0)
               JOIN charge_lines c ON c.run_id = seg.run_id AND c.request_id = e.request_id
               UNION ALL
               SELECT c.price_key, c.served_name, 1, c.fresh_tokens, c.cached_tokens, c.output_tokens,
                      c.amount_micros
               FROM seg JOIN usage_events e
                 ON e.tenant_id = $2 AND seg.d1 >= seg.d0
                AND e.started_at >= GREATEST(seg.t0, seg.d1) AND e.started_at < seg.t1
               JOIN charge_lines c ON c.run_id = seg.run_id AND c.request_id = e.request_id
           )
           INSERT INTO invoice_entries (invoice_id, position, kind, description, price_key, events,
                                        fresh_tokens, cached_tokens, output_tokens, amount_micros)
           -- One line per model (served name) under its price key, row for row with the usage
           -- page; lines rated before models were kept (served_name '') under the key.
           SELECT $1, (row_number() OVER (ORDER BY price_key, served_name))::int, 'usage',
                  COALESCE(NULLIF(served_name, ''), price_key), price_key,
                  sum(events)::bigint, sum(fresh_tokens)::bigint, sum(cached_tokens)::bigint,
                  sum(output_tokens)::bigint, sum(amount_micros)::bigint
           FROM used
           GROUP BY price_key, served_name"#,
        id,
        tenant,
    )
    .execute(&mut *tx)
    .await?;
    // Each grant's remaining balance is its amount plus the (negative) credit entries of issued
    // invoices and the (positive) ones of credit notes; applied in order while charges remain.
    sqlx::query!(
        r#"WITH due AS (SELECT COALESCE(sum(amount_micros), 0)::bigint AS micros
                        FROM invoice_entries WHERE invoice_id = $1),
                g AS (SELECT c.id, c.amount_micros + COALESCE((
                             SELECT sum(x.amount_micros) FROM invoice_entries x
                             JOIN invoices i ON i.id = x.invoice_id
                             WHERE x.grant_id = c.id AND i.status = 'issued'), 0) AS remaining,
                             c.priority, c.expires_at, c.granted_at
                      FROM credit_grants c
                      WHERE c.tenant_id = $2
                        AND (c.expires_at IS NULL OR c.expires_at > clock_timestamp())),
                ordered AS (SELECT g.id, g.remaining,
                                   COALESCE(sum(g.remaining) OVER (
                                       ORDER BY g.priority, g.expires_at NULLS LAST, g.granted_at, g.id
                                       ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING), 0) AS before
                            FROM g WHERE g.remaining > 0)
           INSERT INTO invoice_entries (invoice_id, position, kind, description, amount_micros, grant_id)
           SELECT $1, 100000 + (row_number() OVER (ORDER BY o.before))::int, 'credit', 'prepaid credit',
                  (-least(o.remaining, due.micros - o.before))::bigint, o.id
           FROM ordered o, due WHERE due.micros > o.before"#,
        id,
        tenant,
    )
    .execute(&mut *tx)
    .await?;
    set_total(&mut tx, id).await?;
    tx.commit().await?;
    Ok(Draft::Built(id))
}

/// Rates into re-rate `run` the events of its tenant and period that it has no line for: events
/// stored after the re-rate walked past their start (a journal replayed late, a re-rate reaching
/// into the present). Its cursor moves back to just before the earliest such event and the run's
/// own batches take them (lines already there are skipped), so a draft built from the run has
/// every event of its segments.
///
/// INVARIANT: an event in a re-rate's segment is on the draft, whenever it was stored (test:
/// core/tests/billing_props.rs, which found the late event missing).
async fn catch_up_rerate(tx: &mut sqlx::PgConnection, run: i64) -> sqlx::Result<()> {
    let moved = sqlx::query!(
        "UPDATE rating_cursor c
         SET after_started = l.started_at - interval '1 microsecond',
             after_request = 'ffffffff-ffff-ffff-ffff-ffffffffffff'
         FROM (SELECT e.started_at FROM rating_runs r
                    JOIN usage_events e
                      ON e.tenant_id = r.tenant_id AND e.started_at >= r.period_start
                     AND e.started_at < r.period_end
               WHERE r.id = $1 AND r.kind = 'rerate' AND e.status <> 'rejected'
                 AND NOT EXISTS (SELECT 1 FROM charge_lines x
                                 WHERE x.run_id = $1 AND x.request_id = e.request_id)
               ORDER BY e.started_at LIMIT 1) l
         WHERE c.run_id = $1",
        run,
    )
    .execute(&mut *tx)
    .await?;
    if moved.rows_affected() == 0 {
        return Ok(());
    }
    while sqlx::query_scalar!(r#"SELECT billing_rate_batch($1, $2) AS "n!""#, run, 20_000)
        .fetch_one(&mut *tx)
        .await?
        > 0
    {}
    Ok(())
}

async fn set_total(tx: &mut sqlx::PgConnection, id: Uuid) -> sqlx::Result<()> {
    sqlx::query!(
        "UPDATE invoices SET total_micros = (SELECT COALESCE(sum(amount_micros), 0)::bigint
                                             FROM invoice_entries WHERE invoice_id = $1)
         WHERE id = $1",
        id,
    )
    .execute(tx)
    .await?;
    Ok(())
}

/// Adds an adjustment entry (positive charges, negative refunds) to a draft; false when the
/// invoice is not a draft. Rebuilding the draft keeps it.
pub async fn adjust(
    db: impl Acquire<'_, Database = Postgres>,
    invoice: Uuid,
    description: &str,
    amount_micros: i64,
) -> sqlx::Result<bool> {
    let mut tx = db.begin().await?;
    let draft = sqlx::query_scalar!(
        "SELECT id FROM invoices WHERE id = $1 AND status = 'draft' FOR UPDATE",
        invoice
    )
    .fetch_optional(&mut *tx)
    .await?;
    if draft.is_none() {
        return Ok(false);
    }
    sqlx::query!(
        "INSERT INTO invoice_entries (invoice_id, position, kind, description, amount_micros)
         VALUES ($1, 200000 + (SELECT count(*) FROM invoice_entries
                               WHERE invoice_id = $1 AND kind = 'adjustment')::int,
                 'adjustment', $2, $3)",
        invoice,
        description,
        amount_micros,
    )
    .execute(&mut *tx)
    .await?;
    set_total(&mut tx, invoice).await?;
    tx.commit().await?;
    Ok(true)
}

/// What [`issue`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Issue {
    Issued,
    /// Not a draft (issued already, or no such invoice).
    NotDraft,
    /// The period is still open: it ends at this instant.
    Open(OffsetDateTime),
    /// The draft was last built before its period ended (at this instant): build the final one.
    NotFinal(OffsetDateTime),
}

/// Issues a draft: from then on the database refuses any change to it or its entries. Only
/// once its period has ended and the draft was built after the end (the final draft): an open
/// month issued would leave the rest of its usage on no invoice.
pub async fn issue(
    db: impl Acquire<'_, Database = Postgres>,
    invoice: Uuid,
    by: &str,
) -> sqlx::Result<Issue> {
    let mut tx = db.begin().await?;
    // The tenant's row first, as [`build_draft`] takes it: a rebuild running now finishes before
    // the draft is frozen, and one that starts after sees it issued (without the lock, a rebuild
    // that read "not issued" just before could start a second draft for an issued month).
    sqlx::query!(
        "SELECT t.id FROM tenants t JOIN invoices i ON i.tenant_id = t.id
         WHERE i.id = $1 FOR UPDATE OF t",
        invoice
    )
    .fetch_optional(&mut *tx)
    .await?;
    let row = sqlx::query!(
        r#"SELECT COALESCE(covers_until, (period_start + interval '1 month') AT TIME ZONE 'UTC')
                      AS "until!",
                  built_at, clock_timestamp() AS "now!"
           FROM invoices WHERE id = $1 AND status = 'draft' AND kind = 'invoice'"#,
        invoice,
    )
    .fetch_optional(&mut *tx)
    .await?;
    let Some(row) = row else {
        return Ok(Issue::NotDraft);
    };
    // INVARIANT: only a closed period's final draft is issued (test: billing::
    // a_month_is_issued_only_after_it_closed_and_close_early_moves_the_rest_on).
    if row.now < row.until {
        return Ok(Issue::Open(row.until));
    }
    if row.built_at.is_none_or(|b| b < row.until) {
        return Ok(Issue::NotFinal(row.until));
    }
    sqlx::query!(
        "UPDATE invoices SET status = 'issued', issued_at = now(), issued_by = $2
         WHERE id = $1 AND status = 'draft'",
        invoice,
        by,
    )
    .execute(&mut *tx)
    .await?;
    tx.commit().await?;
    Ok(Issue::Issued)
}

/// Corrects an issued invoice: an issued credit note negating every entry (credits burned come
/// back to their grants), after which [`build_draft`] makes the month's new invoice. Returns the
/// credit note; None when the invoice is not an issued invoice or is already corrected.
pub async fn correct(
    db: impl Acquire<'_, Database = Postgres>,
    invoice: Uuid,
    by: &str,
) -> sqlx::Result<Option<Uuid>> {
    let mut tx = db.begin().await?;
    let original = sqlx::query_scalar!(
        "SELECT id FROM invoices i
         WHERE id = $1 AND kind = 'invoice' AND status = 'issued'
           AND NOT EXISTS (SELECT 1 FROM invoices n WHERE n.kind = 'credit_note' AND n.corrects = i.id)",
        invoice
    )
    .fetch_optional(&mut *tx)
    .await?;
    if original.is_none() {
        return Ok(None);
    }
    let note = Uuid::now_v7();
    sqlx::query!(
        "INSERT INTO invoices (id, tenant_id, period_start, kind, corrects, run_id, covers_from,
                               covers_until, built_at)
         SELECT $1, tenant_id, period_start, 'credit_note', id, run_id, covers_from, covers_until,
                clock_timestamp()
         FROM invoices WHERE id = $2",
        note,
        invoice,
    )
    .execute(&mut *tx)
    .await?;
    // The note's lines (its CSV) are the ones it negates.
    sqlx::query!(
        "INSERT INTO invoice_sources (invoice_id, run_id, covers_from, covers_until)
         SELECT $1, run_id, covers_from, covers_until FROM invoice_sources WHERE invoice_id = $2",
        note,
        invoice,
    )
    .execute(&mut *tx)
    .await?;
    sqlx::query!(
        "INSERT INTO invoice_entries (invoice_id, position, kind, description, price_key, events,
                                      fresh_tokens, cached_tokens, output_tokens, amount_micros, grant_id)
         SELECT $1, position, kind, description, price_key, events, fresh_tokens, cached_tokens,
                output_tokens, -amount_micros, grant_id
         FROM invoice_entries WHERE invoice_id = $2",
        note,
        invoice,
    )
    .execute(&mut *tx)
    .await?;
    set_total(&mut tx, note).await?;
    sqlx::query!(
        "UPDATE invoices SET status = 'issued', issued_at = now(), issued_by = $2 WHERE id = $1",
        note,
        by,
    )
    .execute(&mut *tx)
    .await?;
    tx.commit().await?;
    Ok(Some(note))
}

/// An invoice or credit note.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Invoice {
    pub id: Uuid,
    pub tenant_id: Uuid,
    pub period_start: Date,
    /// 'invoice' or 'credit_note'.
    pub kind: String,
    pub corrects: Option<Uuid>,
    /// 'draft' or 'issued'.
    pub status: String,
    pub run_id: i64,
    pub total_micros: i64,
    pub issued_at: Option<OffsetDateTime>,
    pub created_at: OffsetDateTime,
    /// The period it covers (event start times): the calendar month unless closed early.
    pub covers_from: OffsetDateTime,
    pub covers_until: OffsetDateTime,
    /// When its figures were last computed (None on invoices older than issue 31).
    pub built_at: Option<OffsetDateTime>,
}

/// A tenant's invoices and credit notes, newest period first.
pub async fn invoices(db: impl PgExecutor<'_>, tenant: Uuid) -> sqlx::Result<Vec<Invoice>> {
    sqlx::query_as!(
        Invoice,
        r#"SELECT id, tenant_id, period_start, kind, corrects, status, run_id, total_micros,
                  issued_at, created_at,
                  COALESCE(covers_from, period_start::timestamp AT TIME ZONE 'UTC') AS "covers_from!",
                  COALESCE(covers_until, (period_start + interval '1 month') AT TIME ZONE 'UTC')
                      AS "covers_until!",
                  built_at
         FROM invoices WHERE tenant_id = $1 ORDER BY period_start DESC, created_at DESC"#,
        tenant
    )
    .fetch_all(db)
    .await
}

/// One of `tenant`'s invoices (None for another tenant's).
pub async fn invoice(
    db: impl PgExecutor<'_>,
    tenant: Uuid,
    id: Uuid,
) -> sqlx::Result<Option<Invoice>> {
    sqlx::query_as!(
        Invoice,
        r#"SELECT id, tenant_id, period_start, kind, corrects, status, run_id, total_micros,
                  issued_at, created_at,
                  COALESCE(covers_from, period_start::timestamp AT TIME ZONE 'UTC') AS "covers_from!",
                  COALESCE(covers_until, (period_start + interval '1 month') AT TIME ZONE 'UTC')
                      AS "covers_until!",
                  built_at
         FROM invoices WHERE tenant_id = $1 AND id = $2"#,
        tenant,
        id
    )
    .fetch_optional(db)
    .await
}

/// The tenant (id, handle) an invoice belongs to, for the operator's view of any invoice.
pub async fn invoice_tenant(
    db: impl PgExecutor<'_>,
    id: Uuid,
) -> sqlx::Result<Option<(Uuid, String)>> {
    let row = sqlx::query!(
        "SELECT t.id, t.name FROM invoices i JOIN tenants t ON t.id = i.tenant_id WHERE i.id = $1",
        id
    )
    .fetch_optional(db)
    .await?;
    Ok(row.map(|r| (r.id, r.name)))
}

/// An entry of an invoice: usage per price key, a credit or an adjustment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    pub position: i32,
    /// 'usage', 'credit' or 'adjustment'.
    pub kind: String,
    pub description: String,
    pub price_key: Option<String>,
    pub events: i64,
    pub fresh_tokens: i64,
    pub cached_tokens: i64,
    pub output_tokens: i64,
    pub amount_micros: i64,
}

/// The entries of one of `tenant`'s invoices, in order (empty for another tenant's).
pub async fn invoice_entries(
    db: impl PgExecutor<'_>,
    tenant: Uuid,
    id: Uuid,
) -> sqlx::Result<Vec<Entry>> {
    sqlx::query_as!(
        Entry,
        "SELECT x.position, x.kind, x.description, x.price_key, x.events, x.fresh_tokens,
                x.cached_tokens, x.output_tokens, x.amount_micros
         FROM invoice_entries x JOIN invoices i ON i.id = x.invoice_id
         WHERE i.tenant_id = $1 AND x.invoice_id = $2 ORDER BY x.position",
        tenant,
        id
    )
    .fetch_all(db)
    .await
}

/// One rated event (a charge line).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Line {
    pub request_id: Uuid,
    pub started_at: OffsetDateTime,
    /// The model the request named ('' on lines rated before models were kept).
    pub served_name: String,
    pub price_key: String,
    pub price_version_id: Option<i64>,
    pub fresh_tokens: i64,
    pub cached_tokens: i64,
    pub output_tokens: i64,
    pub amount_micros: i64,
    /// '', 'partial', 'estimated' or 'unpriced'.
    pub flag: String,
}

/// The charge lines behind one of `tenant`'s invoices (each of its segments' run over the
/// segment), oldest first: the CSV download. Empty for another tenant's invoice.
pub async fn invoice_lines(pool: &PgPool, tenant: Uuid, id: Uuid) -> sqlx::Result<Vec<Line>> {
    sqlx::query_as!(
        Line,
        "SELECT c.request_id, c.started_at, c.served_name, c.price_key, c.price_version_id,
                c.fresh_tokens,
                c.cached_tokens, c.output_tokens, c.amount_micros, c.flag
         FROM invoices i
              JOIN invoice_sources s ON s.invoice_id = i.id
              JOIN usage_events e
                ON e.tenant_id = i.tenant_id
               AND e.started_at >= s.covers_from AND e.started_at < s.covers_until
              JOIN charge_lines c ON c.run_id = s.run_id AND c.request_id = e.request_id
         WHERE i.tenant_id = $1 AND i.id = $2
         ORDER BY e.started_at, e.request_id",
        tenant,
        id
    )
    .fetch_all(pool)
    .await
}

/// Grants `tenant` prepaid credit; returns the grant.
pub async fn grant_credit(
    db: impl PgExecutor<'_>,
    tenant: Uuid,
    amount_micros: i64,
    priority: i32,
    expires_at: Option<OffsetDateTime>,
    note: &str,
    by: &str,
) -> sqlx::Result<Uuid> {
    let id = Uuid::now_v7();
    sqlx::query!(
        "INSERT INTO credit_grants (id, tenant_id, amount_micros, priority, expires_at, note, granted_by)
         VALUES ($1, $2, $3, $4, $5, $6, $7)",
        id,
        tenant,
        amount_micros,
        priority,
        expires_at,
        note,
        by,
    )
    .execute(db)
    .await?;
    Ok(id)
}

/// A grant with what is left of it (issued invoices burned the rest).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Grant {
    pub id: Uuid,
    pub amount_micros: i64,
    pub remaining_micros: i64,
    pub priority: i32,
    pub expires_at: Option<OffsetDateTime>,
    pub note: String,
    pub granted_at: OffsetDateTime,
}

/// A tenant's grants in burn order.
pub async fn credit_grants(db: impl PgExecutor<'_>, tenant: Uuid) -> sqlx::Result<Vec<Grant>> {
    sqlx::query_as!(
        Grant,
        r#"SELECT c.id, c.amount_micros,
                  (c.amount_micros + COALESCE((
                    SELECT sum(x.amount_micros) FROM invoice_entries x
                    JOIN invoices i ON i.id = x.invoice_id
                    WHERE x.grant_id = c.id AND i.status = 'issued'), 0))::bigint AS "remaining_micros!",
                  c.priority, c.expires_at, c.note, c.granted_at
           FROM credit_grants c WHERE c.tenant_id = $1
           ORDER BY c.priority, c.expires_at NULLS LAST, c.granted_at, c.id"#,
        tenant
    )
    .fetch_all(db)
    .await
}

/// A tenant's remaining prepaid credit now: unexpired grants less what issued invoices burned.
pub async fn credit_balance(db: impl PgExecutor<'_>, tenant: Uuid) -> sqlx::Result<i64> {
    Ok(credit_balances(db, Some(tenant))
        .await?
        .first()
        .map_or(0, |(_, micros)| *micros))
}

/// Remaining prepaid credit now of one tenant (`Some`) or of every tenant with a grant, by
/// tenant: unexpired grants less what issued invoices burned (SQL function `credit_balance`,
/// migration 20261208100000, which the spend limit reads too).
pub async fn credit_balances(
    db: impl PgExecutor<'_>,
    tenant: Option<Uuid>,
) -> sqlx::Result<Vec<(Uuid, i64)>> {
    let rows = sqlx::query!(
        r#"SELECT t.tenant_id, credit_balance(t.tenant_id, now()) AS "micros!"
           FROM (SELECT DISTINCT tenant_id FROM credit_grants
                 WHERE ($1::uuid IS NULL OR tenant_id = $1)) t"#,
        tenant,
    )
    .fetch_all(db)
    .await?;
    Ok(rows.into_iter().map(|r| (r.tenant_id, r.micros)).collect())
}

/// One rated event for an export: the line and what the event says about it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rated {
    pub request_id: Uuid,
    pub tenant_id: Uuid,
    pub tenant_name: String,
    pub served_name: String,
    pub base_model: String,
    pub price_key: String,
    pub started_at: OffsetDateTime,
    pub status: String,
    pub provenance: String,
    pub prompt_tokens: i64,
    pub cached_tokens: i64,
    pub completion_tokens: i64,
    pub price_version_id: Option<i64>,
    pub amount_micros: i64,
    pub flag: String,
    /// Which endpoint served it (`chat`, `completions`, `responses`, `embeddings`, `messages`).
    pub endpoint: String,
    /// Of `completion_tokens`, the reasoning tokens the engine reported.
    pub reasoning_tokens: i64,
}

/// A page of the live run's lines for events started in `[since, until)`, after `after` (the
/// previous page's last `(started_at, request_id)`), oldest first.
pub async fn rated_usage(
    pool: &PgPool,
    since: OffsetDateTime,
    until: OffsetDateTime,
    after: Option<(OffsetDateTime, Uuid)>,
    limit: i64,
) -> sqlx::Result<Vec<Rated>> {
    let (after_t, after_id) = after.unzip();
    sqlx::query_as!(
        Rated,
        r#"SELECT c.request_id, c.tenant_id, COALESCE(t.name, '') AS "tenant_name!",
                  e.served_name, e.base_model, c.price_key, c.started_at, e.status, e.provenance,
                  e.prompt_tokens, e.cached_tokens, e.completion_tokens, c.price_version_id,
                  c.amount_micros, c.flag, e.endpoint, e.reasoning_tokens
           FROM usage_events e
                JOIN charge_lines c
                  ON c.run_id = (SELECT id FROM rating_runs WHERE kind = 'live')
                 AND c.request_id = e.request_id
                LEFT JOIN tenants t ON t.id = c.tenant_id
           WHERE e.started_at >= $1 AND e.started_at < $2
             AND ($3::timestamptz IS NULL OR (e.started_at, e.request_id) > ($3, $4::uuid))
           ORDER BY e.started_at, e.request_id
           LIMIT $5"#,
        since,
        until,
        after_t,
        after_id as Option<Uuid>,
        limit,
    )
    .fetch_all(pool)
    .await
}
