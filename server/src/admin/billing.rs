//! `admin prices`, `admin rerate`, `admin export`, `admin invoices` and `admin credit`: the
//! operator's side of billing (`tf_core::db::billing`). Amounts are integer micro-units.

use std::io::Write;

use anyhow::{bail, Context};
use sqlx::PgPool;
use tf_core::accounts;
use tf_core::db::billing as db;
use tf_core::money::Rates;
use time::{Date, Month, OffsetDateTime};

use super::{parse_time, say};
use crate::billing::export::{self, Format};
use crate::cli::{ExportFormat, InvoicesAction, InvoicesArgs, PricesAction, PricesArgs};

const BY: &str = "cli";

fn required_time(flag: &str, v: String) -> anyhow::Result<OffsetDateTime> {
    Ok(parse_time(flag, Some(v))?.unwrap_or_else(OffsetDateTime::now_utc))
}

/// `YYYY-MM` as the first day of that month.
pub fn parse_month(v: &str) -> anyhow::Result<Date> {
    let bad = || format!("--month {v:?} is not YYYY-MM");
    let (y, m) = v.split_once('-').with_context(bad)?;
    let y: i32 = y.parse().with_context(bad)?;
    let m: u8 = m.parse().with_context(bad)?;
    let month = Month::try_from(m).with_context(bad)?;
    Date::from_calendar_date(y, month, 1).with_context(bad)
}

pub async fn prices(pool: &PgPool, args: PricesArgs, out: &mut impl Write) -> anyhow::Result<()> {
    match args.action {
        PricesAction::Show { at } => {
            let at = parse_time("at", at)?.unwrap_or_else(OffsetDateTime::now_utc);
            let Some((version, prices)) = db::prices_at(pool, at).await? else {
                return say(out, "no price version in effect");
            };
            say(out, &format!("version {version}"))?;
            say(out, "price_key\ttier\tfresh/M\tcached/M\toutput/M")?;
            for p in prices {
                say(
                    out,
                    &format!(
                        "{}\t{}\t{}\t{}\t{}",
                        p.price_key,
                        p.tier,
                        p.rates.fresh_per_m,
                        p.rates.cached_per_m,
                        p.rates.output_per_m
                    ),
                )?;
            }
        }
        PricesAction::Set {
            key,
            tier,
            fresh,
            cached,
            output,
            from,
        } => {
            if fresh < 0 || cached < 0 || output < 0 {
                bail!("prices are micro-units per million tokens, never negative");
            }
            let from = parse_time("from", from)?.unwrap_or_else(OffsetDateTime::now_utc);
            let rates = Rates {
                fresh_per_m: fresh,
                cached_per_m: cached,
                output_per_m: output,
            };
            let Some(v) = db::set_price(pool, from, &key, &tier, rates, BY).await? else {
                bail!("prices only change going forward: --from must be after the latest version (see `admin prices versions`)");
            };
            say(out, &format!("price version {v} effective {from}"))?;
        }
        PricesAction::Versions => {
            say(out, "id\teffective_from\tcreated_by\tnote")?;
            for v in db::versions(pool).await? {
                say(
                    out,
                    &format!(
                        "{}\t{}\t{}\t{}",
                        v.id, v.effective_from, v.created_by, v.note
                    ),
                )?;
            }
        }
    }
    Ok(())
}

pub async fn rerate(
    pool: &PgPool,
    tenant: &str,
    since: String,
    until: String,
    version: Option<i64>,
    out: &mut impl Write,
) -> anyhow::Result<()> {
    let tenant = accounts::find_tenant(pool, tenant).await?;
    let (since, until) = (
        required_time("since", since)?,
        required_time("until", until)?,
    );
    if until <= since {
        bail!("--until must be after --since");
    }
    let version = match version {
        Some(v) => v,
        None => {
            db::prices_at(pool, OffsetDateTime::now_utc())
                .await?
                .context("no price version in effect")?
                .0
        }
    };
    let run = db::rerate(pool, tenant.id, since, until, version, BY).await?;
    let runs = db::runs_of(pool, tenant.id).await?;
    let this = runs.iter().find(|r| r.id == run);
    say(
        out,
        &format!(
            "rating run {run} for {} under version {version}: {} events, {} micros",
            tenant.name,
            this.map_or(0, |r| r.events),
            this.map_or(0, |r| r.amount_micros)
        ),
    )
}

pub async fn export(
    pool: &PgPool,
    format: ExportFormat,
    since: String,
    until: String,
    source: &str,
    out: &mut impl Write,
) -> anyhow::Result<()> {
    let format = match format {
        ExportFormat::Csv => Format::Csv,
        ExportFormat::Cloudevents => Format::CloudEvents,
        ExportFormat::Lago => Format::Lago,
    };
    let (since, until) = (
        required_time("since", since)?,
        required_time("until", until)?,
    );
    export::export(pool, format, since, until, source, out).await?;
    Ok(())
}

pub async fn invoices(
    pool: &PgPool,
    args: InvoicesArgs,
    out: &mut impl Write,
) -> anyhow::Result<()> {
    match args.action {
        InvoicesAction::List { tenant } => {
            let tenant = accounts::find_tenant(pool, &tenant).await?;
            say(out, "id\tmonth\tkind\tstatus\ttotal_micros")?;
            for i in db::invoices(pool, tenant.id).await? {
                say(
                    out,
                    &format!(
                        "{}\t{}\t{}\t{}\t{}",
                        i.id, i.period_start, i.kind, i.status, i.total_micros
                    ),
                )?;
            }
        }
        InvoicesAction::Build { tenant, month, run } => {
            let tenant = accounts::find_tenant(pool, &tenant).await?;
            let month = parse_month(&month)?;
            let run = match run {
                Some(r) => r,
                None => db::live_run(pool).await?,
            };
            match db::build_draft(pool, tenant.id, month, run).await? {
                db::Draft::Built(id) => say(out, &format!("draft {id}"))?,
                db::Draft::AlreadyIssued(id) => {
                    bail!("{month} is invoiced by issued invoice {id}: correct it first")
                }
            }
        }
        InvoicesAction::Issue { id } => {
            if !db::issue(pool, id, BY).await? {
                bail!("{id} is not a draft");
            }
            say(out, &format!("issued {id}"))?;
        }
        InvoicesAction::Adjust {
            id,
            description,
            amount,
        } => {
            if !db::adjust(pool, id, &description, amount).await? {
                bail!("{id} is not a draft");
            }
            say(out, &format!("adjusted {id} by {amount}"))?;
        }
        InvoicesAction::Correct { id } => {
            let Some(note) = db::correct(pool, id, BY).await? else {
                bail!("{id} is not an issued, uncorrected invoice");
            };
            say(
                out,
                &format!("credit note {note} issued; build the month again"),
            )?;
        }
    }
    Ok(())
}

pub async fn credit(
    pool: &PgPool,
    tenant: &str,
    amount: i64,
    priority: i32,
    expires: Option<String>,
    note: &str,
    out: &mut impl Write,
) -> anyhow::Result<()> {
    if amount <= 0 {
        bail!("--amount must be positive");
    }
    let tenant = accounts::find_tenant(pool, tenant).await?;
    let expires = parse_time("expires", expires)?;
    let id = db::grant_credit(pool, tenant.id, amount, priority, expires, note, BY).await?;
    let balance = db::credit_balance(pool, tenant.id).await?;
    say(
        out,
        &format!("grant {id}; {} has {balance} micros of credit", tenant.name),
    )
}
