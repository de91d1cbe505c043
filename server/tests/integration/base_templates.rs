//! Base templates from files (`TF_BASE_TEMPLATES`, issue 14): a directory of YAML and TOML files
//! is upserted into the desired state idempotently, with each base's `config.json` and
//! `tokenizer.json`; the gateway's route table then counts a templated base's prompts with its
//! own tokenizer and falls back to the estimator for a base without one. A bad file stops
//! start-up with a message naming it.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests may fail loudly

use std::path::Path;
use std::time::Duration;

use serde_json::json;
use sqlx::PgPool;
use tokenfactory::engine_policy::PromptEstimator;
use tokenfactory::fleet::templates;
use tokenfactory::gateway::resolve::RouteTable;
use tokenfactory::gateway::upstream::UpstreamOptions;
use uuid::Uuid;

/// Splits words from punctuation (`\w+|[^\w\s]+`), every piece one token, and adds a BOS.
const PUNCT_TOKENIZER: &str = r#"{"version":"1.0","truncation":null,"padding":null,"added_tokens":[],
  "normalizer":null,"pre_tokenizer":{"type":"Whitespace"},
  "post_processor":{"type":"TemplateProcessing",
    "single":[{"SpecialToken":{"id":"<s>","type_id":0}},{"Sequence":{"id":"A","type_id":0}}],
    "pair":[{"SpecialToken":{"id":"<s>","type_id":0}},{"Sequence":{"id":"A","type_id":0}},{"Sequence":{"id":"B","type_id":1}}],
    "special_tokens":{"<s>":{"id":"<s>","ids":[1],"tokens":["<s>"]}}},
  "decoder":null,"model":{"type":"WordLevel","vocab":{"[UNK]":0,"<s>":1},"unk_token":"[UNK]"}}"#;

fn write(dir: &Path, name: &str, text: &str) {
    let path = dir.join(name);
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(path, text).unwrap();
}

/// Two bases: a YAML one with files for its config and tokenizer, a TOML one with its config
/// inline and no tokenizer; plus what a mounted ConfigMap holds besides (hidden entries) and a
/// file that is not a template.
fn template_dir() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    write(
        d,
        "tiny-llama.yaml",
        r#"base: tiny-llama
model: tokenfactory/tiny-llama
image: runtime:1
gpus_per_replica: 2
replicas: 1
replicas_max: 3
tensor_parallel_size: 2
quantization: ""
max_loras: 4
max_lora_rank: 16
extra_args: ["--max-cpu-loras", "8"]
env_from_secret: ""
offered: true
config_json: llama/config.json
tokenizer_json: llama/tokenizer.json
"#,
    );
    write(
        d,
        "llama/config.json",
        &json!({"hidden_size": 64, "num_attention_heads": 4, "num_key_value_heads": 2,
                "intermediate_size": 128, "num_hidden_layers": 2})
        .to_string(),
    );
    write(d, "llama/tokenizer.json", PUNCT_TOKENIZER);
    write(
        d,
        "tiny-qwen.toml",
        r#"base = "tiny-qwen"
model = "tokenfactory/tiny-qwen"
offered = true
replicas = 2
quantization = "fp8"
prompt_estimator = "sim-words"
idle_after_secs = 600
allow_dora = true

[config_json]
hidden_size = 32
num_attention_heads = 2
num_key_value_heads = 1
intermediate_size = 64
num_hidden_layers = 1
"#,
    );
    // A ConfigMap volume's own entries, and a file that is not a template.
    write(d, "..data/ignored.yaml", "not: [a template");
    write(d, "README.md", "notes");
    dir
}

#[sqlx::test(migrator = "tf_core::db::MIGRATOR")]
async fn a_directory_of_templates_is_offered_idempotently(pool: PgPool) {
    let dir = template_dir();
    let loaded = templates::load(dir.path()).unwrap();
    assert_eq!(
        loaded.iter().map(|t| t.base.as_str()).collect::<Vec<_>>(),
        ["tiny-llama", "tiny-qwen"]
    );
    assert_eq!(
        templates::apply(&pool, "local-sim", &loaded).await.unwrap(),
        2
    );
    let first = tf_core::db::lifecycle::templated_bases(&pool)
        .await
        .unwrap();
    // Applying the same files again (every start) changes nothing but the timestamps.
    templates::apply(&pool, "local-sim", &templates::load(dir.path()).unwrap())
        .await
        .unwrap();
    let again = tf_core::db::lifecycle::templated_bases(&pool)
        .await
        .unwrap();
    assert_eq!(again.len(), 2);
    for (a, b) in first.iter().zip(&again) {
        assert_eq!((a.id, &a.name, &a.graph), (b.id, &b.name, &b.graph));
        assert_eq!(format!("{:?}", a.template), format!("{:?}", b.template));
    }
    let llama = &again[0];
    let t = &llama.template;
    assert_eq!(llama.name, "tiny-llama");
    assert_eq!(llama.fleet, "local-sim");
    assert_eq!(
        llama.graph,
        tokenfactory::fleet::dynamo_render::graph_name("tiny-llama")
    );
    assert!(llama.offered);
    let unset: templates::TemplateFile =
        toml::from_str("base = \"b\"\nmodel = \"m\"\nconfig_json = \"c.json\"").unwrap();
    assert!(
        !unset.offered,
        "a template that does not say offered is not: its GPUs wait for a started adapter"
    );
    assert_eq!(
        (
            t.gpus_per_replica,
            t.tensor_parallel_size,
            t.replicas_min,
            t.replicas_max
        ),
        (2, 2, 1, 3)
    );
    assert_eq!((t.max_loras, t.max_lora_rank), (4, 16));
    assert_eq!(t.quantization, None, "an empty quantization is none");
    assert_eq!(t.env_from_secret, None);
    assert_eq!(t.extra_args, ["--max-cpu-loras", "8"]);
    assert_eq!(t.config_json["hidden_size"], 64);
    assert_eq!(
        t.tokenizer_json.as_ref().unwrap()["pre_tokenizer"]["type"],
        "Whitespace"
    );
    let qwen = &again[1].template;
    assert_eq!((qwen.replicas_min, qwen.replicas_max), (2, 2));
    assert_eq!(qwen.quantization.as_deref(), Some("fp8"));
    assert_eq!(qwen.idle_after_secs, Some(600));
    assert!(qwen.allow_dora);
    assert_eq!(qwen.config_json["num_hidden_layers"], 1);
    assert!(qwen.tokenizer_json.is_none());
}

#[sqlx::test(migrator = "tf_core::db::MIGRATOR")]
async fn prompts_are_counted_by_the_bases_own_tokenizer(pool: PgPool) {
    let dir = template_dir();
    templates::apply(&pool, "local-sim", &templates::load(dir.path()).unwrap())
        .await
        .unwrap();
    // The controller would set the URL once the graph is up; the table only routes such bases.
    sqlx::query("UPDATE base_models SET upstream_url = 'http://127.0.0.1:9/v1'")
        .execute(&pool)
        .await
        .unwrap();
    let table = RouteTable::new(
        pool.clone(),
        UpstreamOptions {
            connect_timeout: Duration::from_secs(1),
            first_byte_timeout: Duration::from_secs(1),
            chunk_timeout: Duration::from_secs(1),
            pool_idle_per_host: 1,
        },
    );
    table.reload().await.unwrap();
    let snapshot = table.snapshot();
    let llama = snapshot.get(Uuid::nil(), "tiny-llama").unwrap();
    let tokenizer = llama
        .policy
        .tokenizer
        .clone()
        .expect("the base's tokenizer");
    // By hand: `<s>` `Hello` `,` `world` `!` (words would say 2 + BOS).
    assert_eq!(
        tokenizer.completion_prompt_tokens(&json!("Hello, world!")),
        5
    );
    // 2 markers + `user` + 4 pieces, then a marker + `assistant`.
    assert_eq!(
        tokenizer.chat_prompt_tokens(&json!([{"role": "user", "content": "Hello, world!"}])),
        9
    );
    // A base without a tokenizer.json falls back to its estimator.
    let qwen = snapshot.get(Uuid::nil(), "tiny-qwen").unwrap();
    assert!(qwen.policy.tokenizer.is_none());
    assert_eq!(qwen.policy.estimator, PromptEstimator::SimWords);

    // Parsed once per template version: a rebuild reuses it; a changed template reloads it.
    table.reload().await.unwrap();
    let same = table
        .snapshot()
        .get(Uuid::nil(), "tiny-llama")
        .unwrap()
        .clone();
    assert!(std::sync::Arc::ptr_eq(
        same.policy.tokenizer.as_ref().unwrap(),
        &tokenizer
    ));
    write(
        dir.path(),
        "llama/tokenizer.json",
        tf_engine_sim::tokenizer::TOKENIZER_JSON,
    );
    templates::apply(&pool, "local-sim", &templates::load(dir.path()).unwrap())
        .await
        .unwrap();
    table.reload().await.unwrap();
    let changed = table
        .snapshot()
        .get(Uuid::nil(), "tiny-llama")
        .unwrap()
        .clone();
    let sim = changed.policy.tokenizer.clone().unwrap();
    assert!(!std::sync::Arc::ptr_eq(&sim, &tokenizer));
    // The simulator's tokenizer: words plus BOS.
    assert_eq!(sim.completion_prompt_tokens(&json!("Hello, world!")), 3);
}

#[test]
fn a_bad_template_is_refused_naming_its_file() {
    let cases = [
        (
            "unknown.yaml",
            "base: a\nmodel: m\nconfig_json: {}\ncolour: red\n",
            "colour",
        ),
        (
            "rank.yaml",
            "base: a\nmodel: m\nmax_lora_rank: 7\nconfig_json: {}\n",
            "max LoRA rank 7",
        ),
        (
            "gpus.yaml",
            "base: a\nmodel: m\ntensor_parallel_size: 2\nconfig_json: {}\n",
            "needs 2 GPUs",
        ),
        (
            "noconfig.yaml",
            "base: a\nmodel: m\nconfig_json: missing.json\n",
            "missing.json",
        ),
        (
            "tokenizer.yaml",
            "base: a\nmodel: m\nconfig_json: {}\ntokenizer_json: {\"model\": 1}\n",
            "tokenizer_json: not a usable tokenizer.json",
        ),
        (
            "estimator.toml",
            "base = \"a\"\nmodel = \"m\"\nprompt_estimator = \"magic\"\n[config_json]\n",
            "unknown prompt_estimator",
        ),
        (
            "floor.yaml",
            "base: a\nmodel: m\nreplicas: 3\nreplicas_max: 2\nconfig_json: {}\n",
            "below the floor",
        ),
    ];
    for (file, text, reason) in cases {
        let dir = tempfile::tempdir().unwrap();
        write(dir.path(), file, text);
        let err = templates::load(dir.path()).unwrap_err().to_string();
        assert!(err.contains(file), "{file}: {err}");
        assert!(err.contains(reason), "{file}: {err}");
    }
    // One base in two files.
    let dir = tempfile::tempdir().unwrap();
    write(dir.path(), "a.yaml", "base: a\nmodel: m\nconfig_json: {}\n");
    write(dir.path(), "b.yaml", "base: a\nmodel: n\nconfig_json: {}\n");
    let err = templates::load(dir.path()).unwrap_err().to_string();
    assert!(
        err.contains("b.yaml") && err.contains("defined twice"),
        "{err}"
    );
}
