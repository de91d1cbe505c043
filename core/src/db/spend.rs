//! Spend billed in PostgreSQL: what the spend reconciler raises Redis's counters to, and what
//! `admin limits` shows. Refused requests cost nothing (they carry no tokens).
//!
//! These two statements price each event in SQL, `((prompt + completion) * micros_per_1k + 999)
//! / 1000`, the formula of [`crate::money::cost_micros`], instead of calling it: the reconciler
//! sums a month of events for every limited subject on every pass, and shipping each event to
//! Rust to price it would move the whole month's rows per pass. The test below proves both agree.

use sqlx::PgPool;
use time::OffsetDateTime;
use uuid::Uuid;

/// Whose spend a row is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Subject {
    Tenant(Uuid),
    Key(Uuid),
}

/// Billed spend since `since` of every tenant and key that has a spend limit (zero when it has no
/// events).
pub async fn billed_by_limited_subject(
    pool: &PgPool,
    since: OffsetDateTime,
) -> sqlx::Result<Vec<(Subject, i64)>> {
    let rows = sqlx::query!(
        r#"SELECT 't' AS "kind!", l.tenant_id AS "id!",
                  COALESCE(SUM(((e.prompt_tokens + e.completion_tokens) * b.micros_per_1k_tokens + 999) / 1000), 0)::bigint AS "billed!"
           FROM tenant_limits l
                LEFT JOIN usage_events e ON e.tenant_id = l.tenant_id AND e.started_at >= $1
                LEFT JOIN base_models b ON b.name = e.base_model
           WHERE l.spend_limit_micros IS NOT NULL
           GROUP BY l.tenant_id
           UNION ALL
           SELECT 'k', l.api_key_id,
                  COALESCE(SUM(((e.prompt_tokens + e.completion_tokens) * b.micros_per_1k_tokens + 999) / 1000), 0)::bigint
           FROM key_limits l
                LEFT JOIN usage_events e ON e.api_key_id = l.api_key_id AND e.tenant_id = l.tenant_id AND e.started_at >= $1
                LEFT JOIN base_models b ON b.name = e.base_model
           WHERE l.spend_limit_micros IS NOT NULL
           GROUP BY l.api_key_id"#,
        since,
    )
    .fetch_all(pool)
    .await?;
    Ok(rows
        .into_iter()
        .map(|r| {
            let subject = if r.kind == "t" {
                Subject::Tenant(r.id)
            } else {
                Subject::Key(r.id)
            };
            (subject, r.billed)
        })
        .collect())
}

/// A subject's recent use and billed spend.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Consumption {
    /// Requests started in the last minute (refusals excluded).
    pub requests_last_minute: i64,
    /// Prompt + completion tokens of those requests.
    pub tokens_last_minute: i64,
    /// Spend of the events since `month_start`, in micro-units.
    pub spend_micros: i64,
}

/// Consumption of a tenant, or of one of its keys when `key` is given.
pub async fn consumption(
    pool: &PgPool,
    tenant: Uuid,
    key: Option<Uuid>,
    month_start: OffsetDateTime,
) -> sqlx::Result<Consumption> {
    sqlx::query_as!(
        Consumption,
        r#"SELECT count(*) FILTER (WHERE e.started_at >= now() - interval '1 minute') AS "requests_last_minute!",
                  COALESCE(SUM(e.prompt_tokens + e.completion_tokens) FILTER (WHERE e.started_at >= now() - interval '1 minute'), 0)::bigint AS "tokens_last_minute!",
                  COALESCE(SUM(((e.prompt_tokens + e.completion_tokens) * b.micros_per_1k_tokens + 999) / 1000), 0)::bigint AS "spend_micros!"
           FROM usage_events e LEFT JOIN base_models b ON b.name = e.base_model
           WHERE e.tenant_id = $2 AND ($1::uuid IS NULL OR e.api_key_id = $1)
             AND e.started_at >= $3 AND e.status <> 'rejected'"#,
        key as Option<Uuid>,
        tenant,
        month_start,
    )
    .fetch_one(pool)
    .await
}
