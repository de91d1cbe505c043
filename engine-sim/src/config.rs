//! Start-up configuration of a simulated engine: which names it serves and how fast its "GPU"
//! is. Every field is public and documented because the `tokenfactory engine-sim` subcommand turns
//! each one into a command-line flag.

/// How a simulated engine behaves; build with struct-update syntax over [`SimConfig::default`].
#[derive(Clone, Debug)]
pub struct SimConfig {
    /// Base model names served (the `model` a request may name).
    pub models: Vec<String>,
    /// LoRA adapters loaded at start, as (lora_name, lora_path).
    pub loras: Vec<(String, String)>,
    /// Fixed time before the first token, in milliseconds.
    pub ttft_ms: u64,
    /// Prefill speed for uncached prompt tokens, one prefill at a time (0: free).
    pub prefill_tokens_per_sec: u64,
    /// Decode speed of each request, in tokens per second (0: no delay).
    pub decode_tokens_per_sec: u64,
    /// Completion length when a request sets no max_tokens.
    pub default_max_tokens: u32,
    /// Prefix-cache block size in tokens.
    pub block_size: u32,
    /// Prefix-cache capacity in blocks; the least recently used blocks are evicted.
    pub prefix_cache_blocks: usize,
    /// Answer errors in Dynamo's flat shape instead of OpenAI's envelope.
    pub flat_errors: bool,
    /// Put streamed usage on the last content chunk instead of a separate chunk.
    pub usage_on_last_chunk: bool,
    /// Fail every completion request with this HTTP status.
    pub fail_status: Option<u16>,
    /// Ledger entries kept in memory; the oldest are dropped beyond this.
    pub ledger_capacity: usize,
}

impl Default for SimConfig {
    fn default() -> Self {
        Self {
            models: vec!["sim-base".to_owned()],
            loras: Vec::new(),
            ttft_ms: 0,
            prefill_tokens_per_sec: 0,
            decode_tokens_per_sec: 0,
            default_max_tokens: 16,
            block_size: 16,
            prefix_cache_blocks: 100_000,
            flat_errors: false,
            usage_on_last_chunk: false,
            fail_status: None,
            ledger_capacity: 1_000_000,
        }
    }
}
