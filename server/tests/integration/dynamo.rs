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

/// POSTs `body` to Dynamo's own `path` (no gateway): its answer, for the ground truth.
async fn direct(url: &str, path: &str, body: &Value) -> (u16, Value) {
    let r = reqwest::Client::new()
        .post(format!("{url}{path}"))
        .json(body)
        .send()
        .await
        .unwrap();
    let status = r.status().as_u16();
    (status, r.json().await.unwrap_or(Value::Null))
}

/// The JSON of each `data:` line of a typed-event stream (Dynamo ends it with `[DONE]` too).
async fn typed_events(r: reqwest::Response) -> Vec<Value> {
    let text = r.text().await.unwrap();
    text.split("\n\n")
        .filter_map(|e| e.lines().find_map(|l| l.strip_prefix("data: ")))
        .filter(|d| *d != "[DONE]")
        .map(|d| serde_json::from_str(d).unwrap())
        .collect()
}

/// `/v1/responses` through the gateway in front of Dynamo's own Responses endpoint: whole and
/// streamed, the event names the endpoint and holds Dynamo's counts (its `response.incomplete`
/// at `max_output_tokens` is final usage, like `response.completed`).
#[sqlx::test(migrations = "../migrations")]
async fn responses_are_metered_through_dynamo(pool: PgPool) {
    let Some((t, url)) = with_dynamo(pool).await else {
        return;
    };
    let a = t.tenant("acme").await;
    let body = json!({"model": MODEL, "input": "hello there from the responses api", "max_output_tokens": 5});
    let (status, truth) = direct(&url, "/responses", &body).await;
    assert_eq!(status, 200, "{truth}");
    let truth_input = truth["usage"]["input_tokens"].as_i64().unwrap();
    assert_eq!(truth["usage"]["output_tokens"], 5);

    let r = t
        .post(&a.key, "/v1/responses", body.clone())
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let id = request_id(&r);
    let whole: Value = r.json().await.unwrap();
    assert_eq!(whole["object"], "response");
    assert_eq!(whole["usage"]["input_tokens"], truth_input);
    assert_eq!(whole["store"], false);
    let ev = t.event(&id).await;
    assert_eq!(ev.endpoint, tf_core::endpoint::Endpoint::Responses);
    assert_eq!(
        (ev.status, ev.provenance),
        (UsageStatus::Ok, Provenance::Engine)
    );
    assert_eq!((ev.prompt_tokens, ev.completion_tokens), (truth_input, 5));
    assert!(!ev.stream);

    let mut streamed = body;
    streamed["stream"] = json!(true);
    let r = t
        .post(&a.key, "/v1/responses", streamed)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let id = request_id(&r);
    let events = typed_events(r).await;
    let kinds: Vec<&str> = events.iter().filter_map(|e| e["type"].as_str()).collect();
    assert_eq!(kinds.first(), Some(&"response.created"), "{kinds:?}");
    assert_eq!(kinds.last(), Some(&"response.incomplete"), "{kinds:?}");
    let deltas = kinds
        .iter()
        .filter(|k| **k == "response.output_text.delta")
        .count();
    let fin = &events.last().unwrap()["response"];
    assert_eq!(fin["usage"]["output_tokens"], 5);
    assert_eq!(fin["model"], MODEL);
    let ev = t.event(&id).await;
    assert_eq!(ev.endpoint, tf_core::endpoint::Endpoint::Responses);
    assert_eq!(
        (ev.status, ev.provenance),
        (UsageStatus::Ok, Provenance::Engine)
    );
    assert_eq!((ev.prompt_tokens, ev.completion_tokens), (truth_input, 5));
    assert!(ev.stream);
    println!("dynamo responses: input {truth_input}, output 5 in {deltas} text deltas");
}

/// `/v1/messages` through the gateway in front of Dynamo's Anthropic endpoint (the frontend
/// serves it only with `--enable-anthropic-api`: `FRONTEND_ARGS=--enable-anthropic-api` for the
/// kit's start.sh). Dynamo 1.6's `message_start` carries an estimate of the prompt; its deltas and
/// `message_delta` carry the engine's count, which is what is billed.
#[sqlx::test(migrations = "../migrations")]
async fn messages_through_dynamo_bill_the_engines_prompt_count(pool: PgPool) {
    let Some((t, url)) = with_dynamo(pool).await else {
        return;
    };
    let a = t.tenant("acme").await;
    let body = json!({"model": MODEL, "max_tokens": 5, "messages": [{"role": "user", "content": "hello there from the messages api"}]});
    let (status, truth) = direct(&url, "/messages", &body).await;
    if status == 404 {
        // Without the flag Dynamo has no such route: its flat 404 reaches the client in the
        // Anthropic envelope, billed nothing.
        let r = t
            .post(&a.key, "/v1/messages", body)
            .header("anthropic-version", "2023-06-01")
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 404);
        let id = request_id(&r);
        let b: Value = r.json().await.unwrap();
        assert_eq!(b["type"], "error", "{b}");
        assert!(
            b["error"]["type"].is_string() && b["error"]["message"].is_string(),
            "{b}"
        );
        let ev = t.event(&id).await;
        assert_eq!(ev.status, UsageStatus::UpstreamError);
        assert_eq!((ev.prompt_tokens, ev.completion_tokens), (0, 0));
        eprintln!("Dynamo's frontend does not serve /v1/messages (started without --enable-anthropic-api): {truth}; the client got {b}");
        return;
    }
    assert_eq!(status, 200, "{truth}");
    let truth_input = truth["usage"]["input_tokens"].as_i64().unwrap();
    assert_eq!(truth["usage"]["output_tokens"], 5);

    let r = t
        .post(&a.key, "/v1/messages", body.clone())
        .header("anthropic-version", "2023-06-01")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let id = request_id(&r);
    let whole: Value = r.json().await.unwrap();
    assert_eq!(whole["type"], "message");
    assert_eq!(whole["model"], MODEL);
    assert_eq!(whole["usage"]["input_tokens"], truth_input);
    let ev = t.event(&id).await;
    assert_eq!(ev.endpoint, tf_core::endpoint::Endpoint::Messages);
    assert_eq!(
        (ev.status, ev.provenance),
        (UsageStatus::Ok, Provenance::Engine)
    );
    assert_eq!((ev.prompt_tokens, ev.completion_tokens), (truth_input, 5));

    let mut streamed = body;
    streamed["stream"] = json!(true);
    let r = t
        .post(&a.key, "/v1/messages", streamed)
        .header("anthropic-version", "2023-06-01")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let id = request_id(&r);
    let events = typed_events(r).await;
    let kinds: Vec<&str> = events.iter().filter_map(|e| e["type"].as_str()).collect();
    assert_eq!(kinds.first(), Some(&"message_start"), "{kinds:?}");
    assert_eq!(kinds.last(), Some(&"message_stop"), "{kinds:?}");
    let start_input = events[0]["message"]["usage"]["input_tokens"]
        .as_i64()
        .unwrap();
    let delta = events
        .iter()
        .find(|e| e["type"] == "message_delta")
        .unwrap();
    assert_eq!(delta["usage"]["output_tokens"], 5);
    let ev = t.event(&id).await;
    assert_eq!(ev.endpoint, tf_core::endpoint::Endpoint::Messages);
    assert_eq!(
        (ev.status, ev.provenance),
        (UsageStatus::Ok, Provenance::Engine)
    );
    assert_eq!(
        (ev.prompt_tokens, ev.completion_tokens),
        (truth_input, 5),
        "billed the engine's prompt count, not message_start's {start_input}"
    );
    println!(
        "dynamo messages: message_start input_tokens {start_input}, message_delta input_tokens {}, engine (whole answer) {truth_input}; billed {}",
        delta["usage"]["input_tokens"], ev.prompt_tokens
    );
}

/// An embedding base routed to a Dynamo model that serves no embeddings (the mocker is a
/// generator): Dynamo's flat 404 reaches the client as the OpenAI envelope and bills nothing.
#[sqlx::test(migrations = "../migrations")]
async fn embeddings_dynamo_does_not_serve_are_a_404_billed_nothing(pool: PgPool) {
    let Some((t, url)) = with_dynamo(pool).await else {
        return;
    };
    let (status, direct_answer) =
        direct(&url, "/embeddings", &json!({"model": MODEL, "input": "x"})).await;
    if status == 200 {
        eprintln!("this Dynamo serves embeddings for {MODEL}; the 404 case does not apply");
        return;
    }
    fleet::register_bases(
        &t.pool,
        "static",
        &[BaseRegistration {
            name: "dynamo-embed".into(),
            graph: "dynamo-tiny".into(),
            upstream_url: url.clone(),
            upstream_model: MODEL.into(),
            continuous_usage: true,
            denied_fields: None,
            prompt_estimator: Default::default(),
            kind: tf_core::endpoint::ModelKind::Embedding,
            nvext_allowed: None,
        }],
    )
    .await
    .unwrap();
    t.app.gateway.routes.reload().await.unwrap();
    let a = t.tenant("acme").await;
    let r = t
        .post(
            &a.key,
            "/v1/embeddings",
            json!({"model": "dynamo-embed", "input": ["one", "two"]}),
        )
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), status, "Dynamo said {direct_answer}");
    let id = request_id(&r);
    let b: Value = r.json().await.unwrap();
    assert!(b["error"]["message"].is_string(), "{b}");
    assert!(b["error"]["type"].is_string(), "{b}");
    let ev = t.event(&id).await;
    assert_eq!(ev.endpoint, tf_core::endpoint::Endpoint::Embeddings);
    assert_eq!(ev.status, UsageStatus::UpstreamError);
    assert_eq!((ev.prompt_tokens, ev.completion_tokens), (0, 0));
    println!("dynamo embeddings: Dynamo answered {status} {direct_answer}; the client got {b}");
}

/// A `/v1/messages` stream from Dynamo cut by the client: billed from the running usage Dynamo
/// puts on each `content_block_delta` (the engine's prompt count, not `message_start`'s
/// estimate), as a client abort.
#[sqlx::test(migrations = "../migrations")]
async fn a_cut_dynamo_messages_stream_bills_the_engines_running_usage(pool: PgPool) {
    let Some((t, url)) = with_dynamo(pool).await else {
        return;
    };
    let content = "write a very long essay about metering";
    let whole = json!({"model": MODEL, "max_tokens": 2, "messages": [{"role": "user", "content": content}]});
    let (status, truth) = direct(&url, "/messages", &whole).await;
    if status == 404 {
        eprintln!("Dynamo's frontend does not serve /v1/messages: {truth}");
        return;
    }
    let truth_input = truth["usage"]["input_tokens"].as_i64().unwrap();
    let a = t.tenant("acme").await;
    let r = t
        .post(
            &a.key,
            "/v1/messages",
            json!({"model": MODEL, "max_tokens": 4000, "stream": true,
                   "messages": [{"role": "user", "content": content}]}),
        )
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let id = request_id(&r);
    // message_start, content_block_start, then deltas.
    read_events_then_hang_up(r, 5).await;
    let ev = t.event(&id).await;
    assert_eq!(ev.endpoint, tf_core::endpoint::Endpoint::Messages);
    assert_eq!(ev.status, UsageStatus::ClientAbort);
    assert_eq!(ev.provenance, Provenance::Partial);
    assert_eq!(ev.prompt_tokens, truth_input);
    assert!(
        ev.completion_tokens >= 3 && ev.completion_tokens < 4000,
        "{}",
        ev.completion_tokens
    );
}
