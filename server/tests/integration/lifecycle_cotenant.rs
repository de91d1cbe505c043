//! A co-tenant's stream on a base keeps flowing, token by token, while another tenant starts,
//! stops and deletes an adapter on the same base (issue 14): those operations touch only that
//! adapter, never the graph or the other tenants' requests.

#![allow(
    clippy::disallowed_methods,
    reason = "the test reads a stream on a task of its own; it ends before the test does"
)]
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests may fail loudly

use crate::common;

use std::time::{Duration, Instant};

use common::lifecycle::{self, valid_adapter, LORA_BASE};
use common::{chat, eventually};
use sqlx::PgPool;
use tf_engine_sim::SimConfig;

const SETTLE: Duration = Duration::from_secs(10);
/// Tokens of the co-tenant's stream at 25 tokens/s: long enough to span the three operations.
const TOKENS: u32 = 150;

#[sqlx::test(migrator = "tf_core::db::MIGRATOR")]
async fn a_cotenants_stream_flows_through_start_stop_and_delete(pool: PgPool) {
    let h = lifecycle::start(
        pool,
        SimConfig {
            decode_tokens_per_sec: 25,
            ..SimConfig::default()
        },
    )
    .await;
    let app = &h.app;
    let (acme, globex) = (app.tenant("acme").await, app.tenant("globex").await);
    eventually(SETTLE, "the base served", || async {
        app.ask(&globex, LORA_BASE).await.0 == 200
    })
    .await;
    let (config, weights) = valid_adapter(LORA_BASE);
    assert_eq!(
        app.upload(&acme, "neighbour", LORA_BASE, &config, &weights)
            .await
            .0,
        201
    );

    let mut body = chat(LORA_BASE, "a long story please", TOKENS);
    body["stream"] = true.into();
    let r = app
        .post(&globex.key, "/v1/chat/completions", body)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    // Read the stream on its own task, stamping when each content chunk arrived.
    let reader = lifecycle::stamp_tokens(r);

    let mut marks = Vec::new();
    tokio::time::sleep(Duration::from_millis(300)).await;
    app.manage(&acme, "neighbour", "start").await;
    eventually(SETTLE, "ready", || async {
        app.state_of(&acme, "neighbour").await == "ready"
    })
    .await;
    marks.push(("started", Instant::now()));
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
}
