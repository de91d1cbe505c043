//! The tenant home's figures: this month's usage totals and the models the tenant may call, each
//! one statement scoped by the tenant. Totals are computed in PostgreSQL (a month of events never
//! travels to Rust); the cost is the `usage_daily` rollup's, priced by the one cost function (as
//! [`super::spend`] and the invoices count it).

use sqlx::PgPool;
use time::Date;
use uuid::Uuid;

use crate::money::Rates;

/// A tenant's usage since a point in time.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Totals {
    /// Requests that reached an engine (refusals excluded).
    pub requests: i64,
    pub prompt_tokens: i64,
    pub cached_tokens: i64,
    pub completion_tokens: i64,
    /// Cost in micro-units, each event rounded once, as billed.
    pub cost_micros: i64,
}

/// The tenant's totals of the events started on or after the UTC day `since`.
pub async fn totals_since(pool: &PgPool, tenant_id: Uuid, since: Date) -> sqlx::Result<Totals> {
    sqlx::query_as!(
        Totals,
        r#"SELECT count(*) AS "requests!",
                  COALESCE(SUM(e.prompt_tokens), 0)::bigint AS "prompt_tokens!",
                  COALESCE(SUM(e.cached_tokens), 0)::bigint AS "cached_tokens!",
                  COALESCE(SUM(e.completion_tokens), 0)::bigint AS "completion_tokens!",
                  (SELECT COALESCE(SUM(d.cost_micros), 0)::bigint FROM usage_daily d
                   WHERE d.tenant_id = $1 AND d.day >= $2) AS "cost_micros!"
           FROM usage_events e
           WHERE e.tenant_id = $1 AND e.started_at >= $2::date::timestamp AT TIME ZONE 'UTC'
             AND e.status <> 'rejected'"#,
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
    /// What the tenant pays for it now (its tier's price, else the standard one); `None`: no
    /// price is set, so it costs nothing.
    pub rates: Option<Rates>,
}

/// What the gateway's route table lets the tenant call (see `RouteTable::visible`): every offered
/// base, then the tenant's serving adapters (ready, or unloaded for idleness and loaded again by
/// the next request), each sorted by name, with the price in effect now.
pub async fn usable_models(pool: &PgPool, tenant_id: Uuid) -> sqlx::Result<Vec<UsableModel>> {
    let rows = sqlx::query!(
        r#"SELECT m.name AS "name!", m.base AS "base?", p.fresh_input_per_m AS "fresh?",
                  p.cached_input_per_m AS "cached?", p.output_per_m AS "output?"
           FROM (
               SELECT 0 AS kind, b.name, NULL::text AS base, b.price_key
               FROM base_models b WHERE b.offered
               UNION ALL
               SELECT 1, a.name, b.name, a.price_key
               FROM adapters a JOIN base_models b ON b.id = a.base_model_id
               WHERE a.tenant_id = $1
                     AND a.state IN ('ready', 'unloading', 'unloaded', 'reloading')
           ) m LEFT JOIN LATERAL price_of_event($1, m.price_key, m.name, m.kind = 1, now()) p ON true
           ORDER BY m.kind, m.name"#,
        tenant_id,
    )
    .fetch_all(pool)
    .await?;
    Ok(rows
        .into_iter()
        .map(|r| UsableModel {
            name: r.name,
            base: r.base,
            rates: match (r.fresh, r.cached, r.output) {
                (Some(fresh_per_m), Some(cached_per_m), Some(output_per_m)) => Some(Rates {
                    fresh_per_m,
                    cached_per_m,
                    output_per_m,
                }),
                _ => None,
            },
        })
        .collect())
}
