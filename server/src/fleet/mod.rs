//! The fleet: where base models are served. A backend makes engines reachable and records them in
//! the catalog (`base_models`, `adapters`); the gateway only ever reads the catalog. A Kubernetes
//! (Dynamo) backend is to come behind the same entry point.

pub mod dynamo_render;
pub mod local_sim;
pub mod static_file;

use std::path::PathBuf;

use sqlx::PgPool;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use uuid::Uuid;

use crate::engine_policy::PromptEstimator;

/// Which backend `serve` uses.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FleetSpec {
    /// Simulated engines on loopback: the embedded default.
    LocalSim,
    /// Engines that already run elsewhere, listed in a TOML file.
    Static(PathBuf),
}

impl FleetSpec {
    pub fn label(&self) -> &'static str {
        match self {
            Self::LocalSim => "local-sim",
            Self::Static(_) => "static",
        }
    }
}

/// A base model as a backend registers it.
#[derive(Debug, Clone)]
pub struct BaseRegistration {
    pub name: String,
    pub graph: String,
    pub upstream_url: String,
    pub upstream_model: String,
    pub continuous_usage: bool,
    /// Engine-control fields stripped from client bodies (`None`: the gateway's default list).
    pub denied_fields: Option<Vec<String>>,
    /// How prompts are counted before the engine reports them.
    pub prompt_estimator: PromptEstimator,
}

/// Upserts the bases a backend serves; a base that moved (new port) gets its new URL.
pub async fn register_bases(
    pool: &PgPool,
    fleet: &str,
    bases: &[BaseRegistration],
) -> sqlx::Result<()> {
    let mut tx = pool.begin().await?;
    for b in bases {
        sqlx::query(
            "INSERT INTO base_models (id, name, graph, fleet, upstream_url, upstream_model, continuous_usage, price_key,
                 denied_fields, prompt_estimator)
             VALUES ($1, $2, $3, $4, $5, $6, $7, $2, $8, $9)
             ON CONFLICT (name) DO UPDATE SET graph = EXCLUDED.graph, fleet = EXCLUDED.fleet,
                 upstream_url = EXCLUDED.upstream_url, upstream_model = EXCLUDED.upstream_model,
                 continuous_usage = EXCLUDED.continuous_usage, denied_fields = EXCLUDED.denied_fields,
                 prompt_estimator = EXCLUDED.prompt_estimator",
        )
        .bind(Uuid::now_v7())
        .bind(&b.name)
        .bind(&b.graph)
        .bind(fleet)
        .bind(&b.upstream_url)
        .bind(&b.upstream_model)
        .bind(b.continuous_usage)
        .bind(&b.denied_fields)
        .bind(b.prompt_estimator.as_str())
        .execute(&mut *tx)
        .await?;
    }
    tx.commit().await
}

/// Records a tenant's adapter on a base (idempotent by tenant and name).
pub async fn register_adapter(
    pool: &PgPool,
    tenant_id: Uuid,
    name: &str,
    base: &str,
    upstream_model: &str,
) -> sqlx::Result<()> {
    sqlx::query(
        "INSERT INTO adapters (id, tenant_id, name, base_model_id, upstream_model, price_key)
         SELECT $1, $2, $3, b.id, $5, b.price_key FROM base_models b WHERE b.name = $4
         ON CONFLICT (tenant_id, name) DO UPDATE SET base_model_id = EXCLUDED.base_model_id,
             upstream_model = EXCLUDED.upstream_model",
    )
    .bind(Uuid::now_v7())
    .bind(tenant_id)
    .bind(name)
    .bind(base)
    .bind(upstream_model)
    .execute(pool)
    .await?;
    Ok(())
}

/// Starts the backend and registers what it serves. Engines it starts run until `cancel`.
pub async fn start(
    spec: &FleetSpec,
    pool: &PgPool,
    tracker: &TaskTracker,
    cancel: &CancellationToken,
) -> anyhow::Result<()> {
    let bases = match spec {
        FleetSpec::LocalSim => local_sim::start(tracker, cancel).await?,
        FleetSpec::Static(path) => static_file::load(path)?,
    };
    register_bases(pool, spec.label(), &bases).await?;
    Ok(())
}
