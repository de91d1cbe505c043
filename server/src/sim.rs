//! The `engine-sim` command: the simulated engine on its own port (benchmarks, manual tests).

use std::io::Write;
use std::net::SocketAddr;

use tf_engine_sim::{EngineSim, SimConfig};

/// Serves `config` on `listen` until Ctrl-C.
pub async fn run(listen: SocketAddr, config: SimConfig) -> anyhow::Result<()> {
    let listener = tokio::net::TcpListener::bind(listen).await?;
    let addr = listener.local_addr()?;
    {
        let mut out = std::io::stdout().lock();
        writeln!(
            out,
            "engine-sim serving {:?} on http://{addr}/v1",
            config.models
        )?;
        out.flush()?;
    }
    tf_engine_sim::serve(listener, EngineSim::new(config), async {
        let _ = tokio::signal::ctrl_c().await;
    })
    .await?;
    Ok(())
}
