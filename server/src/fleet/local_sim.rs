//! The `local-sim` backend, the embedded default: one simulated engine per base model on a
//! loopback port, speaking the same protocol as a vLLM worker behind Dynamo. Paced like a small
//! real model so the demo feels like one.

use tf_engine_sim::{EngineSim, SimConfig};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::BaseRegistration;
use crate::engine_policy::PromptEstimator;

/// The base that carries the demo adapters.
pub const DEMO_BASE: &str = "llama-3.1-8b-sim";
/// A second base without adapters.
const OTHER_BASE: &str = "qwen-2.5-7b-sim";
/// Demo adapters on [`DEMO_BASE`]: (served name, LoRA name the engine knows).
pub const DEMO_ADAPTERS: [(&str, &str); 2] = [
    ("support-bot", "demo--support-bot--v1"),
    ("sql-helper", "demo--sql-helper--v1"),
];

/// Starts the engines; they stop when `cancel` fires.
pub async fn start(
    tracker: &TaskTracker,
    cancel: &CancellationToken,
) -> anyhow::Result<Vec<BaseRegistration>> {
    let mut bases = Vec::new();
    for name in [DEMO_BASE, OTHER_BASE] {
        let loras = if name == DEMO_BASE {
            DEMO_ADAPTERS
                .iter()
                .map(|(_, lora)| ((*lora).to_owned(), format!("/demo/{lora}")))
                .collect()
        } else {
            Vec::new()
        };
        let config = SimConfig {
            models: vec![name.to_owned()],
            loras,
            ttft_ms: 40,
            prefill_tokens_per_sec: 20_000,
            decode_tokens_per_sec: 60,
            ..SimConfig::default()
        };
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let sim = EngineSim::new(config);
        let stop = cancel.clone();
        tracker.spawn(async move {
            if let Err(e) =
                tf_engine_sim::serve(listener, sim, async move { stop.cancelled().await }).await
            {
                tracing::error!(error = %e, "simulated engine stopped");
            }
        });
        bases.push(BaseRegistration {
            name: name.to_owned(),
            graph: format!("local-sim/{name}"),
            upstream_url: format!("http://{addr}/v1"),
            upstream_model: name.to_owned(),
            continuous_usage: true,
            // The demo's tenants must not drive the simulator: the default deny-list strips `sim`.
            denied_fields: None,
            prompt_estimator: PromptEstimator::SimWords,
        });
    }
    Ok(bases)
}
