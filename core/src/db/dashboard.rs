//! The tenant home's figures: this month's usage totals and the models the tenant may call, each
//! one statement scoped by the tenant. Totals are computed in PostgreSQL (a month of events never
//! travels to Rust), with the per-event price formula of [`crate::money::cost_micros`] (as in
//! [`super::spend`]).

use sqlx::PgPool;
use time::OffsetDateTime;
use uuid::Uuid;

/// A tenant's usage since a point in time.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Totals {
    /// Requests that reached an engine (refusals excluded).
    pub requests: i64,
    pub prompt_tokens: i64,
    pub cached_tokens: i64,
    pub completion_tokens: i64,
    /// Cost in micro-units, each event rounded up as billed.
    pub cost_micros: i64,
}

/// The tenant's totals of the events started at or after `since`.
pub async fn totals_since(
    pool: &PgPool,
    tenant_id: Uuid,
    since: OffsetDateTime,
) -> sqlx::Result<Totals> {
    sqlx::query_as!(
        Totals,
        r#"SELECT count(*) AS "requests!",
                  COALESCE(SUM(e.prompt_tokens), 0)::bigint AS "prompt_tokens!",
                  COALESCE(SUM(e.cached_tokens), 0)::bigint AS "cached_tokens!",
                  COALESCE(SUM(e.completion_tokens), 0)::bigint AS "completion_tokens!",
                  COALESCE(SUM(((e.prompt_tokens + e.completion_tokens) * b.micros_per_1k_tokens + 999) / 1000), 0)::bigint AS "cost_micros!"
           FROM usage_events e LEFT JOIN base_models b ON b.name = e.base_model
           WHERE e.tenant_id = $1 AND e.started_at >= $2 AND e.status <> 'rejected'"#,
        tenant_id,
        since,
    )
    .fetch_one(pool)
    .await
}

/// A model the tenant may call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UsableModel {
    /// The name to put in `model`.
    pub name: String,
    /// For an adapter, the base it runs on; `None` for a base model.
    pub base: Option<String>,
    /// Price in micro-units per 1000 tokens.
    pub micros_per_1k_tokens: i64,
}

/// What the gateway's route table lets the tenant call (see `RouteTable::visible`): every offered
/// base, then the tenant's ready adapters, each sorted by name.
pub async fn usable_models(pool: &PgPool, tenant_id: Uuid) -> sqlx::Result<Vec<UsableModel>> {
    sqlx::query_as!(
        UsableModel,
        r#"SELECT name AS "name!", base AS "base?", micros AS "micros_per_1k_tokens!" FROM (
               SELECT 0 AS kind, b.name, NULL::text AS base, b.micros_per_1k_tokens AS micros
               FROM base_models b WHERE b.offered
               UNION ALL
               SELECT 1, a.name, b.name, b.micros_per_1k_tokens
               FROM adapters a JOIN base_models b ON b.id = a.base_model_id
               WHERE a.tenant_id = $1 AND a.state = 'ready'
           ) m ORDER BY kind, name"#,
        tenant_id,
    )
    .fetch_all(pool)
    .await
}
