//! The simulated GPU and its scheduler. One engine-wide FIFO lock stands for the GPU: a
//! request's prefill holds it for `uncached_prompt_tokens / prefill_tokens_per_sec`, and every
//! decode step takes it briefly, so a long prefill stalls everyone's next token. Tokens are then
//! paced per request. With no prefill rate the lock is never taken, and with no rates at all a
//! request never sleeps, so the simulator costs next to nothing in benchmarks.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use crate::config::SimConfig;
use crate::faults::{GlobalFaults, Knobs};
use crate::ledger::{Ledger, LedgerGuard};
use crate::lock::lock;
use crate::lora::LoraRegistry;
use crate::prefix_cache::PrefixCache;

/// Shared state of one simulated engine.
#[derive(Debug)]
pub struct Engine {
    /// Start-up configuration.
    pub config: SimConfig,
    /// Unix seconds at start, reported as `created` by `/v1/models`.
    pub created: u64,
    /// Finished requests.
    pub ledger: Arc<Ledger>,
    /// Loaded LoRA adapters.
    pub loras: LoraRegistry,
    gpu: tokio::sync::Mutex<()>,
    cache: Mutex<PrefixCache>,
    faults: Mutex<GlobalFaults>,
    /// Prompt tokens prefilled and tokens generated so far, exported on `/metrics` under vLLM's
    /// names (`vllm:prompt_tokens_total`, `vllm:generation_tokens_total`).
    pub prompt_tokens_total: AtomicU64,
    pub generation_tokens_total: AtomicU64,
}

impl Engine {
    /// An idle engine.
    pub fn new(config: SimConfig) -> Self {
        let faults = GlobalFaults {
            fail_status: config.fail_status,
            flat_errors: config.flat_errors,
            usage_on_last_chunk: config.usage_on_last_chunk,
            ..GlobalFaults::default()
        };
        Self {
            created: unix_now(),
            ledger: Arc::new(Ledger::new(config.ledger_capacity)),
            loras: LoraRegistry::new(&config.loras),
            gpu: tokio::sync::Mutex::new(()),
            cache: Mutex::new(PrefixCache::new(
                config.block_size,
                config.prefix_cache_blocks,
            )),
            faults: Mutex::new(faults),
            prompt_tokens_total: AtomicU64::new(0),
            generation_tokens_total: AtomicU64::new(0),
            config,
        }
    }

    /// The current global knobs.
    pub fn faults(&self) -> GlobalFaults {
        *lock(&self.faults)
    }

    /// Replaces the global knobs.
    pub fn set_faults(&self, faults: GlobalFaults) {
        *lock(&self.faults) = faults;
    }

    /// Resolves a served name: `None` if unknown, `Some(None)` for a base, `Some(Some(lora))`.
    pub fn resolve(&self, model: &str) -> Option<Option<String>> {
        if self.config.models.iter().any(|m| m == model) {
            Some(None)
        } else if self.loras.contains(model) {
            Some(Some(model.to_owned()))
        } else {
            None
        }
    }
}

/// One admitted request on its way through the GPU.
#[derive(Debug)]
pub struct Job {
    engine: Arc<Engine>,
    /// The request's ledger entry; `completion_tokens` is bumped by [`Job::commit`].
    pub guard: LedgerGuard,
    prompt_ids: Vec<u64>,
    /// Tokens to generate.
    pub target: u32,
    /// `length` if the limit stopped generation, else `stop`.
    pub finish_reason: &'static str,
    /// Content tokens after which the response dies (only if below `target`).
    pub die_after: Option<u32>,
    interval: Option<Duration>,
    ttft: Duration,
    last_token: Option<Instant>,
    /// The request asked for reasoning: the first half of its output counts as reasoning
    /// tokens (the ledger's `reasoning_tokens`).
    pub reasoning: bool,
    /// Tokens per streamed delta (at least 1).
    pub per_delta: u32,
    /// Content tokens after which an error event ends the stream (only if below `target`).
    pub error_after: Option<u32>,
    /// Content tokens after which the stream hangs (only if below `target`).
    pub hang_after: Option<u32>,
    /// How the stream's lines end.
    pub line_ending: crate::faults::LineEnding,
}

impl Job {
    /// Plans a request: `limit` is its max_tokens, `prompt_ids` its rendered prompt.
    pub fn new(
        engine: Arc<Engine>,
        guard: LedgerGuard,
        prompt_ids: Vec<u64>,
        limit: Option<u32>,
        knobs: &Knobs,
    ) -> Self {
        let limit = limit.unwrap_or(engine.config.default_max_tokens);
        let target = knobs.completion_tokens.unwrap_or(limit);
        let interval = match knobs.token_interval_ms {
            Some(ms) => Some(Duration::from_millis(ms)),
            None if engine.config.decode_tokens_per_sec > 0 => Some(Duration::from_secs_f64(
                1.0 / engine.config.decode_tokens_per_sec as f64,
            )),
            None => None,
        }
        .filter(|d| !d.is_zero());
        let ttft = Duration::from_millis(knobs.ttft_ms.unwrap_or(engine.config.ttft_ms));
        Self {
            finish_reason: if target >= limit { "length" } else { "stop" },
            die_after: knobs.die_after_chunks.filter(|&n| n < target),
            engine,
            guard,
            prompt_ids,
            target,
            interval,
            ttft,
            last_token: None,
            reasoning: false,
            per_delta: knobs.tokens_per_delta.max(1),
            error_after: knobs.error_after_chunks.filter(|&n| n < target),
            hang_after: knobs.hang_after_chunks.filter(|&n| n < target),
            line_ending: knobs.line_ending,
        }
    }

    /// Tokens handed out so far.
    pub fn produced(&self) -> u32 {
        self.guard.entry.completion_tokens
    }

    /// Whether the response should die before its next token.
    pub fn dies_now(&self) -> bool {
        self.die_after == Some(self.produced())
    }

    /// Whether an in-stream error replaces the next token.
    pub fn errors_now(&self) -> bool {
        self.error_after == Some(self.produced())
    }

    /// Whether the stream hangs before its next token.
    pub fn hangs_now(&self) -> bool {
        self.hang_after == Some(self.produced())
    }

    /// Whether a delta being filled must end before its next token (the target, or a fault
    /// that strikes at this count).
    pub fn delta_ends(&self, in_delta: u32) -> bool {
        in_delta >= self.per_delta
            || self.produced() >= self.target
            || self.dies_now()
            || self.errors_now()
            || self.hangs_now()
    }

    /// Looks the prompt up in the prefix cache and pays for the uncached part (holding the GPU),
    /// then waits the time to first token.
    pub async fn prefill(&mut self) {
        let ids = std::mem::take(&mut self.prompt_ids);
        self.engine
            .prompt_tokens_total
            .fetch_add(u64::from(self.guard.entry.prompt_tokens), Ordering::Relaxed);
        let rate = self.engine.config.prefill_tokens_per_sec;
        if rate == 0 {
            self.admit(&ids);
        } else {
            let engine = self.engine.clone();
            let _gpu = engine.gpu.lock().await;
            let cached = self.admit(&ids);
            let uncached = self.guard.entry.prompt_tokens.saturating_sub(cached);
            if uncached > 0 {
                tokio::time::sleep(Duration::from_secs_f64(f64::from(uncached) / rate as f64))
                    .await;
            }
        }
        if !self.ttft.is_zero() {
            tokio::time::sleep(self.ttft).await;
        }
    }

    /// Waits until the next token may be produced (decode pacing and the GPU lock).
    pub async fn wait_next(&mut self) {
        if let (Some(interval), Some(last)) = (self.interval, self.last_token) {
            tokio::time::sleep_until((last + interval).into()).await;
        }
        if self.engine.config.prefill_tokens_per_sec > 0 {
            drop(self.engine.gpu.lock().await);
        }
    }

    /// Counts one token as handed to the response; call in the same poll that hands it over.
    pub fn commit(&mut self) {
        self.guard.entry.completion_tokens += 1;
        if self.reasoning {
            self.guard.entry.reasoning_tokens = self.guard.entry.completion_tokens / 2;
        }
        self.engine
            .generation_tokens_total
            .fetch_add(1, Ordering::Relaxed);
        if self.interval.is_some() {
            self.last_token = Some(Instant::now());
        }
    }

    /// The counts so far, for the typed protocols' usage.
    pub fn counts(&self) -> crate::typed_reply::Counts {
        let e = &self.guard.entry;
        crate::typed_reply::Counts {
            prompt: e.prompt_tokens,
            cached: e.cached_tokens,
            completion: e.completion_tokens,
            reasoning: e.reasoning_tokens,
        }
    }

    fn admit(&mut self, ids: &[u64]) -> u32 {
        let entry = &self.guard.entry;
        let cached = lock(&self.engine.cache).admit(&entry.model, entry.cache_salt.as_deref(), ids);
        self.guard.entry.cached_tokens = cached;
        cached
    }
}

/// Unix seconds now.
pub fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}
