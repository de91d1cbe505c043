//! The two JSON files an adapter is judged by: its PEFT `adapter_config.json` and the base's
//! `config.json` (Hugging Face, Llama-style attention and MLP). Only the fields the shape check needs
//! are read; unknown fields are ignored, because both formats grow.

use serde::Deserialize;

use crate::rejection::Rejection;

/// `adapter_config.json` of a PEFT LoRA adapter.
#[derive(Debug, Clone, Deserialize)]
pub struct AdapterConfig {
    pub r: u64,
    #[serde(default)]
    pub lora_alpha: Option<f64>,
    pub target_modules: TargetModules,
    #[serde(default)]
    pub base_model_name_or_path: Option<String>,
    #[serde(default)]
    pub modules_to_save: Option<Vec<String>>,
    #[serde(default)]
    pub use_dora: bool,
    #[serde(default)]
    pub bias: Option<String>,
    #[serde(default)]
    pub peft_type: Option<String>,
}

/// PEFT allows a list of module names or one regular expression; only the list is accepted (a
/// regex would need the engine's regex semantics to be judged here).
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum TargetModules {
    List(Vec<String>),
    Pattern(String),
}

/// The dimensions of a Llama-style base that fix every LoRA tensor's shape.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
pub struct BaseConfig {
    pub hidden_size: u64,
    pub num_attention_heads: u64,
    #[serde(default)]
    pub num_key_value_heads: Option<u64>,
    #[serde(default)]
    pub head_dim: Option<u64>,
    pub intermediate_size: u64,
    pub num_hidden_layers: u64,
}

impl BaseConfig {
    pub fn parse(json: &str) -> Result<Self, Rejection> {
        let config: Self =
            serde_json::from_str(json).map_err(|e| Rejection::Base(e.to_string()))?;
        if config.num_attention_heads == 0 || config.hidden_size == 0 {
            return Err(Rejection::Base(
                "num_attention_heads or hidden_size is zero".into(),
            ));
        }
        Ok(config)
    }

    pub fn head_dim(&self) -> u64 {
        self.head_dim
            .unwrap_or(self.hidden_size / self.num_attention_heads)
    }

    /// `(in_features, out_features)` of a projection the engine can put a LoRA on.
    pub fn projection(&self, module: &str) -> Option<(u64, u64)> {
        let heads = self.num_attention_heads * self.head_dim();
        let kv = self.num_key_value_heads.unwrap_or(self.num_attention_heads) * self.head_dim();
        match module {
            "q_proj" => Some((self.hidden_size, heads)),
            "k_proj" | "v_proj" => Some((self.hidden_size, kv)),
            "o_proj" => Some((heads, self.hidden_size)),
            "gate_proj" | "up_proj" => Some((self.hidden_size, self.intermediate_size)),
            "down_proj" => Some((self.intermediate_size, self.hidden_size)),
            _ => None,
        }
    }
}

impl AdapterConfig {
    pub fn parse(json: &str) -> Result<Self, Rejection> {
        let config: Self =
            serde_json::from_str(json).map_err(|e| Rejection::Config(e.to_string()))?;
        if let Some(peft) = &config.peft_type {
            if peft != "LORA" {
                return Err(Rejection::Config(format!("peft_type {peft} is not LORA")));
            }
        }
        if config.use_dora {
            return Err(Rejection::Config(
                "use_dora: DoRA adapters are not served".into(),
            ));
        }
        if config.bias.as_deref().is_some_and(|b| b != "none") {
            return Err(Rejection::Config("bias must be \"none\"".into()));
        }
        if config
            .modules_to_save
            .as_ref()
            .is_some_and(|m| !m.is_empty())
        {
            return Err(Rejection::Config(
                "modules_to_save is not supported: only LoRA weights are loaded".into(),
            ));
        }
        if config.r == 0 {
            return Err(Rejection::Config("r (the rank) must be at least 1".into()));
        }
        Ok(config)
    }

    /// The targeted projections, sorted; a regex is refused.
    pub fn modules(&self) -> Result<Vec<String>, Rejection> {
        match &self.target_modules {
            TargetModules::List(list) if !list.is_empty() => {
                let mut list = list.clone();
                list.sort();
                list.dedup();
                Ok(list)
            }
            TargetModules::List(_) => Err(Rejection::Config("target_modules is empty".into())),
            TargetModules::Pattern(p) => Err(Rejection::Config(format!(
                "target_modules as a pattern ({p:?}) is not accepted: list the module names"
            ))),
        }
    }
}
