//! The Context Service server.

use std::process::ExitCode;

use clap::{Parser, Subcommand};
use context_service::config::ServeConfig;
use context_service::server::{shutdown_signal, Server};
use context_service::telemetry;

#[derive(Debug, Parser)]
#[command(
    name = "context-service",
    version,
    about = "Allocation engine and context gateway for agent sandboxes"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run the HTTP service.
    Serve(ServeConfig),
}

#[tokio::main]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::Serve(config) => {
            telemetry::init(config.log_format);
            match serve(config).await {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    tracing::error!("{e:#}");
                    eprintln!("context-service: {e:#}");
                    ExitCode::FAILURE
                }
            }
        }
    }
}

async fn serve(config: ServeConfig) -> anyhow::Result<()> {
    let server = Server::bind(&config).await?;
    tracing::info!(addr = %server.local_addr()?, metrics_addr = ?server.metrics_addr()?, data_dir = %config.data_dir.display(), backend = ?config.backend, "listening");
    server.run(shutdown_signal()).await
}
