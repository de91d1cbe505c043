//! The one interface every fleet backend implements (`local-sim`, `local-vllm`, `kubernetes`).
//! The lifecycle controller reconciles desired state from PostgreSQL into a backend and writes
//! what it observes back; it never knows which backend it drives. Every call is idempotent: the
//! controller re-sends the whole desired state on every pass and after every error, so "already
//! there" and "already gone" are successes, not errors. One contract suite runs against every
//! implementation.

use async_trait::async_trait;

use super::dynamo_render::ServingTemplate;

/// A base model's serving graph as the controller wants it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GraphSpec {
    /// The base's public served name (what clients send as `model`).
    pub base: String,
    /// The graph's name in the backend (`dynamo_render::graph_name(base)` on Kubernetes).
    pub graph: String,
    pub template: ServingTemplate,
    /// The replica ceiling (`replicas_max`; the template's `replicas` is the floor).
    pub replicas_max: u32,
}

/// A started adapter as the controller wants it: loaded on every replica of its base's graph.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AdapterSpec {
    pub graph: String,
    pub base: String,
    /// The engine-side LoRA name: globally unique and versioned (a new upload is a new name, so
    /// stale prefix-cache blocks are never reused).
    pub lora_name: String,
    /// Where the validated files are (`file:///...` locally, `s3://...` on a cluster).
    pub source_uri: String,
}

/// What a backend reports of a graph.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GraphObserved {
    pub phase: Phase,
    pub replicas_ready: u32,
    pub replicas_desired: u32,
    /// OpenAI-compatible base URL of the graph's frontend (e.g. `http://127.0.0.1:8180/v1`).
    pub frontend_url: String,
}

/// What a backend reports of an adapter.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AdapterObserved {
    pub phase: Phase,
    /// Replicas (endpoints) that have the adapter loaded, of how many the graph has.
    pub ready_endpoints: u32,
    pub total_endpoints: u32,
    /// Why it is not ready yet, as the backend says it (a `DynamoModel`'s condition message),
    /// kept as the adapter's reason for its owner.
    pub message: Option<String>,
}

/// Where a graph or adapter is on its way to serving.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Phase {
    /// Accepted, not serving yet.
    Pending,
    Ready,
    /// Scaled to zero on purpose (issue 18): no replicas, the frontend and the registered
    /// adapters kept, so a wake needs only replicas.
    Asleep,
    /// Will not become ready without a change; the reason is shown to its owner.
    Failed(String),
}

/// Why a backend call did not happen; the controller backs off and retries, and counts each kind
/// in a metric (`tf_fleet_errors_total{kind}`).
#[derive(Debug, thiserror::Error)]
pub enum FleetError {
    /// The backend could not be reached or answered 5xx: retry.
    #[error("fleet backend unavailable: {0}")]
    Unavailable(String),
    /// The backend refused the request as invalid: retrying the same spec will not help.
    #[error("fleet backend rejected the request: {0}")]
    Rejected(String),
    /// Someone else's change is in the way (a field owned by another manager).
    #[error("conflict in the fleet backend: {0}")]
    Conflict(String),
}

impl FleetError {
    /// The metric label of this error.
    pub fn kind(&self) -> &'static str {
        match self {
            Self::Unavailable(_) => "unavailable",
            Self::Rejected(_) => "rejected",
            Self::Conflict(_) => "conflict",
        }
    }
}

#[async_trait]
pub trait FleetBackend: Send + Sync + 'static {
    /// `local-sim`, `local-vllm` or `kubernetes`: stored in `base_models.fleet`.
    fn kind(&self) -> &'static str;

    /// A hash of what [`Self::apply_graph`] would make of `graph`: the controller stores it, so a
    /// template change (a new hash) is rolled out to a running graph and an unchanged one is not
    /// applied again. Backends that render more than the spec (Kubernetes) hash their render.
    fn fingerprint(&self, graph: &GraphSpec) -> String {
        use sha2::Digest;
        let digest = sha2::Sha256::digest(format!("{graph:?}").as_bytes());
        format!("{digest:x}")[..16].to_owned()
    }

    /// Creates or updates the graph; returns what the backend observes right after.
    async fn apply_graph(&self, graph: &GraphSpec) -> Result<GraphObserved, FleetError>;
    /// Tears the graph down; a graph that does not exist is already deleted.
    async fn delete_graph(&self, graph: &str) -> Result<(), FleetError>;
    /// The graph's current state, `None` when it does not exist.
    async fn observe_graph(&self, graph: &str) -> Result<Option<GraphObserved>, FleetError>;

    /// Registers the adapter on every replica of its graph.
    async fn apply_adapter(&self, adapter: &AdapterSpec) -> Result<AdapterObserved, FleetError>;
    /// Deregisters the adapter; one that is not registered is already removed.
    async fn remove_adapter(&self, adapter: &AdapterSpec) -> Result<(), FleetError>;
    /// The adapter's current state, `None` when it is not registered.
    async fn observe_adapter(
        &self,
        adapter: &AdapterSpec,
    ) -> Result<Option<AdapterObserved>, FleetError>;
}
