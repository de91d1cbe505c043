//! Fault knobs, client disconnects and timing: failures in both error shapes, dying streams,
//! delays, cancellation accounting and the FIFO prefill lock.

mod common;

use std::time::{Duration, Instant};

use common::{chunk_text, config, content_chunks, parse_sse, start};
use serde_json::{json, Value};
use tf_engine_sim::{GlobalFaults, SimConfig};

fn chat(extra: Value) -> Value {
    let mut body = json!({"model": "tiny-llama", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 5});
    if let Value::Object(fields) = extra {
        for (k, v) in fields {
            body[k] = v;
        }
    }
    body
}

#[tokio::test]
async fn fail_status_enveloped_and_flat() {
    let sim = start(config()).await;
    let (status, err) = sim
        .post_json(
            "/v1/chat/completions",
            &chat(json!({"sim": {"fail_status": 503}})),
        )
        .await;
    assert_eq!(status, 503);
    assert_eq!(err["error"]["type"], "ServiceUnavailableError");
    assert_eq!(err["error"]["code"], 503);
    assert!(err["error"]["param"].is_null());

    let faults = json!({"fail_status": 429, "flat_errors": true, "usage_on_last_chunk": false, "delay_ms": 0, "die_after_chunks": null});
    assert_eq!(sim.post("/sim/faults", &faults).await.status(), 200);
    let got: GlobalFaults = sim.get("/sim/faults").await.json().await.unwrap();
    assert_eq!(
        got,
        GlobalFaults {
            fail_status: Some(429),
            flat_errors: true,
            ..Default::default()
        }
    );
    let (status, err) = sim
        .post_json("/v1/chat/completions", &chat(json!({"stream": true})))
        .await;
    assert_eq!(status, 429);
    assert_eq!(
        err,
        json!({"message": "Simulated engine failure.", "type": "RateLimitError", "code": 429})
    );
    // A per-request knob overrides the global one.
    let (status, _) = sim
        .post_json(
            "/v1/chat/completions",
            &chat(json!({"sim": {"fail_status": 500, "flat_errors": false}})),
        )
        .await;
    assert_eq!(status, 500);
    sim.sim.set_faults(GlobalFaults::default());
    assert_eq!(
        sim.post_json("/v1/chat/completions", &chat(json!({})))
            .await
            .0,
        200
    );
    let statuses: Vec<u16> = sim.ledger().await.iter().map(|e| e.status).collect();
    assert_eq!(statuses, vec![503, 429, 500, 200]);
    let produced: Vec<u32> = sim
        .sim
        .ledger()
        .iter()
        .map(|e| e.completion_tokens)
        .collect();
    assert_eq!(produced, vec![0, 0, 0, 5]);
}

#[tokio::test]
async fn die_after_chunks_breaks_the_stream() {
    let sim = start(config()).await;
    let body = chat(
        json!({"stream": true, "stream_options": {"include_usage": true}, "sim": {"die_after_chunks": 2}}),
    );
    let response = sim
        .client
        .post(format!("{}/v1/chat/completions", sim.url))
        .header("x-request-id", "die")
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    let mut text = Vec::new();
    let mut response = response;
    let error = loop {
        match response.chunk().await {
            Ok(Some(bytes)) => text.extend_from_slice(&bytes),
            Ok(None) => break None,
            Err(e) => break Some(e),
        }
    };
    assert!(
        error.is_some(),
        "the body must end in an error, not cleanly"
    );
    let (events, done) = parse_sse(std::str::from_utf8(&text).unwrap());
    assert!(!done);
    assert_eq!(content_chunks(&events), 2);
    assert!(events.iter().all(|e| e["usage"].is_null()));
    let entry = sim.wait_entry("die").await;
    assert!(entry.died && !entry.cancelled);
    assert_eq!(entry.completion_tokens, 2);

    // Not streamed: the connection closes with no response at all.
    let body = chat(json!({"sim": {"die_after_chunks": 3}}));
    let sent = sim
        .client
        .post(format!("{}/v1/chat/completions", sim.url))
        .header("x-request-id", "die2")
        .json(&body)
        .send()
        .await;
    assert!(sent.is_err());
    let entry = sim.wait_entry("die2").await;
    assert!(entry.died);
    assert_eq!(entry.completion_tokens, 3);
}

#[tokio::test]
async fn delay_and_pacing_knobs() {
    let sim = start(config()).await;
    let started = Instant::now();
    let (status, _) = sim
        .post_json(
            "/v1/chat/completions",
            &chat(json!({"sim": {"delay_ms": 200, "fail_status": 503}})),
        )
        .await;
    assert_eq!(status, 503);
    assert!(started.elapsed() >= Duration::from_millis(200));

    let started = Instant::now();
    let body =
        chat(json!({"sim": {"ttft_ms": 100, "token_interval_ms": 20, "completion_tokens": 6}}));
    let (_, v) = sim.post_json("/v1/chat/completions", &body).await;
    assert!(started.elapsed() >= Duration::from_millis(100 + 5 * 20));
    assert_eq!(v["usage"]["completion_tokens"], 6);
    assert_eq!(v["choices"][0]["finish_reason"], "length");
    let (_, v) = sim
        .post_json(
            "/v1/chat/completions",
            &chat(json!({"sim": {"completion_tokens": 2}})),
        )
        .await;
    assert_eq!(v["choices"][0]["finish_reason"], "stop");
}

#[tokio::test]
async fn client_disconnect_stops_a_stream() {
    let sim = start(config()).await;
    let body = chat(json!({"stream": true, "max_tokens": 100, "sim": {"token_interval_ms": 30}}));
    let mut response = sim
        .client
        .post(format!("{}/v1/chat/completions", sim.url))
        .header("x-request-id", "gone")
        .json(&body)
        .send()
        .await
        .unwrap();
    let mut text = String::new();
    while content_chunks(&complete_events(&text)) < 3 {
        text.push_str(std::str::from_utf8(&response.chunk().await.unwrap().unwrap()).unwrap());
    }
    let read = content_chunks(&complete_events(&text));
    drop(response);
    let entry = sim.wait_entry("gone").await;
    assert!(entry.cancelled && !entry.died);
    assert_eq!(entry.status, 200);
    assert!(
        entry.completion_tokens as usize >= read,
        "{} < {read}",
        entry.completion_tokens
    );
    assert!(
        entry.completion_tokens as usize <= read + 3,
        "kept generating: {}",
        entry.completion_tokens
    );
}

/// The events fully received so far.
fn complete_events(text: &str) -> Vec<Value> {
    let end = text.rfind("\n\n").map_or(0, |i| i + 2);
    parse_sse(&text[..end]).0
}

#[tokio::test]
async fn client_disconnect_stops_a_whole_request() {
    let sim = start(config()).await;
    let client = reqwest::Client::builder()
        .timeout(Duration::from_millis(200))
        .build()
        .unwrap();
    let body = chat(json!({"max_tokens": 100, "sim": {"token_interval_ms": 20}}));
    let sent = client
        .post(format!("{}/v1/chat/completions", sim.url))
        .header("x-request-id", "timeout")
        .json(&body)
        .send()
        .await;
    assert!(sent.is_err());
    let entry = sim.wait_entry("timeout").await;
    assert!(entry.cancelled);
    assert_eq!(entry.status, 0);
    assert!(
        entry.completion_tokens > 0 && entry.completion_tokens < 30,
        "{}",
        entry.completion_tokens
    );
}

#[tokio::test]
async fn long_prefill_stalls_other_requests() {
    let config = SimConfig {
        prefill_tokens_per_sec: 10_000,
        ..config()
    };
    let sim = start(config).await;
    // A tiny request alone: its first token comes at once.
    let small = chat(json!({"stream": true, "max_tokens": 1}));
    let started = Instant::now();
    sim.stream("/v1/chat/completions", &small).await;
    assert!(started.elapsed() < Duration::from_millis(300));

    // A 5000-token uncached prompt holds the GPU for ~0.5 s.
    let long: String = (0..5000).map(|i| format!("t{i} ")).collect();
    let big = json!({"model": "tiny-llama", "prompt": long, "max_tokens": 1, "stream": true, "cache_salt": "big"});
    let started = Instant::now();
    // Its headers arrive only after hyper has polled the body once, so its prefill holds the lock.
    let big_response = sim.post("/v1/completions", &big).await;
    let small_response = sim.post("/v1/chat/completions", &small).await;
    let mut small_response = small_response;
    let first = small_response.chunk().await.unwrap().unwrap();
    let waited = started.elapsed();
    assert!(chunk_text(&parse_sse(std::str::from_utf8(&first).unwrap()).0[0]).is_empty());
    assert!(
        waited >= Duration::from_millis(400),
        "small request was not stalled: {waited:?}"
    );
    big_response.text().await.unwrap();
    small_response.text().await.unwrap();

    // Repeating the long prompt is almost all cached, so it is fast.
    let started = Instant::now();
    sim.post("/v1/completions", &big)
        .await
        .text()
        .await
        .unwrap();
    assert!(started.elapsed() < Duration::from_millis(300));
    assert_eq!(sim.sim.ledger().last().unwrap().cached_tokens, 4992); // 5001 tokens: 312 whole blocks, the last token computed
}
