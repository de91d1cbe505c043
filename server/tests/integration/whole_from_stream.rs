//! Non-streamed answers assembled from the engine's stream (issue 31): the gateway always asks
//! the engine to stream, so a client that abandons a non-streamed request is billed exactly what
//! the engine produced (the simulator's ledger is the ground truth), and the answer a patient
//! client gets equals the engine's own non-streamed answer in every field clients read.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
use crate::common;

use std::time::Duration;

use common::*;
use serde_json::{json, Value};
use sqlx::PgPool;
use tf_engine_sim::SimConfig;
use tokenfactory::usage::{Provenance, UsageStatus};

/// The fields of an answer that differ between two runs of the same request.
fn without_run_fields(mut v: Value) -> Value {
    let o = v.as_object_mut().unwrap();
    o.remove("id");
    o.remove("created");
    v
}

#[sqlx::test(migrations = "../migrations")]
async fn the_assembled_answer_equals_the_engines_whole_answer(pool: PgPool) {
    let app = TestApp::builder(pool).start().await;
    let acme = app.tenant("acme").await;
    let direct = reqwest::Client::new();
    for (path, body) in [
        (
            "/v1/chat/completions",
            json!({"model": BASE, "messages": [{"role": "user", "content": "one two three four"}], "max_tokens": 9}),
        ),
        (
            "/v1/completions",
            json!({"model": BASE, "prompt": "five six seven", "max_tokens": 6}),
        ),
        // Stopped before the limit: finish_reason "stop".
        (
            "/v1/chat/completions",
            json!({"model": BASE, "messages": [{"role": "user", "content": "eight nine"}], "max_tokens": 30, "sim": {"completion_tokens": 4}}),
        ),
    ] {
        let engine: Value = direct
            .post(format!("http://{}{path}", app.sim_addr))
            .json(&body)
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        let r = app
            .post(&acme.key, path, body.clone())
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200);
        assert_eq!(r.headers()["content-type"], "application/json", "{path}");
        let id = request_id(&r);
        let ours: Value = r.json().await.unwrap();
        assert!(ours["id"].as_str().is_some_and(|s| !s.is_empty()), "{ours}");
        assert!(ours["created"].as_u64().is_some(), "{ours}");
        assert_eq!(
            without_run_fields(ours.clone()),
            without_run_fields(engine.clone()),
            "{path}: ours {ours}\nengine {engine}"
        );
        let entry = app.ledger_entry(&id).await;
        assert!(entry.stream, "the engine was asked to stream");
        let ev = app.event(&id).await;
        assert!(!ev.stream, "the event records what the client asked");
        assert_eq!(ev.provenance, Provenance::Engine);
        assert_eq!(
            ev.completion_tokens,
            i64::from(entry.completion_tokens),
            "{path}"
        );
    }
}

#[sqlx::test(migrations = "../migrations")]
async fn an_abandoned_whole_answer_bills_the_engine_ledger(pool: PgPool) {
    let app = TestApp::builder(pool)
        .sim(SimConfig {
            decode_tokens_per_sec: 100,
            ..SimConfig::default()
        })
        .start()
        .await;
    let acme = app.tenant("acme").await;
    for path in ["/v1/chat/completions", "/v1/completions"] {
        app.sim.clear_ledger();
        let body = if path == "/v1/completions" {
            json!({"model": BASE, "prompt": "tell me a long story", "max_tokens": 2000})
        } else {
            json!({"model": BASE, "messages": [{"role": "user", "content": "tell me a long story"}], "max_tokens": 2000})
        };
        // The client gives up after 400 ms, mid-generation (2000 tokens take 20 s).
        let gone = app
            .post(&acme.key, path, body)
            .timeout(Duration::from_millis(400))
            .send()
            .await;
        assert!(gone.is_err(), "the client hung up before the answer");
        let entry = eventually(
            Duration::from_secs(5),
            "the engine's ledger entry",
            || async { app.sim.ledger().into_iter().next() },
        )
        .await;
        assert!(entry.cancelled, "the engine was cancelled: {entry:?}");
        assert!(
            entry.completion_tokens > 5 && entry.completion_tokens < 2000,
            "{entry:?}"
        );
        let id = entry.request_id.clone().unwrap();
        let ev = app.event(&id).await;
        assert_eq!(ev.status, UsageStatus::ClientAbort, "{path}");
        assert_eq!(
            (ev.prompt_tokens, ev.completion_tokens),
            (
                i64::from(entry.prompt_tokens),
                i64::from(entry.completion_tokens)
            ),
            "{path}: billed exactly what the engine produced"
        );
    }
}
