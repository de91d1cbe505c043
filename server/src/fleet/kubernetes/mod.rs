//! The `kubernetes` backend: Dynamo's operator does the serving, Token Factory owns the desired
//! objects. One `DynamoGraphDeployment` per base (rendered from its template), one LoRA
//! `DynamoModel` per started adapter, both written by server-side apply under the field manager
//! `tokenfactory`; status is read back from the objects.
//!
//! Nothing is orphaned: a `DynamoModel` is owned by its graph (owner reference, so the garbage
//! collector removes it with the graph however the graph goes), and the graph carries our
//! finalizer, so even a `kubectl delete` of a graph waits until Token Factory has removed its
//! models (the operator unloads each from its workers first) and released it.
//!
//! Every call is one or a few API requests and keeps no state, so any replica that leads the
//! controller can drive it. An apply first reads the object: when it already carries the hash of
//! what would be written ([`dynamo_render::SPEC_HASH`]), nothing is written, so a pending graph
//! or a loading model costs one read per pass, never an apply storm.
//!
//! The API version is discovered once at start-up ([`discovery`]): `v1beta1` when served, else
//! `v1alpha1`; the bodies and paths follow it.

mod client;
pub mod discovery;
pub mod status;

use std::path::PathBuf;

use async_trait::async_trait;
use serde_json::{json, Value};

use self::client::Resource;
use super::backend::{
    AdapterObserved, AdapterSpec, FleetBackend, FleetError, GraphObserved, GraphSpec,
};
use super::dynamo_render::{
    self, ApiVersion, ClusterPieces, RenderContext, BASE_LABEL, FIELD_MANAGER, MANAGED_BY,
};

/// Our finalizer on every graph: released once the graph's models are gone.
pub const FINALIZER: &str = "tokenfactory.dev/cleanup";

/// Where the backend works.
#[derive(Debug, Clone)]
pub struct KubeOptions {
    /// Namespace of the graphs; `None`: the kubeconfig context's (in a pod: its own).
    pub namespace: Option<String>,
    /// The gateway's URL of a graph's frontend; `{graph}` and `{namespace}` are replaced.
    pub frontend_url: String,
    /// A kubeconfig file; `None`: `KUBECONFIG`, `~/.kube/config`, then the in-cluster config.
    pub kubeconfig: Option<PathBuf>,
    /// Secrets and the model cache every graph gets.
    pub cluster: ClusterPieces,
}

impl Default for KubeOptions {
    fn default() -> Self {
        Self {
            namespace: None,
            frontend_url: dynamo_render::DEFAULT_FRONTEND_URL.to_owned(),
            kubeconfig: None,
            cluster: ClusterPieces::default(),
        }
    }
}

pub struct KubeBackend {
    graphs: Resource,
    models: Resource,
    namespace: String,
    frontend_url: String,
    version: ApiVersion,
    cluster: ClusterPieces,
}

impl KubeBackend {
    /// Connects with the kubeconfig (or in-cluster) configuration and discovers the API version
    /// the cluster serves: a cluster without Dynamo's CRDs stops start-up, naming them.
    pub async fn connect(opts: &KubeOptions) -> anyhow::Result<Self> {
        let config = match &opts.kubeconfig {
            Some(path) => {
                let kubeconfig = kube::config::Kubeconfig::read_from(path)?;
                kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default()).await?
            }
            None => kube::Config::infer().await?,
        };
        Self::with_config(config, opts).await
    }

    /// A backend on an explicit configuration (tests: `Config::new` on a fake API server), at
    /// the version the server serves.
    pub async fn with_config(config: kube::Config, opts: &KubeOptions) -> anyhow::Result<Self> {
        let client = kube::Client::try_from(config.clone())?;
        let version = discovery::served_version(&client).await?;
        tracing::info!(version = version.version(), "Dynamo API version discovered");
        Self::with_version(config, opts, version)
    }

    /// A backend at a known version, asking nothing (tests of an unreachable cluster).
    pub fn with_version(
        config: kube::Config,
        opts: &KubeOptions,
        version: ApiVersion,
    ) -> anyhow::Result<Self> {
        let namespace = opts
            .namespace
            .clone()
            .unwrap_or_else(|| config.default_namespace.clone());
        let client = kube::Client::try_from(config)?;
        Ok(Self {
            graphs: Resource::new(
                client.clone(),
                &namespace,
                &client::graph_resource(version),
                "DynamoGraphDeployment",
            ),
            models: Resource::new(
                client,
                &namespace,
                &client::model_resource(version),
                "DynamoModel",
            ),
            namespace,
            frontend_url: opts.frontend_url.clone(),
            version,
            cluster: opts.cluster.clone(),
        })
    }

    /// The version this backend renders and requests.
    pub fn version(&self) -> ApiVersion {
        self.version
    }

    /// The graph's body as applied (with our finalizer).
    fn render_graph(&self, spec: &GraphSpec) -> Result<Value, FleetError> {
        let cx = RenderContext {
            version: self.version,
            cluster: self.cluster.clone(),
            replicas_max: Some(spec.replicas_max),
        };
        let mut body = dynamo_render::graph_with(&spec.base, &self.namespace, &spec.template, &cx)
            .map_err(rejected)?;
        body["metadata"]["finalizers"] = json!([FINALIZER]);
        Ok(body)
    }

    fn observed_graph(&self, obj: &Value) -> GraphObserved {
        let name = obj["metadata"]["name"].as_str().unwrap_or_default();
        let url = dynamo_render::frontend_url(&self.frontend_url, name, &self.namespace);
        status::graph(obj, url)
    }

    /// Deletes the graph's models, then releases our finalizer on the graph once none is left.
    /// `Unavailable` while some are still being unloaded: the caller retries.
    async fn clean_up(&self, graph: &Value) -> Result<(), FleetError> {
        let name = graph["metadata"]["name"].as_str().unwrap_or_default();
        let selector = format!("{MANAGED_BY}={FIELD_MANAGER},{BASE_LABEL}={name}");
        let mut left = 0;
        for model in self.models.list(&selector).await? {
            let model_name = model["metadata"]["name"].as_str().unwrap_or_default();
            if self.models.delete(model_name).await?.is_some() {
                left += 1;
            }
        }
        if left > 0 {
            return Err(FleetError::Unavailable(format!(
                "graph {name} waits for {left} adapter(s) to be unloaded"
            )));
        }
        self.graphs.release(graph, FINALIZER).await
    }
}

/// A graph's name must be the one `dynamo_render` derives from its base: its models find it by
/// that name and label.
fn check_graph_name(graph: &str, base: &str) -> Result<(), FleetError> {
    let expected = dynamo_render::graph_name(base);
    if graph == expected {
        Ok(())
    } else {
        Err(FleetError::Rejected(format!(
            "graph {graph:?} of base {base:?} must be named {expected:?} on Kubernetes"
        )))
    }
}

/// Whether the stored `obj` already is what applying `body` would make it: the same spec hash,
/// our finalizers on it, and not being deleted (a deleted object is re-created by an apply).
fn current(obj: &Value, body: &Value) -> bool {
    let finalizers = |o: &Value| -> Vec<Value> {
        o["metadata"]["finalizers"]
            .as_array()
            .cloned()
            .unwrap_or_default()
    };
    let have = finalizers(obj);
    !status::terminating(obj)
        && dynamo_render::stamped(obj).is_some()
        && dynamo_render::stamped(obj) == dynamo_render::stamped(body)
        && finalizers(body).iter().all(|f| have.contains(f))
}

fn rejected(e: impl std::fmt::Display) -> FleetError {
    FleetError::Rejected(e.to_string())
}

#[async_trait]
impl FleetBackend for KubeBackend {
    fn kind(&self) -> &'static str {
        "kubernetes"
    }

    fn fingerprint(&self, spec: &GraphSpec) -> String {
        match self.render_graph(spec) {
            Ok(body) => dynamo_render::stamped(&body).unwrap_or_default().to_owned(),
            // Unrenderable: a stable value, so the rejection is recorded once per template.
            Err(e) => format!("unrenderable: {e}"),
        }
    }

    async fn apply_graph(&self, spec: &GraphSpec) -> Result<GraphObserved, FleetError> {
        check_graph_name(&spec.graph, &spec.base)?;
        let body = self.render_graph(spec)?;
        if let Some(obj) = self.graphs.get(&spec.graph).await? {
            if current(&obj, &body) {
                return Ok(self.observed_graph(&obj));
            }
        }
        let mut obj = self.graphs.apply(&spec.graph, &body).await?;
        if status::terminating(&obj) {
            // Deleted outside Token Factory: finish that delete (models first; `Unavailable`
            // while the operator still unloads them), then create it anew.
            self.clean_up(&obj).await?;
            obj = self.graphs.apply(&spec.graph, &body).await?;
            if status::terminating(&obj) {
                return Err(FleetError::Unavailable(format!(
                    "graph {} is still being deleted; it is created again on a later pass",
                    spec.graph
                )));
            }
        }
        Ok(self.observed_graph(&obj))
    }

    async fn delete_graph(&self, graph: &str) -> Result<(), FleetError> {
        let Some(obj) = self.graphs.get(graph).await? else {
            return Ok(());
        };
        // Models first, so the operator unloads each from live workers before they go away.
        self.clean_up(&obj).await?;
        if let Some(obj) = self.graphs.delete(graph).await? {
            self.graphs.release(&obj, FINALIZER).await?;
        }
        Ok(())
    }

    async fn observe_graph(&self, graph: &str) -> Result<Option<GraphObserved>, FleetError> {
        Ok(self
            .graphs
            .get(graph)
            .await?
            .map(|o| self.observed_graph(&o)))
    }

    async fn apply_adapter(&self, a: &AdapterSpec) -> Result<AdapterObserved, FleetError> {
        check_graph_name(&a.graph, &a.base)?;
        let graph = match self.graphs.get(&a.graph).await? {
            Some(g) if !status::terminating(&g) => g,
            _ => {
                return Err(FleetError::Unavailable(format!(
                    "graph {} does not exist (yet)",
                    a.graph
                )))
            }
        };
        let model = status::worker_model(&graph).ok_or_else(|| {
            FleetError::Rejected(format!("graph {} names no --model for its worker", a.graph))
        })?;
        let uid = graph["metadata"]["uid"].as_str().unwrap_or_default();
        let body = dynamo_render::lora_model(
            &a.lora_name,
            &a.base,
            &model,
            &a.source_uri,
            &self.namespace,
            uid,
            self.version,
        )
        .map_err(rejected)?;
        let name = dynamo_render::lora_model_name(&a.graph, &a.lora_name);
        if let Some(obj) = self.models.get(&name).await? {
            if current(&obj, &body) {
                return Ok(status::adapter(&obj));
            }
        }
        let obj = self.models.apply(&name, &body).await?;
        Ok(status::adapter(&obj))
    }

    async fn remove_adapter(&self, a: &AdapterSpec) -> Result<(), FleetError> {
        let name = dynamo_render::lora_model_name(&a.graph, &a.lora_name);
        self.models.delete(&name).await?;
        Ok(())
    }

    async fn observe_adapter(
        &self,
        a: &AdapterSpec,
    ) -> Result<Option<AdapterObserved>, FleetError> {
        let name = dynamo_render::lora_model_name(&a.graph, &a.lora_name);
        Ok(self.models.get(&name).await?.map(|o| status::adapter(&o)))
    }
}
