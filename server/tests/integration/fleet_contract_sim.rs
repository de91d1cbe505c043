//! The fleet backend contract (`common::fleet_contract::run`) against `local-sim`: two simulated
//! replicas behind one frontend, adapters loaded and unloaded on each through vLLM's runtime LoRA
//! endpoints. Other backends run the same function.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests may fail loudly

use crate::common;

use common::fleet_contract::{self, Probe};
use tf_engine_sim::SimConfig;
use tokenfactory::fleet::backend::{FleetBackend, GraphSpec};
use tokenfactory::fleet::local_sim;
use tokenfactory::fleet::sim_fleet::SimFleet;
use tokenfactory::lifecycle::controller::graph_spec;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

fn spec(base: &str, replicas: i32) -> GraphSpec {
    let t = local_sim::template(base, replicas);
    graph_spec(&tf_core::db::lifecycle::TemplatedBase {
        id: uuid::Uuid::now_v7(),
        name: base.into(),
        graph: format!("local-sim/{base}"),
        fleet: "local-sim".into(),
        offered: true,
        upstream_url: String::new(),
        template: t,
        graph_state: None,
        replicas_desired: None,
        replicas_ready: None,
        adapter_idle_after_secs: None,
        sleep: Default::default(),
    })
}

#[tokio::test]
async fn local_sim_keeps_the_fleet_contract() {
    let cancel = CancellationToken::new();
    let fleet = SimFleet::new(TaskTracker::new(), cancel.clone(), SimConfig::default());
    assert_eq!(fleet.kind(), "local-sim");
    fleet_contract::run(
        &fleet,
        spec("contract-base", 2),
        "acme--bot--v1",
        Probe::Http,
    )
    .await;
    cancel.cancel();
}

#[tokio::test]
async fn a_replica_added_later_gets_the_adapters_already_registered() {
    let fleet = SimFleet::new(
        TaskTracker::new(),
        CancellationToken::new(),
        SimConfig::default(),
    );
    let one = spec("scaled", 1);
    fleet.apply_graph(&one).await.unwrap();
    let adapter = tokenfactory::fleet::backend::AdapterSpec {
        graph: one.graph.clone(),
        base: one.base.clone(),
        lora_name: "t--a--v1".into(),
        source_uri: "file:///a/".into(),
    };
    fleet.apply_adapter(&adapter).await.unwrap();
    let observed = fleet.apply_graph(&spec("scaled", 3)).await.unwrap();
    assert_eq!(observed.replicas_ready, 3);
    let seen = fleet.observe_adapter(&adapter).await.unwrap().unwrap();
    assert_eq!((seen.ready_endpoints, seen.total_endpoints), (3, 3));
}

#[tokio::test]
async fn a_graph_scales_to_zero_and_back_keeping_its_frontend_and_adapters() {
    let fleet = SimFleet::new(
        TaskTracker::new(),
        CancellationToken::new(),
        SimConfig::default(),
    );
    let awake = fleet.apply_graph(&spec("sleepy", 2)).await.unwrap();
    let adapter = tokenfactory::fleet::backend::AdapterSpec {
        graph: "local-sim/sleepy".into(),
        base: "sleepy".into(),
        lora_name: "t--s--v1".into(),
        source_uri: "file:///s/".into(),
    };
    fleet.apply_adapter(&adapter).await.unwrap();
    let asleep = fleet.apply_graph(&spec("sleepy", 0)).await.unwrap();
    assert_eq!((asleep.replicas_ready, asleep.replicas_desired), (0, 0));
    assert_eq!(asleep.phase, tokenfactory::fleet::backend::Phase::Asleep);
    assert_eq!(asleep.frontend_url, awake.frontend_url);
    assert!(fleet.replicas("local-sim/sleepy").await.is_empty());
    let woken = fleet.apply_graph(&spec("sleepy", 2)).await.unwrap();
    assert_eq!(woken.replicas_ready, 2);
    assert_eq!(woken.frontend_url, awake.frontend_url);
    let seen = fleet.observe_adapter(&adapter).await.unwrap().unwrap();
    assert_eq!((seen.ready_endpoints, seen.total_endpoints), (2, 2));
    assert_eq!(
        fleet_contract::complete(&woken.frontend_url, "t--s--v1").await,
        200
    );
}
