//! The LoRA check proper: every tensor is an A or B matrix of a targeted projection, on a layer the
//! base has, with the shape the base's dimensions and the declared rank imply.

use std::collections::BTreeMap;

use crate::config::{AdapterConfig, BaseConfig};
use crate::rejection::Rejection;
use crate::safetensors::Header;

/// The base an adapter is registered on, and what its graph allows (from its serving template).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GraphLimits<'a> {
    /// The base's model id (`org/name`), which an adapter's `base_model_name_or_path` must name.
    pub base_name: &'a str,
    /// vLLM's `--max-lora-rank`.
    pub max_lora_rank: u64,
}

/// Whether `declared` (a hub id or a local path) names `base`: their last path components agree,
/// ignoring case, so `/models/Llama-3.1-8B` names `meta-llama/llama-3.1-8b`.
fn names_base(declared: &str, base: &str) -> bool {
    let last = |s: &str| {
        s.trim_end_matches('/')
            .rsplit('/')
            .next()
            .unwrap_or("")
            .to_ascii_lowercase()
    };
    last(declared) == last(base)
}

/// What a valid adapter is, for its registration record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Accepted {
    pub rank: u64,
    pub modules: Vec<String>,
    pub layers: u64,
    pub tensors: usize,
    pub weight_bytes: u64,
}

/// Checks an adapter's parsed header and config against the base and the graph.
pub fn check(
    header: &Header,
    adapter: &AdapterConfig,
    base: &BaseConfig,
    graph: GraphLimits<'_>,
) -> Result<Accepted, Rejection> {
    let modules = adapter.modules()?;
    if let Some(declared) = &adapter.base_model_name_or_path {
        if !names_base(declared, graph.base_name) {
            return Err(Rejection::Config(format!(
                "base_model_name_or_path: made for {declared}, not for {}",
                graph.base_name
            )));
        }
    }
    if adapter.r > graph.max_lora_rank {
        return Err(Rejection::Config(format!(
            "r: rank {} is above this base's maximum LoRA rank {}",
            adapter.r, graph.max_lora_rank
        )));
    }
    for module in &modules {
        if base.projection(module).is_none() {
            return Err(Rejection::Config(format!(
                "target_modules: target module {module} is not a projection this base serves LoRA on"
            )));
        }
    }
    // (layer, module) -> which of A and B were seen.
    let mut seen: BTreeMap<(u64, String), [bool; 2]> = BTreeMap::new();
    for (name, tensor) in &header.tensors {
        let (layer, module, which) = parse_name(name)?;
        if layer >= base.num_hidden_layers {
            return Err(Rejection::Shape(format!(
                "{name}: layer {layer}, the base has {}",
                base.num_hidden_layers
            )));
        }
        if !modules.iter().any(|m| m == module) {
            return Err(Rejection::Shape(format!(
                "{name}: module {module} is not in target_modules"
            )));
        }
        if !tensor.dtype.is_float_weight() {
            return Err(Rejection::Shape(format!(
                "{name}: dtype {} (expected F16, BF16 or F32)",
                tensor.dtype
            )));
        }
        let (input, output) = base.projection(module).unwrap_or((0, 0));
        let expected = match which {
            Matrix::A => [adapter.r, input],
            Matrix::B => [output, adapter.r],
        };
        if tensor.shape != expected {
            return Err(Rejection::Shape(format!(
                "{name}: shape {:?}, expected {expected:?} for rank {}",
                tensor.shape, adapter.r
            )));
        }
        let slot = seen.entry((layer, module.to_string())).or_default();
        slot[which as usize] = true;
    }
    if seen.is_empty() {
        return Err(Rejection::Shape("no LoRA tensors".into()));
    }
    if let Some(((layer, module), _)) = seen.iter().find(|(_, ab)| !(ab[0] && ab[1])) {
        return Err(Rejection::Shape(format!(
            "layer {layer} {module} has only one of lora_A and lora_B"
        )));
    }
    let layers = seen
        .keys()
        .map(|(l, _)| *l)
        .collect::<std::collections::BTreeSet<_>>()
        .len();
    Ok(Accepted {
        rank: adapter.r,
        modules,
        layers: layers as u64,
        tensors: header.tensors.len(),
        weight_bytes: header.data_bytes,
    })
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Matrix {
    A = 0,
    B = 1,
}

/// `base_model.model.model.layers.{i}.{self_attn|mlp}.{module}.lora_{A|B}.weight`.
fn parse_name(name: &str) -> Result<(u64, &str, Matrix), Rejection> {
    let bad = || Rejection::Shape(format!("{name}: not a LoRA weight name"));
    let rest = name
        .strip_prefix("base_model.model.model.layers.")
        .ok_or_else(bad)?;
    let (layer, rest) = rest.split_once('.').ok_or_else(bad)?;
    let layer: u64 = layer.parse().map_err(|_| bad())?;
    let rest = rest
        .strip_prefix("self_attn.")
        .or_else(|| rest.strip_prefix("mlp."))
        .ok_or_else(bad)?;
    let (module, rest) = rest.split_once('.').ok_or_else(bad)?;
    let which = match rest {
        "lora_A.weight" => Matrix::A,
        "lora_B.weight" => Matrix::B,
        _ => return Err(bad()),
    };
    Ok((layer, module, which))
}

#[cfg(test)]
mod tests {
    use super::super::safetensors::{encode, read_header, Dtype};
    use super::*;

    /// A small Llama-style base: hidden 64, 4 heads of 16, 2 KV heads, MLP 128, 2 layers.
    const BASE: &str = r#"{"hidden_size":64,"num_attention_heads":4,"num_key_value_heads":2,
        "intermediate_size":128,"num_hidden_layers":2,"architectures":["LlamaForCausalLM"]}"#;

    fn adapter_config(r: u64, modules: &[&str]) -> AdapterConfig {
        let json = serde_json::json!({"r": r, "lora_alpha": 16, "target_modules": modules,
            "peft_type": "LORA", "bias": "none"});
        AdapterConfig::parse(&json.to_string()).unwrap_or_else(|e| unreachable!("{e}"))
    }

    fn name(layer: u64, module: &str, m: &str) -> String {
        let mlp = ["gate_proj", "up_proj", "down_proj"].contains(&module);
        let block = if mlp { "mlp" } else { "self_attn" };
        format!("base_model.model.model.layers.{layer}.{block}.{module}.lora_{m}.weight")
    }

    fn run(
        tensors: &[(String, Dtype, Vec<u64>)],
        adapter: &AdapterConfig,
        max_rank: u64,
    ) -> Result<Accepted, Rejection> {
        let spec: Vec<(&str, Dtype, &[u64])> = tensors
            .iter()
            .map(|(n, d, s)| (n.as_str(), *d, s.as_slice()))
            .collect();
        let bytes = encode(&spec);
        let header = read_header(&bytes[..], bytes.len() as u64)?;
        let base = BaseConfig::parse(BASE)?;
        let graph = GraphLimits {
            base_name: "meta-llama/Llama-3.1-8B-Instruct",
            max_lora_rank: max_rank,
        };
        check(&header, adapter, &base, graph)
    }

    /// q_proj (64 -> 64) and v_proj (64 -> 32, two KV heads of 16) on both layers, rank 8.
    fn good(r: u64) -> Vec<(String, Dtype, Vec<u64>)> {
        let mut out = Vec::new();
        for layer in 0..2 {
            out.push((name(layer, "q_proj", "A"), Dtype::BF16, vec![r, 64]));
            out.push((name(layer, "q_proj", "B"), Dtype::BF16, vec![64, r]));
            out.push((name(layer, "v_proj", "A"), Dtype::BF16, vec![r, 64]));
            out.push((name(layer, "v_proj", "B"), Dtype::BF16, vec![32, r]));
        }
        out
    }

    fn reason(r: Result<Accepted, Rejection>) -> String {
        match r {
            Ok(a) => format!("accepted {a:?}"),
            Err(e) => e.to_string(),
        }
    }

    #[test]
    fn a_fitting_adapter_is_accepted_with_its_summary() {
        let accepted = run(&good(8), &adapter_config(8, &["v_proj", "q_proj"]), 16);
        assert_eq!(
            accepted,
            Ok(Accepted {
                rank: 8,
                modules: vec!["q_proj".into(), "v_proj".into()],
                layers: 2,
                tensors: 8,
                weight_bytes: 2 * 2 * (8 * 64 + 64 * 8 + 8 * 64 + 32 * 8),
            })
        );
    }

    #[test]
    fn rank_above_the_graphs_maximum_is_refused() {
        let r = run(&good(32), &adapter_config(32, &["q_proj", "v_proj"]), 16);
        assert!(reason(r).contains("rank 32 is above this base's maximum LoRA rank 16"));
    }

    #[test]
    fn shapes_must_match_the_base_and_the_declared_rank() {
        // Made for a base with 128 KV width (e.g. no grouped-query attention).
        let mut tensors = good(8);
        tensors[3].2 = vec![64, 8];
        let r = run(&tensors, &adapter_config(8, &["q_proj", "v_proj"]), 16);
        assert!(reason(r).contains("shape [64, 8], expected [32, 8]"));
        // Declared rank 4, weights of rank 8.
        let r = run(&good(8), &adapter_config(4, &["q_proj", "v_proj"]), 16);
        assert!(reason(r).contains("expected [4, 64] for rank 4"));
    }

    #[test]
    fn tensors_outside_the_base_or_the_config_are_refused() {
        let mut tensors = good(8);
        tensors.push((name(2, "q_proj", "A"), Dtype::BF16, vec![8, 64]));
        assert!(
            reason(run(&tensors, &adapter_config(8, &["q_proj", "v_proj"]), 16))
                .contains("layer 2, the base has 2")
        );
        let r = run(&good(8), &adapter_config(8, &["q_proj"]), 16);
        assert!(reason(r).contains("module v_proj is not in target_modules"));
        let mut tensors = good(8);
        tensors.push(("lm_head.weight".into(), Dtype::BF16, vec![8, 64]));
        assert!(
            reason(run(&tensors, &adapter_config(8, &["q_proj", "v_proj"]), 16))
                .contains("not a LoRA weight name")
        );
        let r = run(
            &good(8),
            &adapter_config(8, &["q_proj", "v_proj", "embed_tokens"]),
            16,
        );
        assert!(reason(r).contains("embed_tokens is not a projection"));
    }

    #[test]
    fn a_missing_half_or_integer_weights_are_refused() {
        let mut tensors = good(8);
        tensors.remove(1);
        assert!(
            reason(run(&tensors, &adapter_config(8, &["q_proj", "v_proj"]), 16))
                .contains("only one of lora_A and lora_B")
        );
        let mut tensors = good(8);
        tensors[0].1 = Dtype::I8;
        assert!(
            reason(run(&tensors, &adapter_config(8, &["q_proj", "v_proj"]), 16))
                .contains("dtype I8")
        );
        assert!(reason(run(&[], &adapter_config(8, &["q_proj"]), 16)).contains("no LoRA tensors"));
    }

    #[test]
    fn the_declared_base_must_be_this_base() {
        let mut config = adapter_config(8, &["q_proj", "v_proj"]);
        config.base_model_name_or_path = Some("/models/llama-3.1-8b-instruct/".into());
        assert!(run(&good(8), &config, 16).is_ok());
        config.base_model_name_or_path = Some("Qwen/Qwen2.5-7B".into());
        assert!(reason(run(&good(8), &config, 16)).contains("made for Qwen/Qwen2.5-7B"));
    }

    #[test]
    fn adapter_configs_asking_for_what_is_not_served_are_refused() {
        let refuse = |json: &str| match AdapterConfig::parse(json) {
            Ok(c) => c.modules().err().map(|e| e.to_string()).unwrap_or_default(),
            Err(e) => e.to_string(),
        };
        assert!(refuse(r#"{"r":8,"target_modules":["q_proj"],"use_dora":true}"#).contains("DoRA"));
        assert!(refuse(r#"{"r":8,"target_modules":["q_proj"],"bias":"all"}"#).contains("bias"));
        assert!(
            refuse(r#"{"r":8,"target_modules":["q_proj"],"modules_to_save":["lm_head"]}"#)
                .contains("modules_to_save")
        );
        assert!(refuse(r#"{"r":0,"target_modules":["q_proj"]}"#).contains("at least 1"));
        assert!(refuse(r#"{"r":8,"target_modules":".*proj"}"#).contains("pattern"));
        assert!(
            refuse(r#"{"r":8,"target_modules":["q_proj"],"peft_type":"IA3"}"#).contains("not LORA")
        );
        assert!(refuse(r#"{"target_modules":["q_proj"]}"#).contains("missing field `r`"));
    }
}
