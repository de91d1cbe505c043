//! Protocol fidelity and metering against misbehaving engines: each test drives the real gateway
//! in front of an engine that breaks one rule (a raw TCP engine writing exactly the bytes under
//! test, or the simulator), and checks both what the client receives and the usage event.

#![allow(
    clippy::disallowed_methods,
    reason = "test scaffolding (fake engines, load generators) runs until the test ends; nothing waits for it at shutdown"
)]
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use crate::common;

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use common::*;
use serde_json::{json, Value};
use sqlx::PgPool;
use tokenfactory::fleet::{self, BaseRegistration};
use tokenfactory::gateway::GatewayOptions;
use tokenfactory::usage::{Provenance, UsageStatus};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// The served name of the raw engine's base; the engine knows it as [`INTERNAL`].
const RAW: &str = "raw-base";
const INTERNAL: &str = "raw-base--internal";
/// Prompt tokens of `chat(_, "hello", _)` by the base's tokenizer: 2 + (3 + 1).
const HELLO_PROMPT: i64 = 6;

const SSE_HEAD: &str = "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\nconnection: close\r\n\r\n";
const LAST_CHUNK: &[u8] = b"0\r\n\r\n";

/// One HTTP/1.1 chunk carrying `data`.
fn chunked(data: &str) -> Vec<u8> {
    format!("{:x}\r\n{data}\r\n", data.len()).into_bytes()
}

fn usage(prompt: u32, completion: u32) -> String {
    format!(
        r#"{{"prompt_tokens":{prompt},"completion_tokens":{completion},"total_tokens":{}}}"#,
        prompt + completion
    )
}

/// A content chunk as vLLM writes it (token `i`, the engine's internal model name).
fn content(i: u32, finish: &str, usage: &str) -> String {
    format!(
        "data: {{\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"created\":0,\"model\":\"{INTERNAL}\",\"choices\":[{{\"index\":0,\"delta\":{{\"content\":\" w{i}\"}},\"finish_reason\":{finish}}}],\"usage\":{usage}}}\n\n"
    )
}

/// Starts an engine that runs `script` on every connection, registers it as [`RAW`], and
/// starts the gateway (with `gateway` options) in front of it.
async fn with_raw_engine<F, Fut>(pool: PgPool, gateway: GatewayOptions, script: F) -> TestApp
where
    F: Fn(TcpStream) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = ()> + Send + 'static,
{
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let engine = l.local_addr().unwrap();
    let script = Arc::new(script);
    tokio::spawn(async move {
        loop {
            let (tcp, _) = l.accept().await.unwrap();
            tokio::spawn(script(tcp));
        }
    });
    fleet::register_bases(
        &pool,
        "static",
        &[BaseRegistration {
            name: RAW.into(),
            graph: "graph-raw".into(),
            upstream_url: format!("http://{engine}/v1"),
            upstream_model: INTERNAL.into(),
            continuous_usage: true,
            denied_fields: None,
            prompt_estimator: tokenfactory::engine_policy::PromptEstimator::SimWords,
            kind: tf_core::endpoint::ModelKind::Chat,
            nvext_allowed: None,
        }],
    )
    .await
    .unwrap();
    TestApp::builder(pool).gateway(gateway).start().await
}

/// An engine that reads the request, writes `bytes` and closes.
fn answers(bytes: Vec<u8>) -> impl Fn(TcpStream) -> futures::future::BoxFuture<'static, ()> {
    let bytes = Arc::new(bytes);
    move |mut tcp: TcpStream| {
        let bytes = bytes.clone();
        Box::pin(async move {
            raw_http::read_request(&mut tcp).await.unwrap();
            let _ = tcp.write_all(&bytes).await;
            let _ = tcp.shutdown().await;
        })
    }
}

/// An SSE answer made of `events`, each in its own HTTP chunk.
fn sse(events: &[String]) -> Vec<u8> {
    let mut out = SSE_HEAD.as_bytes().to_vec();
    for e in events {
        out.extend(chunked(e));
    }
    out.extend_from_slice(LAST_CHUNK);
    out
}

fn whole_json(status: &str, extra_headers: &str, body: &str) -> Vec<u8> {
    format!(
        "HTTP/1.1 {status}\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n{extra_headers}\r\n{body}",
        body.len()
    )
    .into_bytes()
}

fn streamed(usage: bool) -> Value {
    let mut body = chat(RAW, "hello", 16);
    body["stream"] = json!(true);
    if usage {
        body["stream_options"] = json!({"include_usage": true});
    }
    body
}

async fn send(t: &TestApp, key: &str, body: Value) -> reqwest::Response {
    tokio::time::timeout(
        Duration::from_secs(10),
        t.post(key, "/v1/chat/completions", body).send(),
    )
    .await
    .expect("the gateway never answered")
    .unwrap()
}

async fn data_of(r: reqwest::Response) -> Vec<String> {
    tokio::time::timeout(Duration::from_secs(10), sse_data(r))
        .await
        .expect("the stream never ended")
}

fn json_of(data: &[String]) -> Vec<Value> {
    data.iter()
        .filter(|d| *d != "[DONE]")
        .map(|d| serde_json::from_str(d).unwrap())
        .collect()
}

#[sqlx::test(migrations = "../migrations")]
async fn answers_carry_the_served_name_and_no_unasked_usage(pool: PgPool) {
    let t = TestApp::builder(pool).start().await;
    let a = t.tenant("acme").await;
    let lora = t.adapter(&a, "bot").await;
    assert_eq!(lora, "acme--bot--v1");

    let r = send(&t, &a.key, chat("bot", "hello", 4)).await;
    assert_eq!(r.status(), 200);
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["model"], "bot", "not the engine's {lora}");

    for usage in [false, true] {
        let mut body = chat("bot", "hello", 4);
        body["stream"] = json!(true);
        if usage {
            body["stream_options"] = json!({"include_usage": true});
        }
        let r = send(&t, &a.key, body).await;
        let data = data_of(r).await;
        let chunks = json_of(&data);
        assert!(chunks.len() >= 4);
        assert!(chunks.iter().all(|c| c["model"] == "bot"), "{data:?}");
        if usage {
            assert!(chunks.iter().all(|c| c.get("usage").is_some()));
        } else {
            assert!(
                chunks.iter().all(|c| c.get("usage").is_none()),
                "OpenAI omits usage for a client that did not ask: {data:?}"
            );
        }
    }
}

#[sqlx::test(migrations = "../migrations")]
async fn a_whole_answer_without_usage_is_billed_from_its_content(pool: PgPool) {
    let words: Vec<String> = (0..40).map(|i| format!("w{i}")).collect();
    let body = json!({"id": "c", "object": "chat.completion", "created": 0, "model": INTERNAL,
        "choices": [{"index": 0, "message": {"role": "assistant", "content": words.join(" ")}, "finish_reason": "stop"}]});
    let t = with_raw_engine(
        pool,
        GatewayOptions::default(),
        answers(whole_json("200 OK", "", &body.to_string())),
    )
    .await;
    let a = t.tenant("acme").await;
    let r = send(&t, &a.key, chat(RAW, "hello", 64)).await;
    assert_eq!(r.status(), 200);
    let id = request_id(&r);
    let v: Value = r.json().await.unwrap();
    let ev = t.event(&id).await;
    assert_eq!((ev.prompt_tokens, ev.completion_tokens), (HELLO_PROMPT, 40));
    assert_eq!(ev.status, UsageStatus::Ok);
    assert_eq!(ev.provenance, Provenance::Estimated);
    assert_eq!(v["model"], RAW);
}

#[sqlx::test(migrations = "../migrations")]
async fn a_silent_engine_ends_the_stream_and_is_billed_partially(pool: PgPool) {
    let gateway = GatewayOptions {
        upstream_chunk_timeout_ms: 300,
        ..GatewayOptions::default()
    };
    let t = with_raw_engine(pool, gateway, |mut tcp: TcpStream| async move {
        raw_http::read_request(&mut tcp).await.unwrap();
        tcp.write_all(SSE_HEAD.as_bytes()).await.unwrap();
        tcp.write_all(&chunked(&content(1, "null", &usage(7, 1))))
            .await
            .unwrap();
        // Then silence, until the gateway gives up on the connection.
        let mut rest = [0u8; 64];
        while !matches!(tcp.read(&mut rest).await, Ok(0) | Err(_)) {}
    })
    .await;
    let a = t.tenant("acme").await;
    let r = send(&t, &a.key, streamed(false)).await;
    assert_eq!(r.status(), 200);
    let id = request_id(&r);
    let data = data_of(r).await;
    let last: Value = serde_json::from_str(data.last().unwrap()).unwrap();
    assert_eq!(last["error"]["code"], "upstream_timeout", "{data:?}");
    let ev = t.event(&id).await;
    assert_eq!(ev.status, UsageStatus::UpstreamError);
    assert_eq!(ev.provenance, Provenance::Partial);
    assert_eq!((ev.prompt_tokens, ev.completion_tokens), (7, 1));
}

#[sqlx::test(migrations = "../migrations")]
async fn shutdown_while_waiting_for_the_engine_is_recorded_and_answered(pool: PgPool) {
    let got = Arc::new(tokio::sync::Notify::new());
    let g = got.clone();
    let t = with_raw_engine(
        pool,
        GatewayOptions::default(),
        move |mut tcp: TcpStream| {
            let g = g.clone();
            async move {
                raw_http::read_request(&mut tcp).await.unwrap();
                g.notify_one();
                // Never answers; waits for the gateway to close.
                let mut rest = [0u8; 64];
                while !matches!(tcp.read(&mut rest).await, Ok(0) | Err(_)) {}
            }
        },
    )
    .await;
    let a = t.tenant("acme").await;
    let request = t
        .post(&a.key, "/v1/chat/completions", chat(RAW, "hello", 8))
        .send();
    let cut = t.app.gateway.cut.clone();
    let (r, ()) = tokio::join!(
        tokio::time::timeout(Duration::from_secs(10), request),
        async move {
            got.notified().await;
            cut.cancel();
        }
    );
    let r = r.expect("no answer after the cut").unwrap();
    assert_eq!(r.status(), 503);
    let id = request_id(&r);
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["error"]["type"], "service_unavailable");
    assert_eq!(v["error"]["code"], "server_shutdown");
    let ev = t.event(&id).await;
    assert_eq!(ev.status, UsageStatus::Interrupted);
    assert_eq!((ev.prompt_tokens, ev.completion_tokens), (0, 0));
}

#[sqlx::test(migrations = "../migrations")]
async fn usage_chunk_without_choices_reaches_a_client_that_asked(pool: PgPool) {
    let events = [
        content(1, "null", "null"),
        content(2, "\"stop\"", "null"),
        format!(
            "data: {{\"id\":\"c\",\"model\":\"{INTERNAL}\",\"usage\":{}}}\n\n",
            usage(7, 2)
        ),
        "data: [DONE]\n\n".into(),
    ];
    let t = with_raw_engine(pool, GatewayOptions::default(), answers(sse(&events))).await;
    let a = t.tenant("acme").await;
    let r = send(&t, &a.key, streamed(true)).await;
    let id = request_id(&r);
    let chunks = json_of(&data_of(r).await);
    let last = chunks.last().unwrap();
    assert_eq!(last["usage"]["completion_tokens"], 2, "{chunks:?}");
    assert_eq!(last["model"], RAW);
    let ev = t.event(&id).await;
    assert_eq!(
        (ev.status, ev.provenance),
        (UsageStatus::Ok, Provenance::Engine)
    );
    assert_eq!((ev.prompt_tokens, ev.completion_tokens), (7, 2));
}

#[sqlx::test(migrations = "../migrations")]
async fn a_comment_before_done_keeps_the_final_usage(pool: PgPool) {
    let events = [
        content(1, "null", "null"),
        content(2, "\"stop\"", &usage(7, 2)),
        ": keep-alive\n\n".into(),
        "data: [DONE]\n\n".into(),
    ];
    let t = with_raw_engine(pool, GatewayOptions::default(), answers(sse(&events))).await;
    let a = t.tenant("acme").await;
    let r = send(&t, &a.key, streamed(true)).await;
    let chunks = json_of(&data_of(r).await);
    assert_eq!(
        chunks.last().unwrap()["usage"]["completion_tokens"],
        2,
        "{chunks:?}"
    );
}

/// Content, then the usage chunk, then the body ends: with `done` as the engine's last bytes.
async fn ends_after_usage(pool: PgPool, done: Option<&str>) {
    let mut events = vec![
        content(1, "null", "null"),
        content(2, "\"stop\"", "null"),
        format!(
            "data: {{\"id\":\"c\",\"choices\":[],\"usage\":{}}}\n\n",
            usage(7, 2)
        ),
    ];
    events.extend(done.map(str::to_owned));
    let t = with_raw_engine(pool, GatewayOptions::default(), answers(sse(&events))).await;
    let a = t.tenant("acme").await;
    let r = send(&t, &a.key, streamed(true)).await;
    let id = request_id(&r);
    let text = tokio::time::timeout(Duration::from_secs(10), r.text())
        .await
        .unwrap()
        .unwrap();
    assert!(text.ends_with("\n\ndata: [DONE]\n\n"), "{text:?}");
    assert!(!text.contains("\"error\""), "{text:?}");
    let ev = t.event(&id).await;
    assert_eq!(
        (ev.status, ev.provenance),
        (UsageStatus::Ok, Provenance::Engine)
    );
    assert_eq!((ev.prompt_tokens, ev.completion_tokens), (7, 2));
}

#[sqlx::test(migrations = "../migrations")]
async fn a_stream_that_ends_after_its_usage_without_done_is_complete(pool: PgPool) {
    ends_after_usage(pool, None).await;
}

#[sqlx::test(migrations = "../migrations")]
async fn a_done_without_its_blank_line_is_complete(pool: PgPool) {
    ends_after_usage(pool, Some("data: [DONE]")).await;
}

#[sqlx::test(migrations = "../migrations")]
async fn running_usage_before_an_engine_error_is_partial(pool: PgPool) {
    let events = [
        content(1, "null", &usage(7, 1)),
        content(2, "null", &usage(7, 2)),
        "data: {\"error\":{\"message\":\"engine overloaded\",\"type\":\"InternalServerError\"}}\n\n"
            .into(),
        "data: [DONE]\n\n".into(),
    ];
    let t = with_raw_engine(pool, GatewayOptions::default(), answers(sse(&events))).await;
    let a = t.tenant("acme").await;
    let r = send(&t, &a.key, streamed(false)).await;
    let id = request_id(&r);
    data_of(r).await;
    let ev = t.event(&id).await;
    assert_eq!(ev.status, UsageStatus::UpstreamError);
    assert_eq!(ev.provenance, Provenance::Partial);
    assert_eq!((ev.prompt_tokens, ev.completion_tokens), (7, 2));
}

#[sqlx::test(migrations = "../migrations")]
async fn a_json_error_to_a_streamed_request_is_passed_on(pool: PgPool) {
    let error = r#"{"error":{"message":"This model's maximum context length is 8 tokens.","type":"BadRequestError","param":null,"code":400}}"#;
    let t = with_raw_engine(
        pool,
        GatewayOptions::default(),
        answers(whole_json("200 OK", "", error)),
    )
    .await;
    let a = t.tenant("acme").await;
    let r = send(&t, &a.key, streamed(false)).await;
    assert_eq!(r.status(), 502);
    let id = request_id(&r);
    let v: Value = r.json().await.unwrap();
    assert_eq!(
        v["error"]["message"],
        "This model's maximum context length is 8 tokens."
    );
    assert_eq!(v["error"]["type"], "api_error");
    let ev = t.event(&id).await;
    assert_eq!(ev.status, UsageStatus::UpstreamError);
    assert_eq!((ev.prompt_tokens, ev.completion_tokens), (0, 0));
}

#[sqlx::test(migrations = "../migrations")]
async fn an_oversized_answer_bills_what_the_client_received(pool: PgPool) {
    // The large-answer rule: over the limit, nothing is relayed and nothing is billed, though the
    // engine reports its usage (last, as vLLM writes it). The limit is the test's, 64 KiB.
    let limit = 64 * 1024;
    let filler = " w".repeat(limit);
    let body = format!(
        r#"{{"id":"c","object":"chat.completion","created":0,"model":"{INTERNAL}","choices":[{{"index":0,"message":{{"role":"assistant","content":"{filler}"}},"finish_reason":"stop"}}],"usage":{}}}"#,
        usage(7, limit as u32)
    );
    let gateway = GatewayOptions {
        max_answer_bytes: limit,
        ..GatewayOptions::default()
    };
    let t = with_raw_engine(pool, gateway, answers(whole_json("200 OK", "", &body))).await;
    let a = t.tenant("acme").await;
    let r = send(&t, &a.key, chat(RAW, "hello", 8)).await;
    assert_eq!(r.status(), 502);
    let id = request_id(&r);
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["error"]["code"], "upstream_response_too_large");
    let ev = t.event(&id).await;
    assert_eq!((ev.prompt_tokens, ev.completion_tokens), (0, 0));
    assert_eq!(ev.status, UsageStatus::UpstreamError);
}

#[sqlx::test(migrations = "../migrations")]
async fn an_engine_retry_after_is_passed_on(pool: PgPool) {
    let error = r#"{"error":{"message":"Too many requests","type":"RateLimitError","code":429}}"#;
    let t = with_raw_engine(
        pool,
        GatewayOptions::default(),
        answers(whole_json(
            "429 Too Many Requests",
            "retry-after: 7\r\n",
            error,
        )),
    )
    .await;
    let a = t.tenant("acme").await;
    let r = send(&t, &a.key, chat(RAW, "hello", 8)).await;
    assert_eq!(r.status(), 429);
    assert_eq!(r.headers()["retry-after"], "7");
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["error"]["type"], "rate_limit_error");
    assert_eq!(v["error"]["message"], "Too many requests");
}

#[sqlx::test(migrations = "../migrations")]
async fn wrong_methods_get_the_envelope(pool: PgPool) {
    let t = TestApp::builder(pool).start().await;
    let a = t.tenant("acme").await;
    for (method, path, allow) in [
        (reqwest::Method::GET, "/v1/chat/completions", "POST"),
        (reqwest::Method::PUT, "/v1/completions", "POST"),
        (reqwest::Method::POST, "/v1/models", "GET"),
    ] {
        let r = t
            .http
            .request(method.clone(), t.url(path))
            .bearer_auth(&a.key)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 405, "{method} {path}");
        assert_eq!(r.headers()["allow"], allow);
        let v: Value = r.json().await.unwrap();
        assert_eq!(v["error"]["type"], "invalid_request_error");
        assert_eq!(v["error"]["code"], "method_not_allowed");
    }
}
