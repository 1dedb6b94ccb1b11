//! `contextctl`: the command-line client for Context Service.

use std::process::ExitCode;

use clap::{Parser, Subcommand};
use context_service::cli::bundle::BundleCommand;
use context_service::cli::{self, token::TokenArgs, ConnectionArgs, OutputFormat};

#[derive(Debug, Parser)]
#[command(
    name = "contextctl",
    version,
    about = "Command-line client for Context Service"
)]
struct Cli {
    /// Output format. (No `-o` short form: `bundle pack DIR -o FILE` uses it.)
    #[arg(long, global = true, value_enum, default_value_t = OutputFormat::Text)]
    output: OutputFormat,
    #[command(flatten)]
    conn: ConnectionArgs,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Validate or pack workload bundles offline.
    Bundle {
        #[command(subcommand)]
        cmd: BundleCommand,
    },
    /// Check that the service answers.
    Health,
    /// Print the local development token, or mint one.
    Token(TokenArgs),
    /// Create, upload, activate, inspect, download and delete workloads.
    #[command(alias = "workloads")]
    Workload(cli::workload::WorkloadArgs),
}

#[tokio::main]
async fn main() -> ExitCode {
    // A missing .env is normal; a broken one is worth saying.
    if let Err(e) = dotenvy::dotenv() {
        if !e.not_found() {
            eprintln!("contextctl: ignoring .env: {e}");
        }
    }
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Bundle { cmd } => Ok(cli::bundle::run(cmd, cli.output)),
        Command::Health => cli::health(&cli.conn, cli.output).await,
        Command::Token(args) => cli::token::run(args, &cli.conn, cli.output),
        Command::Workload(args) => cli::workload::run(args, &cli.conn, cli.output).await,
    };
    result.unwrap_or_else(|e| cli::fail(&e))
}
