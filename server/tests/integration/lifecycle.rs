//! Model lifecycle end to end (issue 14): upload through `/api/v1`, validation, start on every
//! replica of the base through the controller and the `local-sim` backend, stop, delete; the
//! resolution table following (404 when stopped or deleted, 503 with `retry-after` while
//! starting) on every gateway replica; another tenant's names answering 404.

#![allow(
    clippy::disallowed_methods,
    reason = "the test reads a stream on a task of its own; it ends before the test does"
)]
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests may fail loudly

use crate::common;

use std::time::{Duration, Instant};

use common::lifecycle::{self, valid_adapter, LORA_BASE};
use common::{eventually, TestApp};
use sqlx::PgPool;
use tf_engine_sim::SimConfig;

const SETTLE: Duration = Duration::from_secs(10);

#[sqlx::test(migrator = "tf_core::db::MIGRATOR")]
async fn upload_start_serve_stop_delete_through_the_api(pool: PgPool) {
    let h = lifecycle::start(pool.clone(), SimConfig::default()).await;
    let app = &h.app;
    let acme = app.tenant("acme").await;
    let (config, weights) = valid_adapter(LORA_BASE);

    let (status, body) = app
        .upload(&acme, "helper", LORA_BASE, &config, &weights)
        .await;
    assert_eq!(status, 201, "{body}");
    assert_eq!(body["state"], "stopped", "{body}");
    assert_eq!(body["version"], 1);
    assert_eq!(body["validation"]["rank"], 8);
    let engine_name = body["engine_name"].as_str().unwrap().to_owned();
    assert!(engine_name.ends_with("--v1"), "{engine_name}");
    // Uploaded but not started: not routable.
    assert_eq!(app.ask(&acme, "helper").await.0, 404);

    let (status, body) = app.manage(&acme, "helper", "start").await;
    assert_eq!(status, 202, "{body}");
    assert!(
        ["starting", "ready"].contains(&body["state"].as_str().unwrap()),
        "{body}"
    );
    eventually(SETTLE, "the adapter ready", || async {
        app.state_of(&acme, "helper").await == "ready"
    })
    .await;
    // Loaded on every replica of the base, through the engines' LoRA endpoints.
    let replicas = h.fleet.replicas(&format!("local-sim/{LORA_BASE}")).await;
    assert_eq!(replicas.len(), 2);
    eventually(SETTLE, "200 from the adapter", || async {
        app.ask(&acme, "helper").await.0 == 200
    })
    .await;
    // Round-robin over two replicas: four calls reach both, and each serves the adapter.
    for _ in 0..4 {
        let (status, _, body) = app.ask(&acme, "helper").await;
        assert_eq!(status, 200, "{body}");
    }
    for r in &replicas {
        assert!(
            r.sim
                .ledger()
                .iter()
                .any(|e| e.adapter.as_deref() == Some(engine_name.as_str())),
            "replica {} served the adapter",
            r.addr
        );
    }

    let (status, body) = app.manage(&acme, "helper", "stop").await;
    assert_eq!(status, 200, "{body}");
    let stopped_at = Instant::now();
    eventually(Duration::from_secs(1), "404 after stop", || async {
        app.ask(&acme, "helper").await.0 == 404
    })
    .await;
    assert!(stopped_at.elapsed() < Duration::from_secs(1));
    eventually(SETTLE, "stopped", || async {
        app.state_of(&acme, "helper").await == "stopped"
    })
    .await;
    eventually(SETTLE, "unloaded from every replica", || async {
        let mut loaded = false;
        for r in &replicas {
            let models: serde_json::Value = reqwest::get(format!("http://{}/v1/models", r.addr))
                .await
                .unwrap()
                .json()
                .await
                .unwrap();
            loaded |= models["data"]
                .as_array()
                .unwrap()
                .iter()
                .any(|m| m["id"] == engine_name.as_str());
        }
        !loaded
    })
    .await;
    // The base itself kept serving.
    assert_eq!(app.ask(&acme, LORA_BASE).await.0, 200);

    // Started again, then deleted while running.
    app.manage(&acme, "helper", "start").await;
    eventually(SETTLE, "ready again", || async {
        app.state_of(&acme, "helper").await == "ready"
    })
    .await;
    let (_, detail) = app.manage(&acme, "helper", "get").await;
    let id = detail["id"].as_str().unwrap().to_owned();
    let history: Vec<&str> = detail["history"]
        .as_array()
        .unwrap()
        .iter()
        .map(|h| h["to"].as_str().unwrap())
        .collect();
    assert_eq!(
        history,
        [
            "uploading",
            "validating",
            "stopped",
            "starting",
            "ready",
            "stopping",
            "stopped",
            "starting",
            "ready"
        ]
    );
    let folder = h.dir.path().join(id.replace('-', ""));
    assert!(folder.join("v1/adapter_model.safetensors").exists());

    let (status, body) = app.manage(&acme, "helper", "delete").await;
    assert_eq!(status, 200, "{body}");
    eventually(Duration::from_secs(1), "404 after delete", || async {
        app.ask(&acme, "helper").await.0 == 404
    })
    .await;
    eventually(SETTLE, "the adapter gone", || async {
        app.manage(&acme, "helper", "get").await.0 == 404
    })
    .await;
    assert!(!folder.exists(), "its files are removed");
    let kept: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM lifecycle_history WHERE entity_id = $1::uuid AND to_state = 'deleted'",
    )
    .bind(&id)
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(kept, 1, "the history outlives the adapter");
    // The name can be used again: a fresh adapter, version 1.
    let (status, body) = app
        .upload(&acme, "helper", LORA_BASE, &config, &weights)
        .await;
    assert_eq!((status, body["version"].as_i64()), (201, Some(1)), "{body}");
}

#[sqlx::test(migrator = "tf_core::db::MIGRATOR")]
async fn another_tenants_model_answers_404_everywhere(pool: PgPool) {
    let h = lifecycle::start(pool, SimConfig::default()).await;
    let app = &h.app;
    let (acme, globex) = (app.tenant("acme").await, app.tenant("globex").await);
    let (config, weights) = valid_adapter(LORA_BASE);
    assert_eq!(
        app.upload(&acme, "secret-bot", LORA_BASE, &config, &weights)
            .await
            .0,
        201
    );
    app.manage(&acme, "secret-bot", "start").await;
    eventually(SETTLE, "ready", || async {
        app.state_of(&acme, "secret-bot").await == "ready"
    })
    .await;
    for verb in ["get", "start", "stop", "delete"] {
        let (status, body) = app.manage(&globex, "secret-bot", verb).await;
        assert_eq!(status, 404, "{verb}: {body}");
        assert_eq!(body["error"]["code"], "model_not_found", "{body}");
        assert_eq!(body["error"]["type"], "invalid_request_error");
    }
    let list = app
        .http
        .get(app.url("/api/v1/adapters"))
        .bearer_auth(&globex.key)
        .send()
        .await
        .unwrap()
        .json::<serde_json::Value>()
        .await
        .unwrap();
    assert_eq!(list["data"].as_array().unwrap().len(), 0);
    assert_eq!(app.ask(&globex, "secret-bot").await.0, 404);
    // Still running for its owner.
    assert_eq!(app.state_of(&acme, "secret-bot").await, "ready");
    assert_eq!(app.ask(&acme, "secret-bot").await.0, 200);
    // Without a key: the OpenAI envelope's 401.
    let r = app
        .http
        .get(app.url("/api/v1/adapters"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 401);
}

#[sqlx::test(migrator = "tf_core::db::MIGRATOR")]
async fn a_starting_model_answers_503_with_retry_after(pool: PgPool) {
    // No controller: a started adapter stays `starting`.
    lifecycle::offer(&pool, LORA_BASE, 1, true).await;
    tf_core::db::lifecycle::set_base_upstream(
        &pool,
        sqlx::query_scalar("SELECT id FROM base_models WHERE name = $1")
            .bind(LORA_BASE)
            .fetch_one(&pool)
            .await
            .unwrap(),
        "http://127.0.0.1:9/v1",
    )
    .await
    .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let app = TestApp::builder(pool)
        .lifecycle(tokenfactory::lifecycle::LifecycleOptions {
            adapter_dir: dir.path().to_path_buf(),
            ..Default::default()
        })
        .start()
        .await;
    let acme = app.tenant("acme").await;
    let (config, weights) = valid_adapter(LORA_BASE);
    app.upload(&acme, "slow", LORA_BASE, &config, &weights)
        .await;
    app.manage(&acme, "slow", "start").await;
    let (status, retry, body) = eventually(SETTLE, "503", || async {
        Some(app.ask(&acme, "slow").await).filter(|r| r.0 == 503)
    })
    .await;
    assert_eq!(status, 503);
    assert_eq!(retry.as_deref(), Some("2"));
    assert_eq!(body["error"]["code"], "model_starting", "{body}");
    assert_eq!(body["error"]["type"], "service_unavailable");
    // Not listed as usable while starting.
    let models: serde_json::Value = app
        .http
        .get(app.url("/v1/models"))
        .bearer_auth(&acme.key)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert!(!models["data"]
        .as_array()
        .unwrap()
        .iter()
        .any(|m| m["id"] == "slow"));
    app.manage(&acme, "slow", "stop").await;
    eventually(Duration::from_secs(1), "404 once stopped", || async {
        app.ask(&acme, "slow").await.0 == 404
    })
    .await;
}

#[sqlx::test(migrator = "tf_core::db::MIGRATOR")]
async fn two_gateway_replicas_see_start_and_stop_within_a_second(pool: PgPool) {
    let h = lifecycle::start(pool.clone(), SimConfig::default()).await;
    let primary = &h.app;
    let replica = TestApp::builder(pool).replica_of(primary).start().await;
    let acme = primary.tenant("acme").await;
    let (config, weights) = valid_adapter(LORA_BASE);
    primary
        .upload(&acme, "twin", LORA_BASE, &config, &weights)
        .await;
    primary.manage(&acme, "twin", "start").await;
    eventually(SETTLE, "ready", || async {
        primary.state_of(&acme, "twin").await == "ready"
    })
    .await;
    let ready_at = Instant::now();
    for app in [primary, &replica] {
        eventually(Duration::from_secs(1), "200 on both replicas", || async {
            app.ask(&acme, "twin").await.0 == 200
        })
        .await;
    }
    assert!(ready_at.elapsed() < Duration::from_secs(1));

    primary.manage(&acme, "twin", "stop").await;
    let stopped_at = Instant::now();
    for app in [primary, &replica] {
        eventually(Duration::from_secs(1), "404 on both replicas", || async {
            app.ask(&acme, "twin").await.0 == 404
        })
        .await;
    }
    assert!(stopped_at.elapsed() < Duration::from_secs(1));
}

/// Prompt estimates on a templated base use its own `tokenizer.json` (the simulated bases ship
/// the simulator's tokenizer as theirs): admission's estimate of a prompt full of punctuation,
/// tabs, a Unicode space and non-Latin text equals the prompt tokens the engine bills.
#[sqlx::test(migrator = "tf_core::db::MIGRATOR")]
async fn prompt_estimates_use_the_bases_tokenizer(pool: PgPool) {
    let h = lifecycle::start(pool.clone(), SimConfig::default()).await;
    let app = &h.app;
    let acme = app.tenant("acme").await;
    eventually(SETTLE, "the base routed with its tokenizer", || async {
        app.app
            .gateway
            .routes
            .snapshot()
            .get(acme.id, LORA_BASE)
            .is_some_and(|r| r.policy.tokenizer.is_some())
    })
    .await;
    common::admin_limits(&pool, &["--key", &acme.key, "--tpm", "100000"]).await;
    let content = "Tabs\tand  spaces,\u{2003}an em space; ünïcödé text, 漢字 かな!";
    let body = serde_json::json!({
        "model": LORA_BASE,
        "messages": [{"role": "system", "content": "Be brief."},
                     {"role": "user", "content": content}],
        "max_tokens": 5,
    });
    let r = app
        .post(&acme.key, "/v1/chat/completions", body)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let remaining: u64 = r.headers()["x-ratelimit-remaining-tokens"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    let v: serde_json::Value = r.json().await.unwrap();
    let engine = v["usage"]["prompt_tokens"].as_u64().unwrap();
    // Admission reserved the estimated prompt plus max_tokens.
    assert_eq!(100_000 - remaining - 5, engine, "estimate = engine's count");
    // By hand: (3 + 2 words) + (3 + 10 words) + 2 for the assistant header.
    assert_eq!(engine, 20);
}
