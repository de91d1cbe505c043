//! The catalog: base models (one serving graph each), tenants' adapters on them, and the routes
//! the gateway's resolution table is built from. Every write fires `tf_catalog_changed`.

use sqlx::PgPool;
use uuid::Uuid;

/// A base model as a fleet backend registers it.
pub struct BaseUpsert<'a> {
    pub name: &'a str,
    pub graph: &'a str,
    pub upstream_url: &'a str,
    pub upstream_model: &'a str,
    pub continuous_usage: bool,
    /// `None`: the gateway's default deny-list.
    pub denied_fields: Option<&'a [String]>,
    /// The stored name of the prompt estimator (`byte-bound`, `sim-words`).
    pub prompt_estimator: &'a str,
    /// The stored name of the base's kind (`chat`, `embedding`).
    pub kind: &'a str,
    /// `None`: the gateway's default `nvext` allow-list.
    pub nvext_allowed: Option<&'a [String]>,
}

/// Upserts `bases` of `fleet` in one transaction; a base that moved (new port) gets its new URL.
/// Price key and price are kept on update (an operator's choice, not the backend's).
pub async fn upsert_bases(
    pool: &PgPool,
    fleet: &str,
    bases: &[BaseUpsert<'_>],
) -> sqlx::Result<()> {
    let mut tx = pool.begin().await?;
    for b in bases {
        sqlx::query!(
            "INSERT INTO base_models (id, name, graph, fleet, upstream_url, upstream_model, continuous_usage, price_key,
                 denied_fields, prompt_estimator, kind, nvext_allowed)
             VALUES ($1, $2, $3, $4, $5, $6, $7, $2, $8, $9, $10, $11)
             ON CONFLICT (name) DO UPDATE SET graph = EXCLUDED.graph, fleet = EXCLUDED.fleet,
                 upstream_url = EXCLUDED.upstream_url, upstream_model = EXCLUDED.upstream_model,
                 continuous_usage = EXCLUDED.continuous_usage, denied_fields = EXCLUDED.denied_fields,
                 prompt_estimator = EXCLUDED.prompt_estimator, kind = EXCLUDED.kind,
                 nvext_allowed = EXCLUDED.nvext_allowed",
            Uuid::now_v7(),
            b.name,
            b.graph,
            fleet,
            b.upstream_url,
            b.upstream_model,
            b.continuous_usage,
            b.denied_fields as Option<&[String]>,
            b.prompt_estimator,
            b.kind,
            b.nvext_allowed as Option<&[String]>,
        )
        .execute(&mut *tx)
        .await?;
    }
    tx.commit().await
}

/// Records a tenant's adapter on the base named `base` (idempotent by tenant and name; nothing
/// happens when no such base exists).
pub async fn upsert_adapter(
    pool: &PgPool,
    tenant_id: Uuid,
    name: &str,
    base: &str,
    upstream_model: &str,
) -> sqlx::Result<()> {
    sqlx::query!(
        "INSERT INTO adapters (id, tenant_id, name, base_model_id, upstream_model, price_key)
         SELECT $1, $2, $3, b.id, $5, b.price_key FROM base_models b WHERE b.name = $4
         ON CONFLICT (tenant_id, name) DO UPDATE SET base_model_id = EXCLUDED.base_model_id,
             upstream_model = EXCLUDED.upstream_model",
        Uuid::now_v7(),
        tenant_id,
        name,
        base,
        upstream_model,
    )
    .execute(pool)
    .await?;
    Ok(())
}

/// Deletes a tenant's adapter; returns whether it existed.
pub async fn delete_adapter(pool: &PgPool, tenant_id: Uuid, name: &str) -> sqlx::Result<bool> {
    let done = sqlx::query!(
        "DELETE FROM adapters WHERE tenant_id = $1 AND name = $2",
        tenant_id,
        name,
    )
    .execute(pool)
    .await?;
    Ok(done.rows_affected() > 0)
}

/// One servable name: a bare base (no owner) or a tenant's adapter.
#[derive(Debug)]
pub struct RouteRow {
    pub served_name: String,
    /// The owning tenant; `None` for a public bare base.
    pub owner: Option<Uuid>,
    pub base: String,
    pub adapter_id: Option<Uuid>,
    pub adapter_version: Option<i32>,
    pub graph: String,
    pub upstream_url: String,
    pub upstream_model: String,
    pub price_key: String,
    /// An adapter's own price key (`adapter:<tenant>/<name>`), priced before `price_key` where
    /// the book holds it; `None` for a base.
    pub own_price_key: Option<String>,
    pub shared_cache: bool,
    pub continuous_usage: bool,
    pub denied_fields: Option<Vec<String>>,
    pub prompt_estimator: String,
    /// `chat` or `embedding` (`base_models.kind`).
    pub kind: String,
    pub nvext_allowed: Option<Vec<String>>,
    /// Unix seconds (OpenAI's `created`).
    pub created: i64,
    /// `ready`, `starting` (answered 503 with `retry-after` until it is ready), or an idle
    /// adapter's `unloading`, `unloaded`, `reloading`.
    pub state: String,
    /// The base's graph is asleep or waking, or the adapter is unloaded for idleness (or on its
    /// way out or back): requests are held until it serves (issue 18).
    pub asleep: bool,
    /// Failed wakes of the graph plus failed reloads of the adapter so far (a held request that
    /// sees this grow gives up).
    pub wake_failures: i64,
}

/// Every routable name: offered bases with a graph, and ready or starting adapters of active
/// tenants that their owner wants running.
pub async fn routes(pool: &PgPool) -> sqlx::Result<Vec<RouteRow>> {
    sqlx::query_as!(
        RouteRow,
        r#"SELECT b.name AS "served_name!", NULL::uuid AS "owner?", b.name AS "base!", NULL::uuid AS "adapter_id?",
                  NULL::int AS "adapter_version?", b.graph AS "graph!", b.upstream_url AS "upstream_url!",
                  b.upstream_model AS "upstream_model!", b.price_key AS "price_key!",
                  NULL::text AS "own_price_key?", b.shared_cache AS "shared_cache!", b.continuous_usage AS "continuous_usage!",
                  b.denied_fields AS "denied_fields?", b.prompt_estimator AS "prompt_estimator!",
                  b.kind AS "kind!", b.nvext_allowed AS "nvext_allowed?", extract(epoch FROM b.created_at)::bigint AS "created!", 'ready' AS "state!",
                  COALESCE(g.state IN ('asleep', 'waking'), false) AS "asleep!",
                  COALESCE(g.wake_failures, 0) AS "wake_failures!"
           FROM base_models b LEFT JOIN graphs g ON g.base_model_id = b.id
           WHERE b.offered AND b.upstream_url <> ''
           UNION ALL
           SELECT a.name, a.tenant_id, b.name, a.id, a.version, b.graph, b.upstream_url, a.upstream_model,
                  a.price_key, adapter_price_key(t.name, a.name, true), a.shared_cache, b.continuous_usage, b.denied_fields, b.prompt_estimator,
                  b.kind, b.nvext_allowed, extract(epoch FROM a.created_at)::bigint, a.state,
                  COALESCE(g.state IN ('asleep', 'waking'), false)
                      OR a.state IN ('unloading', 'unloaded', 'reloading'),
                  COALESCE(g.wake_failures, 0) + a.reload_failures
           FROM adapters a JOIN base_models b ON b.id = a.base_model_id
                JOIN tenants t ON t.id = a.tenant_id LEFT JOIN graphs g ON g.base_model_id = b.id
           WHERE a.state IN ('ready', 'starting', 'unloading', 'unloaded', 'reloading')
                 AND a.desired = 'running'
                 AND b.upstream_url <> '' AND t.status = 'active'"#,
    )
    .fetch_all(pool)
    .await
}

/// The price keys of the bases of `fleet` (the demo prices its simulated bases by them).
pub async fn price_keys_of_fleet(pool: &PgPool, fleet: &str) -> sqlx::Result<Vec<String>> {
    sqlx::query_scalar!(
        "SELECT DISTINCT price_key FROM base_models WHERE fleet = $1 ORDER BY price_key",
        fleet
    )
    .fetch_all(pool)
    .await
}
