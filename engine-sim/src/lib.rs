//! A simulated vLLM engine behind Dynamo: the GPU fleet stand-in every test and benchmark of
//! Token Factory talks to. It speaks the OpenAI-compatible API (chat and text completions,
//! streamed or not, with vLLM's usage options), vLLM's and Dynamo's LoRA APIs, a prefix cache
//! isolated by model and `cache_salt`, a FIFO "GPU" that makes long prefills stall everyone, and
//! fault knobs. Its ledger (`/sim/ledger`) records what each request really cost, which is the
//! ground truth the gateway's metering is checked against.

use std::future::Future;
use std::sync::Arc;

mod completions;
mod config;
mod embeddings;
mod engine;
mod faults;
mod ledger;
mod lock;
mod lora;
mod openai;
mod prefix_cache;
mod reply;
mod routes;
mod stream;
pub mod tokenizer;
mod typed_reply;

pub use config::SimConfig;
pub use faults::{GlobalFaults, LineEnding};
pub use ledger::LedgerEntry;

use engine::Engine;

/// A running simulated engine; cheap to clone (all clones share one engine).
#[derive(Clone, Debug)]
pub struct EngineSim {
    engine: Arc<Engine>,
}

impl EngineSim {
    /// A fresh engine: empty cache and ledger, the configured LoRAs loaded.
    pub fn new(config: SimConfig) -> Self {
        Self {
            engine: Arc::new(Engine::new(config)),
        }
    }

    /// All HTTP routes (OpenAI API, LoRA APIs, `/health`, `/sim/*` controls).
    pub fn router(&self) -> axum::Router {
        routes::router(self.engine.clone())
    }

    /// The ledger so far, in completion order.
    pub fn ledger(&self) -> Vec<LedgerEntry> {
        self.engine.ledger.snapshot()
    }

    /// Forgets all ledger entries.
    pub fn clear_ledger(&self) {
        self.engine.ledger.clear();
    }

    /// The current global fault knobs.
    pub fn faults(&self) -> GlobalFaults {
        self.engine.faults()
    }

    /// Changes the global fault knobs at run time.
    pub fn set_faults(&self, faults: GlobalFaults) {
        self.engine.set_faults(faults);
    }
}

/// Serves the simulator on `listener` until `shutdown` resolves (then drains open requests).
pub async fn serve(
    listener: tokio::net::TcpListener,
    sim: EngineSim,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    use axum::serve::ListenerExt;
    // Stream chunks are small and latency matters: no Nagle delay.
    let listener = listener.tap_io(|tcp| {
        if let Err(e) = tcp.set_nodelay(true) {
            tracing::debug!(error = %e, "could not set TCP_NODELAY");
        }
    });
    axum::serve(listener, sim.router())
        .with_graceful_shutdown(shutdown)
        .await
}
