//! Limits of tenants and keys (`tenant_limits`, `key_limits`; NULL: no limit of that kind). Every
//! write fires `tf_limits_changed`, so replicas drop their cached limits within a second.

use sqlx::PgPool;
use uuid::Uuid;

/// One limit in an update: left as it is, or set to a value (`None` removes the limit).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Change {
    /// Whether the limit is written at all.
    pub given: bool,
    /// The value written when `given`.
    pub value: Option<i64>,
}

/// Rate and spend limits of one subject (a tenant or a key); `None`: unlimited.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RateRow {
    pub requests_per_minute: Option<i64>,
    pub tokens_per_minute: Option<i64>,
    pub spend_limit_micros: Option<i64>,
}

/// A tenant's concurrency caps (each per graph).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CapsRow {
    pub max_in_flight: Option<i64>,
    pub max_long_prompts: Option<i64>,
    pub long_prompt_tokens: Option<i64>,
}

/// What may change in a subject's rates.
#[derive(Debug, Clone, Copy, Default)]
pub struct RateChange {
    pub requests_per_minute: Change,
    pub tokens_per_minute: Change,
    pub spend_limit_micros: Change,
}

/// What may change in a tenant's caps.
#[derive(Debug, Clone, Copy, Default)]
pub struct CapsChange {
    pub max_in_flight: Change,
    pub max_long_prompts: Change,
    pub long_prompt_tokens: Change,
}

/// Writes the given limits of a tenant (creating its row; limits not given stay as they were).
pub async fn update_tenant(
    pool: impl sqlx::PgExecutor<'_>,
    tenant_id: Uuid,
    rates: &RateChange,
    caps: &CapsChange,
) -> sqlx::Result<()> {
    let (r, c) = (rates, caps);
    sqlx::query!(
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
        tenant_id,
        r.requests_per_minute.given,
        r.requests_per_minute.value,
        r.tokens_per_minute.given,
        r.tokens_per_minute.value,
        r.spend_limit_micros.given,
        r.spend_limit_micros.value,
        c.max_in_flight.given,
        c.max_in_flight.value,
        c.max_long_prompts.given,
        c.max_long_prompts.value,
        c.long_prompt_tokens.given,
        c.long_prompt_tokens.value,
    )
    .execute(pool)
    .await?;
    Ok(())
}

/// Writes the given limits of a key of `tenant_id` (a key of another tenant is left untouched).
pub async fn update_key(
    pool: impl sqlx::PgExecutor<'_>,
    key_id: Uuid,
    tenant_id: Uuid,
    rates: &RateChange,
) -> sqlx::Result<()> {
    let r = rates;
    sqlx::query!(
        "INSERT INTO key_limits AS l (api_key_id, tenant_id, requests_per_minute, tokens_per_minute, spend_limit_micros)
         VALUES ($1, $2, $4, $6, $8)
         ON CONFLICT (api_key_id) DO UPDATE SET
           requests_per_minute = CASE WHEN $3 THEN $4 ELSE l.requests_per_minute END,
           tokens_per_minute = CASE WHEN $5 THEN $6 ELSE l.tokens_per_minute END,
           spend_limit_micros = CASE WHEN $7 THEN $8 ELSE l.spend_limit_micros END,
           updated_at = now()
         WHERE l.tenant_id = $2",
        key_id,
        tenant_id,
        r.requests_per_minute.given,
        r.requests_per_minute.value,
        r.tokens_per_minute.given,
        r.tokens_per_minute.value,
        r.spend_limit_micros.given,
        r.spend_limit_micros.value,
    )
    .execute(pool)
    .await?;
    Ok(())
}

/// A tenant's stored limits (`None`: it has no row, i.e. no limits).
pub async fn of_tenant(pool: &PgPool, tenant_id: Uuid) -> sqlx::Result<Option<(RateRow, CapsRow)>> {
    let row = sqlx::query!(
        "SELECT requests_per_minute, tokens_per_minute, spend_limit_micros,
                max_in_flight, max_long_prompts, long_prompt_tokens
         FROM tenant_limits WHERE tenant_id = $1",
        tenant_id,
    )
    .fetch_optional(pool)
    .await?;
    Ok(row.map(|r| {
        (
            RateRow {
                requests_per_minute: r.requests_per_minute,
                tokens_per_minute: r.tokens_per_minute,
                spend_limit_micros: r.spend_limit_micros,
            },
            CapsRow {
                max_in_flight: r.max_in_flight,
                max_long_prompts: r.max_long_prompts,
                long_prompt_tokens: r.long_prompt_tokens,
            },
        )
    }))
}

/// A key's stored limits (`None`: no row).
pub async fn of_key(pool: &PgPool, key_id: Uuid, tenant_id: Uuid) -> sqlx::Result<Option<RateRow>> {
    sqlx::query_as!(
        RateRow,
        "SELECT requests_per_minute, tokens_per_minute, spend_limit_micros
         FROM key_limits WHERE api_key_id = $1 AND tenant_id = $2",
        key_id,
        tenant_id,
    )
    .fetch_optional(pool)
    .await
}

/// Everything admission needs about one key in one round trip: its tenant's limits and caps and
/// its own limits (all `None` where no row exists).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct KeyLimitsRow {
    pub tenant: RateRow,
    pub caps: CapsRow,
    pub key: RateRow,
    /// The tenant's billing tier (`None`: no such tenant).
    pub tier: Option<String>,
}

/// The tenant's spend limit in it is the one enforced: the stored limit plus the tenant's
/// remaining prepaid credit (SQL `credit_balance`, as `/invoices` shows it), so a tenant's
/// charges count net of its credit. No stored limit stays no limit (credit never creates one);
/// key limits are the keys' own, without credit. The sum saturates at `i64::MAX`.
pub async fn for_key(pool: &PgPool, tenant_id: Uuid, key_id: Uuid) -> sqlx::Result<KeyLimitsRow> {
    let r = sqlx::query!(
        r#"SELECT t.requests_per_minute AS "t_rpm?", t.tokens_per_minute AS "t_tpm?",
                  CASE WHEN t.spend_limit_micros IS NOT NULL
                       THEN least(t.spend_limit_micros::numeric + credit_balance($1, now()),
                                  9223372036854775807)::bigint END AS "t_spend?",
                  t.max_in_flight AS "max_in_flight?", t.max_long_prompts AS "max_long_prompts?",
                  t.long_prompt_tokens AS "long_prompt_tokens?",
                  k.requests_per_minute AS "k_rpm?", k.tokens_per_minute AS "k_tpm?",
                  k.spend_limit_micros AS "k_spend?", tn.tier AS "tier?"
           FROM (SELECT 1) AS one
                LEFT JOIN tenant_limits t ON t.tenant_id = $1
                LEFT JOIN key_limits k ON k.api_key_id = $2 AND k.tenant_id = $1
                LEFT JOIN tenants tn ON tn.id = $1"#,
        tenant_id,
        key_id,
    )
    .fetch_one(pool)
    .await?;
    Ok(KeyLimitsRow {
        tenant: RateRow {
            requests_per_minute: r.t_rpm,
            tokens_per_minute: r.t_tpm,
            spend_limit_micros: r.t_spend,
        },
        caps: CapsRow {
            max_in_flight: r.max_in_flight,
            max_long_prompts: r.max_long_prompts,
            long_prompt_tokens: r.long_prompt_tokens,
        },
        key: RateRow {
            requests_per_minute: r.k_rpm,
            tokens_per_minute: r.k_tpm,
            spend_limit_micros: r.k_spend,
        },
        tier: r.tier,
    })
}
