//! Token Factory: the `tokenfactory` binary's library. `app::build` assembles the whole server
//! (portal, `/v1` gateway, background workers) so tests start the real thing on port 0.

/// Every request allocates and frees small buffers on several threads; glibc's malloc was ~8% of
/// the gateway's CPU under load (perf, `--bench gateway`). Declared here, not in `main.rs`, so the
/// tests and benchmarks run on the allocator the product runs on.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

pub mod admin;
pub mod app;
pub mod cli;
pub mod demo;
pub mod endpoint;
pub mod engine_policy;
pub(crate) mod fd_limit;
pub mod fleet;
pub mod gateway;
pub mod http_server;
pub mod journal;
pub(crate) mod metering;
pub(crate) mod notify;
pub mod portal;
pub mod quota;
pub mod redis_conn;
pub mod secret;
pub mod serve;
pub mod sim;
pub mod usage;
pub mod usage_store;
