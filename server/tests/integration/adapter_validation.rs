//! Upload validation (issue 14) with adapters the tests generate: a fitting adapter is accepted
//! (`stopped`), and each way an upload can be wrong is `rejected` with a reason that names the
//! fault, through the same service the API and the portal use. The management API's pickle
//! refusal by file name, and size limits, are checked over HTTP.

#![allow(
    clippy::disallowed_methods,
    reason = "the concurrent uploads run until the test has their answers"
)]
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests may fail loudly

use crate::common;

use common::lifecycle::{self, base_config, valid_adapter, LORA_BASE};
use common::TestApp;
use futures::StreamExt;
use sqlx::PgPool;
use tokenfactory::adapter_check::safetensors::Dtype;
use tokenfactory::fleet::local_sim::model_id;
use tokenfactory::lifecycle::{
    fixture, Actor, AdapterStore, Lifecycle, LifecycleError, UploadLimits,
};
use uuid::Uuid;

struct Bench {
    service: Lifecycle,
    tenant: Uuid,
    _dir: tempfile::TempDir,
}

async fn bench(pool: PgPool, limits: UploadLimits) -> Bench {
    lifecycle::offer(&pool, LORA_BASE, 1, true).await;
    let tenant = tf_core::accounts::create_tenant(&pool, "acme", "Acme")
        .await
        .unwrap()
        .id;
    let dir = tempfile::tempdir().unwrap();
    Bench {
        service: Lifecycle::new(pool, AdapterStore::local(dir.path()).unwrap(), limits),
        tenant,
        _dir: dir,
    }
}

fn actor() -> Actor {
    Actor {
        user_id: None,
        label: "test".into(),
    }
}

impl Bench {
    /// Uploads and returns (state, reason).
    async fn verdict(&self, name: &str, config: &[u8], weights: Vec<u8>) -> (String, String) {
        let v = self
            .service
            .upload_bytes(
                self.tenant,
                name,
                LORA_BASE,
                config.to_vec(),
                weights,
                &actor(),
            )
            .await
            .unwrap();
        (v.state, v.reason.unwrap_or_default())
    }

    async fn rejected(&self, name: &str, config: &[u8], weights: Vec<u8>, needle: &str) {
        let (state, reason) = self.verdict(name, config, weights).await;
        assert_eq!(state, "rejected", "{name}: {reason}");
        assert!(
            reason.contains(needle),
            "{name}: {reason:?} should mention {needle:?}"
        );
    }
}

fn modules() -> [&'static str; 2] {
    ["q_proj", "v_proj"]
}

/// A safetensors file with a hand-written header over `data` zero bytes.
fn raw(header: &str, data: usize) -> Vec<u8> {
    let mut out = (header.len() as u64).to_le_bytes().to_vec();
    out.extend_from_slice(header.as_bytes());
    out.resize(out.len() + data, 0);
    out
}

#[sqlx::test(migrator = "tf_core::db::MIGRATOR")]
async fn generated_adapters_are_judged_with_precise_reasons(pool: PgPool) {
    let b = bench(pool, UploadLimits::default()).await;
    let base = base_config();
    let config = fixture::config(&model_id(LORA_BASE), 8, &modules());

    // Right shapes: accepted, ready to start.
    let (good_config, good) = valid_adapter(LORA_BASE);
    assert_eq!(
        b.verdict("good", &good_config, good.clone()).await.0,
        "stopped"
    );

    // Wrong rank: 128 is above the template's max-lora-rank 64.
    let c128 = fixture::config(&model_id(LORA_BASE), 128, &modules());
    let w128 = fixture::weights(&fixture::tensors(&base, 128, &modules(), Dtype::BF16));
    b.rejected("rank", c128.as_bytes(), w128, "maximum LoRA rank 64")
        .await;

    // Wrong base: made for another model.
    let other = fixture::config("meta-llama/Llama-3.1-70B", 8, &modules());
    b.rejected("base", other.as_bytes(), good.clone(), "not for")
        .await;

    // Wrong dtype: integer weights.
    let ints = fixture::weights(&fixture::tensors(&base, 8, &modules(), Dtype::I8));
    b.rejected("dtype", config.as_bytes(), ints, "dtype I8")
        .await;

    // Wrong shapes: tensors of a bigger base (hidden 128).
    let mut big = base;
    big.hidden_size = 128;
    let wrong = fixture::weights(&fixture::tensors(&big, 8, &modules(), Dtype::BF16));
    b.rejected("shape", config.as_bytes(), wrong, "weights do not fit")
        .await;

    // Truncated file: the data ends early.
    let mut cut = good.clone();
    cut.truncate(cut.len() - 10);
    b.rejected(
        "truncated",
        config.as_bytes(),
        cut,
        "not a valid safetensors",
    )
    .await;

    // Overlapping offsets.
    let a = fixture::tensor_name(0, "q_proj", 'A');
    let bb = fixture::tensor_name(0, "q_proj", 'B');
    let overlap = format!(
        r#"{{"{a}":{{"dtype":"BF16","shape":[8,64],"data_offsets":[0,1024]}},"{bb}":{{"dtype":"BF16","shape":[64,8],"data_offsets":[512,1536]}}}}"#
    );
    b.rejected(
        "overlap",
        config.as_bytes(),
        raw(&overlap, 1536),
        "gap or overlap",
    )
    .await;

    // Offsets past the end of the data.
    let past = format!(r#"{{"{a}":{{"dtype":"BF16","shape":[8,64],"data_offsets":[0,1024]}}}}"#);
    b.rejected(
        "out-of-range",
        config.as_bytes(),
        raw(&past, 100),
        "data buffer",
    )
    .await;

    // A header length far beyond the file (and beyond any accepted header).
    let mut huge = u64::MAX.to_le_bytes().to_vec();
    huge.extend_from_slice(b"{}");
    b.rejected("huge-header", config.as_bytes(), huge, "header of")
        .await;
    let mut long = (1_000_000u64).to_le_bytes().to_vec();
    long.extend_from_slice(b"{}");
    b.rejected("long-header", config.as_bytes(), long, "runs past the end")
        .await;

    // A pickle, by content (protocol 2 opcode) and as a torch.save zip.
    let pickle = b"\x80\x02}q\x00(X\x01\x00\x00\x00aq\x01K\x01u.".to_vec();
    b.rejected("pickle", config.as_bytes(), pickle, "pickle")
        .await;
    let zip = b"PK\x03\x04\x14\x00\x00\x00\x08\x00archive/data.pkl".to_vec();
    b.rejected("torch-zip", config.as_bytes(), zip, "pickle")
        .await;

    // Wrong target module: lm_head is not a projection LoRA is served on.
    let lm = fixture::config(&model_id(LORA_BASE), 8, &["q_proj", "lm_head"]);
    b.rejected(
        "module",
        lm.as_bytes(),
        good.clone(),
        "target module lm_head",
    )
    .await;

    // A tensor for a module the config does not target.
    let only_q = fixture::config(&model_id(LORA_BASE), 8, &["q_proj"]);
    b.rejected("untargeted", only_q.as_bytes(), good.clone(), "v_proj")
        .await;

    // DoRA and a broken config.
    let dora = r#"{"peft_type":"LORA","r":8,"target_modules":["q_proj"],"use_dora":true}"#;
    b.rejected("dora", dora.as_bytes(), good.clone(), "DoRA")
        .await;
    b.rejected("garbage", b"not json", good, "adapter_config.json")
        .await;
}

#[sqlx::test(migrator = "tf_core::db::MIGRATOR")]
async fn a_new_upload_of_a_name_is_a_new_version_with_a_new_engine_name(pool: PgPool) {
    let b = bench(pool, UploadLimits::default()).await;
    let (config, weights) = valid_adapter(LORA_BASE);
    let who = actor();
    let up = |w: Vec<u8>| {
        b.service
            .upload_bytes(b.tenant, "bot", LORA_BASE, config.clone(), w, &who)
    };
    let v1 = up(weights.clone()).await.unwrap();
    let v2 = up(weights.clone()).await.unwrap();
    assert_eq!((v1.version, v2.version), (1, 2));
    assert_ne!(v1.engine_name, v2.engine_name);
    assert_eq!(v2.state, "stopped");
    // A running adapter must be stopped before a new version replaces it.
    let act = actor();
    b.service
        .command(
            b.tenant,
            "bot",
            tokenfactory::lifecycle::transitions::Command::Start,
            &act,
        )
        .await
        .unwrap();
    let refused = up(weights).await.unwrap_err();
    assert!(matches!(refused, LifecycleError::Conflict(_)), "{refused}");
}

#[sqlx::test(migrator = "tf_core::db::MIGRATOR")]
async fn size_limits_and_pickle_names_are_refused_over_the_api(pool: PgPool) {
    lifecycle::offer(&pool, LORA_BASE, 1, true).await;
    let dir = tempfile::tempdir().unwrap();
    let app = TestApp::builder(pool)
        .lifecycle(tokenfactory::lifecycle::LifecycleOptions {
            adapter_dir: dir.path().to_path_buf(),
            limits: UploadLimits {
                config_bytes: 4096,
                weights_bytes: 64 << 10,
            },
            ..Default::default()
        })
        .start()
        .await;
    let acme = app.tenant("acme").await;
    let (config, weights) = valid_adapter(LORA_BASE);
    let (status, body) = app
        .upload_named(
            &acme,
            "pt",
            LORA_BASE,
            &config,
            &weights,
            "adapter_model.bin",
        )
        .await;
    assert_eq!(status, 201, "{body}");
    assert_eq!(body["state"], "rejected");
    assert!(
        body["reason"].as_str().unwrap().contains("pickle"),
        "{body}"
    );

    let too_big = vec![0u8; 65 << 10];
    let (status, body) = app.upload(&acme, "big", LORA_BASE, &config, &too_big).await;
    assert_eq!(status, 413, "{body}");
    assert_eq!(body["error"]["code"], "request_too_large");
    assert_eq!(app.state_of(&acme, "big").await, "rejected");
    // Nothing of it is left on disk.
    let left: Vec<_> = walk(dir.path())
        .into_iter()
        .filter(|p| p.ends_with("adapter_model.safetensors"))
        .collect();
    assert!(left.is_empty(), "{left:?}");

    let (status, body) = app
        .upload(&acme, "../../etc", LORA_BASE, &config, &weights)
        .await;
    assert_eq!(status, 400, "{body}");
    let (status, body) = app
        .upload(&acme, "x", "no-such-base", &config, &weights)
        .await;
    assert_eq!(status, 400, "{body}");
}

fn walk(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap().flatten() {
        let p = entry.path();
        if p.is_dir() {
            out.extend(walk(&p));
        } else {
            out.push(p);
        }
    }
    out
}

/// A safetensors file starts with its header's length, whose first byte can be anything: an
/// adapter whose length starts with each of the 256 byte values (the header padded with spaces,
/// which the format allows) is accepted, including 0x80 followed by 0x02..0x05, the shape of a
/// pickle's PROTO opcode.
#[sqlx::test(migrator = "tf_core::db::MIGRATOR")]
async fn a_valid_adapter_is_accepted_whatever_its_first_byte(pool: PgPool) {
    let b = bench(pool, UploadLimits::default()).await;
    let (config, good) = valid_adapter(LORA_BASE);
    let n = u64::from_le_bytes(good[..8].try_into().unwrap());
    let header = &good[8..8 + n as usize];
    let data = &good[8 + n as usize..];
    for first in 0u64..=255 {
        // The smallest padded length starting with `first`; for 0x80 also with a pickle
        // protocol byte after it.
        let len = (n..)
            .find(|l| l & 0xFF == first && (first != 0x80 || (2..=5).contains(&((l >> 8) & 0xFF))))
            .unwrap();
        let mut weights = len.to_le_bytes().to_vec();
        weights.extend_from_slice(header);
        weights.resize(8 + len as usize, b' ');
        weights.extend_from_slice(data);
        assert_eq!(weights[0] as u64, first);
        if first == 0x80 {
            assert!((2..=5).contains(&weights[1]), "{:#x}", weights[1]);
        }
        let (state, reason) = b
            .verdict(&format!("first-{first:02x}"), &config, weights)
            .await;
        assert_eq!(state, "stopped", "first byte {first:#04x}: {reason}");
    }
}

/// Every rejection names the file (or field) at fault: a form without `adapter_config.json`
/// leaves the adapter `rejected` with a reason naming that file.
#[sqlx::test(migrator = "tf_core::db::MIGRATOR")]
async fn a_missing_file_is_named_in_the_reason(pool: PgPool) {
    lifecycle::offer(&pool, LORA_BASE, 1, true).await;
    let app = TestApp::builder(pool).start().await;
    let acme = app.tenant("acme").await;
    let (_, weights) = valid_adapter(LORA_BASE);
    let (ct, body) = lifecycle::multipart(
        &[("name", "no-config"), ("base", LORA_BASE)],
        &[(
            "adapter_model.safetensors",
            "adapter_model.safetensors",
            &weights,
        )],
    );
    let r = reqwest::Client::new()
        .post(app.url("/api/v1/adapters"))
        .bearer_auth(&acme.key)
        .header("content-type", ct)
        .body(body)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 400);
    let (status, body) = app.manage(&acme, "no-config", "get").await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["state"], "rejected");
    let reason = body["reason"].as_str().unwrap();
    assert!(
        reason.contains("adapter_config.json is missing"),
        "{reason}"
    );

    // The validator's own kinds name their file too.
    let b = Bench {
        service: app.app.lifecycle.clone(),
        tenant: acme.id,
        _dir: tempfile::tempdir().unwrap(),
    };
    let (config, _) = valid_adapter(LORA_BASE);
    b.rejected(
        "short",
        &config,
        vec![1, 2, 3],
        "adapter_model.safetensors is not a valid safetensors file",
    )
    .await;
    b.rejected(
        "bad-config",
        br#"{"r":0,"target_modules":["q_proj"]}"#,
        weights,
        "adapter_config.json: r",
    )
    .await;
}

/// Of four uploads of one new name at once, one wins (201) and the others get 409, never 500.
/// Each body stops after the config file has begun (so each request has claimed the name, or
/// tried to) and goes on only once the losers have been answered.
#[sqlx::test(migrator = "tf_core::db::MIGRATOR")]
async fn concurrent_uploads_of_one_new_name_give_one_201_and_409s(pool: PgPool) {
    lifecycle::offer(&pool, LORA_BASE, 1, true).await;
    let app = TestApp::builder(pool).start().await;
    let acme = app.tenant("acme").await;
    let (config, weights) = valid_adapter(LORA_BASE);
    let (ct, body) = lifecycle::multipart(
        &[("name", "twin"), ("base", LORA_BASE)],
        &[
            ("adapter_config.json", "adapter_config.json", &config),
            (
                "adapter_model.safetensors",
                "adapter_model.safetensors",
                &weights,
            ),
        ],
    );
    // Up to the middle of the config file: the server has opened the upload by then.
    let split = body
        .windows(config.len())
        .position(|w| w == &config[..])
        .unwrap()
        + config.len() / 2;
    let (go, _) = tokio::sync::watch::channel(false);
    let (done, mut answers) = tokio::sync::mpsc::unbounded_channel();
    for _ in 0..4 {
        let (first, rest) = (body[..split].to_vec(), body[split..].to_vec());
        let mut go = go.subscribe();
        let stream = futures::stream::iter([Ok::<_, std::io::Error>(first)]).chain(
            futures::stream::once(async move {
                let _ = go.wait_for(|g| *g).await;
                Ok(rest)
            }),
        );
        let request = reqwest::Client::new()
            .post(app.url("/api/v1/adapters"))
            .bearer_auth(&acme.key)
            .header("content-type", ct.clone())
            .body(reqwest::Body::wrap_stream(stream));
        let done = done.clone();
        tokio::spawn(async move {
            let answer = match request.send().await {
                Ok(r) => (
                    r.status().as_u16(),
                    r.json::<serde_json::Value>().await.unwrap_or_default(),
                ),
                Err(e) => (0, serde_json::json!(e.to_string())),
            };
            let _ = done.send(answer);
        });
    }
    let mut seen = Vec::new();
    for _ in 0..3 {
        let answer = tokio::time::timeout(std::time::Duration::from_secs(20), answers.recv())
            .await
            .expect("three uploads answered while the fourth still sends")
            .unwrap();
        seen.push(answer);
    }
    go.send_replace(true);
    seen.push(
        tokio::time::timeout(std::time::Duration::from_secs(20), answers.recv())
            .await
            .unwrap()
            .unwrap(),
    );
    let statuses: Vec<u16> = seen.iter().map(|(s, _)| *s).collect();
    assert_eq!(statuses, [409, 409, 409, 201], "{seen:?}");
    for (_, body) in &seen[..3] {
        assert_eq!(body["error"]["code"], "conflict", "{body}");
    }
    assert_eq!(seen[3].1["state"], "stopped", "{:?}", seen[3]);
    assert_eq!(seen[3].1["version"], 1);
}

/// An adapter may not take a public model's name (it would shadow the base for its tenant).
#[sqlx::test(migrator = "tf_core::db::MIGRATOR")]
async fn an_adapter_may_not_take_a_base_models_name(pool: PgPool) {
    lifecycle::offer(&pool, LORA_BASE, 1, true).await;
    lifecycle::offer(&pool, "quiet-base", 1, false).await;
    let app = TestApp::builder(pool).start().await;
    let acme = app.tenant("acme").await;
    let (config, weights) = valid_adapter(LORA_BASE);
    for name in [LORA_BASE, "quiet-base", common::BASE] {
        let (status, body) = app.upload(&acme, name, LORA_BASE, &config, &weights).await;
        assert_eq!(status, 409, "{name}: {body}");
        assert_eq!(body["error"]["code"], "name_taken");
        assert!(
            body["error"]["message"]
                .as_str()
                .unwrap()
                .contains("public model"),
            "{body}"
        );
        assert_eq!(app.state_of(&acme, name).await, "absent");
    }
    let (status, body) = app
        .upload(&acme, "my-own", LORA_BASE, &config, &weights)
        .await;
    assert_eq!(status, 201, "{body}");
}
