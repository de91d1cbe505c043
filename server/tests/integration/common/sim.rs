//! The one way tests start the engine simulator: in-process, on a loopback port, serving until
//! the test ends. Its ledger is the ground truth the usage table is checked against.

use std::net::SocketAddr;

use tf_engine_sim::{EngineSim, SimConfig};

/// The base model the simulator serves when the config names none.
pub const BASE: &str = "sim-base";

/// A running simulator.
#[derive(Clone)]
pub struct Sim {
    pub sim: EngineSim,
    pub addr: SocketAddr,
}

/// Starts a simulator with `config` (serving [`BASE`] if `config.models` is empty).
pub async fn start(mut config: SimConfig) -> Sim {
    if config.models.is_empty() {
        config.models = vec![BASE.to_owned()];
    }
    let sim = EngineSim::new(config);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(tf_engine_sim::serve(
        listener,
        sim.clone(),
        std::future::pending(),
    ));
    Sim { sim, addr }
}
