//! `tokenfactory`: parse the command line, set up logging (and traces), run the command. A failure is one line
//! on stderr (what went wrong and what to do) and exit code 1, never a backtrace.

use std::io::Write;
use std::process::ExitCode;

use clap::Parser;
use tokenfactory::cli::{Cli, Command, ServeArgs};

#[tokio::main]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    let traces = match tokenfactory::telemetry::logs::init(
        cli.log_format,
        cli.otlp_endpoint.as_deref(),
    ) {
        Ok(traces) => traces,
        Err(e) => {
            let _ = writeln!(
                std::io::stderr(),
                "error: the OTLP trace exporter (--otlp-endpoint, OTEL_EXPORTER_OTLP_ENDPOINT): {e:#}"
            );
            return ExitCode::FAILURE;
        }
    };
    let result = match cli.command {
        None => tokenfactory::serve::run(ServeArgs::parse_from(["tokenfactory"])).await,
        Some(Command::Serve(args)) => tokenfactory::serve::run(*args).await,
        Some(Command::Migrate(args)) => tokenfactory::admin::migrate(&args).await,
        Some(Command::Admin(cmd)) => tokenfactory::admin::run(cmd).await,
        Some(Command::EngineSim(args)) => match args.config() {
            Ok(config) => tokenfactory::sim::run(args.listen, config).await,
            Err(e) => Err(anyhow::Error::msg(e)),
        },
    };
    // The spans of the last requests are still queued: export them before exiting (blocking,
    // bounded by the exporter's timeout, so off the runtime's threads).
    if let Some(traces) = traces {
        let flushed = tokio::task::spawn_blocking(move || traces.shutdown()).await;
        if let Ok(Err(e)) = flushed {
            tracing::warn!(error = %e, "flushing the last traces failed");
        }
    }
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            // `{:#}` joins the causes on one line.
            let _ = writeln!(std::io::stderr(), "error: {e:#}");
            ExitCode::FAILURE
        }
    }
}
