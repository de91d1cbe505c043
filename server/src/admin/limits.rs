//! `tokenfactory admin limits`: set and show the limits of a tenant or a key, with this period's
//! consumption from PostgreSQL (the billed truth, not Redis's approximate counters). Every write
//! fires `tf_limits_changed`, so replicas apply it within a second, and is audit-logged (actor
//! `cli`) through `tf_core::operator`, the code path the admin pages use too. Errors name what was wrong
//! (unknown tenant, unknown key, a cap given for a key) and change nothing.

use std::fmt::Write as _;

use anyhow::{bail, Context};
use sqlx::PgPool;
use tf_core::db::limits::{self, CapsChange, Change, RateChange};
use tf_core::db::spend;
use tf_core::operator::{self, Actor};
use time::OffsetDateTime;
use uuid::Uuid;

use crate::cli::{LimitsArgs, MoneySetting, Setting};

fn money_change(s: Option<MoneySetting>) -> Change {
    change(s.map(|m| match m {
        MoneySetting::Set(n) => Setting::Set(n),
        MoneySetting::Clear => Setting::Clear,
    }))
}

fn change(s: Option<Setting>) -> Change {
    match s {
        None => Change::default(),
        Some(Setting::Clear) => Change {
            given: true,
            value: None,
        },
        Some(Setting::Set(n)) => Change {
            given: true,
            value: Some(n),
        },
    }
}

/// Applies the flags (if any) and returns the report to print.
pub async fn run(pool: &PgPool, a: &LimitsArgs) -> anyhow::Result<String> {
    let rates = RateChange {
        requests_per_minute: change(a.rpm),
        tokens_per_minute: change(a.tpm),
        spend_limit_micros: money_change(a.spend_limit),
    };
    let caps = CapsChange {
        max_in_flight: change(a.max_in_flight),
        max_long_prompts: change(a.max_long_prompts),
        long_prompt_tokens: change(a.long_prompt_tokens),
    };
    let any_rate = rates.requests_per_minute.given
        || rates.tokens_per_minute.given
        || rates.spend_limit_micros.given;
    let any_cap =
        caps.max_in_flight.given || caps.max_long_prompts.given || caps.long_prompt_tokens.given;
    if let Some(tenant) = &a.tenant {
        let t = tf_core::accounts::find_tenant(pool, tenant).await?;
        if any_rate || any_cap {
            operator::set_tenant_limits(pool, &Actor::CLI, &t, &rates, &caps).await?;
        }
        return show_tenant(pool, t.id, &t.name).await;
    }
    let given = a.key.as_deref().context("--tenant or --key is required")?;
    if any_cap {
        bail!("--max-in-flight, --max-long-prompts and --long-prompt-tokens are per tenant; use --tenant");
    }
    let prefix = tf_core::keys::visible_prefix(given);
    let key = tf_core::db::keys::by_prefix(pool, prefix)
        .await?
        .with_context(|| format!("no key with prefix {prefix:?}"))?;
    if any_rate {
        operator::set_key_limits(pool, &Actor::CLI, key.tenant_id, prefix, &rates).await?;
    }
    show_key(pool, key.id, key.tenant_id, prefix).await
}

async fn show_tenant(pool: &PgPool, tenant: Uuid, name: &str) -> anyhow::Result<String> {
    let (r, c) = limits::of_tenant(pool, tenant).await?.unwrap_or_default();
    let mut out = format!("tenant {name}\n");
    line(&mut out, "requests per minute", r.requests_per_minute);
    line(&mut out, "tokens per minute", r.tokens_per_minute);
    line(&mut out, "spend limit (micros/month)", r.spend_limit_micros);
    line(&mut out, "max in flight per graph", c.max_in_flight);
    line(&mut out, "max long prompts per graph", c.max_long_prompts);
    line(&mut out, "long prompt from (tokens)", c.long_prompt_tokens);
    consumption(pool, &mut out, None, tenant).await?;
    Ok(out)
}

async fn show_key(pool: &PgPool, key: Uuid, tenant: Uuid, prefix: &str) -> anyhow::Result<String> {
    let r = limits::of_key(pool, key, tenant).await?.unwrap_or_default();
    let mut out = format!("key {prefix}\n");
    line(&mut out, "requests per minute", r.requests_per_minute);
    line(&mut out, "tokens per minute", r.tokens_per_minute);
    line(&mut out, "spend limit (micros/month)", r.spend_limit_micros);
    consumption(pool, &mut out, Some(key), tenant).await?;
    Ok(out)
}

fn line(out: &mut String, what: &str, v: Option<i64>) {
    let v = v.map_or_else(|| "unlimited".to_owned(), |n| n.to_string());
    let _ = writeln!(out, "  {what:<28} {v}");
}

/// Requests and tokens in the last minute, spend billed this month (refusals excluded).
async fn consumption(
    pool: &PgPool,
    out: &mut String,
    key: Option<Uuid>,
    tenant: Uuid,
) -> anyhow::Result<()> {
    let now = OffsetDateTime::now_utc();
    let month = tf_core::period::month_of(now);
    let c = spend::consumption(pool, tenant, key, month).await?;
    let _ = writeln!(out, "consumption (billed, PostgreSQL)");
    line(out, "requests, last minute", Some(c.requests_last_minute));
    line(out, "tokens, last minute", Some(c.tokens_last_minute));
    line(out, "spend this month (micros)", Some(c.spend_micros));
    Ok(())
}
