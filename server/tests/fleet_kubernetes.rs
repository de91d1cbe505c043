//! The `kubernetes` backend against the fake API server: the exact requests (method, path with
//! group/version/namespace/plural, field manager, force, strict validation, content type, the
//! rendered bodies), every status transition the operator reports, the finalizer and owner
//! paths, and each error kind.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests may fail loudly

mod fleet_support;

use serde_json::json;
use tokenfactory::fleet::backend::{AdapterSpec, FleetBackend, FleetError, GraphSpec, Phase};
use tokenfactory::fleet::dynamo_render::{self, graph_name, lora_model_name, ServingTemplate};
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
    let backend = KubeBackend::with_config(fake.config(), &opts).unwrap();
    (fake, backend)
}

fn path(plural: &str, name: &str) -> String {
    format!("/apis/nvidia.com/v1alpha1/namespaces/{NS}/{plural}/{name}")
}

#[tokio::test]
async fn apply_graph_sends_one_server_side_apply_of_the_rendered_graph() {
    let (fake, backend) = setup(None).await;
    let observed = backend.apply_graph(&spec()).await.unwrap();
    let reqs = fake.requests();
    assert_eq!(reqs.len(), 1, "{reqs:?}");
    let r = &reqs[0];
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
    let mut expected = dynamo_render::graph(BASE, NS, &template()).unwrap();
    expected["metadata"]["finalizers"] = json!([FINALIZER]);
    assert_eq!(r.body, expected);
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
    assert_eq!(
        reqs.iter()
            .map(|r| (r.method.as_str(), r.path.clone()))
            .collect::<Vec<_>>(),
        vec![
            ("GET", path(GRAPHS, &graph_name(BASE))),
            (
                "PATCH",
                path(MODELS, &lora_model_name(&graph_name(BASE), &a.lora_name))
            ),
        ]
    );
    let body = &reqs[1].body;
    assert_eq!(reqs[1].content_type, "application/apply-patch+yaml");
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
    let gone = KubeBackend::with_config(config, &KubeOptions::default()).unwrap();
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
    // The next apply finishes the delete (models first), then the one after creates it anew.
    assert!(matches!(
        backend.apply_graph(&spec()).await,
        Err(FleetError::Unavailable(_))
    ));
    assert_eq!(fake.names(MODELS), Vec::<String>::new());
    assert_eq!(fake.object(GRAPHS, &name), None);
    backend.apply_graph(&spec()).await.unwrap();
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
    let reqs = fake.requests();
    assert_eq!(reqs.len(), 1, "one apply: {reqs:?}");
    assert_eq!(reqs[0].method, "PATCH");
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
    let reqs = fake.requests();
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
