//! What an operator watches: Prometheus series on a listener of their own (`--metrics-listen`,
//! loopback by default, never on the client port), the log format, and traces exported over
//! OTLP when a collector is configured.
//!
//! The request path only touches atomics here (per-model series resolved once per request);
//! rendering happens when Prometheus scrapes (`metrics_scrape`, which gathers every subsystem's
//! series).

pub mod histogram;
pub mod logs;
pub mod requests;
pub mod sink;
pub mod traces;
