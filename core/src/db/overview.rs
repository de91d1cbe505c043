//! What the admin pages list: every tenant (a page at a time, by handle, with this month's usage
//! from the `usage_daily` rollup, so a page costs a few index lookups however many events there
//! are) and every portal user (a page at a time, by email). Keyset-paginated, never OFFSET.

use sqlx::PgExecutor;
use time::{Date, OffsetDateTime};
use uuid::Uuid;

use crate::tenancy::{Role, Tenant, TenantStatus};

/// One tenant as `/admin/tenants` lists it.
#[derive(Debug, Clone)]
pub struct TenantSummary {
    pub id: Uuid,
    pub name: String,
    pub display_name: String,
    pub status: TenantStatus,
    pub created_at: OffsetDateTime,
    /// Portal users of the tenant.
    pub users: i64,
    /// Keys that still work (not revoked, not past a rotation's grace period).
    pub active_keys: i64,
    /// Since the month's first day (UTC), from the rollup.
    pub requests: i64,
    pub tokens: i64,
    pub cost_micros: i64,
}

/// Tenants whose handle sorts after `after` (all when `None`), in handle order, with their usage
/// since `month_start`.
pub async fn tenant_page(
    db: impl PgExecutor<'_>,
    after: Option<&str>,
    month_start: Date,
    limit: i64,
) -> sqlx::Result<Vec<TenantSummary>> {
    sqlx::query_as!(
        TenantSummary,
        r#"SELECT t.id, t.name, t.display_name, t.status AS "status: TenantStatus", t.created_at,
                  (SELECT count(*) FROM users u WHERE u.tenant_id = t.id) AS "users!",
                  (SELECT count(*) FROM api_keys k
                    WHERE k.tenant_id = t.id AND k.revoked_at IS NULL
                      AND (k.expires_at IS NULL OR k.expires_at > now())) AS "active_keys!",
                  COALESCE(m.requests, 0)::bigint AS "requests!",
                  COALESCE(m.tokens, 0)::bigint AS "tokens!",
                  COALESCE(m.cost, 0)::bigint AS "cost_micros!"
           FROM tenants t
                LEFT JOIN LATERAL (
                    SELECT SUM(d.requests) AS requests,
                           SUM(d.prompt_tokens + d.completion_tokens) AS tokens,
                           SUM(d.cost_micros) AS cost
                    FROM usage_daily d WHERE d.tenant_id = t.id AND d.day >= $2
                ) m ON true
           WHERE ($1::text IS NULL OR t.name > $1)
           ORDER BY t.name LIMIT $3"#,
        after,
        month_start,
        limit,
    )
    .fetch_all(db)
    .await
}

/// A tenant's usage of one model since a day, from the rollup.
#[derive(Debug, Clone)]
pub struct ModelMonth {
    pub served_name: String,
    pub requests: i64,
    pub prompt_tokens: i64,
    pub completion_tokens: i64,
    pub cost_micros: i64,
}

/// The tenant's usage per model since `since` (the detail page's month), largest cost first.
pub async fn tenant_models_since(
    db: impl PgExecutor<'_>,
    tenant_id: Uuid,
    since: Date,
) -> sqlx::Result<Vec<ModelMonth>> {
    sqlx::query_as!(
        ModelMonth,
        r#"SELECT served_name, SUM(requests)::bigint AS "requests!",
                  SUM(prompt_tokens)::bigint AS "prompt_tokens!",
                  SUM(completion_tokens)::bigint AS "completion_tokens!",
                  SUM(cost_micros)::bigint AS "cost_micros!"
           FROM usage_daily WHERE tenant_id = $1 AND day >= $2
           GROUP BY served_name ORDER BY 5 DESC, 1"#,
        tenant_id,
        since,
    )
    .fetch_all(db)
    .await
}

/// Sets a tenant's status by id; returns the tenant as it now is (`None`: no such tenant).
pub async fn set_status(
    db: impl PgExecutor<'_>,
    tenant_id: Uuid,
    status: TenantStatus,
) -> sqlx::Result<Option<Tenant>> {
    sqlx::query_as!(
        Tenant,
        r#"UPDATE tenants SET status = $2 WHERE id = $1
           RETURNING id, name, display_name, status AS "status: TenantStatus""#,
        tenant_id,
        status as TenantStatus,
    )
    .fetch_optional(db)
    .await
}

/// One portal user as `/admin/users` lists it.
#[derive(Debug, Clone)]
pub struct UserSummary {
    pub id: Uuid,
    pub email: String,
    pub role: Role,
    pub tenant_name: Option<String>,
    pub created_at: OffsetDateTime,
    /// Portal sessions stored for the user (some may have expired, not yet purged).
    pub sessions: i64,
}

/// Users whose email sorts after `after`, in email order.
pub async fn user_page(
    db: impl PgExecutor<'_>,
    after: Option<&str>,
    limit: i64,
) -> sqlx::Result<Vec<UserSummary>> {
    sqlx::query_as!(
        UserSummary,
        r#"SELECT u.id, u.email, u.role AS "role: Role", t.name AS "tenant_name?", u.created_at,
                  (SELECT count(*) FROM portal_sessions s
                    WHERE s.user_id = u.id AND s.expiry_date > now()) AS "sessions!"
           FROM users u LEFT JOIN tenants t ON t.id = u.tenant_id
           WHERE ($1::text IS NULL OR u.email > $1)
           ORDER BY u.email LIMIT $2"#,
        after,
        limit,
    )
    .fetch_all(db)
    .await
}

/// A tenant's keys with their own limits, for the detail page's limit forms.
#[derive(Debug, Clone)]
pub struct KeyWithLimits {
    pub id: Uuid,
    pub name: String,
    pub prefix: String,
    pub revoked: bool,
    pub requests_per_minute: Option<i64>,
    pub tokens_per_minute: Option<i64>,
    pub spend_limit_micros: Option<i64>,
}

pub async fn keys_with_limits(
    db: impl PgExecutor<'_>,
    tenant_id: Uuid,
) -> sqlx::Result<Vec<KeyWithLimits>> {
    sqlx::query_as!(
        KeyWithLimits,
        r#"SELECT k.id, k.name, k.prefix,
                  (k.revoked_at IS NOT NULL OR COALESCE(k.expires_at <= now(), false)) AS "revoked!",
                  l.requests_per_minute AS "requests_per_minute?",
                  l.tokens_per_minute AS "tokens_per_minute?",
                  l.spend_limit_micros AS "spend_limit_micros?"
           FROM api_keys k LEFT JOIN key_limits l ON l.api_key_id = k.id AND l.tenant_id = k.tenant_id
           WHERE k.tenant_id = $1
           ORDER BY (k.revoked_at IS NULL) DESC, k.created_at DESC"#,
        tenant_id,
    )
    .fetch_all(db)
    .await
}
