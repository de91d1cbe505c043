//! Start-up settings of the quota subsystem, as plain data: the CLI (`cli::QuotaArgs`) fills them
//! from flags and takes its defaults from [`QuotaOptions::DEFAULT`], so there is one place for them.

use std::time::Duration;

/// How admission behaves (each field is a `serve` flag; see `cli::QuotaArgs` for the meanings).
#[derive(Debug, Clone, PartialEq)]
pub struct QuotaOptions {
    /// Share of each limit one replica enforces on its own while Redis is unreachable.
    pub local_limit_fraction: f64,
    /// Lifetime of a slot or spend reservation in Redis, in milliseconds (renewed while used).
    pub quota_lease_ms: u64,
    /// Longest wait for a Redis answer, in milliseconds; slower counts as Redis down.
    pub quota_redis_timeout_ms: u64,
    /// How often the cluster's leader resets spend counters from billed usage, in milliseconds.
    pub quota_reconcile_ms: u64,
    /// Completion cap of a request that sets no `max_tokens` (sent upstream, and reserved for).
    pub quota_default_max_tokens: u64,
    /// Prompt tokens from which a request counts as long, where a tenant's limits do not say.
    pub long_prompt_tokens: u64,
}

impl QuotaOptions {
    /// The defaults (the CLI's too).
    pub const DEFAULT: Self = Self {
        local_limit_fraction: 0.5,
        quota_lease_ms: 30_000,
        quota_redis_timeout_ms: 250,
        quota_reconcile_ms: 10_000,
        quota_default_max_tokens: 4096,
        long_prompt_tokens: 32_768,
    };

    /// The lease as a duration (at least 300 ms, so renewal every third of it stays sane).
    pub fn lease(&self) -> Duration {
        Duration::from_millis(self.quota_lease_ms.max(300))
    }

    /// The lease in milliseconds, as the scripts take it.
    pub(super) fn lease_ms(&self) -> i64 {
        i64::try_from(self.lease().as_millis()).unwrap_or(30_000)
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
            Self::DEFAULT.local_limit_fraction
        }
    }
}

impl Default for QuotaOptions {
    fn default() -> Self {
        Self::DEFAULT
    }
}
