//! Model lifecycle: base templates, graphs and managed adapters (desired and observed state), and
//! the history of every state change (`lifecycle_history`, read for replica-hours). Rules about
//! which transition is allowed live with the callers; these are the statements.

use serde_json::Value;
use sqlx::{PgConnection, PgExecutor, PgPool};
use time::OffsetDateTime;
use uuid::Uuid;

/// A base's serving template as an operator sets it.
#[derive(Debug, Clone)]
pub struct TemplateRow {
    pub model: String,
    pub image: String,
    pub tensor_parallel_size: i32,
    pub quantization: Option<String>,
    pub max_loras: i32,
    pub max_lora_rank: i32,
    pub extra_args: Vec<String>,
    pub gpus_per_replica: i32,
    pub replicas_min: i32,
    pub replicas_max: i32,
    pub env_from_secret: Option<String>,
    pub config_json: Value,
    pub tokenizer_json: Option<Value>,
    pub allow_dora: bool,
    /// `None`: always on; else the graph sleeps (zero replicas) after this many idle seconds.
    pub idle_after_secs: Option<i32>,
    /// `chat` or `embedding` (stored on the base, `base_models.kind`: every base has one, also
    /// those without a template): which endpoints may call it.
    pub kind: String,
}

/// A base the controller manages, with its template and its graph as last observed.
#[derive(Debug, Clone)]
pub struct TemplatedBase {
    pub id: Uuid,
    pub name: String,
    pub graph: String,
    pub fleet: String,
    pub offered: bool,
    pub upstream_url: String,
    pub template: TemplateRow,
    /// `None` when no graph row exists.
    pub graph_state: Option<String>,
    pub replicas_desired: Option<i32>,
    pub replicas_ready: Option<i32>,
    /// `None`: its adapters stay loaded while the graph is up; else each is unloaded after this
    /// many seconds without a request (an admin's setting, kept apart from the template file).
    pub adapter_idle_after_secs: Option<i32>,
    /// The graph's scale-to-zero bookkeeping, read in SQL against the database's clock.
    pub sleep: SleepFacts,
}

/// What the controller needs to put a graph to sleep or wake it, and to unload an idle adapter
/// or load it again (`db::sleep::adapter_sleep`).
#[derive(Debug, Clone, Copy, Default)]
pub struct SleepFacts {
    /// Its policy allows sleeping and nothing arrived or ran for longer than its idle time since
    /// the later of its last activity and its last state change.
    pub idle: bool,
    /// A request was seen after its last state change.
    pub used_since_change: bool,
    /// Seconds since the last state change.
    pub changed_secs_ago: f64,
    /// A held request asked for it to serve again: a graph's wake, an adapter's reload.
    pub wake_requested: bool,
}

/// Offers `name` as a base served by `fleet` from `template` (idempotent by name). Its URL stays
/// empty (not routable) until the controller has a graph for it.
///
/// Start-up calls this for every template again. The template's floor and idle-after are written
/// only when they differ from what the template said last time (`file_policy`): a policy an
/// operator applied since (`operator::set_serving_policy`, `operator::set_idle_policy`) is kept
/// across restarts while the file is unchanged (its floor capped at a lowered ceiling), and an
/// edited file wins. Tested by `economics_advisor::an_applied_policy_survives_the_start_up_upsert`.
pub async fn offer_base(
    pool: &PgPool,
    fleet: &str,
    name: &str,
    graph: &str,
    offered: bool,
    prompt_estimator: &str,
    t: &TemplateRow,
) -> sqlx::Result<Uuid> {
    let mut tx = pool.begin().await?;
    let id = sqlx::query_scalar!(
        "INSERT INTO base_models (id, name, graph, fleet, upstream_url, upstream_model, price_key,
             offered, prompt_estimator, kind)
         VALUES ($1, $2, $3, $4, '', $2, $2, $5, $6, $7)
         ON CONFLICT (name) DO UPDATE SET graph = EXCLUDED.graph, fleet = EXCLUDED.fleet,
             offered = EXCLUDED.offered, prompt_estimator = EXCLUDED.prompt_estimator,
             kind = EXCLUDED.kind
         RETURNING id",
        Uuid::now_v7(),
        name,
        graph,
        fleet,
        offered,
        prompt_estimator,
        t.kind,
    )
    .fetch_one(&mut *tx)
    .await?;
    sqlx::query!(
        "INSERT INTO base_templates (base_model_id, model, image, tensor_parallel_size, quantization,
             max_loras, max_lora_rank, extra_args, gpus_per_replica, replicas_min, replicas_max,
             env_from_secret, config_json, tokenizer_json, allow_dora, idle_after_secs, file_policy)
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16,
             jsonb_build_object('floor', $10::int4, 'idle_after_secs', $16::int4))
         ON CONFLICT (base_model_id) DO UPDATE SET model = EXCLUDED.model, image = EXCLUDED.image,
             tensor_parallel_size = EXCLUDED.tensor_parallel_size, quantization = EXCLUDED.quantization,
             max_loras = EXCLUDED.max_loras, max_lora_rank = EXCLUDED.max_lora_rank,
             extra_args = EXCLUDED.extra_args, gpus_per_replica = EXCLUDED.gpus_per_replica,
             replicas_min = CASE WHEN base_templates.file_policy = EXCLUDED.file_policy
                 THEN LEAST(base_templates.replicas_min, EXCLUDED.replicas_max)
                 ELSE EXCLUDED.replicas_min END,
             replicas_max = EXCLUDED.replicas_max,
             env_from_secret = EXCLUDED.env_from_secret, config_json = EXCLUDED.config_json,
             tokenizer_json = EXCLUDED.tokenizer_json, allow_dora = EXCLUDED.allow_dora,
             idle_after_secs = CASE WHEN base_templates.file_policy = EXCLUDED.file_policy
                 THEN base_templates.idle_after_secs ELSE EXCLUDED.idle_after_secs END,
             file_policy = EXCLUDED.file_policy, updated_at = now()",
        id,
        t.model,
        t.image,
        t.tensor_parallel_size,
        t.quantization,
        t.max_loras,
        t.max_lora_rank,
        &t.extra_args,
        t.gpus_per_replica,
        t.replicas_min,
        t.replicas_max,
        t.env_from_secret,
        t.config_json,
        t.tokenizer_json,
        t.allow_dora,
        t.idle_after_secs,
    )
    .execute(&mut *tx)
    .await?;
    tx.commit().await?;
    Ok(id)
}

/// Every base with a template, and its graph row if any.
pub async fn templated_bases(db: impl PgExecutor<'_>) -> sqlx::Result<Vec<TemplatedBase>> {
    let rows = sqlx::query!(
        r#"SELECT b.id, b.name, b.graph, b.fleet, b.offered, b.upstream_url, b.kind,
                  t.model, t.image, t.tensor_parallel_size, t.quantization, t.max_loras, t.max_lora_rank,
                  t.extra_args, t.gpus_per_replica, t.replicas_min, t.replicas_max, t.env_from_secret,
                  t.config_json, t.tokenizer_json, t.allow_dora, t.idle_after_secs,
                  t.adapter_idle_after_secs, g.state AS "graph_state?", g.replicas_desired AS "replicas_desired?",
                  g.replicas_ready AS "replicas_ready?",
                  COALESCE(GREATEST(g.last_active_at, g.state_since)
                      < now() - make_interval(secs => t.idle_after_secs), false) AS "idle!",
                  COALESCE(g.last_active_at > g.state_since, false) AS "used_since_change!",
                  COALESCE(extract(epoch FROM now() - g.state_since)::float8, 0) AS "changed_secs_ago!",
                  g.wake_requested_at IS NOT NULL AS "wake_requested!"
           FROM base_models b JOIN base_templates t ON t.base_model_id = b.id
                LEFT JOIN graphs g ON g.base_model_id = b.id
           ORDER BY b.name"#,
    )
    .fetch_all(db)
    .await?;
    Ok(rows
        .into_iter()
        .map(|r| TemplatedBase {
            id: r.id,
            name: r.name,
            graph: r.graph,
            fleet: r.fleet,
            offered: r.offered,
            upstream_url: r.upstream_url,
            template: TemplateRow {
                model: r.model,
                image: r.image,
                tensor_parallel_size: r.tensor_parallel_size,
                quantization: r.quantization,
                max_loras: r.max_loras,
                max_lora_rank: r.max_lora_rank,
                extra_args: r.extra_args,
                gpus_per_replica: r.gpus_per_replica,
                replicas_min: r.replicas_min,
                replicas_max: r.replicas_max,
                env_from_secret: r.env_from_secret,
                config_json: r.config_json,
                tokenizer_json: r.tokenizer_json,
                allow_dora: r.allow_dora,
                idle_after_secs: r.idle_after_secs,
                kind: r.kind,
            },
            graph_state: r.graph_state,
            replicas_desired: r.replicas_desired,
            replicas_ready: r.replicas_ready,
            adapter_idle_after_secs: r.adapter_idle_after_secs,
            sleep: SleepFacts {
                idle: r.idle,
                used_since_change: r.used_since_change,
                changed_secs_ago: r.changed_secs_ago,
                wake_requested: r.wake_requested,
            },
        })
        .collect())
}

/// The version of each base's `tokenizer.json` (its template's last change), for the bases that
/// have one: the gateway reloads a base's tokenizer only when this moves.
pub async fn tokenizer_versions(pool: &PgPool) -> sqlx::Result<Vec<(String, OffsetDateTime)>> {
    let rows = sqlx::query!(
        "SELECT b.name, t.updated_at
           FROM base_models b JOIN base_templates t ON t.base_model_id = b.id
          WHERE t.tokenizer_json IS NOT NULL"
    )
    .fetch_all(pool)
    .await?;
    Ok(rows.into_iter().map(|r| (r.name, r.updated_at)).collect())
}

/// A base's `tokenizer.json` as text, and its version.
pub async fn tokenizer_json(
    pool: &PgPool,
    base: &str,
) -> sqlx::Result<Option<(String, OffsetDateTime)>> {
    let row = sqlx::query!(
        r#"SELECT t.tokenizer_json::text AS "json!", t.updated_at
             FROM base_models b JOIN base_templates t ON t.base_model_id = b.id
            WHERE b.name = $1 AND t.tokenizer_json IS NOT NULL"#,
        base
    )
    .fetch_optional(pool)
    .await?;
    Ok(row.map(|r| (r.json, r.updated_at)))
}

/// A managed adapter (one with stored files), as the controller and the surfaces read it.
#[derive(Debug, Clone)]
pub struct AdapterRow {
    pub id: Uuid,
    pub tenant_id: Uuid,
    pub name: String,
    pub base_model_id: Uuid,
    pub base: String,
    pub graph: String,
    pub version: i32,
    pub upstream_model: String,
    pub state: String,
    pub desired: String,
    pub reason: Option<String>,
    pub storage_uri: Option<String>,
    pub validation: Option<Value>,
    pub size_bytes: Option<i64>,
    pub updated_at: OffsetDateTime,
}

/// Every managed adapter (the controller's pass), oldest first.
pub async fn managed_adapters(db: impl PgExecutor<'_>) -> sqlx::Result<Vec<AdapterRow>> {
    sqlx::query_as!(
        AdapterRow,
        "SELECT a.id, a.tenant_id, a.name, a.base_model_id, b.name AS base, b.graph, a.version,
                a.upstream_model, a.state, a.desired, a.reason, a.storage_uri, a.validation,
                a.size_bytes, a.updated_at
         FROM adapters a JOIN base_models b ON b.id = a.base_model_id
         WHERE a.storage_uri IS NOT NULL ORDER BY a.id",
    )
    .fetch_all(db)
    .await
}

/// Whether `name` is a base model's served name (offered or not): an adapter of that name would
/// shadow the public model for its tenant, so uploads may not take it.
pub async fn is_base_name(db: impl PgExecutor<'_>, name: &str) -> sqlx::Result<bool> {
    sqlx::query_scalar!(
        r#"SELECT EXISTS (SELECT 1 FROM base_models WHERE name = $1) AS "taken!""#,
        name,
    )
    .fetch_one(db)
    .await
}

/// A tenant's adapters (every state), by name.
pub async fn tenant_adapters(
    db: impl PgExecutor<'_>,
    tenant: Uuid,
) -> sqlx::Result<Vec<AdapterRow>> {
    sqlx::query_as!(
        AdapterRow,
        "SELECT a.id, a.tenant_id, a.name, a.base_model_id, b.name AS base, b.graph, a.version,
                a.upstream_model, a.state, a.desired, a.reason, a.storage_uri, a.validation,
                a.size_bytes, a.updated_at
         FROM adapters a JOIN base_models b ON b.id = a.base_model_id
         WHERE a.tenant_id = $1 ORDER BY a.name",
        tenant,
    )
    .fetch_all(db)
    .await
}

/// One tenant's adapter by name, locked for a transition.
pub async fn lock_adapter(
    conn: &mut PgConnection,
    tenant: Uuid,
    name: &str,
) -> sqlx::Result<Option<AdapterRow>> {
    sqlx::query_as!(
        AdapterRow,
        "SELECT a.id, a.tenant_id, a.name, a.base_model_id, b.name AS base, b.graph, a.version,
                a.upstream_model, a.state, a.desired, a.reason, a.storage_uri, a.validation,
                a.size_bytes, a.updated_at
         FROM adapters a JOIN base_models b ON b.id = a.base_model_id
         WHERE a.tenant_id = $1 AND a.name = $2 FOR UPDATE OF a",
        tenant,
        name,
    )
    .fetch_optional(conn)
    .await
}

/// An adapter by id, locked for a transition.
pub async fn lock_adapter_by_id(
    conn: &mut PgConnection,
    id: Uuid,
) -> sqlx::Result<Option<AdapterRow>> {
    sqlx::query_as!(
        AdapterRow,
        "SELECT a.id, a.tenant_id, a.name, a.base_model_id, b.name AS base, b.graph, a.version,
                a.upstream_model, a.state, a.desired, a.reason, a.storage_uri, a.validation,
                a.size_bytes, a.updated_at
         FROM adapters a JOIN base_models b ON b.id = a.base_model_id
         WHERE a.id = $1 FOR UPDATE OF a",
        id,
    )
    .fetch_optional(conn)
    .await
}

/// A new adapter row in `uploading` on the base named `base`; `None` when there is no such
/// templated base.
pub async fn insert_upload(
    conn: &mut PgConnection,
    id: Uuid,
    tenant: Uuid,
    name: &str,
    base: &str,
    upstream_model: &str,
    storage_uri: &str,
) -> sqlx::Result<Option<Uuid>> {
    sqlx::query_scalar!(
        "INSERT INTO adapters (id, tenant_id, name, base_model_id, upstream_model, price_key, state,
             desired, storage_uri)
         SELECT $1, $2, $3, b.id, $5, b.price_key, 'uploading', 'stopped', $6
         FROM base_models b JOIN base_templates t ON t.base_model_id = b.id WHERE b.name = $4
         RETURNING base_model_id",
        id,
        tenant,
        name,
        base,
        upstream_model,
        storage_uri,
    )
    .fetch_optional(conn)
    .await
}

/// A new version of an existing adapter: new engine-side name and files, back to `uploading`.
pub async fn reupload(
    conn: &mut PgConnection,
    id: Uuid,
    version: i32,
    upstream_model: &str,
    storage_uri: &str,
) -> sqlx::Result<()> {
    sqlx::query!(
        "UPDATE adapters SET version = $2, upstream_model = $3, storage_uri = $4, state = 'uploading',
             desired = 'stopped', reason = NULL, validation = NULL, size_bytes = NULL, updated_at = now()
         WHERE id = $1",
        id,
        version,
        upstream_model,
        storage_uri,
    )
    .execute(conn)
    .await?;
    Ok(())
}

/// Sets an adapter's desired and observed state and reason (the caller records the history).
pub async fn set_adapter(
    conn: &mut PgConnection,
    id: Uuid,
    desired: &str,
    state: &str,
    reason: Option<&str>,
) -> sqlx::Result<()> {
    sqlx::query!(
        "UPDATE adapters SET desired = $2, state = $3, reason = $4, updated_at = now() WHERE id = $1",
        id,
        desired,
        state,
        reason,
    )
    .execute(conn)
    .await?;
    Ok(())
}

/// What validation found, with the total stored size.
pub async fn set_validation(
    conn: &mut PgConnection,
    id: Uuid,
    validation: &Value,
    size_bytes: i64,
) -> sqlx::Result<()> {
    sqlx::query!(
        "UPDATE adapters SET validation = $2, size_bytes = $3 WHERE id = $1",
        id,
        validation,
        size_bytes,
    )
    .execute(conn)
    .await?;
    Ok(())
}

pub async fn delete_adapter_row(conn: &mut PgConnection, id: Uuid) -> sqlx::Result<()> {
    sqlx::query!("DELETE FROM adapters WHERE id = $1", id)
        .execute(conn)
        .await?;
    Ok(())
}

/// One row of history.
#[derive(Debug, Clone)]
pub struct HistoryEntry<'a> {
    pub entity: &'a str,
    pub entity_id: Uuid,
    pub tenant_id: Option<Uuid>,
    pub name: &'a str,
    pub from_state: Option<&'a str>,
    pub to_state: &'a str,
    pub reason: Option<&'a str>,
    pub replicas: Option<i32>,
    /// Graphs: the template's floor (minimum replicas) then, so the economics split floor from
    /// scaled-up replica-hours as they were.
    pub floor: Option<i32>,
}

pub async fn record_history(db: impl PgExecutor<'_>, h: &HistoryEntry<'_>) -> sqlx::Result<()> {
    sqlx::query!(
        "INSERT INTO lifecycle_history (entity, entity_id, tenant_id, name, from_state, to_state, reason, replicas, floor)
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)",
        h.entity,
        h.entity_id,
        h.tenant_id,
        h.name,
        h.from_state,
        h.to_state,
        h.reason,
        h.replicas,
        h.floor,
    )
    .execute(db)
    .await?;
    Ok(())
}

/// A recorded state change.
#[derive(Debug, Clone)]
pub struct HistoryRow {
    pub from_state: Option<String>,
    pub to_state: String,
    pub reason: Option<String>,
    pub replicas: Option<i32>,
    pub at: OffsetDateTime,
}

/// An entity's history, oldest first.
pub async fn history(db: impl PgExecutor<'_>, entity_id: Uuid) -> sqlx::Result<Vec<HistoryRow>> {
    sqlx::query_as!(
        HistoryRow,
        "SELECT from_state, to_state, reason, replicas, at FROM lifecycle_history
         WHERE entity_id = $1 ORDER BY id",
        entity_id,
    )
    .fetch_all(db)
    .await
}

/// A graph as the controller observed it.
#[derive(Debug, Clone)]
pub struct GraphWrite<'a> {
    pub base_model_id: Uuid,
    pub name: &'a str,
    pub state: &'a str,
    pub reason: Option<&'a str>,
    pub replicas_ready: i32,
    pub replicas_desired: i32,
    /// The template's minimum replicas, recorded with the history.
    pub floor: i32,
}

/// Upserts the graph row; when its state or desired replicas changed, records history. Returns
/// the state before (`None`: no row).
pub async fn set_graph(pool: &PgPool, g: &GraphWrite<'_>) -> sqlx::Result<Option<String>> {
    let mut tx = pool.begin().await?;
    let before = sqlx::query!(
        "SELECT state, replicas_desired FROM graphs WHERE base_model_id = $1 FOR UPDATE",
        g.base_model_id,
    )
    .fetch_optional(&mut *tx)
    .await?;
    sqlx::query!(
        "INSERT INTO graphs (base_model_id, name, state, reason, replicas_ready, replicas_desired)
         VALUES ($1, $2, $3, $4, $5, $6)
         ON CONFLICT (base_model_id) DO UPDATE SET name = EXCLUDED.name, state = EXCLUDED.state,
             reason = EXCLUDED.reason, replicas_ready = EXCLUDED.replicas_ready,
             replicas_desired = EXCLUDED.replicas_desired,
             updated_at = now(),
             state_since = CASE WHEN graphs.state = EXCLUDED.state THEN graphs.state_since
                 ELSE now() END,
             wake_requested_at = CASE WHEN EXCLUDED.state = 'ready' THEN NULL
                 ELSE graphs.wake_requested_at END",
        g.base_model_id,
        g.name,
        g.state,
        g.reason,
        g.replicas_ready,
        g.replicas_desired,
    )
    .execute(&mut *tx)
    .await?;
    let changed = before
        .as_ref()
        .is_none_or(|b| b.state != g.state || b.replicas_desired != g.replicas_desired);
    if changed {
        record_history(
            &mut *tx,
            &HistoryEntry {
                entity: "graph",
                entity_id: g.base_model_id,
                tenant_id: None,
                name: g.name,
                from_state: before.as_ref().map(|b| b.state.as_str()),
                to_state: g.state,
                reason: g.reason,
                replicas: Some(g.replicas_desired),
                floor: Some(g.floor),
            },
        )
        .await?;
    }
    tx.commit().await?;
    Ok(before.map(|b| b.state))
}

/// Removes the graph row (the graph is gone), records it with zero replicas, and makes the base
/// unroutable.
pub async fn delete_graph_row(pool: &PgPool, base_model_id: Uuid, name: &str) -> sqlx::Result<()> {
    let mut tx = pool.begin().await?;
    let before = sqlx::query_scalar!(
        "DELETE FROM graphs WHERE base_model_id = $1 RETURNING state",
        base_model_id,
    )
    .fetch_optional(&mut *tx)
    .await?;
    sqlx::query!(
        "UPDATE base_models SET upstream_url = '' WHERE id = $1 AND upstream_url <> ''",
        base_model_id,
    )
    .execute(&mut *tx)
    .await?;
    if let Some(before) = before {
        record_history(
            &mut *tx,
            &HistoryEntry {
                entity: "graph",
                entity_id: base_model_id,
                tenant_id: None,
                name,
                from_state: Some(&before),
                to_state: "deleted",
                reason: None,
                replicas: Some(0),
                floor: None,
            },
        )
        .await?;
    }
    tx.commit().await
}

/// Points the base at its graph's frontend (only a change writes, so no needless NOTIFY).
pub async fn set_base_upstream(pool: &PgPool, base_model_id: Uuid, url: &str) -> sqlx::Result<()> {
    sqlx::query!(
        "UPDATE base_models SET upstream_url = $2 WHERE id = $1 AND upstream_url <> $2",
        base_model_id,
        url,
    )
    .execute(pool)
    .await?;
    Ok(())
}

/// A graph row for the admin view.
#[derive(Debug, Clone)]
pub struct GraphRow {
    pub base: String,
    pub name: String,
    pub state: String,
    pub reason: Option<String>,
    pub replicas_ready: i32,
    pub replicas_desired: i32,
    pub updated_at: OffsetDateTime,
    /// Wakes from zero replicas so far, and how many of them failed.
    pub wakes: i64,
    pub wake_failures: i64,
    /// The sleep policy (`None`: always on).
    pub idle_after_secs: Option<i32>,
}

pub async fn graphs(db: impl PgExecutor<'_>) -> sqlx::Result<Vec<GraphRow>> {
    sqlx::query_as!(
        GraphRow,
        r#"SELECT b.name AS base, g.name, g.state, g.reason, g.replicas_ready, g.replicas_desired,
                  g.updated_at, g.wakes, g.wake_failures, t.idle_after_secs AS "idle_after_secs?"
           FROM graphs g JOIN base_models b ON b.id = g.base_model_id
                LEFT JOIN base_templates t ON t.base_model_id = b.id
           ORDER BY b.name"#,
    )
    .fetch_all(db)
    .await
}
