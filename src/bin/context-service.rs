//! The Context Service server.

use std::process::ExitCode;
use std::sync::Weak;
use std::time::Duration;

use clap::{Parser, Subcommand};
use context_service::config::ServeConfig;
use context_service::migrate::MigrateConfig;
use context_service::server::{shutdown_signal, Server};
use context_service::store::MetadataStore;
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

// Parsed once per process: the size of the variants does not matter.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Subcommand)]
enum Command {
    /// Run the HTTP service.
    Serve(ServeConfig),
    /// Copy a single replica's embedded store (metadata and bundles under
    /// its data dir) into PostgreSQL and object storage, for scale-out.
    /// Exit status: 0 everything is in the target, 1 something is not
    /// (each reason one line on stderr), 2 a usage error.
    Migrate(MigrateConfig),
}

/// How long stopping the runtime waits for blocking work (an upload still
/// being written after its connection was cut) before the process exits.
const BLOCKING_WORK_WAIT: Duration = Duration::from_secs(5);

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::Migrate(config) => context_service::migrate::run_cli(&config),
        Command::Serve(config) => {
            telemetry::init(config.log_format);
            let result = context_service::server::runtime(&config)
                .map_err(anyhow::Error::from)
                .and_then(|runtime| {
                    let served = context_service::runtime::run_to_end(&runtime, serve(config))
                        .and_then(|served| served);
                    // Stopping the runtime drops every task, and with them
                    // the last handles on the store: its drop is the clean
                    // close that spares the next start a repair.
                    runtime.shutdown_timeout(BLOCKING_WORK_WAIT);
                    served
                });
            match result {
                Ok(store) => {
                    if store.strong_count() == 0 {
                        tracing::info!("store closed; stopped");
                    } else {
                        tracing::warn!(
                            "stopped with the store still in use by unfinished work; \
                             the next start repairs it"
                        );
                    }
                    ExitCode::SUCCESS
                }
                Err(e) => {
                    tracing::error!("{e:#}");
                    eprintln!("context-service: {e:#}");
                    ExitCode::FAILURE
                }
            }
        }
    }
}

/// Serves until a shutdown signal and the drain after it; returns a weak
/// handle on the store, to tell whether it was closed.
async fn serve(config: ServeConfig) -> anyhow::Result<Weak<dyn MetadataStore>> {
    let server = Server::bind(&config).await?;
    // Before "listening": a signal from then on stops the service cleanly.
    let signal = shutdown_signal();
    let store = server.state().workloads.store_handle();
    tracing::info!(addr = %server.local_addr()?, metrics_addr = ?server.metrics_addr()?, data_dir = %config.data_dir.display(), database = ?config.database_url, backend = ?config.backend, "listening");
    server.run_until(signal).await?;
    Ok(store)
}
