//! The `engine-sim` command: the simulated engine on its own port (benchmarks, manual tests).

use std::io::Write;

use tf_engine_sim::{EngineSim, SimConfig};

use crate::cli::SimArgs;

pub async fn run(args: SimArgs) -> anyhow::Result<()> {
    let loras = args
        .loras
        .iter()
        .map(|spec| {
            spec.split_once('=')
                .map(|(n, p)| (n.to_owned(), p.to_owned()))
                .ok_or_else(|| anyhow::anyhow!("--loras takes name=path, got {spec:?}"))
        })
        .collect::<anyhow::Result<Vec<_>>>()?;
    let config = SimConfig {
        models: args.models,
        loras,
        ttft_ms: args.ttft_ms,
        prefill_tokens_per_sec: args.prefill_tokens_per_sec,
        decode_tokens_per_sec: args.decode_tokens_per_sec,
        default_max_tokens: args.default_max_tokens,
        flat_errors: args.flat_errors,
        usage_on_last_chunk: args.usage_on_last_chunk,
        ..SimConfig::default()
    };
    let listener = tokio::net::TcpListener::bind(args.listen).await?;
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
