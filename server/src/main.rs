//! `tokenfactory`: parse the command line, set up logging, run the command.

use clap::Parser;
use tokenfactory::cli::{Cli, Command, ServeArgs};

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| "info,sqlx=warn,tower_sessions=warn".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    let cli = Cli::parse();
    match cli.command {
        None => tokenfactory::serve::run(ServeArgs::parse_from(["tokenfactory"])).await,
        Some(Command::Serve(args)) => tokenfactory::serve::run(args).await,
        Some(Command::Migrate(db)) => tokenfactory::admin::migrate(&db).await,
        Some(Command::Admin(cmd)) => tokenfactory::admin::run(cmd).await,
        Some(Command::EngineSim(args)) => tokenfactory::sim::run(args).await,
    }
}
