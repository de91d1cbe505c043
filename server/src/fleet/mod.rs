//! The fleet: where base models are served. A backend makes engines reachable and records them in
//! the catalog (`base_models`, `adapters`); the gateway only ever reads the catalog. A Kubernetes
//! (Dynamo) backend is to come behind the same entry point.

pub mod backend;
pub mod build;
pub mod dynamo_render;
pub mod kubernetes;
pub mod local_sim;
pub mod local_vllm;
pub mod sim_fleet;
pub mod sim_frontend;
pub mod static_file;
pub mod templates;

use std::path::PathBuf;
use std::sync::Arc;

use sqlx::PgPool;
use tf_core::db::catalog::{self, BaseUpsert};
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
    /// Dynamo graphs on Kubernetes, driven by the lifecycle controller ([`kubernetes`]).
    Kubernetes,
    /// `vllm serve` processes on this machine, driven by the lifecycle controller ([`local_vllm`]).
    LocalVllm,
}

impl FleetSpec {
    pub fn label(&self) -> &'static str {
        match self {
            Self::LocalSim => "local-sim",
            Self::Static(_) => "static",
            Self::Kubernetes => "kubernetes",
            Self::LocalVllm => "local-vllm",
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
    /// A chat (generating) or an embedding model: which endpoints may call it.
    pub kind: tf_core::endpoint::ModelKind,
    /// The `nvext` keys tenants may set (`None`: the gateway's default allow-list).
    pub nvext_allowed: Option<Vec<String>>,
}

/// Upserts the bases a backend serves; a base that moved (new port) gets its new URL.
pub async fn register_bases(
    pool: &PgPool,
    fleet: &str,
    bases: &[BaseRegistration],
) -> sqlx::Result<()> {
    let rows: Vec<_> = bases
        .iter()
        .map(|b| BaseUpsert {
            name: &b.name,
            graph: &b.graph,
            upstream_url: &b.upstream_url,
            upstream_model: &b.upstream_model,
            continuous_usage: b.continuous_usage,
            denied_fields: b.denied_fields.as_deref(),
            prompt_estimator: b.prompt_estimator.as_str(),
            kind: b.kind.as_str(),
            nvext_allowed: b.nvext_allowed.as_deref(),
        })
        .collect();
    catalog::upsert_bases(pool, fleet, &rows).await
}

/// Records a tenant's adapter on a base (idempotent by tenant and name).
pub async fn register_adapter(
    pool: &PgPool,
    tenant_id: Uuid,
    name: &str,
    base: &str,
    upstream_model: &str,
) -> sqlx::Result<()> {
    catalog::upsert_adapter(pool, tenant_id, name, base, upstream_model).await
}

/// Starts the backend: a static fleet's engines are registered as they are; the local simulator
/// offers its bases and returns the backend the lifecycle controller drives (engines it starts
/// run until `cancel`).
pub async fn start(
    spec: &FleetSpec,
    pool: &PgPool,
    tracker: &TaskTracker,
    cancel: &CancellationToken,
) -> anyhow::Result<Option<Arc<dyn backend::FleetBackend>>> {
    match spec {
        FleetSpec::LocalSim => {
            local_sim::offer(pool).await?;
            Ok(Some(Arc::new(sim_fleet::SimFleet::new(
                tracker.clone(),
                cancel.clone(),
                local_sim::pacing(),
            ))))
        }
        FleetSpec::Static(path) => {
            register_bases(pool, spec.label(), &static_file::load(path)?).await?;
            Ok(None)
        }
        // The lifecycle controller registers these backends' bases as it starts their graphs.
        FleetSpec::Kubernetes | FleetSpec::LocalVllm => Ok(None),
    }
}
