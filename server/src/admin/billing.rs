//! `admin prices`, `admin rerate`, `admin export`, `admin invoices` and `admin credit`: the
//! operator's side of billing. Changes go through `tf_core::billing_ops` (actor `cli`), the code
//! path of `/admin/prices` and `/admin/invoices`, which writes each action's audit row; reads are
//! `tf_core::db::billing`'s. Amounts are typed in currency (`5`, `$5.00`, `0.000125`; parsed
//! exactly by `tf_core::money::parse_money`), stored as integer micro-units, and echoed.

use std::io::Write;

use anyhow::{bail, Context};
use sqlx::PgPool;
use tf_core::accounts;
use tf_core::billing_ops::{self as ops, NewGrant, NewPrice};
use tf_core::db::billing as db;
use tf_core::db::documents;
use tf_core::db::periods;
use tf_core::money::{echo_money, Rates};
use tf_core::operator::Actor;
use time::{Date, Month, OffsetDateTime};

use super::{parse_time, say};
use crate::billing::export::{self, Format};
use crate::cli::{ExportFormat, InvoicesAction, InvoicesArgs, PricesAction, PricesArgs};

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
            let from = parse_time("from", from)?;
            let price = NewPrice {
                price_key: key,
                tier,
                rates: Rates {
                    fresh_per_m: fresh,
                    cached_per_m: cached,
                    output_per_m: output,
                },
            };
            let (v, from) = ops::set_prices(pool, &Actor::CLI, from, &[price])
                .await
                .map_err(|e| anyhow::anyhow!("{e} (see `admin prices versions`)"))?;
            say(
                out,
                &format!(
                    "price version {v} effective {from}: per million tokens fresh {}, cached {}, output {}",
                    echo_money(fresh),
                    echo_money(cached),
                    echo_money(output)
                ),
            )?;
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
    let run = ops::rerate(
        pool,
        &Actor::CLI,
        tenant.id,
        &tenant.name,
        since,
        until,
        version,
    )
    .await?;
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
        InvoicesAction::Build {
            tenant,
            month,
            run,
            live,
        } => {
            let tenant = accounts::find_tenant(pool, &tenant).await?;
            let month = parse_month(&month)?;
            let runs = match (live, run.is_empty()) {
                (false, true) => db::Runs::Kept,
                _ => db::Runs::Chosen(&run),
            };
            match ops::build_draft(pool, &Actor::CLI, tenant.id, month, runs).await? {
                db::Draft::Built(id) => {
                    say(out, &format!("draft {id}"))?;
                    for s in periods::sources(pool, id).await? {
                        say(
                            out,
                            &format!(
                                "  run {} for events from {} until {}",
                                s.run, s.from, s.until
                            ),
                        )?;
                    }
                }
                db::Draft::AlreadyIssued(id) => {
                    bail!("{month} is invoiced by issued invoice {id}: correct it first")
                }
                db::Draft::RunRefused(r) => bail!("run {r} cannot be used for {month}"),
            }
        }
        InvoicesAction::Close { tenant, month, at } => {
            let tenant = accounts::find_tenant(pool, &tenant).await?;
            let month = parse_month(&month)?;
            let at = parse_time("at", at)?.unwrap_or_else(OffsetDateTime::now_utc);
            ops::close_period(pool, &Actor::CLI, tenant.id, &tenant.name, month, at).await?;
            say(
                out,
                &format!(
                    "{} {month} closed at {at}; usage from then on is on the next month's invoice",
                    tenant.name
                ),
            )?;
        }
        InvoicesAction::Issue { id } => {
            ops::issue(pool, &Actor::CLI, id).await?;
            let number = documents::of_invoice(pool, None, id)
                .await?
                .and_then(|d| d.number)
                .unwrap_or_default();
            say(out, &format!("issued {id} as {number}"))?;
        }
        InvoicesAction::Issuer {
            name,
            address,
            due_days,
        } => {
            let was = documents::issuer(pool).await?;
            let new = documents::Issuer {
                name: name.unwrap_or_else(|| was.name.clone()),
                address: address.map_or_else(|| was.address.clone(), |a| a.replace("\\n", "\n")),
                due_days: due_days.unwrap_or(was.due_days),
            };
            if new != was {
                ops::set_issuer(pool, &Actor::CLI, &new).await?;
            }
            let now = documents::issuer(pool).await?;
            say(
                out,
                &format!(
                    "issuer: {}\naddress: {}\ndue: {} days after issue",
                    now.name,
                    now.address.replace('\n', " / "),
                    now.due_days
                ),
            )?;
        }
        InvoicesAction::Adjust {
            id,
            description,
            amount,
        } => {
            ops::adjust(pool, &Actor::CLI, id, &description, amount).await?;
            say(out, &format!("adjusted {id} by {}", echo_money(amount)))?;
        }
        InvoicesAction::Correct { id } => {
            let note = ops::correct(pool, &Actor::CLI, id).await?;
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
    let grant = NewGrant {
        tenant: tenant.id,
        tenant_name: &tenant.name,
        amount_micros: amount,
        priority,
        expires_at: expires,
        note,
    };
    let id = ops::grant_credit(pool, &Actor::CLI, &grant).await?;
    let balance = db::credit_balance(pool, tenant.id).await?;
    say(
        out,
        &format!(
            "grant {id} of {}; {} has {balance} micros of credit",
            echo_money(amount),
            tenant.name
        ),
    )
}
