//! On a Dynamo cluster (the `kubernetes` backend against the schema-checking, operator-acting
//! fake API server), a co-tenant's stream on a shared base keeps flowing, token by token, while
//! another tenant's adapter is started, made ready, its base's template rolled out, stopped and
//! deleted (issue 30's proof): none of these touches the graph's frontend the gateway streams
//! through, and a rollout never takes the graph out of routing.

#![allow(
    clippy::disallowed_methods,
    reason = "the test reads a stream on a task of its own; it ends before the test does"
)]
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests may fail loudly

use crate::common;
use crate::fleet_support;

use std::sync::Arc;
use std::time::{Duration, Instant};

use common::lifecycle::{self, valid_adapter};
use common::{chat, eventually, TestApp};
use fleet_support::fake_kube::{FakeKube, GRAPHS};
use sqlx::PgPool;
use tf_engine_sim::SimConfig;
use tokenfactory::fleet::dynamo_render::graph_name;
use tokenfactory::fleet::kubernetes::{KubeBackend, KubeOptions};
use tokenfactory::fleet::local_sim;
use tokenfactory::lifecycle::{AdapterStore, ControllerOptions, LifecycleOptions};

const NS: &str = "models";
const KBASE: &str = "kube-base";
const SETTLE: Duration = Duration::from_secs(15);
/// Tokens of the co-tenant's stream at 25 tokens/s: long enough to span every operation.
const TOKENS: u32 = 200;

async fn rollout(pool: &PgPool) -> Option<String> {
    sqlx::query_scalar("SELECT rollout FROM graphs")
        .fetch_optional(pool)
        .await
        .unwrap()
        .flatten()
}

#[sqlx::test(migrator = "tf_core::db::MIGRATOR")]
async fn a_cotenants_stream_flows_through_start_rollout_stop_and_delete(pool: PgPool) {
    // The engine the graph's frontend stands for, serving the base's model id.
    let sim = common::sim::start(SimConfig {
        decode_tokens_per_sec: 25,
        models: vec![KBASE.to_owned()],
        ..SimConfig::default()
    })
    .await;
    let fake = FakeKube::start(NS).await;
    let backend = KubeBackend::with_config(
        fake.config(),
        &KubeOptions {
            namespace: Some(NS.into()),
            frontend_url: format!("http://{}/v1", sim.addr),
            ..KubeOptions::default()
        },
    )
    .await
    .unwrap();
    tf_core::db::lifecycle::offer_base(
        &pool,
        "kubernetes",
        KBASE,
        &graph_name(KBASE),
        true,
        "sim-words",
        &local_sim::template(KBASE, 2),
    )
    .await
    .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let app = TestApp::builder(pool.clone())
        .upstream_sim(sim)
        .lifecycle(LifecycleOptions {
            store: Some(AdapterStore::local(dir.path()).unwrap()),
            backend: Some(Arc::new(backend)),
            controller: ControllerOptions {
                tick: Duration::from_millis(50),
            },
            ..LifecycleOptions::default()
        })
        .start()
        .await;
    let (acme, globex) = (app.tenant("acme").await, app.tenant("globex").await);
    // The frontend serves the base under Token Factory's name of it, the name the gateway sends.
    eventually(SETTLE, "the offered base served", || async {
        app.ask(&globex, KBASE).await.0 == 200
    })
    .await;
    let dgd = fake.object(GRAPHS, &graph_name(KBASE)).unwrap();
    let args =
        dgd["spec"]["services"]["worker"]["extraPodSpec"]["mainContainer"]["args"].to_string();
    assert!(
        args.contains(&format!("\"--served-model-name\",\"{KBASE}\"")),
        "{args}"
    );
    eventually(SETTLE, "the graph rolled out", || async {
        rollout(&pool).await.as_deref() == Some("rolled_out")
    })
    .await;
    let (config, weights) = valid_adapter(KBASE);
    assert_eq!(
        app.upload(&acme, "neighbour", KBASE, &config, &weights)
            .await
            .0,
        201
    );
    // On a cluster adapters are in S3; the operator refuses anything else.
    sqlx::query("UPDATE adapters SET storage_uri = 's3://adapters/' || id::text || '/'")
        .execute(&pool)
        .await
        .unwrap();

    let mut body = chat(KBASE, "a long story please", TOKENS);
    body["stream"] = true.into();
    let r = app
        .post(&globex.key, "/v1/chat/completions", body)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let reader = lifecycle::stamp_tokens(r);

    let mut marks = Vec::new();
    tokio::time::sleep(Duration::from_millis(300)).await;
    app.manage(&acme, "neighbour", "start").await;
    eventually(SETTLE, "ready", || async {
        app.state_of(&acme, "neighbour").await == "ready"
    })
    .await;
    marks.push(("ready", Instant::now()));

    let applies = fake.applies(GRAPHS);
    sqlx::query("UPDATE base_templates SET max_loras = 4, image = 'runtime:2'")
        .execute(&pool)
        .await
        .unwrap();
    eventually(SETTLE, "the new template applied", || async {
        fake.applies(GRAPHS) > applies
    })
    .await;
    marks.push(("rolling out", Instant::now()));
    eventually(SETTLE, "rolled out", || async {
        rollout(&pool).await.as_deref() == Some("rolled_out")
    })
    .await;
    assert_eq!(app.state_of(&acme, "neighbour").await, "ready");
    marks.push(("rolled out", Instant::now()));

    app.manage(&acme, "neighbour", "stop").await;
    eventually(SETTLE, "stopped", || async {
        app.state_of(&acme, "neighbour").await == "stopped"
    })
    .await;
    marks.push(("stopped", Instant::now()));
    app.manage(&acme, "neighbour", "delete").await;
    eventually(SETTLE, "deleted", || async {
        app.manage(&acme, "neighbour", "get").await.0 == 404
    })
    .await;
    marks.push(("deleted", Instant::now()));

    let (stamps, done) = reader.await.unwrap();
    assert!(done, "the stream ended normally");
    assert_eq!(stamps.len(), TOKENS as usize, "every token arrived");
    lifecycle::assert_flowed_through(&stamps, &marks);
    // The offered base keeps its graph; every body the fake received passed the CRD schema.
    assert_eq!(fake.names(GRAPHS), vec![graph_name(KBASE)]);
    assert_eq!(fake.violations(), Vec::<String>::new());
    // The co-tenant's answer was metered once.
    eventually(SETTLE, "the stream's event stored", || async {
        app.events()
            .await
            .iter()
            .any(|e| e.completion_tokens == i64::from(TOKENS))
    })
    .await;
}
