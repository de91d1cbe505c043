//! Issue 34's metering leaks, each against a simulator fault mode (its ledger is the truth):
//! SSE line ends (`\n`, `\r\n`, a lone `\r`) on streamed, aborted and assembled answers; an
//! engine's error sent with HTTP 200 or inside a stream; and output counted from its text when
//! the engine reports no usage and puts several tokens in each delta.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use crate::common;

use std::time::Duration;

use common::*;
use futures::StreamExt;
use serde_json::{json, Value};
use sqlx::PgPool;
use tokenfactory::usage::{Provenance, UsageStatus};

const ENDINGS: [&str; 3] = ["lf", "crlf", "cr"];

/// Reads a stream as a client that follows the SSE spec: the `data:` payloads of its events,
/// up to `hang_up_after` of them (then the client hangs up).
async fn client_events(r: reqwest::Response, hang_up_after: Option<usize>) -> Vec<String> {
    let mut reader = common::sse::Reader::default();
    let mut body = r.bytes_stream();
    let read = async {
        while let Some(Ok(b)) = body.next().await {
            reader.push(&b);
            if hang_up_after.is_some_and(|n| reader.events.len() >= n) {
                return;
            }
        }
        reader.finish();
    };
    tokio::time::timeout(Duration::from_secs(20), read)
        .await
        .expect("the stream never ended");
    reader.events
}

fn chunks(data: &[String]) -> Vec<Value> {
    data.iter()
        .filter(|d| *d != "[DONE]")
        .map(|d| serde_json::from_str(d).unwrap())
        .collect()
}

/// The event of `id` billed exactly the ledger's prompt and completion.
async fn billed_as_ledger(app: &TestApp, id: &str, what: &str) -> tokenfactory::usage::UsageEvent {
    let entry = app.ledger_entry(id).await;
    let ev = app.event(id).await;
    assert_eq!(
        (ev.prompt_tokens, ev.completion_tokens),
        (
            i64::from(entry.prompt_tokens),
            i64::from(entry.completion_tokens)
        ),
        "{what}: billed what the engine produced ({entry:?})"
    );
    ev
}

#[sqlx::test(migrations = "../migrations")]
async fn every_line_ending_is_metered_and_relayed(pool: PgPool) {
    let app = TestApp::builder(pool).start().await;
    let acme = app.tenant("acme").await;
    let lora = app.adapter(&acme, "bot").await;
    for ending in ENDINGS {
        // Streamed to the end: proper chunks under the public name, the engine's counts.
        let mut body = chat("bot", "one two three", 12);
        body["stream"] = json!(true);
        body["stream_options"] = json!({"include_usage": true});
        body["sim"] = json!({"line_ending": ending});
        let r = app
            .post(&acme.key, "/v1/chat/completions", body)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200);
        let id = request_id(&r);
        let data = client_events(r, None).await;
        assert_eq!(
            data.last().map(String::as_str),
            Some("[DONE]"),
            "{ending}: {data:?}"
        );
        let c = chunks(&data);
        assert!(
            c.len() >= 13,
            "{ending}: role chunk, 12 tokens, usage: {data:?}"
        );
        assert!(
            c.iter().all(|c| c["model"] == "bot"),
            "{ending}: not {lora}: {data:?}"
        );
        let text: String = c
            .iter()
            .filter_map(|c| c["choices"][0]["delta"]["content"].as_str())
            .collect();
        assert_eq!(text.split_whitespace().count(), 12, "{ending}: {text}");
        assert_eq!(c.last().unwrap()["usage"]["completion_tokens"], 12);
        let ev = billed_as_ledger(&app, &id, ending).await;
        assert_eq!(
            (ev.status, ev.provenance),
            (UsageStatus::Ok, Provenance::Engine)
        );

        // Aborted after a few chunks: billed what the engine produced until it saw the hang-up.
        let mut body = chat("bot", "tell me more", 400);
        body["stream"] = json!(true);
        body["sim"] = json!({"line_ending": ending, "token_interval_ms": 10});
        let r = app
            .post(&acme.key, "/v1/chat/completions", body)
            .send()
            .await
            .unwrap();
        let id = request_id(&r);
        let data = client_events(r, Some(4)).await;
        assert!(
            chunks(&data).iter().all(|c| c["model"] == "bot"),
            "{data:?}"
        );
        let entry = app.ledger_entry(&id).await;
        assert!(
            entry.cancelled && entry.completion_tokens < 400,
            "{entry:?}"
        );
        let ev = billed_as_ledger(&app, &id, ending).await;
        assert_eq!(ev.status, UsageStatus::ClientAbort);

        // Not streamed: the engine's stream assembled into the JSON answer.
        let mut body = chat("bot", "four five", 7);
        body["sim"] = json!({"line_ending": ending});
        let r = app
            .post(&acme.key, "/v1/chat/completions", body)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200);
        let id = request_id(&r);
        let v: Value = r.json().await.unwrap();
        assert_eq!(v["model"], "bot", "{ending}: {v}");
        assert_eq!(v["object"], "chat.completion");
        assert_eq!(v["usage"]["completion_tokens"], 7, "{ending}: {v}");
        let content = v["choices"][0]["message"]["content"].as_str().unwrap();
        assert_eq!(content.split_whitespace().count(), 7, "{v}");
        billed_as_ledger(&app, &id, ending).await;
    }
}

#[sqlx::test(migrations = "../migrations")]
async fn typed_streams_read_every_line_ending(pool: PgPool) {
    let app = TestApp::builder(pool).start().await;
    let acme = app.tenant("acme").await;
    for ending in ENDINGS {
        for (path, body) in [
            (
                "/v1/responses",
                json!({"model": BASE, "input": "one two", "max_output_tokens": 6, "stream": true}),
            ),
            (
                "/v1/messages",
                json!({"model": BASE, "max_tokens": 6, "stream": true, "messages": [{"role": "user", "content": "one two"}]}),
            ),
        ] {
            let mut body = body;
            body["sim"] = json!({"line_ending": ending});
            let r = app
                .post(&acme.key, path, body.clone())
                .send()
                .await
                .unwrap();
            assert_eq!(r.status(), 200);
            let id = request_id(&r);
            let data = client_events(r, None).await;
            assert!(data.len() >= 8, "{path} {ending}: {data:?}");
            let ev = billed_as_ledger(&app, &id, path).await;
            assert_eq!(ev.status, UsageStatus::Ok, "{path} {ending}");
            // And assembled whole.
            body["stream"] = json!(false);
            let r = app.post(&acme.key, path, body).send().await.unwrap();
            assert_eq!(r.status(), 200, "{path} {ending}");
            let id = request_id(&r);
            let v: Value = r.json().await.unwrap();
            assert_eq!(v["model"], BASE, "{v}");
            billed_as_ledger(&app, &id, path).await;
        }
    }
}

#[sqlx::test(migrations = "../migrations")]
async fn a_json_error_with_200_is_an_upstream_error(pool: PgPool) {
    let app = with_embeddings(pool).await;
    let acme = app.tenant("acme").await;
    let fault = json!({"fail_status": 400, "error_with_200": true});
    let mut streamed = chat(BASE, "hello", 8);
    streamed["stream"] = json!(true);
    for (path, mut body) in [
        ("/v1/chat/completions", chat(BASE, "hello", 8)),
        ("/v1/chat/completions", streamed),
        (
            "/v1/embeddings",
            json!({"model": EMBED, "input": "one two three"}),
        ),
    ] {
        body["sim"] = fault.clone();
        let r = app
            .post(&acme.key, path, body.clone())
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 502, "{path} {body}");
        let id = request_id(&r);
        let v: Value = r.json().await.unwrap();
        assert_eq!(v["error"]["message"], "Simulated engine failure.", "{v}");
        assert_eq!(v["error"]["type"], "api_error", "{v}");
        let ev = app.event(&id).await;
        assert_eq!(ev.status, UsageStatus::UpstreamError, "{path} {body}");
        assert_eq!((ev.prompt_tokens, ev.completion_tokens), (0, 0), "{path}");
    }
}

#[sqlx::test(migrations = "../migrations")]
async fn an_error_inside_a_stream_is_not_billed_as_output(pool: PgPool) {
    let app = TestApp::builder(pool).start().await;
    let acme = app.tenant("acme").await;
    for omit_usage in [false, true] {
        let sim = json!({"error_after_chunks": 3, "omit_usage": omit_usage});
        let mut body = chat(BASE, "hello there", 10);
        body["stream"] = json!(true);
        body["sim"] = sim.clone();
        let r = app
            .post(&acme.key, "/v1/chat/completions", body)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200);
        let id = request_id(&r);
        let data = client_events(r, None).await;
        assert!(
            data.iter().any(|d| d.contains("\"error\"")),
            "the client sees the error: {data:?}"
        );
        let entry = app.ledger_entry(&id).await;
        assert_eq!(entry.completion_tokens, 3);
        let ev = billed_as_ledger(&app, &id, "streamed").await;
        assert_eq!(
            ev.status,
            UsageStatus::UpstreamError,
            "omit_usage {omit_usage}"
        );

        // Not streamed: relayed as an error in the envelope, billed the three tokens produced.
        let mut body = chat(BASE, "hello there", 10);
        body["sim"] = sim;
        let r = app
            .post(&acme.key, "/v1/chat/completions", body)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 502);
        let id = request_id(&r);
        let v: Value = r.json().await.unwrap();
        assert!(v["error"]["message"].is_string(), "{v}");
        let ev = billed_as_ledger(&app, &id, "whole").await;
        assert_eq!(ev.status, UsageStatus::UpstreamError);
    }
}

#[sqlx::test(migrations = "../migrations")]
async fn several_tokens_per_delta_without_usage_bill_the_true_count(pool: PgPool) {
    let app = TestApp::builder(pool).start().await;
    let acme = app.tenant("acme").await;
    let sim = json!({"tokens_per_delta": 3, "omit_usage": true});
    for path in ["/v1/chat/completions", "/v1/completions"] {
        let base = if path == "/v1/completions" {
            json!({"model": BASE, "prompt": "one two three", "max_tokens": 10})
        } else {
            chat(BASE, "one two three", 10)
        };
        // Whole (assembled from the engine's stream).
        let mut body = base.clone();
        body["sim"] = sim.clone();
        let r = app.post(&acme.key, path, body).send().await.unwrap();
        assert_eq!(r.status(), 200);
        let id = request_id(&r);
        let ev = billed_as_ledger(&app, &id, path).await;
        assert_eq!(ev.completion_tokens, 10);
        assert_eq!(
            (ev.status, ev.provenance),
            (UsageStatus::Ok, Provenance::Estimated)
        );

        // Streamed.
        let mut body = base.clone();
        body["stream"] = json!(true);
        body["sim"] = sim.clone();
        let r = app.post(&acme.key, path, body).send().await.unwrap();
        let id = request_id(&r);
        let data = client_events(r, None).await;
        assert_eq!(
            data.len(),
            4 + usize::from(path.contains("chat")) + 1,
            "{data:?}"
        );
        let ev = billed_as_ledger(&app, &id, path).await;
        assert_eq!(ev.completion_tokens, 10);

        // Aborted.
        let mut body = base.clone();
        body["max_tokens"] = json!(600);
        body["stream"] = json!(true);
        body["sim"] = json!({"tokens_per_delta": 3, "omit_usage": true, "token_interval_ms": 5});
        let r = app.post(&acme.key, path, body).send().await.unwrap();
        let id = request_id(&r);
        client_events(r, Some(5)).await;
        let entry = app.ledger_entry(&id).await;
        assert!(entry.cancelled && entry.completion_tokens >= 9, "{entry:?}");
        let ev = billed_as_ledger(&app, &id, path).await;
        assert_eq!(ev.status, UsageStatus::ClientAbort);
    }
    // A Responses stream cut before its usage: its deltas' tokens.
    let body = json!({"model": BASE, "input": "one two", "max_output_tokens": 600, "stream": true,
        "sim": {"tokens_per_delta": 3, "token_interval_ms": 5}});
    let r = app
        .post(&acme.key, "/v1/responses", body)
        .send()
        .await
        .unwrap();
    let id = request_id(&r);
    client_events(r, Some(5)).await;
    let ev = billed_as_ledger(&app, &id, "responses").await;
    assert_eq!(ev.status, UsageStatus::ClientAbort);
}
