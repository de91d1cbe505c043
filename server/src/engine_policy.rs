//! What a client may tell an engine, per base: the engine-control fields stripped from request
//! bodies, and how a prompt is counted before the engine has counted it.
//!
//! Pass-through stays the rule (a new sampling parameter works the day vLLM ships it); only the
//! fields below, which hand a tenant the engine's scheduler, KV transfer or test knobs, are removed.

/// Stripped from every request body unless a base lists its own set (`base_models.denied_fields`):
/// - `priority`: vLLM's scheduler priority; a tenant setting it jumps the queue and defeats the
///   per-tenant fairness caps.
/// - `request_id`: vLLM's own request id; a client could collide with another request's.
/// - `kv_transfer_params`: disaggregated-serving KV transfer control (prefill/decode routing).
/// - `vllm_xargs`: arbitrary extra arguments for engine plugins.
/// - `logits_processors`: names engine-side code to load and run.
/// - `sim`: the engine simulator's fault and token-count knobs (a client could set its own
///   completion count under a token limit).
const DEFAULT_DENIED_FIELDS: &[&str] = &[
    "priority",
    "request_id",
    "kv_transfer_params",
    "vllm_xargs",
    "logits_processors",
    "sim",
];

/// The `nvext` keys kept unless a base lists its own set (`base_models.nvext_allowed`); every
/// other key of the nested object is stripped before forwarding. Kept: sampling and guided
/// decoding extras Dynamo reads (a tenant's own output, nobody else's), `annotations` (asks the
/// frontend for extra events) and `token_data` (token ids used as the prompt; admission counts
/// them). Stripped by default, among others:
/// - `backend_instance_id`, `prefill_worker_id`, `decode_worker_id`: pin a request to a worker,
///   bypassing the router (a tenant could pile onto, or probe, one worker).
/// - `agent_hints`: scheduler priority, latency sensitivity, speculative prefill: queue-jumping,
///   like the top-level `priority`.
/// - `cache_salt`: the gateway writes its own (see `gateway::request`).
const DEFAULT_NVEXT_ALLOWED: &[&str] = &[
    "top_k",
    "min_p",
    "repetition_penalty",
    "ignore_eos",
    "greed_sampling",
    "guided_json",
    "guided_regex",
    "guided_grammar",
    "guided_choice",
    "guided_decoding_backend",
    "guided_whitespace_pattern",
    "annotations",
    "token_data",
];

/// How a prompt's tokens are estimated before the engine reports them when the base has no
/// `tokenizer.json` of its own (with one, [`crate::base_tokenizer::BaseTokenizer`] counts them).
/// No such estimate is exact for a real engine, so each use errs on its safe side: admission
/// high (a bound), billing a cut request low (never above what was produced).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum PromptEstimator {
    /// A real engine: admission counts at most one token per byte of the prompt's JSON (a
    /// byte-level BPE token is at least one byte, and the JSON keys around each message outweigh
    /// the chat template's markers), token-id prompts exactly; a cut request is billed by words,
    /// which no BPE tokenizer counts fewer of. Images and other non-text parts are not bounded.
    #[default]
    ByteBound,
    /// The engine simulator: its whitespace tokenizer is exact, for admission and billing alike.
    SimWords,
}

impl PromptEstimator {
    /// The name stored in `base_models.prompt_estimator`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::ByteBound => "byte-bound",
            Self::SimWords => "sim-words",
        }
    }

    /// Parses a stored or configured name.
    pub fn parse(name: &str) -> Option<Self> {
        match name {
            "byte-bound" => Some(Self::ByteBound),
            "sim-words" => Some(Self::SimWords),
            _ => None,
        }
    }
}

/// A base's policy as the request path applies it.
#[derive(Debug, Clone)]
pub struct EnginePolicy {
    /// Top-level body fields removed before forwarding.
    pub denied_fields: Vec<String>,
    /// The `nvext` keys forwarded; every other key of `nvext` is removed.
    pub nvext_allowed: Vec<String>,
    /// The fallback estimator, used when the base has no tokenizer.
    pub estimator: PromptEstimator,
    /// The base's own tokenizer (its `tokenizer.json`), shared by every route on the base.
    pub tokenizer: Option<std::sync::Arc<crate::base_tokenizer::BaseTokenizer>>,
}

impl Default for EnginePolicy {
    fn default() -> Self {
        Self {
            denied_fields: DEFAULT_DENIED_FIELDS
                .iter()
                .map(|f| (*f).to_owned())
                .collect(),
            nvext_allowed: Self::default_nvext_allowed(),
            estimator: PromptEstimator::default(),
            tokenizer: None,
        }
    }
}

impl EnginePolicy {
    /// The policy of a base registered with `denied` (`None`: the default list).
    pub fn new(denied: Option<Vec<String>>, estimator: PromptEstimator) -> Self {
        Self {
            denied_fields: denied.unwrap_or_else(|| Self::default().denied_fields),
            nvext_allowed: Self::default_nvext_allowed(),
            estimator,
            tokenizer: None,
        }
    }

    /// This policy with the base's own `nvext` allow-list (`None`: the default one).
    #[must_use]
    pub fn with_nvext_allowed(mut self, allowed: Option<Vec<String>>) -> Self {
        if let Some(allowed) = allowed {
            self.nvext_allowed = allowed;
        }
        self
    }

    /// The default `nvext` allow-list (what a base without its own list forwards).
    pub fn default_nvext_allowed() -> Vec<String> {
        DEFAULT_NVEXT_ALLOWED
            .iter()
            .map(|f| (*f).to_owned())
            .collect()
    }

    /// This policy with the base's own tokenizer.
    #[must_use]
    pub fn with_tokenizer(
        mut self,
        tokenizer: Option<std::sync::Arc<crate::base_tokenizer::BaseTokenizer>>,
    ) -> Self {
        self.tokenizer = tokenizer;
        self
    }

    /// The default deny-list without `allowed`: a simulated engine that tests drive through
    /// its `sim` block registers `denied_except(&["sim"])`.
    pub fn denied_except(allowed: &[&str]) -> Vec<String> {
        DEFAULT_DENIED_FIELDS
            .iter()
            .filter(|f| !allowed.contains(f))
            .map(|f| (*f).to_owned())
            .collect()
    }
}
