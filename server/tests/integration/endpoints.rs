//! Issue 32: `/v1/responses`, `/v1/embeddings` and `/v1/messages` (Anthropic) served like chat
//! completions: the key's tenant, the same 404 for missing and forbidden names, one usage event
//! per request id with the engine's counts (checked against the simulator's ledger), aborts
//! billed for what the engine produced, each endpoint's own error envelope, and a base's kind
//! (chat or embedding) enforced before anything is forwarded.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use crate::common;

use common::*;
use serde_json::{json, Value};
use sqlx::PgPool;
use tf_core::endpoint::Endpoint;
use tokenfactory::usage::{Provenance, UsageStatus};

fn responses_body(model: &str, input: &str, max: u32) -> Value {
    json!({"model": model, "input": input, "max_output_tokens": max})
}

fn messages_body(model: &str, content: &str, max: u32) -> Value {
    json!({"model": model, "max_tokens": max, "messages": [{"role": "user", "content": content}]})
}

/// The event of `id` holds the ledger's counts, exactly.
async fn assert_matches_ledger(t: &TestApp, id: &str, endpoint: Endpoint) -> (i64, i64) {
    let ev = t.event(id).await;
    let led = t.ledger_entry(id).await;
    assert_eq!(ev.endpoint, endpoint);
    assert_eq!(
        ev.prompt_tokens,
        i64::from(led.prompt_tokens),
        "prompt of {id}"
    );
    assert_eq!(
        ev.cached_tokens,
        i64::from(led.cached_tokens),
        "cached of {id}"
    );
    assert_eq!(
        ev.completion_tokens,
        i64::from(led.completion_tokens),
        "completion of {id}"
    );
    assert_eq!(ev.reasoning_tokens, i64::from(led.reasoning_tokens));
    (ev.prompt_tokens, ev.completion_tokens)
}

#[sqlx::test(migrations = "../migrations")]
async fn embeddings_are_metered_for_every_input_shape(pool: PgPool) {
    let t = with_embeddings(pool).await;
    let a = t.tenant("acme").await;
    for (input, prompt, vectors) in [
        (json!("one two three"), 4, 1),
        (json!(["one two", "three"]), 5, 2),
        (json!([11, 12, 13, 14, 15]), 5, 1),
        (json!([[11, 12], [13]]), 3, 2),
    ] {
        let r = t
            .post(
                &a.key,
                "/v1/embeddings",
                json!({"model": EMBED, "input": input}),
            )
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200);
        let id = request_id(&r);
        let body: Value = r.json().await.unwrap();
        assert_eq!(body["usage"]["prompt_tokens"], prompt, "{input}");
        assert_eq!(body["data"].as_array().unwrap().len(), vectors);
        assert_eq!(body["model"], EMBED);
        let (p, c) = assert_matches_ledger(&t, &id, Endpoint::Embeddings).await;
        assert_eq!((p, c), (prompt, 0));
        let ev = t.event(&id).await;
        assert_eq!(
            (ev.status, ev.provenance),
            (UsageStatus::Ok, Provenance::Engine)
        );
    }
    // base64 vectors, as the openai package asks by default.
    let r = t
        .post(
            &a.key,
            "/v1/embeddings",
            json!({"model": EMBED, "input": "x", "encoding_format": "base64"}),
        )
        .send()
        .await
        .unwrap();
    let body: Value = r.json().await.unwrap();
    assert!(body["data"][0]["embedding"].is_string(), "{body}");
}

#[sqlx::test(migrations = "../migrations")]
async fn each_endpoint_refuses_the_other_kind_of_base_before_forwarding(pool: PgPool) {
    let t = with_embeddings(pool).await;
    let a = t.tenant("acme").await;
    let before = t.sim.ledger().len();
    let r = t
        .post(
            &a.key,
            "/v1/embeddings",
            json!({"model": BASE, "input": "x"}),
        )
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 400);
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["error"]["param"], "model");
    assert!(v["error"]["message"]
        .as_str()
        .unwrap()
        .contains("not an embedding model"));
    for (path, body) in [
        ("/v1/chat/completions", chat(EMBED, "x", 3)),
        ("/v1/responses", responses_body(EMBED, "x", 3)),
    ] {
        let r = t.post(&a.key, path, body).send().await.unwrap();
        assert_eq!(r.status(), 400, "{path}");
        let v: Value = r.json().await.unwrap();
        assert!(v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("/v1/embeddings"));
    }
    let r = t
        .post(&a.key, "/v1/messages", messages_body(EMBED, "x", 3))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 400);
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["type"], "error");
    assert_eq!(v["error"]["type"], "invalid_request_error");
    assert_eq!(t.sim.ledger().len(), before, "nothing was forwarded");
}

#[sqlx::test(migrations = "../migrations")]
async fn responses_are_metered_whole_and_streamed_with_reasoning(pool: PgPool) {
    let t = with_embeddings(pool).await;
    let a = t.tenant("acme").await;
    // Whole.
    let mut body = responses_body(BASE, "say some words", 9);
    body["instructions"] = json!("be brief");
    body["reasoning"] = json!({"effort": "low"});
    let r = t
        .post(&a.key, "/v1/responses", body.clone())
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let id = request_id(&r);
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["object"], "response");
    assert_eq!(v["model"], BASE);
    assert_eq!(v["usage"]["output_tokens"], 9);
    assert_eq!(v["usage"]["output_tokens_details"]["reasoning_tokens"], 4);
    let (p, c) = assert_matches_ledger(&t, &id, Endpoint::Responses).await;
    // 2 + (3 + 2) + (3 + 3) by the simulator's rules: the gateway's estimate agrees.
    assert_eq!((p, c), (13, 9));
    assert_eq!(t.event(&id).await.reasoning_tokens, 4);
    // Streamed: typed events, no `[DONE]`, the final usage in `response.completed`.
    body["stream"] = json!(true);
    let r = t.post(&a.key, "/v1/responses", body).send().await.unwrap();
    assert_eq!(r.status(), 200);
    let id = request_id(&r);
    let text = r.text().await.unwrap();
    assert!(text.starts_with("event: response.created\n"), "{text}");
    assert!(!text.contains("[DONE]"), "{text}");
    let completed = text
        .split("\n\n")
        .find(|e| {
            e.starts_with("event: response.incomplete")
                || e.starts_with("event: response.completed")
        })
        .unwrap();
    assert!(completed.contains("\"output_tokens\":9"), "{completed}");
    let (_, c) = assert_matches_ledger(&t, &id, Endpoint::Responses).await;
    assert_eq!(c, 9);
    let ev = t.event(&id).await;
    assert_eq!(
        (ev.status, ev.provenance, ev.stream),
        (UsageStatus::Ok, Provenance::Engine, true)
    );
}

#[sqlx::test(migrations = "../migrations")]
async fn aborted_typed_streams_bill_what_the_engine_produced(pool: PgPool) {
    let t = with_embeddings(pool).await;
    let a = t.tenant("acme").await;
    for (path, k) in [
        ("/v1/responses", 2),
        ("/v1/responses", 5),
        ("/v1/messages", 3),
        ("/v1/messages", 6),
    ] {
        let mut body = if path == "/v1/responses" {
            responses_body(BASE, "count for me", 200)
        } else {
            messages_body(BASE, "count for me", 200)
        };
        body["stream"] = json!(true);
        body["sim"] = json!({"token_interval_ms": 20});
        let r = t.post(&a.key, path, body).send().await.unwrap();
        assert_eq!(r.status(), 200);
        let id = request_id(&r);
        read_events_then_hang_up(r, k).await;
        let led = t.ledger_entry(&id).await;
        assert!(led.cancelled, "{path} after {k}: the engine was told");
        let ev = t.event(&id).await;
        assert_eq!(ev.status, UsageStatus::ClientAbort);
        assert!(led.completion_tokens < 200, "cut mid-stream");
        assert_eq!(
            (ev.prompt_tokens, ev.completion_tokens),
            (
                i64::from(led.prompt_tokens),
                i64::from(led.completion_tokens)
            ),
            "{path} after {k} events"
        );
    }
}

#[sqlx::test(migrations = "../migrations")]
async fn messages_speak_anthropic_and_meter_its_usage(pool: PgPool) {
    let t = with_embeddings(pool).await;
    let a = t.tenant("acme").await;
    // Long enough to fill two prefix-cache blocks (16 tokens each).
    let words: Vec<String> = (0..30).map(|i| format!("word{i}")).collect();
    let body = json!({"model": BASE, "max_tokens": 6, "system": "you are terse",
                      "messages": [{"role": "user", "content": words.join(" ")}]});
    // `x-api-key`, as Anthropic's clients send it.
    let send = |body: Value| {
        t.http
            .post(t.url("/v1/messages"))
            .header("x-api-key", &a.key)
            .header("anthropic-version", "2023-06-01")
            .json(&body)
            .send()
    };
    let r = send(body.clone()).await.unwrap();
    assert_eq!(r.status(), 200);
    let id = request_id(&r);
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["type"], "message");
    assert_eq!(v["model"], BASE);
    assert_eq!(v["usage"]["output_tokens"], 6);
    assert_eq!(v["content"][0]["type"], "text");
    let (p, _) = assert_matches_ledger(&t, &id, Endpoint::Messages).await;
    // The same prompt again hits the prefix cache: Anthropic's input_tokens excludes it.
    let mut streamed = body;
    streamed["stream"] = json!(true);
    let r = send(streamed).await.unwrap();
    let id = request_id(&r);
    let text = r.text().await.unwrap();
    assert!(text.contains("event: message_stop"), "{text}");
    assert!(!text.contains("[DONE]"));
    let (p2, c2) = assert_matches_ledger(&t, &id, Endpoint::Messages).await;
    assert_eq!((p2, c2), (p, 6));
    let ev = t.event(&id).await;
    assert!(ev.cached_tokens > 0, "the repeat was cached");
    let start = text.split("\n\n").next().unwrap();
    let data: Value = serde_json::from_str(start.split("data: ").nth(1).unwrap()).unwrap();
    let u = &data["message"]["usage"];
    assert_eq!(
        u["input_tokens"].as_i64().unwrap() + u["cache_read_input_tokens"].as_i64().unwrap(),
        p,
        "input + cache read = the prompt"
    );
}

#[sqlx::test(migrations = "../migrations")]
async fn errors_come_in_each_endpoints_envelope(pool: PgPool) {
    let t = with_embeddings(pool).await;
    let a = t.tenant("acme").await;
    let b = t.tenant("bravo").await;
    let lora = t.adapter(&b, "secret-bot").await;
    assert!(!lora.is_empty());
    // A name of another tenant answers like a missing one, on every endpoint.
    for model in ["no-such-model", "secret-bot"] {
        let r = t
            .post(&a.key, "/v1/responses", responses_body(model, "x", 3))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 404);
        let v: Value = r.json().await.unwrap();
        assert_eq!(v["error"]["code"], "model_not_found");
        let r = t
            .post(
                &a.key,
                "/v1/embeddings",
                json!({"model": model, "input": "x"}),
            )
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 404);
        let r = t
            .post(&a.key, "/v1/messages", messages_body(model, "x", 3))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 404);
        let v: Value = r.json().await.unwrap();
        assert_eq!(
            (v["type"].as_str(), v["error"]["type"].as_str()),
            (Some("error"), Some("not_found_error"))
        );
    }
    let r = t
        .http
        .post(t.url("/v1/messages"))
        .header("x-api-key", "tf-wrong")
        .json(&messages_body(BASE, "x", 3))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 401);
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["error"]["type"], "authentication_error");
    let r = t
        .post(
            "tf-wrong",
            "/v1/embeddings",
            json!({"model": EMBED, "input": "x"}),
        )
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 401);
    // Over quota: 429 in each envelope.
    admin_limits(&t.pool, &["--tenant", "acme", "--rpm", "0"]).await;
    eventually(
        std::time::Duration::from_secs(5),
        "the limit applies",
        || async {
            let r = t
                .post(
                    &a.key,
                    "/v1/embeddings",
                    json!({"model": EMBED, "input": "x"}),
                )
                .send()
                .await
                .unwrap();
            (r.status() == 429).then_some(())
        },
    )
    .await;
    let r = t
        .post(&a.key, "/v1/messages", messages_body(BASE, "x", 3))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 429);
    assert!(r.headers().contains_key("retry-after"));
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["error"]["type"], "rate_limit_error");
    let r = t
        .post(&a.key, "/v1/responses", responses_body(BASE, "x", 3))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 429);
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["error"]["type"], "rate_limit_error");
}

/// Responses that name engine-kept state are refused for every tenant, before forwarding: a
/// second tenant holding the first one's response id gets nothing, because nothing is stored.
#[sqlx::test(migrations = "../migrations")]
async fn responses_refuse_engine_state_for_every_tenant(pool: PgPool) {
    let t = with_embeddings(pool).await;
    let a = t.tenant("acme").await;
    let b = t.tenant("bravo").await;
    let r = t
        .post(
            &a.key,
            "/v1/responses",
            responses_body(BASE, "remember this", 3),
        )
        .send()
        .await
        .unwrap();
    let v: Value = r.json().await.unwrap();
    let resp_id = v["id"].as_str().unwrap().to_owned();
    assert!(resp_id.starts_with("resp_"));
    assert_eq!(v["store"], false, "the engine was told not to store it");
    let before = t.sim.ledger().len();
    for tenant in [&a, &b] {
        for (field, value) in [
            ("store", json!(true)),
            ("previous_response_id", json!(resp_id)),
            ("conversation", json!("conv_1")),
            ("background", json!(true)),
        ] {
            let mut body = responses_body(BASE, "and then?", 3);
            body[field] = value;
            let r = t
                .post(&tenant.key, "/v1/responses", body)
                .send()
                .await
                .unwrap();
            assert_eq!(r.status(), 400, "{field}");
            let v: Value = r.json().await.unwrap();
            assert_eq!(v["error"]["param"], field);
        }
    }
    assert_eq!(t.sim.ledger().len(), before, "nothing was forwarded");
    let mut body = responses_body(BASE, "fine", 3);
    body["store"] = json!(false);
    let r = t.post(&b.key, "/v1/responses", body).send().await.unwrap();
    assert_eq!(r.status(), 200);
}

/// The usage export (`admin export`): every event of every endpoint is one CSV row naming its
/// endpoint and reasoning tokens, and the rows' token totals, per endpoint and overall, equal the
/// stored events'; the JSON formats carry the same two fields.
#[sqlx::test(migrations = "../migrations")]
async fn the_usage_export_names_each_endpoint_and_its_totals_equal_the_events(pool: PgPool) {
    use std::collections::BTreeMap;
    use tokenfactory::billing::export::{self, Format};
    let t = with_embeddings(pool).await;
    let a = t.tenant("acme").await;
    let mut ids = Vec::new();
    for stream in [false, true] {
        let mut reasoning = responses_body(BASE, "think about it", 6);
        reasoning["reasoning"] = json!({"effort": "low"});
        for (path, mut body) in [
            ("/v1/chat/completions", chat(BASE, "chat row", 3)),
            (
                "/v1/completions",
                json!({"model": BASE, "prompt": "completion row", "max_tokens": 4}),
            ),
            ("/v1/responses", reasoning),
            ("/v1/responses", responses_body(BASE, "plain response", 2)),
            ("/v1/messages", messages_body(BASE, "message row", 5)),
        ] {
            body["stream"] = json!(stream);
            let r = t.post(&a.key, path, body).send().await.unwrap();
            assert_eq!(r.status(), 200, "{path}");
            ids.push(request_id(&r));
            r.bytes().await.unwrap();
        }
    }
    let r = t
        .post(
            &a.key,
            "/v1/embeddings",
            json!({"model": EMBED, "input": ["one two", "three, four"]}),
        )
        .send()
        .await
        .unwrap();
    ids.push(request_id(&r));
    r.bytes().await.unwrap();
    for id in &ids {
        t.event(id).await;
    }
    let live = tf_core::db::billing::live_run(&t.pool).await.unwrap();
    tf_core::db::billing::drain(&t.pool, live, 1000)
        .await
        .unwrap();
    let now = time::OffsetDateTime::now_utc();
    let (since, until) = (
        now - time::Duration::hours(1),
        now + time::Duration::hours(1),
    );
    let mut out = Vec::new();
    let n = export::export(&t.pool, Format::Csv, since, until, "tf-test", &mut out)
        .await
        .unwrap();
    assert_eq!(n as usize, ids.len());
    let text = String::from_utf8(out).unwrap();
    let mut lines = text.lines();
    let header: Vec<&str> = lines.next().unwrap().split(',').collect();
    let col = |name: &str| header.iter().position(|h| *h == name).unwrap();
    let (c_id, c_end, c_fresh, c_cached, c_out, c_reason) = (
        col("request_id"),
        col("endpoint"),
        col("fresh_input_tokens"),
        col("cached_input_tokens"),
        col("output_tokens"),
        col("reasoning_tokens"),
    );
    // Per endpoint: (rows, prompt, cached, output, reasoning).
    let mut rows: BTreeMap<String, [i64; 5]> = BTreeMap::new();
    for line in lines {
        let f: Vec<&str> = line.split(',').collect();
        assert_eq!(f.len(), header.len(), "{line}");
        let num = |c: usize| f[c].parse::<i64>().unwrap();
        let ev = t.event(f[c_id]).await;
        assert_eq!(f[c_end], ev.endpoint.as_str(), "{line}");
        assert_eq!(num(c_reason), ev.reasoning_tokens, "{line}");
        let r = rows.entry(f[c_end].to_owned()).or_default();
        r[0] += 1;
        r[1] += num(c_fresh) + num(c_cached);
        r[2] += num(c_cached);
        r[3] += num(c_out);
        r[4] += num(c_reason);
    }
    let stored: BTreeMap<String, [i64; 5]> =
        sqlx::query_as::<_, (String, i64, i64, i64, i64, i64)>(
            "SELECT endpoint, count(*), sum(prompt_tokens)::int8, sum(cached_tokens)::int8,
                sum(completion_tokens)::int8, sum(reasoning_tokens)::int8
           FROM usage_events GROUP BY endpoint",
        )
        .fetch_all(&t.pool)
        .await
        .unwrap()
        .into_iter()
        .map(|(e, n, p, c, o, r)| (e, [n, p, c, o, r]))
        .collect();
    assert_eq!(rows, stored, "the export's totals per endpoint");
    assert_eq!(
        rows.keys().map(String::as_str).collect::<Vec<_>>(),
        ["chat", "completions", "embeddings", "messages", "responses"]
    );
    assert!(rows["responses"][4] > 0, "reasoning tokens exported");
    assert_eq!(rows["embeddings"][3], 0);
    println!("usage export per endpoint (rows, prompt, cached, output, reasoning): {rows:?}");

    let mut out = Vec::new();
    export::export(
        &t.pool,
        Format::CloudEvents,
        since,
        until,
        "tf-test",
        &mut out,
    )
    .await
    .unwrap();
    for line in String::from_utf8(out).unwrap().lines() {
        let v: Value = serde_json::from_str(line).unwrap();
        let ev = t.event(v["id"].as_str().unwrap()).await;
        assert_eq!(v["data"]["endpoint"], ev.endpoint.as_str());
        assert_eq!(v["data"]["reasoning_tokens"], ev.reasoning_tokens);
    }
}
