//! Start-up settings of the quota subsystem (`serve` flags). Owns nothing at run time; a bad value
//! is refused by clap at start-up, naming the flag.

use std::time::Duration;

use clap::Args;

/// How admission behaves; every field is a `serve` flag and an environment variable.
#[derive(Debug, Clone, Args)]
pub struct QuotaArgs {
    /// Share of each limit one replica enforces on its own while Redis is unreachable (fail-open
    /// for rates: with N replicas the cluster admits about N x this share of each limit).
    #[arg(long, env = "TF_LOCAL_LIMIT_FRACTION", default_value_t = 0.5)]
    pub local_limit_fraction: f64,
    /// Lifetime of an in-flight or long-prompt slot (and of a spend reservation) in Redis, in
    /// milliseconds. Renewed while the request runs; a dead replica's slots expire after this.
    #[arg(long, env = "TF_QUOTA_LEASE_MS", default_value_t = 30_000)]
    pub quota_lease_ms: u64,
    /// Longest wait for a Redis answer at admission, in milliseconds; slower answers count as
    /// Redis down (this replica then uses its local limits for a second).
    #[arg(long, env = "TF_QUOTA_REDIS_TIMEOUT_MS", default_value_t = 250)]
    pub quota_redis_timeout_ms: u64,
    /// How often the cluster's leader resets spend counters from billed usage, in milliseconds.
    #[arg(long, env = "TF_QUOTA_RECONCILE_MS", default_value_t = 10_000)]
    pub quota_reconcile_ms: u64,
    /// Completion tokens assumed for a request that sets no `max_tokens` (token and spend
    /// estimates at admission; corrected at completion).
    #[arg(long, env = "TF_QUOTA_DEFAULT_MAX_TOKENS", default_value_t = 4096)]
    pub quota_default_max_tokens: u64,
    /// Prompt tokens from which a request counts as long, where a tenant's limits do not say.
    #[arg(long, env = "TF_LONG_PROMPT_TOKENS", default_value_t = 32_768)]
    pub long_prompt_tokens: u64,
}

impl Default for QuotaArgs {
    fn default() -> Self {
        Self {
            local_limit_fraction: 0.5,
            quota_lease_ms: 30_000,
            quota_redis_timeout_ms: 250,
            quota_reconcile_ms: 10_000,
            quota_default_max_tokens: 4096,
            long_prompt_tokens: 32_768,
        }
    }
}

impl QuotaArgs {
    /// The lease as a duration (at least 300 ms, so renewal every third of it stays sane).
    pub fn lease(&self) -> Duration {
        Duration::from_millis(self.quota_lease_ms.max(300))
    }

    /// The Redis timeout as a duration.
    pub fn redis_timeout(&self) -> Duration {
        Duration::from_millis(self.quota_redis_timeout_ms.max(1))
    }

    /// The local share, clamped to [0, 1].
    pub fn fraction(&self) -> f64 {
        if self.local_limit_fraction.is_finite() {
            self.local_limit_fraction.clamp(0.0, 1.0)
        } else {
            0.5
        }
    }
}
