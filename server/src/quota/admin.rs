//! `tokenfactory admin limits`: set and show the limits of a tenant or a key, with this period's
//! consumption from PostgreSQL (the billed truth, not Redis's approximate counters). Every write
//! fires `tf_limits_changed`, so replicas apply it within a second. Errors name what was wrong
//! (unknown tenant, unknown key, a cap given for a key) and change nothing.

use std::fmt::Write as _;
use std::str::FromStr;

use anyhow::{bail, Context};
use clap::Args;
use sqlx::PgPool;
use time::OffsetDateTime;
use uuid::Uuid;

use crate::cli::DbArgs;

/// A value flag: a number sets the limit, `none` removes it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Setting {
    Set(i64),
    Clear,
}

impl FromStr for Setting {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        if s.eq_ignore_ascii_case("none") {
            return Ok(Self::Clear);
        }
        match s.parse::<i64>() {
            Ok(n) if n >= 0 => Ok(Self::Set(n)),
            _ => Err(format!("{s:?} is not a non-negative integer or `none`")),
        }
    }
}

/// Flags of `admin limits`.
#[derive(Debug, Clone, Args)]
pub struct LimitsArgs {
    #[command(flatten)]
    pub db: DbArgs,
    /// The tenant (handle) whose limits to set or show.
    #[arg(long, required_unless_present = "key", conflicts_with = "key")]
    pub tenant: Option<String>,
    /// The key (visible prefix or whole key) whose limits to set or show.
    #[arg(long)]
    pub key: Option<String>,
    /// Requests per minute (`none` removes the limit).
    #[arg(long)]
    pub rpm: Option<Setting>,
    /// Prompt + completion tokens per minute (`none` removes the limit).
    #[arg(long)]
    pub tpm: Option<Setting>,
    /// Spend per calendar month (UTC) in micro-units (`none` removes the limit).
    #[arg(long)]
    pub spend_limit: Option<Setting>,
    /// Concurrent requests per graph (tenants only; `none` removes the cap).
    #[arg(long)]
    pub max_in_flight: Option<Setting>,
    /// Concurrent long prompts per graph (tenants only; `none` removes the cap).
    #[arg(long)]
    pub max_long_prompts: Option<Setting>,
    /// Prompt tokens from which a request counts as long (tenants only; `none`: server default).
    #[arg(long)]
    pub long_prompt_tokens: Option<Setting>,
}

type Pair = (bool, Option<i64>);

fn pair(s: Option<Setting>) -> Pair {
    match s {
        None => (false, None),
        Some(Setting::Clear) => (true, None),
        Some(Setting::Set(n)) => (true, Some(n)),
    }
}

/// Applies the flags (if any) and returns the report to print.
pub async fn run(pool: &PgPool, a: &LimitsArgs) -> anyhow::Result<String> {
    let (rpm, tpm, spend) = (pair(a.rpm), pair(a.tpm), pair(a.spend_limit));
    let caps = [
        pair(a.max_in_flight),
        pair(a.max_long_prompts),
        pair(a.long_prompt_tokens),
    ];
    let any_rate = rpm.0 || tpm.0 || spend.0;
    let any_cap = caps.iter().any(|c| c.0);
    if let Some(tenant) = &a.tenant {
        let t = tf_core::accounts::find_tenant(pool, tenant).await?;
        if any_rate || any_cap {
            sqlx::query(
                "INSERT INTO tenant_limits AS l (tenant_id, requests_per_minute, tokens_per_minute, spend_limit_micros,
                                                 max_in_flight, max_long_prompts, long_prompt_tokens)
                 VALUES ($1, $3, $5, $7, $9, $11, $13)
                 ON CONFLICT (tenant_id) DO UPDATE SET
                   requests_per_minute = CASE WHEN $2 THEN $3 ELSE l.requests_per_minute END,
                   tokens_per_minute = CASE WHEN $4 THEN $5 ELSE l.tokens_per_minute END,
                   spend_limit_micros = CASE WHEN $6 THEN $7 ELSE l.spend_limit_micros END,
                   max_in_flight = CASE WHEN $8 THEN $9 ELSE l.max_in_flight END,
                   max_long_prompts = CASE WHEN $10 THEN $11 ELSE l.max_long_prompts END,
                   long_prompt_tokens = CASE WHEN $12 THEN $13 ELSE l.long_prompt_tokens END,
                   updated_at = now()",
            )
            .bind(t.id)
            .bind(rpm.0).bind(rpm.1)
            .bind(tpm.0).bind(tpm.1)
            .bind(spend.0).bind(spend.1)
            .bind(caps[0].0).bind(caps[0].1)
            .bind(caps[1].0).bind(caps[1].1)
            .bind(caps[2].0).bind(caps[2].1)
            .execute(pool)
            .await?;
        }
        return show_tenant(pool, t.id, &t.name).await;
    }
    let given = a.key.as_deref().context("--tenant or --key is required")?;
    if any_cap {
        bail!("--max-in-flight, --max-long-prompts and --long-prompt-tokens are per tenant; use --tenant");
    }
    let prefix = tf_core::keys::visible_prefix(given);
    let (key_id, tenant_id): (Uuid, Uuid) =
        sqlx::query_as("SELECT id, tenant_id FROM api_keys WHERE prefix = $1")
            .bind(prefix)
            .fetch_optional(pool)
            .await?
            .with_context(|| format!("no key with prefix {prefix:?}"))?;
    if any_rate {
        sqlx::query(
            "INSERT INTO key_limits AS l (api_key_id, tenant_id, requests_per_minute, tokens_per_minute, spend_limit_micros)
             VALUES ($1, $2, $4, $6, $8)
             ON CONFLICT (api_key_id) DO UPDATE SET
               requests_per_minute = CASE WHEN $3 THEN $4 ELSE l.requests_per_minute END,
               tokens_per_minute = CASE WHEN $5 THEN $6 ELSE l.tokens_per_minute END,
               spend_limit_micros = CASE WHEN $7 THEN $8 ELSE l.spend_limit_micros END,
               updated_at = now()
             WHERE l.tenant_id = $2",
        )
        .bind(key_id)
        .bind(tenant_id)
        .bind(rpm.0).bind(rpm.1)
        .bind(tpm.0).bind(tpm.1)
        .bind(spend.0).bind(spend.1)
        .execute(pool)
        .await?;
    }
    show_key(pool, key_id, tenant_id, prefix).await
}

type Row = (
    Option<i64>,
    Option<i64>,
    Option<i64>,
    Option<i64>,
    Option<i64>,
    Option<i64>,
);

async fn show_tenant(pool: &PgPool, tenant: Uuid, name: &str) -> anyhow::Result<String> {
    let row: Option<Row> = sqlx::query_as(
        "SELECT requests_per_minute, tokens_per_minute, spend_limit_micros, max_in_flight, max_long_prompts, long_prompt_tokens
         FROM tenant_limits WHERE tenant_id = $1",
    )
    .bind(tenant)
    .fetch_optional(pool)
    .await?;
    let r = row.unwrap_or_default();
    let mut out = format!("tenant {name}\n");
    line(&mut out, "requests per minute", r.0);
    line(&mut out, "tokens per minute", r.1);
    line(&mut out, "spend limit (micros/month)", r.2);
    line(&mut out, "max in flight per graph", r.3);
    line(&mut out, "max long prompts per graph", r.4);
    line(&mut out, "long prompt from (tokens)", r.5);
    consumption(pool, &mut out, None, tenant).await?;
    Ok(out)
}

async fn show_key(pool: &PgPool, key: Uuid, tenant: Uuid, prefix: &str) -> anyhow::Result<String> {
    let row: Option<(Option<i64>, Option<i64>, Option<i64>)> = sqlx::query_as(
        "SELECT requests_per_minute, tokens_per_minute, spend_limit_micros FROM key_limits WHERE api_key_id = $1 AND tenant_id = $2",
    )
    .bind(key)
    .bind(tenant)
    .fetch_optional(pool)
    .await?;
    let r = row.unwrap_or_default();
    let mut out = format!("key {prefix}\n");
    line(&mut out, "requests per minute", r.0);
    line(&mut out, "tokens per minute", r.1);
    line(&mut out, "spend limit (micros/month)", r.2);
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
    let month = now
        .date()
        .replace_day(1)
        .map(|d| d.midnight().assume_utc())
        .unwrap_or(now);
    let (requests, tokens, spend): (i64, i64, i64) = sqlx::query_as(
        "SELECT count(*) FILTER (WHERE e.started_at >= now() - interval '1 minute'),
                COALESCE(SUM(e.prompt_tokens + e.completion_tokens) FILTER (WHERE e.started_at >= now() - interval '1 minute'), 0)::bigint,
                COALESCE(SUM(((e.prompt_tokens + e.completion_tokens) * b.micros_per_1k_tokens + 999) / 1000), 0)::bigint
         FROM usage_events e LEFT JOIN base_models b ON b.name = e.base_model
         WHERE e.tenant_id = $2 AND ($1::uuid IS NULL OR e.api_key_id = $1)
           AND e.started_at >= $3 AND e.status <> 'rejected'",
    )
    .bind(key)
    .bind(tenant)
    .bind(month)
    .fetch_one(pool)
    .await?;
    let _ = writeln!(out, "consumption (billed, PostgreSQL)");
    line(out, "requests, last minute", Some(requests));
    line(out, "tokens, last minute", Some(tokens));
    line(out, "spend this month (micros)", Some(spend));
    Ok(())
}
