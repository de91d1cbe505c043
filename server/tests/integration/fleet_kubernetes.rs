//! The `kubernetes` backend against the fake API server: the exact requests (method, path with
//! group/version/namespace/plural, field manager, force, strict validation, content type, the
//! rendered bodies), every status transition the operator reports, the finalizer and owner
//! paths, and each error kind; API version discovery; applies skipped while nothing changed.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests may fail loudly

use crate::common;
use crate::fleet_support;

use serde_json::json;
use tokenfactory::fleet::backend::{AdapterSpec, FleetBackend, FleetError, GraphSpec, Phase};
use tokenfactory::fleet::dynamo_render::{
    self, graph_name, lora_model_name, ApiVersion, ClusterPieces, RenderContext, ServingTemplate,
};
use tokenfactory::fleet::kubernetes::{KubeBackend, KubeOptions, FINALIZER};

use fleet_support::fake_kube::{FakeKube, GRAPHS, MODELS};

const NS: &str = "models";
const BASE: &str = "llama-3.1-8b";

fn template() -> ServingTemplate {
    ServingTemplate {
        model: "meta-llama/Llama-3.1-8B-Instruct".into(),
        image: "nvcr.io/nvidia/ai-dynamo/vllm-runtime:0.6.0".into(),
        gpus_per_replica: 1,
        replicas: 2,
        tensor_parallel_size: 1,
        quantization: None,
        max_loras: 8,
        max_lora_rank: 64,
        extra_args: Vec::new(),
        env_from_secret: Some("hf-token".into()),
    }
}

fn spec() -> GraphSpec {
    GraphSpec {
        base: BASE.into(),
        graph: graph_name(BASE),
        template: template(),
        replicas_max: 2,
    }
}

fn lora(name: &str) -> AdapterSpec {
    AdapterSpec {
        graph: graph_name(BASE),
        base: BASE.into(),
        lora_name: name.into(),
        source_uri: format!("s3://adapters/acme/{name}"),
    }
}

async fn setup(frontend_url: Option<&str>) -> (FakeKube, KubeBackend) {
    let fake = FakeKube::start(NS).await;
    let mut opts = KubeOptions {
        namespace: Some(NS.into()),
        ..KubeOptions::default()
    };
    if let Some(url) = frontend_url {
        opts.frontend_url = url.into();
    }
    let backend = KubeBackend::with_config(fake.config(), &opts)
        .await
        .unwrap();
    (fake, backend)
}

fn path(plural: &str, name: &str) -> String {
    format!("/apis/nvidia.com/v1beta1/namespaces/{NS}/{plural}/{name}")
}

/// The requests other than discovery, as (method, path).
fn calls(fake: &FakeKube) -> Vec<(String, String)> {
    fake.requests()
        .into_iter()
        .filter(|r| r.path.contains("/namespaces/"))
        .map(|r| (r.method, r.path))
        .collect()
}

#[tokio::test]
async fn apply_graph_sends_one_server_side_apply_of_the_rendered_graph() {
    let (fake, backend) = setup(None).await;
    assert_eq!(backend.version(), ApiVersion::V1beta1);
    fake.clear_requests();
    let observed = backend.apply_graph(&spec()).await.unwrap();
    let reqs = fake.requests();
    assert_eq!(reqs.len(), 2, "a read, then one apply: {reqs:?}");
    assert_eq!(
        (reqs[0].method.as_str(), reqs[0].path.clone()),
        ("GET", path(GRAPHS, &graph_name(BASE)))
    );
    let r = &reqs[1];
    assert_eq!(r.method, "PATCH");
    assert_eq!(r.path, path(GRAPHS, &graph_name(BASE)));
    assert_eq!(r.content_type, "application/apply-patch+yaml");
    assert_eq!(
        r.query.get("fieldManager").map(String::as_str),
        Some("tokenfactory")
    );
    assert_eq!(r.query.get("force").map(String::as_str), Some("true"));
    assert_eq!(
        r.query.get("fieldValidation").map(String::as_str),
        Some("Strict")
    );
    let cx = RenderContext {
        replicas_max: Some(2),
        ..RenderContext::default()
    };
    let mut expected = dynamo_render::graph_with(BASE, NS, &template(), &cx).unwrap();
    expected["metadata"]["finalizers"] = json!([FINALIZER]);
    assert_eq!(r.body, expected);
    assert_eq!(r.body["apiVersion"], "nvidia.com/v1beta1");
    assert_eq!(
        r.body["spec"]["services"]["worker"]["modelRef"]["name"],
        "meta-llama/Llama-3.1-8B-Instruct"
    );
    assert_eq!(observed.phase, Phase::Pending);
    assert_eq!(
        observed.frontend_url,
        format!("http://{}-frontend.{NS}.svc:8000/v1", graph_name(BASE))
    );
    assert_eq!(fake.violations(), Vec::<String>::new());
}

#[tokio::test]
async fn a_graph_goes_pending_then_ready_or_failed_with_the_operators_reason() {
    let (fake, backend) = setup(Some("http://127.0.0.1:9/{namespace}/{graph}/v1")).await;
    let name = graph_name(BASE);
    fake.manual_operator();
    backend.apply_graph(&spec()).await.unwrap();
    fake.script(
        GRAPHS,
        &name,
        vec![
            json!({"state": "initializing"}),
            json!({"state": "pending", "services": {"worker": {"readyReplicas": 1}}}),
            json!({"state": "successful", "services": {"worker": {"readyReplicas": 2}}}),
            json!({"state": "failed", "conditions": [{"type": "Ready", "status": "False",
                "reason": "ImagePullBackOff", "message": "image not found"}]}),
        ],
    );
    let seen: Vec<_> = futures_seq(&backend, &name, 4).await;
    assert_eq!(
        seen,
        vec![
            (Phase::Pending, 0, 2),
            (Phase::Pending, 1, 2),
            (Phase::Ready, 2, 2),
            (
                Phase::Failed("ImagePullBackOff: image not found".into()),
                0,
                2
            ),
        ]
    );
    let g = backend.observe_graph(&name).await.unwrap().unwrap();
    assert_eq!(g.frontend_url, format!("http://127.0.0.1:9/{NS}/{name}/v1"));
}

async fn futures_seq(backend: &KubeBackend, name: &str, n: usize) -> Vec<(Phase, u32, u32)> {
    let mut out = Vec::new();
    for _ in 0..n {
        let g = backend.observe_graph(name).await.unwrap().unwrap();
        out.push((g.phase, g.replicas_ready, g.replicas_desired));
    }
    out
}

#[tokio::test]
async fn an_adapter_is_a_lora_model_owned_by_its_graph_ready_on_every_endpoint() {
    let (fake, backend) = setup(None).await;
    backend.apply_graph(&spec()).await.unwrap();
    fake.clear_requests();
    let a = lora("acme--bot--v1");
    let first = backend.apply_adapter(&a).await.unwrap();
    assert_eq!(
        (first.phase, first.ready_endpoints, first.total_endpoints),
        (Phase::Pending, 0, 2)
    );
    let reqs = fake.requests();
    let model_path = path(MODELS, &lora_model_name(&graph_name(BASE), &a.lora_name));
    assert_eq!(
        reqs.iter()
            .map(|r| (r.method.as_str(), r.path.clone()))
            .collect::<Vec<_>>(),
        vec![
            ("GET", path(GRAPHS, &graph_name(BASE))),
            ("GET", model_path.clone()),
            ("PATCH", model_path),
        ]
    );
    let body = &reqs[2].body;
    assert_eq!(reqs[2].content_type, "application/apply-patch+yaml");
    assert_eq!(body["spec"]["modelType"], "lora");
    assert_eq!(body["spec"]["modelName"], "acme--bot--v1");
    assert_eq!(
        body["spec"]["baseModelName"],
        "meta-llama/Llama-3.1-8B-Instruct"
    );
    assert_eq!(
        body["spec"]["source"]["uri"],
        "s3://adapters/acme/acme--bot--v1"
    );
    let graph = fake.object(GRAPHS, &graph_name(BASE)).unwrap();
    let owner = &body["metadata"]["ownerReferences"][0];
    assert_eq!(owner["uid"], graph["metadata"]["uid"]);
    assert_eq!(owner["kind"], "DynamoGraphDeployment");
    // 0/2, then 2/2 as the operator loads it everywhere; 1/2 is not ready.
    let now = backend.observe_adapter(&a).await.unwrap().unwrap();
    assert_eq!(
        (now.phase, now.ready_endpoints, now.total_endpoints),
        (Phase::Ready, 2, 2)
    );
    let name = lora_model_name(&graph_name(BASE), &a.lora_name);
    fake.script(
        MODELS,
        &name,
        vec![json!({"readyEndpoints": 1, "totalEndpoints": 2,
        "conditions": [{"type": "EndpointsReady", "status": "True"}]})],
    );
    let half = backend.observe_adapter(&a).await.unwrap().unwrap();
    assert_eq!((half.phase, half.ready_endpoints), (Phase::Pending, 1));
    assert_eq!(fake.violations(), Vec::<String>::new());
}

#[tokio::test]
async fn errors_map_to_their_kinds() {
    let (fake, backend) = setup(None).await;
    // kube's client retries 429/503/504 itself (`RetryPolicy::server_retry`), so one injected 503
    // never reaches the backend; a 500 does.
    fake.fail_next("PATCH", GRAPHS, 500);
    assert!(matches!(
        backend.apply_graph(&spec()).await,
        Err(FleetError::Unavailable(_))
    ));
    fake.fail_next("PATCH", GRAPHS, 422);
    assert!(matches!(
        backend.apply_graph(&spec()).await,
        Err(FleetError::Rejected(_))
    ));
    fake.fail_next("PATCH", GRAPHS, 409);
    assert!(matches!(
        backend.apply_graph(&spec()).await,
        Err(FleetError::Conflict(_))
    ));
    fake.fail_next("GET", GRAPHS, 500);
    assert!(matches!(
        backend.observe_graph("x").await,
        Err(FleetError::Unavailable(_))
    ));
    // An adapter before its graph: retry later. A source the operator refuses: rejected, unsent.
    assert!(matches!(
        backend.apply_adapter(&lora("a")).await,
        Err(FleetError::Unavailable(_))
    ));
    backend.apply_graph(&spec()).await.unwrap();
    let mut local = lora("b");
    local.source_uri = "file:///tmp/b".into();
    assert!(matches!(
        backend.apply_adapter(&local).await,
        Err(FleetError::Rejected(_))
    ));
    let mut wrong = spec();
    wrong.graph = "some-other-name".into();
    assert!(matches!(
        backend.apply_graph(&wrong).await,
        Err(FleetError::Rejected(_))
    ));
    // Nobody listening.
    let mut config = fake.config();
    config.cluster_url = "http://127.0.0.1:9".parse().unwrap();
    let gone =
        KubeBackend::with_version(config.clone(), &KubeOptions::default(), ApiVersion::V1beta1)
            .unwrap();
    assert!(matches!(
        gone.observe_graph("x").await,
        Err(FleetError::Unavailable(_))
    ));
    assert_eq!(fake.violations(), Vec::<String>::new());
}

#[tokio::test]
async fn a_graph_deleted_outside_waits_for_its_models_then_comes_back() {
    let (fake, backend) = setup(None).await;
    let name = graph_name(BASE);
    backend.apply_graph(&spec()).await.unwrap();
    backend.apply_adapter(&lora("acme--bot--v1")).await.unwrap();
    let uid = fake.object(GRAPHS, &name).unwrap()["metadata"]["uid"].clone();
    fake.delete_outside(GRAPHS, &name);
    // Our finalizer holds it: still there, being deleted.
    let held = fake.object(GRAPHS, &name).unwrap();
    assert!(held["metadata"]["deletionTimestamp"].is_string());
    assert_eq!(
        backend.observe_graph(&name).await.unwrap().unwrap().phase,
        Phase::Pending
    );
    // The next apply finishes the delete (models first) and creates it anew.
    backend.apply_graph(&spec()).await.unwrap();
    assert_eq!(fake.names(MODELS), Vec::<String>::new());
    assert_ne!(fake.object(GRAPHS, &name).unwrap()["metadata"]["uid"], uid);
    assert_eq!(fake.violations(), Vec::<String>::new());
}

#[tokio::test]
async fn deleting_a_graph_waits_for_the_operator_to_unload_its_models() {
    let (fake, backend) = setup(None).await;
    let name = graph_name(BASE);
    fake.with_model_finalizer();
    backend.apply_graph(&spec()).await.unwrap();
    let a = lora("acme--bot--v1");
    backend.apply_adapter(&a).await.unwrap();
    let err = backend.delete_graph(&name).await;
    assert!(matches!(err, Err(FleetError::Unavailable(_))), "{err:?}");
    assert!(
        fake.object(GRAPHS, &name).is_some(),
        "the graph outlives its models"
    );
    // A stopped adapter reads as unloading until the operator is done.
    assert_eq!(
        backend.observe_adapter(&a).await.unwrap().map(|o| o.phase),
        Some(Phase::Pending)
    );
    fake.operator_unloaded(&lora_model_name(&name, &a.lora_name));
    backend.delete_graph(&name).await.unwrap();
    assert_eq!(fake.object(GRAPHS, &name), None);
    assert_eq!(backend.observe_adapter(&a).await.unwrap(), None);
    // Someone else's change between our read and our finalizer release: a conflict, retried.
    backend.apply_graph(&spec()).await.unwrap();
    fake.fail_next("PATCH", GRAPHS, 409);
    assert!(matches!(
        backend.delete_graph(&name).await,
        Err(FleetError::Conflict(_))
    ));
    backend.delete_graph(&name).await.unwrap();
    assert_eq!(fake.object(GRAPHS, &name), None);
    assert_eq!(fake.violations(), Vec::<String>::new());
}

/// Scale to zero (issue 18) on Kubernetes: an idle graph's DGD keeps its frontend and has its
/// worker service's replicas patched to 0 by the same server-side apply, and back to the floor on
/// a wake; the operator's status reads back as 0 of 0, then pending, then ready.
#[tokio::test]
async fn an_idle_graph_goes_to_zero_workers_and_back_by_server_side_apply() {
    let (fake, backend) = setup(None).await;
    let name = graph_name(BASE);
    fake.manual_operator();
    backend.apply_graph(&spec()).await.unwrap();
    fake.script(
        GRAPHS,
        &name,
        vec![json!({"state": "successful", "services": {"worker": {"readyReplicas": 2}}})],
    );
    assert_eq!(
        futures_seq(&backend, &name, 1).await,
        vec![(Phase::Ready, 2, 2)]
    );
    let awake = fake.object(GRAPHS, &name).unwrap();
    fake.clear_requests();

    // Asleep: the controller applies the graph with zero replicas.
    let mut asleep = spec();
    asleep.template.replicas = 0;
    backend.apply_graph(&asleep).await.unwrap();
    let reqs: Vec<_> = fake
        .requests()
        .into_iter()
        .filter(|r| r.method == "PATCH")
        .collect();
    assert_eq!(reqs.len(), 1, "one apply: {reqs:?}");
    assert_eq!(reqs[0].content_type, "application/apply-patch+yaml");
    assert_eq!(reqs[0].body["spec"]["services"]["worker"]["replicas"], 0);
    let stored = fake.object(GRAPHS, &name).unwrap();
    assert_eq!(stored["spec"]["services"]["worker"]["replicas"], 0);
    // Only the worker count changed: the frontend (the gateway's URL) stays.
    let mut expected = awake["spec"].clone();
    expected["services"]["worker"]["replicas"] = json!(0);
    assert_eq!(stored["spec"], expected);
    assert_eq!(
        stored["metadata"]["uid"], awake["metadata"]["uid"],
        "same object"
    );
    fake.script(
        GRAPHS,
        &name,
        vec![json!({"state": "successful", "services": {"worker": {"readyReplicas": 0}}})],
    );
    assert_eq!(
        futures_seq(&backend, &name, 1).await,
        vec![(Phase::Ready, 0, 0)]
    );

    // A wake: back to the floor, pending until the workers are ready.
    fake.clear_requests();
    backend.apply_graph(&spec()).await.unwrap();
    let reqs: Vec<_> = fake
        .requests()
        .into_iter()
        .filter(|r| r.method == "PATCH")
        .collect();
    assert_eq!(reqs.len(), 1);
    assert_eq!(reqs[0].body["spec"]["services"]["worker"]["replicas"], 2);
    fake.script(
        GRAPHS,
        &name,
        vec![
            json!({"state": "pending", "services": {"worker": {"readyReplicas": 0}}}),
            json!({"state": "successful", "services": {"worker": {"readyReplicas": 2}}}),
        ],
    );
    assert_eq!(
        futures_seq(&backend, &name, 2).await,
        vec![(Phase::Pending, 0, 2), (Phase::Ready, 2, 2)]
    );
    assert_eq!(fake.violations(), Vec::<String>::new());
}

#[tokio::test]
async fn discovery_prefers_v1beta1_and_falls_back_to_v1alpha1() {
    let opts = KubeOptions {
        namespace: Some(NS.into()),
        ..KubeOptions::default()
    };
    let current = FakeKube::start(NS).await;
    let backend = KubeBackend::with_config(current.config(), &opts)
        .await
        .unwrap();
    assert_eq!(backend.version(), ApiVersion::V1beta1);
    let asked: Vec<String> = current.requests().into_iter().map(|r| r.path).collect();
    assert_eq!(asked, ["/apis/nvidia.com", "/apis/nvidia.com/v1beta1"]);

    // An older operator: everything goes to v1alpha1, bodies and paths alike, and is accepted.
    let old = FakeKube::serving(NS, &["v1alpha1"]).await;
    let backend = KubeBackend::with_config(old.config(), &opts).await.unwrap();
    assert_eq!(backend.version(), ApiVersion::V1alpha1);
    backend.apply_graph(&spec()).await.unwrap();
    let a = lora("acme--bot--v1");
    eventually_ready(&backend, &a).await;
    let graph = old.object(GRAPHS, &graph_name(BASE)).unwrap();
    assert_eq!(graph["apiVersion"], "nvidia.com/v1alpha1");
    assert!(calls(&old)
        .iter()
        .all(|(_, p)| p.starts_with("/apis/nvidia.com/v1alpha1/")));
    assert_eq!(old.violations(), Vec::<String>::new());

    // No Dynamo at all: start-up stops, naming what is missing.
    let none = FakeKube::serving(NS, &[]).await;
    let err = KubeBackend::with_config(none.config(), &opts)
        .await
        .err()
        .unwrap()
        .to_string();
    assert!(err.contains("dynamographdeployments"), "{err}");
}

async fn eventually_ready(backend: &KubeBackend, a: &AdapterSpec) {
    for _ in 0..10 {
        backend.apply_graph(&spec()).await.unwrap();
        if backend.apply_adapter(a).await.unwrap().phase == Phase::Ready {
            return;
        }
    }
    panic!("adapter {} never ready", a.lora_name);
}

#[tokio::test]
async fn nothing_is_applied_again_while_nothing_changed() {
    let (fake, backend) = setup(None).await;
    let a = lora("acme--bot--v1");
    eventually_ready(&backend, &a).await;
    let (graphs, models) = (fake.applies(GRAPHS), fake.applies(MODELS));
    assert_eq!((graphs, models), (1, 1), "one apply each to get there");
    // 10 s of controller passes at its 250 ms tick: every pass re-sends the whole desired state.
    for _ in 0..40 {
        backend.apply_graph(&spec()).await.unwrap();
        backend.apply_adapter(&a).await.unwrap();
    }
    assert_eq!((fake.applies(GRAPHS), fake.applies(MODELS)), (1, 1));
    // A pending model (its base's graph not serving yet) costs reads, not applies either.
    let b = lora("acme--other--v1");
    fake.manual_operator();
    for _ in 0..40 {
        backend.apply_adapter(&b).await.unwrap();
    }
    assert_eq!(fake.applies(MODELS), 2);
    // A template change is one apply.
    let mut changed = spec();
    changed.template.max_loras = 4;
    backend.apply_graph(&changed).await.unwrap();
    backend.apply_graph(&changed).await.unwrap();
    assert_eq!(fake.applies(GRAPHS), 2);
    let stored = fake.object(GRAPHS, &graph_name(BASE)).unwrap();
    let args =
        stored["spec"]["services"]["worker"]["extraPodSpec"]["mainContainer"]["args"].to_string();
    assert!(args.contains("\"--max-loras\",\"4\""), "{args}");
    assert_eq!(fake.violations(), Vec::<String>::new());
}

#[tokio::test]
async fn a_model_finds_endpoints_only_through_its_workers_model_ref() {
    let (fake, backend) = setup(None).await;
    let name = graph_name(BASE);
    backend.apply_graph(&spec()).await.unwrap();
    // The graph's workers are not up: the operator finds no service for the base yet.
    fake.script(GRAPHS, &name, vec![json!({"state": "pending"})]);
    let a = lora("acme--bot--v1");
    let now = backend.apply_adapter(&a).await.unwrap();
    assert_eq!((now.phase, now.total_endpoints), (Phase::Pending, 0));
    let message = now.message.unwrap_or_default();
    assert!(
        message.starts_with("NoServicesFound: ") && message.contains(&template().model),
        "{message}"
    );
    // Up, and its worker names the base by modelRef: found on both replicas, then loaded.
    fake.script(
        GRAPHS,
        &name,
        vec![json!({"state": "successful", "services": {"worker": {"readyReplicas": 2}}})],
    );
    backend.observe_graph(&name).await.unwrap();
    let mid = backend.observe_adapter(&a).await.unwrap().unwrap();
    assert_eq!(
        (mid.phase.clone(), mid.ready_endpoints, mid.total_endpoints),
        (Phase::Pending, 0, 2)
    );
    assert_eq!(
        mid.message.as_deref(),
        Some("NotReady: 0/2 endpoints ready")
    );
    let ready = backend.observe_adapter(&a).await.unwrap().unwrap();
    assert_eq!(
        (ready.phase, ready.ready_endpoints, ready.message),
        (Phase::Ready, 2, None)
    );
    assert_eq!(fake.violations(), Vec::<String>::new());
}

#[tokio::test]
async fn cluster_pieces_are_rendered_into_every_graph_and_pass_the_crd() {
    let fake = FakeKube::start(NS).await;
    let opts = KubeOptions {
        namespace: Some(NS.into()),
        cluster: ClusterPieces {
            hf_token_secret: Some("hf-token-secret".into()),
            worker_s3_secret: Some("tf-worker-s3".into()),
            model_cache_pvc: Some("model-cache".into()),
            model_cache_mount: "/opt/models".into(),
        },
        ..KubeOptions::default()
    };
    let backend = KubeBackend::with_config(fake.config(), &opts)
        .await
        .unwrap();
    let mut bounded = spec();
    bounded.replicas_max = 4;
    backend.apply_graph(&bounded).await.unwrap();
    let stored = fake.object(GRAPHS, &graph_name(BASE)).unwrap();
    let worker = &stored["spec"]["services"]["worker"];
    assert_eq!(worker["envFromSecret"], "hf-token-secret");
    assert_eq!(worker["volumeMounts"][0]["name"], "model-cache");
    assert_eq!(stored["spec"]["pvcs"][0]["name"], "model-cache");
    assert_eq!(
        worker["envs"][1]["valueFrom"]["secretKeyRef"]["name"],
        "tf-worker-s3"
    );
    assert_eq!(worker["scalingAdapter"]["enabled"], true);
    assert_eq!(worker["annotations"]["tokenfactory.dev/replicas-max"], "4");
    assert_eq!(stored["spec"]["backendFramework"], "vllm");
    assert_eq!(fake.violations(), Vec::<String>::new());
}

#[test]
fn the_fake_refuses_what_the_crd_does_not_define() {
    use fleet_support::crd_schema::{check, graph_deployment};
    let mut body = dynamo_render::graph(BASE, NS, &template()).unwrap();
    let mut problems = Vec::new();
    check(&graph_deployment(), &body, "", &mut problems);
    assert_eq!(problems, Vec::<String>::new());
    // The old project schema had these; the CRD does not.
    body["spec"]["services"]["worker"]["pvc"] = json!({"name": "x"});
    body["spec"]["services"]["worker"]["replicas"] = json!(-1);
    body["spec"]["backendFramework"] = json!("tgi");
    check(&graph_deployment(), &body, "", &mut problems);
    assert_eq!(problems.len(), 3, "{problems:?}");
}

/// The whole lifecycle through the controller, PostgreSQL and the kube backend against the
/// schema-validating, operator-simulating fake: a bare upload starts nothing; start -> ready on
/// both endpoints; nothing applied while nothing changes; a new template version rolls out to the
/// running graph (recorded in PostgreSQL) while the adapter stays served; a lowered
/// `max_lora_rank` stops the adapter with a reason; the last stop tears the graph down; a graph
/// deleted outside takes its adapter out of `ready` until it is back.
mod through_the_controller {
    use std::sync::Arc;
    use std::time::Duration;

    use common::lifecycle::valid_adapter;
    use sqlx::PgPool;
    use tokenfactory::fleet::local_sim;
    use tokenfactory::lifecycle::transitions::Command;
    use tokenfactory::lifecycle::{
        Actor, AdapterStore, Controller, ControllerOptions, FleetMetrics, Lifecycle, UploadLimits,
    };

    use super::*;

    const KBASE: &str = "kube-base";

    fn actor() -> Actor {
        Actor {
            user_id: None,
            label: "test".into(),
        }
    }

    struct World {
        fake: FakeKube,
        controller: Controller,
        service: Lifecycle,
        tenant: uuid::Uuid,
        pool: PgPool,
        _dir: tempfile::TempDir,
    }

    async fn world(pool: PgPool) -> World {
        let fake = FakeKube::start(NS).await;
        let opts = KubeOptions {
            namespace: Some(NS.into()),
            ..KubeOptions::default()
        };
        let backend = KubeBackend::with_config(fake.config(), &opts)
            .await
            .unwrap();
        tf_core::db::lifecycle::offer_base(
            &pool,
            "kubernetes",
            KBASE,
            &graph_name(KBASE),
            false,
            "sim-words",
            &local_sim::template(KBASE, 2),
        )
        .await
        .unwrap();
        let tenant = tf_core::accounts::create_tenant(&pool, "acme", "Acme")
            .await
            .unwrap()
            .id;
        let dir = tempfile::tempdir().unwrap();
        let service = Lifecycle::new(
            pool.clone(),
            AdapterStore::local(dir.path()).unwrap(),
            UploadLimits::default(),
        );
        let controller = Controller::new(
            pool.clone(),
            Arc::new(backend),
            Arc::new(FleetMetrics::default()),
            ControllerOptions::default(),
        )
        .with_start_timeout(Duration::from_secs(600));
        World {
            fake,
            controller,
            service,
            tenant,
            pool,
            _dir: dir,
        }
    }

    impl World {
        async fn passes(&mut self, n: usize) {
            for _ in 0..n {
                self.controller.reconcile_once().await.unwrap();
            }
        }

        async fn view(&self, name: &str) -> (String, Option<String>) {
            self.service
                .view(self.tenant, name)
                .await
                .map_or(("absent".into(), None), |v| (v.state, v.reason))
        }

        /// Passes until `name` is in `state` (at most 30).
        async fn until(&mut self, name: &str, state: &str) {
            for _ in 0..30 {
                self.controller.reconcile_once().await.unwrap();
                if self.view(name).await.0 == state {
                    return;
                }
            }
            panic!("{name} never {state}: {:?}", self.view(name).await);
        }

        async fn rollout(&self) -> (Option<String>, Option<String>) {
            sqlx::query_as("SELECT rollout, rollout_reason FROM graphs")
                .fetch_optional(&self.pool)
                .await
                .unwrap()
                .unwrap_or((None, None))
        }

        async fn upload(&self, name: &str) {
            let (config, weights) = valid_adapter(KBASE);
            self.service
                .upload_bytes(self.tenant, name, KBASE, config, weights, &actor())
                .await
                .unwrap();
            // On a cluster the store is S3; the operator refuses anything else.
            sqlx::query(
                "UPDATE adapters SET storage_uri = 's3://adapters/' || id::text || '/' WHERE name = $1",
            )
            .bind(name)
            .execute(&self.pool)
            .await
            .unwrap();
        }

        async fn command(&self, name: &str, c: Command) {
            self.service
                .command(self.tenant, name, c, &actor())
                .await
                .unwrap();
        }
    }

    #[sqlx::test(migrator = "tf_core::db::MIGRATOR")]
    async fn upload_start_ready_roll_out_stop_tear_down(pool: PgPool) {
        let mut w = world(pool).await;
        let graph = graph_name(KBASE);

        // A bare upload: no graph, no GPUs.
        w.upload("bot").await;
        w.passes(5).await;
        assert_eq!(w.view("bot").await.0, "stopped");
        assert_eq!(w.fake.names(GRAPHS), Vec::<String>::new());

        // Started: the graph, then the model, ready on both endpoints.
        w.command("bot", Command::Start).await;
        w.until("bot", "ready").await;
        let model = w.fake.names(MODELS);
        assert_eq!(model.len(), 1);
        let status = w.fake.object(MODELS, &model[0]).unwrap()["status"].clone();
        assert_eq!(
            (&status["readyEndpoints"], &status["totalEndpoints"]),
            (&json!(2), &json!(2))
        );
        assert_eq!(w.view("bot").await.1, None);
        w.passes(2).await;
        assert_eq!(w.rollout().await.0.as_deref(), Some("rolled_out"));

        // Nothing changes: 10 s of passes at the controller's 250 ms tick apply nothing.
        let before = (w.fake.applies(GRAPHS), w.fake.applies(MODELS));
        w.passes(40).await;
        assert_eq!((w.fake.applies(GRAPHS), w.fake.applies(MODELS)), before);

        // A new template version in PostgreSQL rolls out to the running graph; the adapter stays
        // served on the replicas that serve meanwhile.
        sqlx::query("UPDATE base_templates SET max_loras = 4, image = 'runtime:2'")
            .execute(&w.pool)
            .await
            .unwrap();
        w.passes(1).await;
        assert_eq!(w.fake.applies(GRAPHS), before.0 + 1);
        assert_eq!(w.rollout().await.0.as_deref(), Some("rolling"));
        assert_eq!(w.view("bot").await.0, "ready", "served during the rollout");
        w.passes(3).await;
        assert_eq!(w.rollout().await.0.as_deref(), Some("rolled_out"));
        let dgd = w.fake.object(GRAPHS, &graph).unwrap();
        let main = &dgd["spec"]["services"]["worker"]["extraPodSpec"]["mainContainer"];
        assert_eq!(main["image"], "runtime:2");
        assert!(main["args"].to_string().contains("\"--max-loras\",\"4\""));
        assert_eq!(w.fake.applies(GRAPHS), before.0 + 1, "rolled out once");

        // A lowered max_lora_rank the adapter no longer fits: stopped with the reason.
        sqlx::query("UPDATE base_templates SET max_lora_rank = 1")
            .execute(&w.pool)
            .await
            .unwrap();
        w.until("bot", "stopped").await;
        let (_, reason) = w.view("bot").await;
        assert!(
            reason.as_deref().unwrap_or("").contains("max_lora_rank 1"),
            "{reason:?}"
        );
        // It was the last started adapter of a base that is not offered: the graph goes.
        w.passes(3).await;
        assert_eq!(w.fake.names(GRAPHS), Vec::<String>::new());
        assert_eq!(w.fake.names(MODELS), Vec::<String>::new());
        assert_eq!(w.fake.violations(), Vec::<String>::new());
    }

    #[sqlx::test(migrator = "tf_core::db::MIGRATOR")]
    async fn status_follows_the_operator_through_churn_and_stop(pool: PgPool) {
        let mut w = world(pool).await;
        let graph = graph_name(KBASE);
        w.upload("bot").await;
        w.command("bot", Command::Start).await;
        w.until("bot", "ready").await;

        // The graph deleted and recreated outside: the adapter is not ready meanwhile, and the
        // operator's message is its reason.
        w.fake.delete_outside(GRAPHS, &graph);
        w.passes(1).await;
        let (state, reason) = w.view("bot").await;
        assert_eq!(state, "starting", "{reason:?}");
        assert!(reason.is_some());
        w.until("bot", "ready").await;
        assert_eq!(w.view("bot").await.1, None);

        // Stopped: it was the last one, so the graph is torn down.
        w.command("bot", Command::Stop).await;
        w.until("bot", "stopped").await;
        w.passes(3).await;
        assert_eq!(w.fake.names(GRAPHS), Vec::<String>::new());
        assert_eq!(w.fake.violations(), Vec::<String>::new());
    }

    #[sqlx::test(migrator = "tf_core::db::MIGRATOR")]
    async fn a_start_that_never_finishes_fails_with_the_operators_reason(pool: PgPool) {
        let mut w = world(pool).await;
        w.upload("bot").await;
        w.command("bot", Command::Start).await;
        w.passes(1).await;
        // The graph comes up, but no worker pod ever gets ready: no endpoints for the model.
        w.fake.script(
            GRAPHS,
            &graph_name(KBASE),
            vec![json!({"state": "successful", "services": {"worker": {"readyReplicas": 0}}})],
        );
        w.passes(3).await;
        let (state, reason) = w.view("bot").await;
        assert_eq!(state, "starting");
        let reason = reason.unwrap_or_default();
        assert!(reason.starts_with("NoServicesFound: "), "{reason}");
        // Past the start timeout (the clock moved by the data, not by sleeping): failed, with it.
        sqlx::query("UPDATE adapters SET updated_at = now() - interval '11 minutes'")
            .execute(&w.pool)
            .await
            .unwrap();
        w.until("bot", "failed").await;
        let reason = w.view("bot").await.1.unwrap_or_default();
        assert!(
            reason.starts_with("not ready within 600 s: NoServicesFound: "),
            "{reason}"
        );
        assert_eq!(w.fake.violations(), Vec::<String>::new());
    }
}
