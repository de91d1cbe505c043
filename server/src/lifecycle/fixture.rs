//! Generated adapters: a valid PEFT LoRA (config and zeroed safetensors weights) for a base's
//! dimensions. The demo registers its adapters with these, and tests build good and bad uploads
//! from them.

use serde_json::json;

use crate::adapter_check::config::BaseConfig;
use crate::adapter_check::safetensors::{encode, Dtype};

/// The engine-side tensor name of one LoRA matrix.
pub fn tensor_name(layer: u64, module: &str, matrix: char) -> String {
    let block = if ["gate_proj", "up_proj", "down_proj"].contains(&module) {
        "mlp"
    } else {
        "self_attn"
    };
    format!("base_model.model.model.layers.{layer}.{block}.{module}.lora_{matrix}.weight")
}

/// A LoRA adapter's tensors for `base` at `rank` on `modules` (every layer), in `dtype`.
pub fn tensors(
    base: &BaseConfig,
    rank: u64,
    modules: &[&str],
    dtype: Dtype,
) -> Vec<(String, Dtype, Vec<u64>)> {
    let mut out = Vec::new();
    for layer in 0..base.num_hidden_layers {
        for module in modules {
            let Some((input, output)) = base.projection(module) else {
                continue;
            };
            out.push((tensor_name(layer, module, 'A'), dtype, vec![rank, input]));
            out.push((tensor_name(layer, module, 'B'), dtype, vec![output, rank]));
        }
    }
    out
}

/// Encodes tensors as a safetensors file (zeroed data).
pub fn weights(tensors: &[(String, Dtype, Vec<u64>)]) -> Vec<u8> {
    let spec: Vec<(&str, Dtype, &[u64])> = tensors
        .iter()
        .map(|(n, d, s)| (n.as_str(), *d, s.as_slice()))
        .collect();
    encode(&spec)
}

/// `adapter_config.json` of a PEFT LoRA made for `base_model`.
pub fn config(base_model: &str, rank: u64, modules: &[&str]) -> String {
    json!({
        "peft_type": "LORA",
        "base_model_name_or_path": base_model,
        "r": rank,
        "lora_alpha": rank * 2,
        "target_modules": modules,
        "bias": "none",
        "task_type": "CAUSAL_LM"
    })
    .to_string()
}

/// A complete valid adapter (config, weights) for `base` (q_proj and v_proj, BF16).
pub fn valid(base_model: &str, base: &BaseConfig, rank: u64) -> (String, Vec<u8>) {
    let modules = ["q_proj", "v_proj"];
    (
        config(base_model, rank, &modules),
        weights(&tensors(base, rank, &modules, Dtype::BF16)),
    )
}
