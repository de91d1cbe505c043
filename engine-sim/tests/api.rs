//! The OpenAI-compatible surface: token counts, response shapes, streaming usage options,
//! models, LoRA APIs, errors and the ledger route.

mod common;

use common::{chunk_text, config, content_chunks, start};
use serde_json::{json, Value};
use tf_engine_sim::tokenizer::count_text;

fn messages() -> Value {
    json!([
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": [{"type": "text", "text": "Say hello  to the world"}]}
    ])
}
// (3 + 3) + (3 + 5) + 2
const CHAT_PROMPT: u64 = 16;

#[tokio::test]
async fn chat_whole_counts_and_shape() {
    let sim = start(config()).await;
    let body = json!({"model": "tiny-llama", "messages": messages(), "max_tokens": 5});
    let (status, v) = sim.post_json("/v1/chat/completions", &body).await;
    assert_eq!(status, 200);
    assert!(v["id"].as_str().unwrap().starts_with("chatcmpl-"));
    assert_eq!(v["object"], "chat.completion");
    assert_eq!(v["model"], "tiny-llama");
    assert!(v["created"].as_u64().unwrap() > 1_700_000_000);
    let choice = &v["choices"][0];
    assert_eq!(choice["message"]["role"], "assistant");
    assert_eq!(choice["finish_reason"], "length");
    assert_eq!(
        count_text(choice["message"]["content"].as_str().unwrap()),
        5
    );
    assert_eq!(
        v["usage"],
        json!({"prompt_tokens": CHAT_PROMPT, "completion_tokens": 5, "total_tokens": CHAT_PROMPT + 5,
               "prompt_tokens_details": {"cached_tokens": 0}})
    );
    // max_completion_tokens wins over max_tokens; no limit means default_max_tokens (16).
    let body = json!({"model": "tiny-llama", "messages": messages(), "max_tokens": 5, "max_completion_tokens": 2});
    assert_eq!(
        sim.post_json("/v1/chat/completions", &body).await.1["usage"]["completion_tokens"],
        2
    );
    let body = json!({"model": "tiny-llama", "messages": messages()});
    assert_eq!(
        sim.post_json("/v1/chat/completions", &body).await.1["usage"]["completion_tokens"],
        16
    );
}

#[tokio::test]
async fn completion_whole_counts() {
    let sim = start(config()).await;
    for (prompt, expected) in [
        (json!("one two three"), 4),
        (json!(["one two", "three"]), 5),
        (json!([7, 8, 9, 10]), 4),
    ] {
        let body = json!({"model": "tiny-llama", "prompt": prompt, "max_tokens": 3});
        let (status, v) = sim.post_json("/v1/completions", &body).await;
        assert_eq!(status, 200);
        assert!(v["id"].as_str().unwrap().starts_with("cmpl-"));
        assert_eq!(v["object"], "text_completion");
        assert_eq!(count_text(v["choices"][0]["text"].as_str().unwrap()), 3);
        assert_eq!(v["usage"]["prompt_tokens"], expected);
        assert_eq!(v["usage"]["total_tokens"], expected + 3);
    }
}

#[tokio::test]
async fn chat_stream_without_usage() {
    let sim = start(config()).await;
    let body =
        json!({"model": "tiny-llama", "messages": messages(), "max_tokens": 4, "stream": true});
    let (events, done) = sim.stream("/v1/chat/completions", &body).await;
    assert!(done);
    assert_eq!(events.len(), 5);
    assert_eq!(
        events[0]["choices"][0]["delta"],
        json!({"role": "assistant", "content": ""})
    );
    for (i, e) in events.iter().enumerate() {
        assert_eq!(e["object"], "chat.completion.chunk");
        assert!(e.get("usage").unwrap().is_null());
        let finish = &e["choices"][0]["finish_reason"];
        assert_eq!(
            finish.is_null(),
            i != 4,
            "finish_reason only on the last content chunk"
        );
    }
    assert_eq!(events[4]["choices"][0]["finish_reason"], "length");
    let text: String = events.iter().map(chunk_text).collect();
    assert_eq!(count_text(&text), 4);
    assert_eq!(content_chunks(&events), 4);
}

#[tokio::test]
async fn include_usage_sends_one_usage_chunk_last() {
    let sim = start(config()).await;
    let body = json!({"model": "tiny-llama", "messages": messages(), "max_tokens": 3, "stream": true,
                      "stream_options": {"include_usage": true}});
    let (events, done) = sim.stream("/v1/chat/completions", &body).await;
    assert!(done);
    let usage_chunks: Vec<usize> = (0..events.len())
        .filter(|&i| !events[i]["usage"].is_null())
        .collect();
    assert_eq!(usage_chunks, vec![events.len() - 1]);
    let last = events.last().unwrap();
    assert_eq!(last["choices"], json!([]));
    assert_eq!(last["usage"]["prompt_tokens"], CHAT_PROMPT);
    assert_eq!(last["usage"]["completion_tokens"], 3);
    assert_eq!(last["usage"]["prompt_tokens_details"]["cached_tokens"], 0);
    assert_eq!(
        events[events.len() - 2]["choices"][0]["finish_reason"],
        "length"
    );
}

#[tokio::test]
async fn continuous_usage_counts_as_it_goes() {
    let sim = start(config()).await;
    let body = json!({"model": "tiny-llama", "prompt": "a b c", "max_tokens": 3, "stream": true,
                      "stream_options": {"include_usage": true, "continuous_usage_stats": true}});
    let (events, done) = sim.stream("/v1/completions", &body).await;
    assert!(done);
    // No role chunk for completions: three text chunks, then the usage chunk.
    assert_eq!(events.len(), 4);
    let running: Vec<u64> = events
        .iter()
        .map(|e| e["usage"]["completion_tokens"].as_u64().unwrap())
        .collect();
    assert_eq!(running, vec![1, 2, 3, 3]);
    for e in &events {
        assert_eq!(e["object"], "text_completion");
        assert_eq!(e["usage"]["prompt_tokens"], 4);
        assert_eq!(
            e["usage"]["total_tokens"],
            4 + e["usage"]["completion_tokens"].as_u64().unwrap()
        );
    }
    assert_eq!(events[0]["choices"][0]["logprobs"], Value::Null);
    assert_eq!(events[3]["choices"], json!([]));
}

#[tokio::test]
async fn usage_on_last_chunk_per_request_and_global() {
    let sim = start(config()).await;
    let body = json!({"model": "tiny-llama", "messages": messages(), "max_tokens": 2, "stream": true,
                      "stream_options": {"include_usage": true}, "sim": {"usage_on_last_chunk": true}});
    let check = |events: &[Value]| {
        assert_eq!(events.len(), 3);
        assert!(events.iter().all(|e| e["choices"] != json!([])));
        assert!(events[..2].iter().all(|e| e["usage"].is_null()));
        assert_eq!(events[2]["choices"][0]["finish_reason"], "length");
        assert_eq!(events[2]["usage"]["completion_tokens"], 2);
    };
    let (events, done) = sim.stream("/v1/chat/completions", &body).await;
    assert!(done);
    check(&events);
    let set = sim
        .post("/sim/faults", &json!({"usage_on_last_chunk": true}))
        .await;
    assert_eq!(set.status(), 200);
    let body =
        json!({"model": "tiny-llama", "messages": messages(), "max_tokens": 2, "stream": true});
    check(&sim.stream("/v1/chat/completions", &body).await.0);
}

#[tokio::test]
async fn prefix_cache_hits_and_isolation() {
    let sim = start(config()).await;
    sim.post(
        "/v1/load_lora_adapter",
        &json!({"lora_name": "ad", "lora_path": "/ad"}),
    )
    .await;
    let words: Vec<String> = (0..40).map(|i| format!("x{i}")).collect();
    let prompt = words.join(" "); // 41 tokens with BOS: two full blocks of 16 can be cached.
    let cached = |model: &str, salt: Option<&str>| {
        let mut body = json!({"model": model, "prompt": prompt, "max_tokens": 1});
        if let Some(salt) = salt {
            body["cache_salt"] = json!(salt);
        }
        let sim = &sim;
        async move {
            sim.post_json("/v1/completions", &body).await.1["usage"]["prompt_tokens_details"]
                ["cached_tokens"]
                .clone()
        }
    };
    assert_eq!(cached("tiny-llama", Some("t1")).await, 0);
    assert_eq!(cached("tiny-llama", Some("t1")).await, 32);
    assert_eq!(cached("tiny-llama", Some("t2")).await, 0);
    assert_eq!(cached("tiny-llama", None).await, 0);
    assert_eq!(cached("ad", Some("t1")).await, 0);
    assert_eq!(cached("ad", Some("t1")).await, 32);
    // Streaming reports it too, and the ledger records it.
    let body = json!({"model": "tiny-llama", "prompt": prompt, "max_tokens": 1, "cache_salt": "t1", "stream": true,
                      "stream_options": {"include_usage": true}});
    let (events, _) = sim.stream("/v1/completions", &body).await;
    assert_eq!(
        events.last().unwrap()["usage"]["prompt_tokens_details"]["cached_tokens"],
        32
    );
    let ledger = sim.ledger().await;
    assert_eq!(ledger.last().unwrap().cached_tokens, 32);
    assert_eq!(ledger[4].adapter.as_deref(), Some("ad"));
}

#[tokio::test]
async fn lora_apis_and_models() {
    let sim = start(config()).await;
    let load = sim
        .post(
            "/v1/load_lora_adapter",
            &json!({"lora_name": "sql", "lora_path": "/p/sql"}),
        )
        .await;
    assert_eq!(load.status(), 200);
    assert_eq!(
        load.text().await.unwrap(),
        "Success: LoRA adapter 'sql' added successfully."
    );
    let again = sim
        .post(
            "/v1/load_lora_adapter",
            &json!({"lora_name": "sql", "lora_path": "/p/sql"}),
        )
        .await;
    assert_eq!(again.status(), 400);
    let dyn_load = sim
        .post_json(
            "/v1/loras",
            &json!({"lora_name": "bot", "source": {"uri": "s3://b/bot"}}),
        )
        .await;
    assert_eq!(
        dyn_load,
        (200, json!({"status": "success", "lora_name": "bot"}))
    );

    let models: Value = sim.get("/v1/models").await.json().await.unwrap();
    assert_eq!(models["object"], "list");
    let data = models["data"].as_array().unwrap();
    assert_eq!(data.len(), 3);
    assert_eq!(data[0]["id"], "tiny-llama");
    assert_eq!(data[0]["owned_by"], "vllm");
    assert_eq!(data[0]["root"], "tiny-llama");
    assert!(data[0]["parent"].is_null());
    assert_eq!(
        (&data[1]["id"], &data[1]["root"], &data[1]["parent"]),
        (&json!("sql"), &json!("/p/sql"), &json!("tiny-llama"))
    );
    assert_eq!(data[2]["root"], "s3://b/bot");
    assert!(data
        .iter()
        .all(|m| m["object"] == "model" && m["created"].is_u64()));

    let body = json!({"model": "bot", "messages": messages(), "max_tokens": 1});
    assert_eq!(sim.post_json("/v1/chat/completions", &body).await.0, 200);
    let unload = sim
        .post("/v1/unload_lora_adapter", &json!({"lora_name": "sql"}))
        .await;
    assert_eq!(unload.status(), 200);
    assert_eq!(
        unload.text().await.unwrap(),
        "Success: LoRA adapter 'sql' removed successfully."
    );
    assert_eq!(
        sim.post("/v1/unload_lora_adapter", &json!({"lora_name": "sql"}))
            .await
            .status(),
        404
    );
    let delete = sim
        .client
        .delete(format!("{}/v1/loras/bot", sim.url))
        .send()
        .await
        .unwrap();
    assert_eq!(delete.status(), 200);
    let delete = sim
        .client
        .delete(format!("{}/v1/loras/bot", sim.url))
        .send()
        .await
        .unwrap();
    assert_eq!(delete.status(), 404);
    let (status, err) = sim.post_json("/v1/chat/completions", &body).await;
    assert_eq!(status, 404);
    assert_eq!(
        err,
        json!({"error": {"message": "The model `bot` does not exist.", "type": "NotFoundError", "param": null, "code": 404}})
    );
}

#[tokio::test]
async fn request_errors_in_both_shapes() {
    let sim = start(config()).await;
    let (status, err) = sim
        .post_json(
            "/v1/chat/completions",
            &json!({"model": "nope", "messages": [], "sim": {"flat_errors": true}}),
        )
        .await;
    assert_eq!(status, 404);
    assert_eq!(
        err,
        json!({"message": "The model `nope` does not exist.", "type": "NotFoundError", "code": 404})
    );
    let (status, err) = sim
        .post_json("/v1/chat/completions", &json!({"model": "tiny-llama"}))
        .await;
    assert_eq!(status, 400);
    assert_eq!(err["error"]["type"], "BadRequestError");
    assert_eq!(err["error"]["code"], 400);
    let (status, err) = sim
        .post_json(
            "/v1/completions",
            &json!({"model": "tiny-llama", "prompt": 3}),
        )
        .await;
    assert_eq!(
        (status, &err["error"]["type"]),
        (400, &json!("BadRequestError"))
    );
    let raw = sim
        .client
        .post(format!("{}/v1/completions", sim.url))
        .body("{not json")
        .send()
        .await
        .unwrap();
    assert_eq!(raw.status(), 400);
    assert_eq!(
        raw.json::<Value>().await.unwrap()["error"]["type"],
        "BadRequestError"
    );
    let statuses: Vec<u16> = sim.ledger().await.iter().map(|e| e.status).collect();
    assert_eq!(statuses, vec![404, 400, 400, 400]);
}

#[tokio::test]
async fn ledger_records_request_ids_and_clears() {
    let sim = start(config()).await;
    assert_eq!(sim.get("/health").await.status(), 200);
    for (id, stream) in [("req-1", false), ("req-2", true)] {
        let body = json!({"model": "tiny-llama", "prompt": "hi there", "max_tokens": 2, "stream": stream, "cache_salt": "s"});
        let response = sim
            .client
            .post(format!("{}/v1/completions", sim.url))
            .header("x-request-id", id)
            .json(&body)
            .send()
            .await
            .unwrap();
        response.text().await.unwrap();
    }
    let ledger = sim.ledger().await;
    assert_eq!(ledger.len(), 2);
    assert_eq!(ledger[0].request_id.as_deref(), Some("req-1"));
    assert_eq!(ledger[1].request_id.as_deref(), Some("req-2"));
    for entry in &ledger {
        assert_eq!(
            (entry.prompt_tokens, entry.completion_tokens, entry.status),
            (3, 2, 200)
        );
        assert_eq!(entry.cache_salt.as_deref(), Some("s"));
        assert!(!entry.cancelled && !entry.died);
    }
    assert!(ledger[1].stream && !ledger[0].stream);
    assert_eq!(
        sim.client
            .delete(format!("{}/sim/ledger", sim.url))
            .send()
            .await
            .unwrap()
            .status(),
        204
    );
    assert!(sim.ledger().await.is_empty());
}
