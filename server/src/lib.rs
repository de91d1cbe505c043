//! Token Factory: the `tokenfactory` binary's library. `app::build` assembles the whole server
//! (portal, `/v1` gateway, background workers) so tests start the real thing on port 0.
//!
//! # Layers
//!
//! Each layer imports only the layers above it in this list (and, within a layer, the modules
//! listed before); `scripts/import-cycles.py` checks it (its `LAYERS` table is this list).
//!
//! 1. **Domain types**: plain data every layer shares.
//!    - [`secret`]: a string that never prints itself (URLs with passwords, keys).
//!    - [`fd_limit`]: the open-files limit and the connection cap it implies.
//!    - [`endpoint`]: which OpenAI endpoint (chat, completions) and its path.
//!    - [`base_tokenizer`]: a base's own `tokenizer.json`, counting prompts before the engine does.
//!    - [`engine_policy`]: per base, the engine-control fields stripped and how prompts are
//!      estimated before the engine counts them.
//!    - [`usage`]: the usage event, the engine's `usage`, the sink trait and the spend barrier.
//! 2. **Stores**: where state lives (accounts, keys and catalog SQL live in `tf_core`).
//!    - [`redis_conn`]: connecting to Redis without start-up depending on it.
//!    - [`usage_store`]: usage events in PostgreSQL (the direct sink, the one insert, the read).
//!    - [`journal`]: the local usage journal, its group committer and its shipper to PostgreSQL.
//! 3. **Logic**: decisions, independent of HTTP.
//!    - [`quota`]: admission (rate limits, spend, in-flight caps) shared through Redis.
//!    - [`bodies`]: opted-in tenants' prompts and completions: bounded capture off the request
//!      path, the batch writer and the retention job.
//!    - `metering`: reading engine answers (SSE or whole) to their end, finishing usage events.
//!    - [`adapter_check`]: an uploaded LoRA adapter judged against its base, once, at registration.
//!    - [`fleet`]: where bases are served (local simulators or a static list) and the catalog.
//!    - [`lifecycle`]: tenants' adapters uploaded, validated, started and stopped; the controller.
//! 4. **Edges**: what clients and operators talk to.
//!    - [`gateway`]: the `/v1` request path (auth, resolve, admit, forward, meter).
//!    - [`api`]: the `/api/v1` management API (adapters) for developers with a key.
//!    - [`http_server`]: client connections with head deadlines and a connection cap.
//!    - [`body_bounds`]: size and time bounds on the bodies of every route outside `/v1`.
//!    - [`portal`]: the portal's routes and session layer (components in `tf_app`).
//!    - `notify`: PostgreSQL notifications that refresh this replica's caches.
//!    - [`replica_report`]: this replica's journal and connection figures, reported to
//!      PostgreSQL for `/admin/ops`.
//!    - [`health`]: `/healthz` (alive) and `/readyz` (PostgreSQL answers, migrations current).
//! 5. **Assembly**: putting it together and starting it.
//!    - [`app`]: state, routes and background workers (what tests start).
//!    - [`demo`]: the demo tenant of `serve --demo`.
//!    - [`sim`]: the `engine-sim` command.
//!    - [`cli`]: the command line (clap types stay here; the layers take plain option structs).
//!    - [`admin`]: the `migrate` and `admin` commands.
//!    - [`db_start`]: the connected role's check and whether start-up migrates.
//!    - [`serve`]: the `serve` command (migrate, fleet, build, serve, drain).

/// Every request allocates and frees small buffers on several threads; glibc's malloc was ~8% of
/// the gateway's CPU under load (perf, `--bench gateway`). Declared here, not in `main.rs`, so the
/// tests and benchmarks run on the allocator the product runs on.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

// Domain types.
pub mod base_tokenizer;
pub mod endpoint;
pub mod engine_policy;
pub(crate) mod fd_limit;
pub mod secret;
pub mod usage;
// Stores.
pub mod journal;
pub mod redis_conn;
pub mod usage_store;
// Logic.
pub mod adapter_check;
pub mod bodies;
pub mod fleet;
pub mod lifecycle;
pub mod metering;
pub mod quota;
// Edges.
pub mod api;
pub mod body_bounds;
pub mod gateway;
pub mod health;
pub mod http_server;
pub(crate) mod notify;
pub mod portal;
pub mod replica_report;
// Assembly.
pub mod admin;
pub mod app;
pub mod billing;
pub mod cli;
pub mod db_start;
pub mod demo;
pub mod metrics_scrape;
pub mod serve;
pub mod sim;
pub mod telemetry;
