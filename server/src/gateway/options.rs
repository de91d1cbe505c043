//! The request path's limits and timeouts, as plain values. `Default` holds THE defaults: the
//! command line (`cli::GatewayArgs`) reads its defaults from here.

use std::time::Duration;

use super::body::BodyTiming;
use super::upstream::UpstreamOptions;

/// Request-path limits and timeouts (see `tokenfactory serve --help` for each).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GatewayOptions {
    /// Largest accepted request body, in bytes (larger: 413).
    pub max_body_bytes: usize,
    /// Largest whole JSON answer relayed from an engine, in bytes; a larger one is not relayed
    /// (502) and not billed: the client received nothing (`metering::whole`'s large-answer rule).
    pub max_answer_bytes: usize,
    /// Largest body of a portal form, server function or `/api/v1` call other than an adapter
    /// upload, in bytes (larger: 413); these bodies are read whole before any handler runs.
    pub max_form_bytes: usize,
    pub upstream_connect_timeout_ms: u64,
    /// Time allowed for an upstream to start answering (response headers).
    pub upstream_first_byte_timeout_ms: u64,
    /// Longest silence between two reads of an upstream's body.
    pub upstream_chunk_timeout_ms: u64,
    /// Idle keep-alive connections kept per upstream.
    pub upstream_pool_idle: usize,
    /// Time every request body gets before the minimum rate applies.
    pub body_timeout_ms: u64,
    /// Slowest a request body may arrive after that (slower: 408).
    pub body_min_bytes_per_sec: u64,
    /// Longest a request for an idle (asleep) model is held while it wakes, in milliseconds;
    /// longer: 503 with `retry-after`.
    pub hold_limit_ms: u64,
    /// Peers whose W3C `traceparent` a request's trace joins (default: none).
    pub trust_traceparent_from: tf_app::ssr::client_addr::TrustedProxies,
}

impl Default for GatewayOptions {
    fn default() -> Self {
        Self {
            max_body_bytes: 8 * 1024 * 1024,
            max_answer_bytes: 64 * 1024 * 1024,
            max_form_bytes: 1024 * 1024,
            upstream_connect_timeout_ms: 2_000,
            upstream_first_byte_timeout_ms: 300_000,
            upstream_chunk_timeout_ms: 60_000,
            upstream_pool_idle: 256,
            body_timeout_ms: 10_000,
            body_min_bytes_per_sec: 65_536,
            hold_limit_ms: 120_000,
            trust_traceparent_from: Default::default(),
        }
    }
}

impl GatewayOptions {
    /// The body-read bounds the handlers apply.
    pub fn body_timing(&self) -> BodyTiming {
        BodyTiming {
            base: Duration::from_millis(self.body_timeout_ms),
            min_bytes_per_sec: self.body_min_bytes_per_sec,
        }
    }

    pub fn hold_limit(&self) -> Duration {
        Duration::from_millis(self.hold_limit_ms)
    }

    /// What every upstream client is built with.
    pub fn upstream(&self) -> UpstreamOptions {
        UpstreamOptions {
            connect_timeout: Duration::from_millis(self.upstream_connect_timeout_ms),
            first_byte_timeout: Duration::from_millis(self.upstream_first_byte_timeout_ms),
            chunk_timeout: Duration::from_millis(self.upstream_chunk_timeout_ms),
            pool_idle_per_host: self.upstream_pool_idle,
        }
    }
}
