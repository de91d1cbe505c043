//! The economics of one base and window (computed by `tf_core::economics`).

use serde::{Deserialize, Serialize};

/// Everything shown for one base and window. `None`: the ratio's denominator is zero.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Figures {
    pub floor_replica_seconds: i64,
    pub scaled_replica_seconds: i64,
    /// Warm replica-seconds with no cost version in effect (a cost is missing).
    pub uncosted_replica_seconds: i64,
    pub capacity_tokens: i64,
    pub prompt_tokens: i64,
    pub cached_tokens: i64,
    pub completion_tokens: i64,
    /// The weighted load in tokens (fresh prompt and completion tokens at 1, a cached prompt
    /// token at 0.1: `tf_core::economics`), rounded once.
    pub load_tokens: i64,
    pub gpu_cost_micros: i64,
    pub floor_cost_micros: i64,
    pub idle_floor_cost_micros: i64,
    pub full_load_cost_per_million_micros: Option<i64>,
    pub duty_cycle_bp: Option<i64>,
    pub real_cost_per_million_micros: Option<i64>,
    pub revenue_micros: i64,
    pub price_per_million_micros: Option<i64>,
    pub margin_micros: i64,
    pub margin_bp: Option<i64>,
}
