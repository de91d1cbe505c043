//! The `FleetBackend` contract, run against every backend: the controller re-sends the whole
//! desired state after every pass and every error, so every call must be idempotent, observing
//! what is not there must answer `None`, an adapter must become ready on every replica, and
//! deleting a graph must leave nothing running or stored behind; a graph scaled to zero replicas
//! (asleep) must come back with the adapters registered before. A new backend joins with a
//! factory and one `contract_suite!` line at the bottom.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests may fail loudly

use crate::common;
use crate::fleet_support;

use std::any::Any;
use std::sync::Arc;
use std::time::Duration;

use futures::future::BoxFuture;
use tokenfactory::fleet::backend::{
    AdapterObserved, AdapterSpec, FleetBackend, GraphObserved, GraphSpec, Phase,
};
use tokenfactory::fleet::dynamo_render::{graph_name, ServingTemplate};
use tokenfactory::fleet::kubernetes::{KubeBackend, KubeOptions};
use tokenfactory::fleet::local_vllm::{LocalVllm, LocalVllmOptions};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use common::eventually;
use fleet_support::fake_kube::{FakeKube, GRAPHS, MODELS};
use fleet_support::vllm::FakeVllm;

/// Long enough for two simulator processes to start on a loaded 2-core machine.
const WITHIN: Duration = Duration::from_secs(30);

/// One backend under test and what it needs kept alive.
pub struct Subject {
    pub backend: Arc<dyn FleetBackend>,
    /// Where adapters live for this backend (`s3://` on Kubernetes, `file://` locally).
    pub source_root: String,
    /// What the backend still runs or stores (empty after everything was deleted).
    pub leftovers: Box<dyn Fn() -> BoxFuture<'static, Vec<String>> + Send + Sync>,
    _keep: Box<dyn Any + Send + Sync>,
}

fn template(replicas: u32) -> ServingTemplate {
    ServingTemplate {
        model: "sim/llama-contract".into(),
        image: "nvcr.io/nvidia/ai-dynamo/vllm-runtime:0.6.0".into(),
        gpus_per_replica: 1,
        replicas,
        tensor_parallel_size: 1,
        quantization: None,
        max_loras: 4,
        max_lora_rank: 16,
        extra_args: Vec::new(),
        env_from_secret: None,
    }
}

fn graph_spec(base: &str) -> GraphSpec {
    GraphSpec {
        base: base.into(),
        graph: graph_name(base),
        template: template(2),
        replicas_max: 2,
    }
}

fn adapter(s: &Subject, base: &str, lora: &str) -> AdapterSpec {
    AdapterSpec {
        graph: graph_name(base),
        base: base.into(),
        lora_name: lora.into(),
        source_uri: format!("{}/{lora}", s.source_root),
    }
}

async fn ready_graph(s: &Subject, spec: &GraphSpec) -> GraphObserved {
    s.backend.apply_graph(spec).await.unwrap();
    eventually(WITHIN, "graph ready", || async {
        match s.backend.observe_graph(&spec.graph).await {
            Ok(Some(g)) if g.phase == Phase::Ready => Ok(g),
            other => Err(format!("{other:?}")),
        }
    })
    .await
}

async fn ready_adapter(s: &Subject, a: &AdapterSpec) -> AdapterObserved {
    eventually(WITHIN, "adapter ready", || async {
        // Re-applying is what the controller does on each pass; it must be harmless.
        s.backend.apply_adapter(a).await.unwrap();
        match s.backend.observe_adapter(a).await {
            Ok(Some(o)) if o.phase == Phase::Ready => Ok(o),
            other => Err(format!("{other:?}")),
        }
    })
    .await
}

mod cases {
    use super::*;

    pub async fn apply_graph_is_idempotent(s: Subject) {
        let spec = graph_spec("contract-idem");
        let first = s.backend.apply_graph(&spec).await.unwrap();
        let again = s.backend.apply_graph(&spec).await.unwrap();
        assert_eq!(first.frontend_url, again.frontend_url);
        assert_eq!((first.replicas_desired, again.replicas_desired), (2, 2));
        let ready = ready_graph(&s, &spec).await;
        assert_eq!((ready.replicas_ready, ready.replicas_desired), (2, 2));
        assert_eq!(ready.frontend_url, first.frontend_url);
        let after = s.backend.apply_graph(&spec).await.unwrap();
        assert_eq!(
            after.phase,
            Phase::Ready,
            "re-applying a ready graph keeps it ready"
        );
    }

    pub async fn adapter_becomes_ready_on_every_replica(s: Subject) {
        let spec = graph_spec("contract-ready");
        ready_graph(&s, &spec).await;
        let a = adapter(&s, "contract-ready", "acme--bot--v1");
        let first = s.backend.apply_adapter(&a).await.unwrap();
        assert_eq!(first.total_endpoints, 2);
        let ready = ready_adapter(&s, &a).await;
        assert_eq!((ready.ready_endpoints, ready.total_endpoints), (2, 2));
    }

    pub async fn remove_adapter_is_idempotent(s: Subject) {
        let spec = graph_spec("contract-remove");
        ready_graph(&s, &spec).await;
        let a = adapter(&s, "contract-remove", "acme--bot--v1");
        let other = adapter(&s, "contract-remove", "acme--other--v1");
        ready_adapter(&s, &a).await;
        ready_adapter(&s, &other).await;
        s.backend.remove_adapter(&a).await.unwrap();
        s.backend.remove_adapter(&a).await.unwrap();
        eventually(WITHIN, "adapter gone", || async {
            s.backend.observe_adapter(&a).await.unwrap().is_none()
        })
        .await;
        let kept = s.backend.observe_adapter(&other).await.unwrap();
        assert_eq!(
            kept.map(|o| o.phase),
            Some(Phase::Ready),
            "a co-tenant's adapter stays"
        );
        let graph = s.backend.observe_graph(&spec.graph).await.unwrap();
        assert_eq!(
            graph.map(|g| g.phase),
            Some(Phase::Ready),
            "the graph stays"
        );
    }

    pub async fn observing_what_is_missing_answers_none(s: Subject) {
        let a = adapter(&s, "contract-missing", "nobody--v1");
        assert_eq!(
            s.backend
                .observe_graph(&graph_name("contract-missing"))
                .await
                .unwrap(),
            None
        );
        assert_eq!(s.backend.observe_adapter(&a).await.unwrap(), None);
        s.backend.remove_adapter(&a).await.unwrap();
        s.backend
            .delete_graph(&graph_name("contract-missing"))
            .await
            .unwrap();
        let spec = graph_spec("contract-missing");
        s.backend.apply_graph(&spec).await.unwrap();
        assert_eq!(
            s.backend.observe_adapter(&a).await.unwrap(),
            None,
            "graph there, adapter not"
        );
    }

    pub async fn a_graph_scaled_to_zero_comes_back_with_its_adapters(s: Subject) {
        let spec = graph_spec("contract-sleep");
        ready_graph(&s, &spec).await;
        let a = adapter(&s, "contract-sleep", "acme--bot--v1");
        ready_adapter(&s, &a).await;
        // Asleep: zero replicas, applied twice as the controller does.
        let mut asleep = spec.clone();
        asleep.template.replicas = 0;
        s.backend.apply_graph(&asleep).await.unwrap();
        s.backend.apply_graph(&asleep).await.unwrap();
        eventually(WITHIN, "no replica left", || async {
            match s.backend.observe_graph(&spec.graph).await {
                Ok(Some(g)) if (g.replicas_ready, g.replicas_desired) == (0, 0) => Ok(()),
                other => Err(format!("{other:?}")),
            }
        })
        .await;
        // Woken: the floor again, and the adapter registered before is on every new replica.
        let woken = ready_graph(&s, &spec).await;
        assert_eq!((woken.replicas_ready, woken.replicas_desired), (2, 2));
        let ready = ready_adapter(&s, &a).await;
        assert_eq!((ready.ready_endpoints, ready.total_endpoints), (2, 2));
        s.backend.delete_graph(&spec.graph).await.unwrap();
        assert_eq!((s.leftovers)().await, Vec::<String>::new());
    }

    pub async fn delete_graph_is_idempotent(s: Subject) {
        let spec = graph_spec("contract-delete");
        ready_graph(&s, &spec).await;
        s.backend.delete_graph(&spec.graph).await.unwrap();
        s.backend.delete_graph(&spec.graph).await.unwrap();
        assert_eq!(s.backend.observe_graph(&spec.graph).await.unwrap(), None);
        assert_eq!((s.leftovers)().await, Vec::<String>::new());
        // And it comes back when applied again.
        ready_graph(&s, &spec).await;
    }

    pub async fn deleting_a_graph_with_adapters_leaves_nothing(s: Subject) {
        let spec = graph_spec("contract-teardown");
        let other = graph_spec("contract-bystander");
        ready_graph(&s, &spec).await;
        ready_graph(&s, &other).await;
        let a = adapter(&s, "contract-teardown", "acme--bot--v1");
        let b = adapter(&s, "contract-teardown", "beta--bot--v1");
        let c = adapter(&s, "contract-bystander", "gamma--bot--v1");
        for x in [&a, &b, &c] {
            ready_adapter(&s, x).await;
        }
        s.backend.delete_graph(&spec.graph).await.unwrap();
        assert_eq!(s.backend.observe_graph(&spec.graph).await.unwrap(), None);
        assert_eq!(s.backend.observe_adapter(&a).await.unwrap(), None);
        assert_eq!(s.backend.observe_adapter(&b).await.unwrap(), None);
        let bystander = s.backend.observe_adapter(&c).await.unwrap();
        assert_eq!(
            bystander.map(|o| o.phase),
            Some(Phase::Ready),
            "another base is untouched"
        );
        s.backend.delete_graph(&other.graph).await.unwrap();
        assert_eq!((s.leftovers)().await, Vec::<String>::new());
    }
}

/// Every case, as tests of one backend made by `$factory`.
macro_rules! contract_suite {
    ($name:ident, $factory:path) => {
        mod $name {
            use super::*;
            #[tokio::test]
            async fn apply_graph_is_idempotent() {
                cases::apply_graph_is_idempotent($factory().await).await
            }
            #[tokio::test]
            async fn adapter_becomes_ready_on_every_replica() {
                cases::adapter_becomes_ready_on_every_replica($factory().await).await
            }
            #[tokio::test]
            async fn remove_adapter_is_idempotent() {
                cases::remove_adapter_is_idempotent($factory().await).await
            }
            #[tokio::test]
            async fn observing_what_is_missing_answers_none() {
                cases::observing_what_is_missing_answers_none($factory().await).await
            }
            #[tokio::test]
            async fn a_graph_scaled_to_zero_comes_back_with_its_adapters() {
                cases::a_graph_scaled_to_zero_comes_back_with_its_adapters($factory().await).await
            }
            #[tokio::test]
            async fn delete_graph_is_idempotent() {
                cases::delete_graph_is_idempotent($factory().await).await
            }
            #[tokio::test]
            async fn deleting_a_graph_with_adapters_leaves_nothing() {
                cases::deleting_a_graph_with_adapters_leaves_nothing($factory().await).await
            }
        }
    };
}

/// `kubernetes` against the fake API server playing the operator.
async fn kubernetes() -> Subject {
    let fake = FakeKube::start("models").await;
    let opts = KubeOptions {
        namespace: Some("models".into()),
        ..KubeOptions::default()
    };
    let backend = KubeBackend::with_config(fake.config(), &opts)
        .await
        .unwrap();
    let seen = fake.clone();
    Subject {
        backend: Arc::new(backend),
        source_root: "s3://adapters/contract".into(),
        leftovers: Box::new(move || {
            let fake = seen.clone();
            Box::pin(async move {
                assert_eq!(
                    fake.violations(),
                    Vec::<String>::new(),
                    "requests the API server refused"
                );
                let mut left = fake.names(GRAPHS);
                left.extend(fake.names(MODELS));
                left
            })
        }),
        _keep: Box::new(fake),
    }
}

/// `local-vllm` with the simulator standing in for `vllm serve`.
async fn local_vllm() -> Subject {
    let vllm = Arc::new(FakeVllm::new());
    let tracker = TaskTracker::new();
    let cancel = CancellationToken::new();
    let mut opts = LocalVllmOptions::new(vllm.bin.clone());
    opts.startup_timeout = WITHIN;
    let backend = LocalVllm::new(opts, tracker, cancel.clone());
    let root = format!("file://{}", vllm.dir.path().display());
    let seen = vllm.clone();
    Subject {
        backend: Arc::new(backend),
        source_root: root,
        leftovers: Box::new(move || {
            let vllm = seen.clone();
            Box::pin(async move {
                vllm.listening()
                    .await
                    .iter()
                    .map(|p| format!("engine on port {p}"))
                    .collect()
            })
        }),
        _keep: Box::new((vllm, cancel.drop_guard())),
    }
}

contract_suite!(kubernetes_backend, kubernetes);
contract_suite!(local_vllm_backend, local_vllm);
