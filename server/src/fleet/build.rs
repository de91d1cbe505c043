//! Building the backend `--fleet` names, for the lifecycle controller to drive.

use std::sync::Arc;

use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::backend::FleetBackend;
use super::kubernetes::{KubeBackend, KubeOptions};
use super::local_vllm::{LocalVllm, LocalVllmOptions};
use super::FleetSpec;

/// Options of the backends that need any.
#[derive(Debug, Clone)]
pub struct BackendOptions {
    pub kube: KubeOptions,
    pub vllm: LocalVllmOptions,
}

/// The backend of `spec`, or `None` for fleets the controller does not drive (yet): `local-sim`
/// and `static`. `local-vllm`'s processes run on `tracker` and stop at `cancel`.
pub async fn backend(
    spec: &FleetSpec,
    opts: &BackendOptions,
    tracker: &TaskTracker,
    cancel: &CancellationToken,
) -> anyhow::Result<Option<Arc<dyn FleetBackend>>> {
    Ok(match spec {
        FleetSpec::Kubernetes => Some(Arc::new(KubeBackend::connect(&opts.kube).await?)),
        FleetSpec::LocalVllm => Some(Arc::new(LocalVllm::new(
            opts.vllm.clone(),
            tracker.clone(),
            cancel.clone(),
        ))),
        FleetSpec::LocalSim | FleetSpec::Static(_) => None,
    })
}
