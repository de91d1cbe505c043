//! Traces as a collector sees them: the gateway exports to an in-process OTLP/HTTP receiver
//! (protobuf decoded with `opentelemetry-proto`), and one request's export is checked span by
//! span: the `request` span with the GenAI attributes and the engine's own token counts, its
//! `auth`, `admission` and `upstream` children, no prompt or key anywhere in the bytes, and the
//! engine (the simulator's ledger) given a `traceparent` of the same trace, naming the `upstream`
//! span. A client's `traceparent` is adopted only from a peer in `--trust-traceparent-from`.
//!
//! The subscriber is process-wide, so one receiver and one exporter serve every test of this
//! binary; each test finds its own spans by request id and trace id.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests may fail loudly

use crate::common;

use std::net::SocketAddr;
use std::sync::{Mutex, OnceLock};
use std::time::Duration;

use common::eventually::eventually_every;
use common::*;
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::any_value::Value as Av;
use opentelemetry_proto::tonic::trace::v1::span::SpanKind;
use opentelemetry_proto::tonic::trace::v1::Span;
use prost::Message;
use sqlx::PgPool;
use tokenfactory::gateway::GatewayOptions;
use tokenfactory::telemetry::logs::{self, LogFormat};
use tokenfactory::telemetry::traces::Traces;

/// A prompt no span may carry.
const PROMPT: &str = "pineapple-7f3a secret prompt words";

/// Every span received, and every body as it arrived (to search for what must not be there).
static SPANS: Mutex<Vec<Span>> = Mutex::new(Vec::new());
static BODIES: Mutex<Vec<u8>> = Mutex::new(Vec::new());

struct Exporter {
    traces: Traces,
}

/// The receiver (its own thread and runtime, so it outlives any one test's runtime) and the
/// global subscriber exporting to it, started once per process.
fn exporter() -> &'static Exporter {
    static EXPORTER: OnceLock<Exporter> = OnceLock::new();
    EXPORTER.get_or_init(|| {
        let (tx, rx) = std::sync::mpsc::channel::<SocketAddr>();
        std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async move {
                let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
                tx.send(listener.local_addr().unwrap()).unwrap();
                let app = axum::Router::new().route(
                    "/v1/traces",
                    axum::routing::post(|body: bytes::Bytes| async move {
                        let request = ExportTraceServiceRequest::decode(body.as_ref()).unwrap();
                        BODIES.lock().unwrap().extend_from_slice(&body);
                        let mut spans = SPANS.lock().unwrap();
                        for rs in request.resource_spans {
                            for ss in rs.scope_spans {
                                spans.extend(ss.spans);
                            }
                        }
                        axum::http::StatusCode::OK
                    }),
                );
                axum::serve(listener, app).await.unwrap();
            });
        });
        let addr = rx.recv().unwrap();
        let traces = logs::install(
            LogFormat::Text,
            std::io::sink,
            Some(&format!("http://{addr}")),
        )
        .unwrap()
        .expect("this binary installs the only subscriber");
        assert!(tokenfactory::telemetry::traces::on());
        Exporter { traces }
    })
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn attr<'a>(span: &'a Span, key: &str) -> Option<&'a Av> {
    span.attributes
        .iter()
        .find(|kv| kv.key == key)
        .and_then(|kv| kv.value.as_ref())
        .and_then(|v| v.value.as_ref())
}

fn str_attr<'a>(span: &'a Span, key: &str) -> Option<&'a str> {
    match attr(span, key) {
        Some(Av::StringValue(s)) => Some(s),
        _ => None,
    }
}

fn int_attr(span: &Span, key: &str) -> Option<i64> {
    match attr(span, key) {
        Some(Av::IntValue(n)) => Some(*n),
        _ => None,
    }
}

/// The trace of the request `request_id` once its `request` span and `expected` other spans
/// have arrived (flushing the exporter between looks).
async fn trace_of(request_id: &str, expected: &[&str]) -> (Span, Vec<Span>) {
    let exporter = exporter();
    eventually_every(
        Duration::from_millis(50),
        Duration::from_secs(10),
        &format!("the spans of {request_id}"),
        || async {
            tokio::task::spawn_blocking(|| exporter.traces.force_flush())
                .await
                .unwrap()
                .unwrap();
            let spans = SPANS.lock().unwrap().clone();
            let request = spans
                .iter()
                .find(|s| str_attr(s, "request_id") == Some(request_id))
                .cloned()
                .ok_or("no request span yet")?;
            let trace: Vec<Span> = spans
                .into_iter()
                .filter(|s| s.trace_id == request.trace_id && s.span_id != request.span_id)
                .collect();
            let missing: Vec<_> = expected
                .iter()
                .filter(|name| !trace.iter().any(|s| s.name == **name))
                .collect();
            if missing.is_empty() {
                Ok((request, trace))
            } else {
                Err(format!("missing {missing:?}"))
            }
        },
    )
    .await
}

/// The engine's `traceparent` as (trace id, parent span id).
fn engine_parent(traceparent: Option<&str>) -> (String, String) {
    let tp = traceparent.expect("the engine got a traceparent");
    let parts: Vec<&str> = tp.split('-').collect();
    assert_eq!(parts.len(), 4, "{tp}");
    assert_eq!(parts[0], "00", "{tp}");
    (parts[1].to_owned(), parts[2].to_owned())
}

#[sqlx::test(migrations = "../migrations")]
async fn a_request_is_one_trace_with_genai_attributes_and_the_engine_joins_it(pool: PgPool) {
    exporter();
    let app = TestApp::builder(pool).start().await;
    let t = app.tenant("acme").await;
    let r = app
        .post(&t.key, "/v1/chat/completions", chat(BASE, PROMPT, 7))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let rid = request_id(&r);
    let answer: serde_json::Value = r.json().await.unwrap();
    let finish = answer["choices"][0]["finish_reason"]
        .as_str()
        .unwrap()
        .to_owned();
    let entry = app.ledger_entry(&rid).await;

    let (request, children) = trace_of(&rid, &["auth", "admission", "upstream"]).await;
    // The request span: a root server span named by the GenAI convention.
    assert_eq!(request.name, format!("chat {BASE}"));
    assert_eq!(request.kind, SpanKind::Server as i32);
    assert!(request.parent_span_id.is_empty(), "no client trace to join");
    assert_eq!(str_attr(&request, "gen_ai.operation.name"), Some("chat"));
    assert_eq!(str_attr(&request, "gen_ai.request.model"), Some(BASE));
    assert_eq!(
        str_attr(&request, "tf.tenant.id"),
        Some(t.id.to_string().as_str())
    );
    // The engine's own counts (the ledger is the simulator's ground truth).
    assert_eq!(
        int_attr(&request, "gen_ai.usage.input_tokens"),
        Some(i64::from(entry.prompt_tokens))
    );
    assert_eq!(
        int_attr(&request, "gen_ai.usage.output_tokens"),
        Some(i64::from(entry.completion_tokens))
    );
    assert!(entry.completion_tokens > 0);
    match attr(&request, "gen_ai.response.finish_reasons") {
        Some(Av::ArrayValue(a)) => {
            let reasons: Vec<_> = a
                .values
                .iter()
                .filter_map(|v| match &v.value {
                    Some(Av::StringValue(s)) => Some(s.as_str()),
                    _ => None,
                })
                .collect();
            assert_eq!(reasons, [finish.as_str()]);
        }
        other => panic!("finish reasons: {other:?}"),
    }
    assert_eq!(int_attr(&request, "http.response.status_code"), Some(200));

    // Its children, each under it.
    for name in ["auth", "admission", "upstream"] {
        let child = children.iter().find(|s| s.name == name).unwrap();
        assert_eq!(child.parent_span_id, request.span_id, "{name}");
    }
    assert!(!children.iter().any(|s| s.name == "hold"), "not held");
    let upstream = children.iter().find(|s| s.name == "upstream").unwrap();
    assert_eq!(upstream.kind, SpanKind::Client as i32);

    // The engine joined the trace, under the upstream span.
    let (trace_id, parent) = engine_parent(entry.traceparent.as_deref());
    assert_eq!(trace_id, hex(&request.trace_id));
    assert_eq!(parent, hex(&upstream.span_id));

    // Never a prompt or a key.
    let bodies = BODIES.lock().unwrap().clone();
    let contains = |needle: &str| bodies.windows(needle.len()).any(|w| w == needle.as_bytes());
    assert!(contains(&rid), "the export is searched where the spans are");
    assert!(!contains("pineapple"), "the prompt is not exported");
    assert!(!contains(&t.key), "the key is not exported");
}

/// A client's trace context: (header, trace id, span id).
fn client_traceparent() -> (String, String, String) {
    let trace = format!("{:032x}", uuid::Uuid::new_v4().as_u128());
    let span = format!("{:016x}", rand::random::<u64>() | 1);
    (format!("00-{trace}-{span}-01"), trace, span)
}

#[sqlx::test(migrations = "../migrations")]
async fn a_traceparent_from_an_untrusted_peer_is_not_adopted(pool: PgPool) {
    exporter();
    // Trusted: some other network, not the test's loopback peer.
    let gateway = GatewayOptions {
        trust_traceparent_from: "10.0.0.0/8".parse().unwrap(),
        ..GatewayOptions::default()
    };
    let app = TestApp::builder(pool).gateway(gateway).start().await;
    let t = app.tenant("acme").await;
    let (header, client_trace, _) = client_traceparent();
    let r = app
        .post(&t.key, "/v1/chat/completions", chat(BASE, "hi", 3))
        .header("traceparent", &header)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let rid = request_id(&r);
    r.bytes().await.unwrap();
    let entry = app.ledger_entry(&rid).await;
    let (request, _) = trace_of(&rid, &["upstream"]).await;
    assert_ne!(hex(&request.trace_id), client_trace);
    assert!(request.parent_span_id.is_empty());
    let (engine_trace, _) = engine_parent(entry.traceparent.as_deref());
    assert_eq!(engine_trace, hex(&request.trace_id));
    assert_ne!(
        engine_trace, client_trace,
        "the client's header is not passed on"
    );
}

#[sqlx::test(migrations = "../migrations")]
async fn a_traceparent_from_a_trusted_peer_is_joined_and_passed_on(pool: PgPool) {
    exporter();
    let gateway = GatewayOptions {
        trust_traceparent_from: "127.0.0.1/32".parse().unwrap(),
        ..GatewayOptions::default()
    };
    let app = TestApp::builder(pool).gateway(gateway).start().await;
    let t = app.tenant("acme").await;
    let (header, client_trace, client_span) = client_traceparent();
    // Streamed: the upstream span lasts as long as the stream.
    let mut body = chat(BASE, "hi there", 4);
    body["stream"] = true.into();
    let r = app
        .post(&t.key, "/v1/chat/completions", body)
        .header("traceparent", &header)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let rid = request_id(&r);
    let events = sse_data(r).await;
    assert_eq!(events.last().map(String::as_str), Some("[DONE]"));
    let entry = app.ledger_entry(&rid).await;
    let (request, children) = trace_of(&rid, &["auth", "admission", "upstream"]).await;
    assert_eq!(hex(&request.trace_id), client_trace);
    assert_eq!(hex(&request.parent_span_id), client_span);
    assert_eq!(
        int_attr(&request, "gen_ai.usage.output_tokens"),
        Some(i64::from(entry.completion_tokens))
    );
    let upstream = children.iter().find(|s| s.name == "upstream").unwrap();
    let (engine_trace, engine_parent_span) = engine_parent(entry.traceparent.as_deref());
    assert_eq!(engine_trace, client_trace);
    assert_eq!(engine_parent_span, hex(&upstream.span_id));
}
