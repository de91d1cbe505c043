//! The embedding base the tests call beside the chat base: its name ([`EMBED`], also the one a
//! child-process deployment's fleet file routes to the simulator) and an in-process app serving
//! both ([`with_embeddings`]).

use sqlx::PgPool;
use tf_core::endpoint::ModelKind;
use tf_engine_sim::SimConfig;
use tokenfactory::engine_policy::{EnginePolicy, PromptEstimator};
use tokenfactory::fleet::{self, BaseRegistration};

use super::{TestApp, BASE};

/// The embedding base's name (the simulator serves it when its `models` name it).
pub const EMBED: &str = "embed-sim";

/// The app in front of a simulator serving [`BASE`] (chat) and [`EMBED`] (embedding).
pub async fn with_embeddings(pool: PgPool) -> TestApp {
    let t = TestApp::builder(pool)
        .sim(SimConfig {
            models: vec![BASE.into(), EMBED.into()],
            ..SimConfig::default()
        })
        .start()
        .await;
    fleet::register_bases(
        &t.pool,
        "static",
        &[BaseRegistration {
            name: EMBED.into(),
            graph: "graph-embed".into(),
            upstream_url: format!("http://{}/v1", t.sim_addr),
            upstream_model: EMBED.into(),
            continuous_usage: true,
            denied_fields: Some(EnginePolicy::denied_except(&["sim"])),
            prompt_estimator: PromptEstimator::SimWords,
            kind: ModelKind::Embedding,
            nvext_allowed: None,
        }],
    )
    .await
    .unwrap();
    t.app.gateway.routes.reload().await.unwrap();
    t
}
