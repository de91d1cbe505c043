//! The request path end to end: real server, real PostgreSQL, engine simulator upstream.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests may fail loudly

use crate::common;

use std::time::{Duration, Instant};

use common::*;
use serde_json::{json, Value};
use sqlx::PgPool;
use tf_engine_sim::SimConfig;
use tokenfactory::usage::{Provenance, UsageStatus};

#[sqlx::test(migrations = "../migrations")]
async fn non_streamed_chat_is_forwarded_and_metered_exactly(pool: PgPool) {
    let t = TestApp::builder(pool).start().await;
    let a = t.tenant("acme").await;
    let r = t
        .post(
            &a.key,
            "/v1/chat/completions",
            chat(BASE, "hello there general kenobi", 7),
        )
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let id = request_id(&r);
    let body: Value = r.json().await.unwrap();
    assert_eq!(body["model"], BASE);
    assert_eq!(body["usage"]["completion_tokens"], 7);
    let truth = t.ledger_entry(&id).await;
    assert_eq!(
        truth.cache_salt.as_deref(),
        Some(a.id.to_string().as_str()),
        "tenant salt set upstream"
    );
    let ev = t.event(&id).await;
    assert_eq!(ev.tenant_id, a.id);
    assert_eq!(ev.prompt_tokens, i64::from(truth.prompt_tokens));
    assert_eq!(ev.completion_tokens, i64::from(truth.completion_tokens));
    assert_eq!(ev.provenance, Provenance::Engine);
    assert_eq!(ev.status, UsageStatus::Ok);
    assert_eq!(ev.served_name, BASE);
    assert_eq!(ev.graph, "graph-a");
}

#[sqlx::test(migrations = "../migrations")]
async fn auth_failures_use_the_openai_envelope(pool: PgPool) {
    let t = TestApp::builder(pool).start().await;
    let a = t.tenant("acme").await;
    let r = t
        .http
        .post(t.url("/v1/chat/completions"))
        .json(&chat(BASE, "x", 1))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 401);
    let b: Value = r.json().await.unwrap();
    assert_eq!(b["error"]["type"], "authentication_error");
    assert_eq!(b["error"]["code"], "invalid_api_key");
    let r = t
        .post("tf-not-a-key", "/v1/chat/completions", chat(BASE, "x", 1))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 401);

    // Revocation reaches the gateway within a second.
    let ok = t
        .http
        .get(t.url("/v1/models"))
        .bearer_auth(&a.key)
        .send()
        .await
        .unwrap();
    assert_eq!(ok.status(), 200);
    assert!(tf_core::keys::revoke(&t.pool, Some(a.id), &a.key)
        .await
        .unwrap());
    eventually(
        Duration::from_secs(1),
        "the revoked key to be refused",
        || async {
            let s = t
                .http
                .get(t.url("/v1/models"))
                .bearer_auth(&a.key)
                .send()
                .await
                .unwrap()
                .status();
            (s == 401).then_some(()).ok_or(s)
        },
    )
    .await;

    let b = t.tenant("beta").await;
    tf_core::accounts::set_tenant_status(&t.pool, "beta", tf_core::TenantStatus::Suspended)
        .await
        .unwrap();
    let r = eventually(
        Duration::from_secs(1),
        "the suspended tenant to be refused",
        || async {
            let r = t
                .http
                .get(t.url("/v1/models"))
                .bearer_auth(&b.key)
                .send()
                .await
                .unwrap();
            let s = r.status();
            (s == 403).then_some(r).ok_or(s)
        },
    )
    .await;
    let body: Value = r.json().await.unwrap();
    assert_eq!(body["error"]["type"], "permission_error");
}

#[sqlx::test(migrations = "../migrations")]
async fn other_tenants_models_look_exactly_like_missing_ones(pool: PgPool) {
    let t = TestApp::builder(pool).start().await;
    let a = t.tenant("acme").await;
    let b = t.tenant("beta").await;
    t.adapter(&a, "secret-bot").await;

    let r = t
        .post(&a.key, "/v1/chat/completions", chat("secret-bot", "hi", 2))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let ledger = t.ledger_entry(&request_id(&r)).await;
    assert_eq!(ledger.model, "acme--secret-bot--v1");

    let theirs = t
        .post(&b.key, "/v1/chat/completions", chat("secret-bot", "hi", 2))
        .send()
        .await
        .unwrap();
    let missing = t
        .post(&b.key, "/v1/chat/completions", chat("no-such-bot", "hi", 2))
        .send()
        .await
        .unwrap();
    assert_eq!(theirs.status(), 404);
    assert_eq!(missing.status(), 404);
    let theirs: Value = theirs.json().await.unwrap();
    let missing: Value = missing.json().await.unwrap();
    assert_eq!(theirs["error"]["code"], "model_not_found");
    assert_eq!(
        theirs["error"]["message"]
            .as_str()
            .unwrap()
            .replace("secret-bot", "X"),
        missing["error"]["message"]
            .as_str()
            .unwrap()
            .replace("no-such-bot", "X")
    );

    let list = |key: String| {
        let t = &t;
        async move {
            let v: Value = t
                .http
                .get(t.url("/v1/models"))
                .bearer_auth(key)
                .send()
                .await
                .unwrap()
                .json()
                .await
                .unwrap();
            v["data"]
                .as_array()
                .unwrap()
                .iter()
                .map(|m| m["id"].as_str().unwrap().to_owned())
                .collect::<Vec<_>>()
        }
    };
    assert_eq!(
        list(a.key.clone()).await,
        vec![BASE.to_owned(), "secret-bot".to_owned()]
    );
    assert_eq!(list(b.key.clone()).await, vec![BASE.to_owned()]);

    // Deleting removes the route before the delete returns.
    assert!(tokenfactory::gateway::resolve::delete_adapter(
        &t.pool,
        &t.app.gateway.routes,
        a.id,
        "secret-bot"
    )
    .await
    .unwrap());
    let r = t
        .post(&a.key, "/v1/chat/completions", chat("secret-bot", "hi", 2))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 404);
}

#[sqlx::test(migrations = "../migrations")]
async fn malformed_requests_are_refused_and_nothing_is_forwarded_or_billed(pool: PgPool) {
    let t = TestApp::builder(pool).start().await;
    let a = t.tenant("acme").await;
    for body in [
        &b"{oops"[..],
        b"{\"messages\":[]}",
        b"{\"model\":42}",
        b"[]",
    ] {
        let r = t
            .http
            .post(t.url("/v1/chat/completions"))
            .bearer_auth(&a.key)
            .header("content-type", "application/json")
            .body(body.to_vec())
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 400);
        assert!(r.headers().contains_key("x-request-id"));
        let b: Value = r.json().await.unwrap();
        assert_eq!(b["error"]["type"], "invalid_request_error");
    }
    let big = vec![b' '; 9 * 1024 * 1024];
    let r = t
        .http
        .post(t.url("/v1/completions"))
        .bearer_auth(&a.key)
        .body(big)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 413);
    let b: Value = r.json().await.unwrap();
    assert_eq!(b["error"]["type"], "invalid_request_error");
    assert!(t.sim.ledger().is_empty(), "nothing forwarded");
    assert!(t.events().await.is_empty(), "nothing billed");
}

#[sqlx::test(migrations = "../migrations")]
async fn usage_chunk_reaches_exactly_the_clients_that_asked(pool: PgPool) {
    let t = TestApp::builder(pool).start().await;
    let a = t.tenant("acme").await;
    for (options, want_usage_chunk, want_running) in [
        (json!(null), false, false),
        (json!({"include_usage": false}), false, false),
        (json!({"include_usage": true}), true, false),
        (
            json!({"include_usage": true, "continuous_usage_stats": true}),
            true,
            true,
        ),
    ] {
        let mut body = chat(BASE, "count my tokens please", 5);
        body["stream"] = json!(true);
        if !options.is_null() {
            body["stream_options"] = options.clone();
        }
        let r = t
            .post(&a.key, "/v1/chat/completions", body)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200);
        assert_eq!(r.headers()["content-type"], "text/event-stream");
        let id = request_id(&r);
        let data = sse_data(r).await;
        assert_eq!(data.last().unwrap(), "[DONE]");
        let chunks: Vec<Value> = data[..data.len() - 1]
            .iter()
            .map(|d| serde_json::from_str(d).unwrap())
            .collect();
        let usage_chunks = chunks
            .iter()
            .filter(|c| c["choices"].as_array().unwrap().is_empty())
            .count();
        assert_eq!(usage_chunks, usize::from(want_usage_chunk), "{options}");
        let running = chunks
            .iter()
            .filter(|c| !c["choices"].as_array().unwrap().is_empty() && !c["usage"].is_null())
            .count();
        if want_running {
            assert_eq!(running, chunks.len() - 1, "{options}");
        } else {
            assert_eq!(running, 0, "{options}");
        }
        let content: String = chunks
            .iter()
            .filter_map(|c| c["choices"][0]["delta"]["content"].as_str())
            .collect();
        assert_eq!(content.split_whitespace().count(), 5);
        let ev = t.event(&id).await;
        let truth = t.ledger_entry(&id).await;
        assert_eq!(
            (ev.prompt_tokens, ev.completion_tokens),
            (i64::from(truth.prompt_tokens), 5)
        );
        assert_eq!(ev.provenance, Provenance::Engine);
    }
}

#[sqlx::test(migrations = "../migrations")]
async fn tenants_never_see_each_others_prefix_cache(pool: PgPool) {
    let t = TestApp::builder(pool).start().await;
    let a = t.tenant("acme").await;
    let b = t.tenant("beta").await;
    let prompt = "the quick brown fox jumps over the lazy dog ".repeat(12);
    let cached = |key: String| {
        let t = &t;
        let prompt = prompt.clone();
        async move {
            let v: Value = t
                .post(&key, "/v1/chat/completions", chat(BASE, &prompt, 1))
                .send()
                .await
                .unwrap()
                .json()
                .await
                .unwrap();
            v["usage"]["prompt_tokens_details"]["cached_tokens"]
                .as_u64()
                .unwrap_or(0)
        }
    };
    assert_eq!(cached(a.key.clone()).await, 0);
    assert!(
        cached(a.key.clone()).await > 0,
        "same tenant hits its cache"
    );
    assert_eq!(
        cached(b.key.clone()).await,
        0,
        "another tenant must not hit it"
    );
    assert!(cached(b.key.clone()).await > 0);
}

#[sqlx::test(migrations = "../migrations")]
async fn client_hang_up_cancels_upstream_and_bills_what_was_produced(pool: PgPool) {
    let t = TestApp::builder(pool).start().await;
    let a = t.tenant("acme").await;
    let mut body = chat(BASE, "tell me a long story", 200);
    body["stream"] = json!(true);
    body["sim"] = json!({"token_interval_ms": 20});
    let r = t
        .post(&a.key, "/v1/chat/completions", body)
        .send()
        .await
        .unwrap();
    let id = request_id(&r);
    read_events_then_hang_up(r, 4).await;
    let truth = t.ledger_entry(&id).await;
    assert!(truth.cancelled, "upstream work cancelled");
    assert!(
        truth.completion_tokens < 50,
        "generation stopped early: {}",
        truth.completion_tokens
    );
    let ev = t.event(&id).await;
    assert_eq!(ev.status, UsageStatus::ClientAbort);
    assert_eq!(ev.provenance, Provenance::Partial);
    assert_eq!(ev.completion_tokens, i64::from(truth.completion_tokens));
    assert_eq!(ev.prompt_tokens, i64::from(truth.prompt_tokens));
}

#[sqlx::test(migrations = "../migrations")]
async fn upstream_death_mid_stream_sends_an_error_event_and_bills(pool: PgPool) {
    let t = TestApp::builder(pool).start().await;
    let a = t.tenant("acme").await;
    let mut body = chat(BASE, "doomed", 50);
    body["stream"] = json!(true);
    body["sim"] = json!({"die_after_chunks": 3});
    let r = t
        .post(&a.key, "/v1/chat/completions", body)
        .send()
        .await
        .unwrap();
    let id = request_id(&r);
    let data = sse_data(r).await;
    let last: Value = serde_json::from_str(data.last().unwrap()).unwrap();
    assert_eq!(last["error"]["code"], "upstream_error");
    let ev = t.event(&id).await;
    let truth = t.ledger_entry(&id).await;
    assert_eq!(ev.status, UsageStatus::UpstreamError);
    assert_eq!(ev.completion_tokens, i64::from(truth.completion_tokens));
    assert!(ev.completion_tokens >= 2);
}

#[sqlx::test(migrations = "../migrations")]
async fn upstream_errors_are_reshaped_into_the_envelope(pool: PgPool) {
    let t = TestApp::builder(pool)
        .sim(SimConfig {
            flat_errors: true,
            ..SimConfig::default()
        })
        .start()
        .await;
    let a = t.tenant("acme").await;
    let mut body = chat(BASE, "x", 3);
    body["sim"] = json!({"fail_status": 503});
    let r = t
        .post(&a.key, "/v1/chat/completions", body)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 503);
    let id = request_id(&r);
    let b: Value = r.json().await.unwrap();
    assert!(b["error"]["message"].is_string(), "{b}");
    assert_eq!(b["error"]["type"], "service_unavailable");
    let ev = t.event(&id).await;
    assert_eq!(ev.status, UsageStatus::UpstreamError);
    assert_eq!((ev.prompt_tokens, ev.completion_tokens), (0, 0));
}

#[sqlx::test(migrations = "../migrations")]
async fn completions_endpoint_streams_and_meters(pool: PgPool) {
    let t = TestApp::builder(pool).start().await;
    let a = t.tenant("acme").await;
    let r = t
        .post(
            &a.key,
            "/v1/completions",
            json!({"model": BASE, "prompt": "one two three", "max_tokens": 4, "stream": true}),
        )
        .send()
        .await
        .unwrap();
    let id = request_id(&r);
    let data = sse_data(r).await;
    assert_eq!(data.last().unwrap(), "[DONE]");
    let ev = t.event(&id).await;
    assert_eq!((ev.prompt_tokens, ev.completion_tokens), (4, 4));
}

/// A completed stream hands its upstream connection back to the pool (a new TCP connection per
/// request would cost the engine and the gateway a connect and a close each time).
#[sqlx::test(migrations = "../migrations")]
async fn completed_requests_reuse_their_upstream_connection(pool: PgPool) {
    use std::sync::atomic::Ordering;
    let app = TestApp::builder(pool.clone()).start().await;
    let acme = app.tenant("acme").await;
    let proxy = common::chaos::ChaosProxy::start(&app.sim_addr.to_string()).await;
    tokenfactory::fleet::register_bases(
        &pool,
        "static",
        &[tokenfactory::fleet::BaseRegistration {
            name: BASE.into(),
            graph: "graph-a".into(),
            upstream_url: format!("http://{}/v1", proxy.addr),
            upstream_model: BASE.into(),
            continuous_usage: true,
            denied_fields: Some(tokenfactory::engine_policy::EnginePolicy::denied_except(&[
                "sim",
            ])),
            prompt_estimator: tokenfactory::engine_policy::PromptEstimator::SimWords,
            kind: tf_core::endpoint::ModelKind::Chat,
            nvext_allowed: None,
        }],
    )
    .await
    .unwrap();
    let mut stream = chat(BASE, "hello world", 8);
    stream["stream"] = json!(true);
    let send = |body: Value| async {
        let r = app
            .post(&acme.key, "/v1/chat/completions", body)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200);
        r.bytes().await.unwrap()
    };
    // The route moves to the proxy when the change notification arrives.
    let deadline = Instant::now() + Duration::from_secs(5);
    while proxy.accepted.load(Ordering::SeqCst) == 0 {
        assert!(
            Instant::now() < deadline,
            "the route never moved to the proxy"
        );
        send(stream.clone()).await;
    }
    for _ in 0..20 {
        let body = send(stream.clone()).await;
        assert!(body.ends_with(b"data: [DONE]\n\n"));
        send(chat(BASE, "hello world", 4)).await;
    }
    assert_eq!(
        proxy.accepted.load(Ordering::SeqCst),
        1,
        "40 sequential requests should share one upstream connection"
    );
}
