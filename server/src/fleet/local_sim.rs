//! The `local-sim` fleet, the embedded default: its bases are offered with serving templates, and
//! the lifecycle controller brings their graphs up on [`super::sim_fleet::SimFleet`] (simulated
//! engine replicas on loopback, speaking the same protocol as vLLM workers behind Dynamo). Paced
//! like a small real model so the demo feels like one.

use serde_json::{json, Value};
use sqlx::PgPool;
use tf_core::db::lifecycle::{offer_base, TemplateRow};
use tf_core::endpoint::ModelKind;
use tf_engine_sim::SimConfig;

use crate::engine_policy::PromptEstimator;

/// The base that carries the demo adapters (two replicas, so adapters fan out).
pub const DEMO_BASE: &str = "llama-3.1-8b-sim";
/// A second base without adapters.
const OTHER_BASE: &str = "qwen-2.5-7b-sim";
/// The simulated bases and their replicas.
pub const BASES: [(&str, i32); 2] = [(DEMO_BASE, 2), (OTHER_BASE, 1)];
/// The simulated embedding base (one replica), served on `/v1/embeddings` beside the chat bases.
pub const EMBEDDING_BASE: &str = "bge-small-sim";
/// GPUs a simulated replica says it takes.
pub const GPUS_PER_REPLICA: i32 = 1;
/// The demo tenant's adapters on [`DEMO_BASE`] (served names).
pub const DEMO_ADAPTERS: [&str; 2] = ["support-bot", "sql-helper"];

/// The model id adapters for a simulated base must declare as their base.
pub fn model_id(base: &str) -> String {
    format!("tokenfactory/{base}")
}

/// Replica pacing: a small real model.
pub fn pacing() -> SimConfig {
    SimConfig {
        ttft_ms: 40,
        prefill_tokens_per_sec: 20_000,
        decode_tokens_per_sec: 60,
        ..SimConfig::default()
    }
}

/// The `config.json` of the simulated bases: tiny, so generated adapters are a few KiB.
pub fn sim_base_config() -> Value {
    json!({
        "architectures": ["LlamaForCausalLM"],
        "hidden_size": 64,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "torch_dtype": "bfloat16"
    })
}

/// The serving template of a simulated base with `replicas` replicas.
pub fn template(base: &str, replicas: i32) -> TemplateRow {
    let kind = if base == EMBEDDING_BASE {
        ModelKind::Embedding
    } else {
        ModelKind::Chat
    };
    TemplateRow {
        kind: kind.as_str().to_owned(),
        model: model_id(base),
        image: String::new(),
        tensor_parallel_size: 1,
        quantization: None,
        max_loras: 8,
        max_lora_rank: 64,
        extra_args: Vec::new(),
        gpus_per_replica: GPUS_PER_REPLICA,
        replicas_min: replicas,
        replicas_max: replicas,
        env_from_secret: None,
        config_json: sim_base_config(),
        tokenizer_json: serde_json::from_str(tf_engine_sim::tokenizer::TOKENIZER_JSON).ok(),
        allow_dora: false,
        idle_after_secs: None,
    }
}

/// Offers the simulated bases (idempotent); the controller starts their graphs.
pub async fn offer(pool: &PgPool) -> sqlx::Result<()> {
    for (name, replicas) in BASES.into_iter().chain([(EMBEDDING_BASE, 1)]) {
        offer_base(
            pool,
            "local-sim",
            name,
            &format!("local-sim/{name}"),
            true,
            PromptEstimator::SimWords.as_str(),
            &template(name, replicas),
        )
        .await?;
    }
    Ok(())
}
