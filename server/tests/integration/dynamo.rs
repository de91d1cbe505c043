//! The gateway in front of the real NVIDIA Dynamo frontend (1.6, mocker engine on CPU), reached at
//! `TF_DYNAMO_URL`. `scripts/test.sh` starts one and sets the variable when a Dynamo harness is
//! checked out next to this repository (optional; see the script); without the variable these
//! tests say so and do nothing.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests may fail loudly

use crate::common;

use std::time::Duration;

use common::*;
use serde_json::{json, Value};
use sqlx::PgPool;
use tokenfactory::fleet::{self, BaseRegistration};
use tokenfactory::usage::{Provenance, UsageStatus};

const MODEL: &str = "tiny-llama";

async fn with_dynamo(pool: PgPool) -> Option<(TestApp, String)> {
    let Ok(url) = std::env::var("TF_DYNAMO_URL") else {
        eprintln!("TF_DYNAMO_URL not set: Dynamo integration test not run");
        return None;
    };
    let t = TestApp::builder(pool).start().await;
    let bases = [
        BaseRegistration {
            name: MODEL.into(),
            graph: "dynamo-tiny".into(),
            upstream_url: url.clone(),
            upstream_model: MODEL.into(),
            continuous_usage: true,
            denied_fields: None,
            prompt_estimator: Default::default(),
            kind: tf_core::endpoint::ModelKind::Chat,
            nvext_allowed: None,
        },
        BaseRegistration {
            name: "misrouted".into(),
            graph: "dynamo-tiny".into(),
            upstream_url: url.clone(),
            upstream_model: "no-such-model".into(),
            continuous_usage: true,
            denied_fields: None,
            prompt_estimator: Default::default(),
            kind: tf_core::endpoint::ModelKind::Chat,
            nvext_allowed: None,
        },
    ];
    fleet::register_bases(&t.pool, "static", &bases)
        .await
        .unwrap();
    t.app.gateway.routes.reload().await.unwrap();
    Some((t, url))
}

async fn direct_usage(url: &str, body: &Value) -> Value {
    let mut body = body.clone();
    body["stream"] = json!(false);
    let v: Value = reqwest::Client::new()
        .post(format!("{url}/chat/completions"))
        .json(&body)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    v["usage"].clone()
}

#[sqlx::test(migrations = "../migrations")]
async fn streams_and_meters_through_dynamo(pool: PgPool) {
    let Some((t, url)) = with_dynamo(pool).await else {
        return;
    };
    let a = t.tenant("acme").await;
    let body = chat(MODEL, "hello there from the gateway", 6);
    let truth = direct_usage(&url, &body).await;
    for include_usage in [false, true] {
        let mut b = body.clone();
        b["stream"] = json!(true);
        if include_usage {
            b["stream_options"] = json!({"include_usage": true});
        }
        let r = t
            .post(&a.key, "/v1/chat/completions", b)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200);
        let id = request_id(&r);
        let data = sse_data(r).await;
        assert_eq!(data.last().unwrap(), "[DONE]");
        let chunks: Vec<Value> = data[..data.len() - 1]
            .iter()
            .map(|d| serde_json::from_str(d).unwrap())
            .collect();
        let usage_chunks: Vec<_> = chunks
            .iter()
            .filter(|c| c["choices"].as_array().is_some_and(Vec::is_empty))
            .collect();
        assert_eq!(usage_chunks.len(), usize::from(include_usage));
        assert!(chunks
            .iter()
            .filter(|c| !c["choices"].as_array().unwrap().is_empty())
            .all(|c| c["usage"].is_null()));
        let ev = t.event(&id).await;
        assert_eq!(ev.provenance, Provenance::Engine);
        assert_eq!(ev.prompt_tokens, truth["prompt_tokens"].as_i64().unwrap());
        assert_eq!(ev.completion_tokens, 6);
        if include_usage {
            assert_eq!(usage_chunks[0]["usage"]["completion_tokens"], 6);
        }
    }
}

#[sqlx::test(migrations = "../migrations")]
async fn hang_up_cancels_dynamo_and_bills_partial_usage(pool: PgPool) {
    let Some((t, url)) = with_dynamo(pool).await else {
        return;
    };
    let a = t.tenant("acme").await;
    let mut body = chat(MODEL, "write a very long essay", 4000);
    body["stream"] = json!(true);
    let r = t
        .post(&a.key, "/v1/chat/completions", body)
        .send()
        .await
        .unwrap();
    let id = request_id(&r);
    read_events_then_hang_up(r, 3).await;
    let ev = t.event(&id).await;
    assert_eq!(ev.status, UsageStatus::ClientAbort);
    assert_eq!(
        ev.provenance,
        Provenance::Partial,
        "continuous usage from Dynamo"
    );
    // The half-close stopped Dynamo itself: the gateway did not have to wait out its read limit.
    assert!(
        ev.duration_ms < 900,
        "Dynamo kept the half-closed stream open for {} ms",
        ev.duration_ms
    );
    assert!(
        ev.completion_tokens >= 2 && ev.completion_tokens < 4000,
        "{}",
        ev.completion_tokens
    );
    // The frontend must have dropped the request: nothing left in flight.
    let metrics_url = url.trim_end_matches("/v1").to_owned() + "/metrics";
    let mut inflight = f64::NAN;
    for _ in 0..100 {
        let text = reqwest::get(&metrics_url)
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        inflight = text
            .lines()
            .filter(|l| l.starts_with("dynamo_frontend_inflight_requests"))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum();
        if inflight == 0.0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(inflight, 0.0, "Dynamo still generating after the hang-up");
}

#[sqlx::test(migrations = "../migrations")]
async fn dynamo_flat_errors_become_openai_envelopes(pool: PgPool) {
    let Some((t, _)) = with_dynamo(pool).await else {
        return;
    };
    let a = t.tenant("acme").await;
    let r = t
        .post(
            &a.key,
            "/v1/chat/completions",
            json!({"model": MODEL, "messages": []}),
        )
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 400);
    let b: Value = r.json().await.unwrap();
    assert_eq!(b["error"]["type"], "invalid_request_error");
    assert!(
        b["error"]["message"].as_str().unwrap().contains("messages"),
        "{b}"
    );
    let r = t
        .post(&a.key, "/v1/chat/completions", chat("misrouted", "hi", 2))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 404);
    let b: Value = r.json().await.unwrap();
    assert_eq!(b["error"]["code"], "model_not_found");
    assert!(b["error"]["message"].is_string());
}

#[sqlx::test(migrations = "../migrations")]
async fn the_admission_estimate_is_never_below_the_engines_prompt_count(pool: PgPool) {
    let Some((t, url)) = with_dynamo(pool.clone()).await else {
        return;
    };
    let a = t.tenant("acme").await;
    admin_limits(&pool, &["--key", &a.key, "--tpm", "1000000"]).await;
    for content in [
        "hello there",
        "Tokenizers split unusual words: antidisestablishmentarianism, naïve café, 1234567.",
        "",
    ] {
        let body = chat(MODEL, content, 4);
        let engine = direct_usage(&url, &body).await["prompt_tokens"]
            .as_u64()
            .unwrap();
        let r = t
            .post(&a.key, "/v1/chat/completions", body)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200);
        let remaining: u64 = r.headers()["x-ratelimit-remaining-tokens"]
            .to_str()
            .unwrap()
            .parse()
            .unwrap();
        let estimated_prompt = 1_000_000 - remaining - 4;
        assert!(
            estimated_prompt >= engine,
            "{content:?}: admission estimated {estimated_prompt} prompt tokens, the engine counted {engine}"
        );
    }
}
