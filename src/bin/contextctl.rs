//! `contextctl`: the command-line client for Context Service.

use std::process::ExitCode;

use clap::{Parser, Subcommand};
use context_service::cli::bundle::BundleCommand;
use context_service::cli::{self, token::TokenArgs, ConnectionArgs, OutputFormat};
use context_service::cli::{context::ContextArgs, pool};

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
    /// Create a sandbox pool (see `contextctl help create`).
    Create(pool::CreateArgs),
    /// Show a sandbox pool and its sandboxes.
    Get(pool::GetArgs),
    /// Wait until a sandbox pool is ready (exit 1 if it fails or times out).
    Wait(pool::WaitArgs),
    /// Delete a sandbox pool: its sandboxes and managed workspaces.
    #[command(visible_alias = "delete")]
    Rm(pool::RmArgs),
    /// List your sandbox pools.
    Ls,
    /// Named contexts: standalone volumes (workspace, memory, knowledge, artifacts).
    Context(ContextArgs),
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
        Command::Create(args) => pool::create(args, &cli.conn, cli.output).await,
        Command::Get(args) => pool::get(args, &cli.conn, cli.output).await,
        Command::Wait(args) => pool::wait(args, &cli.conn, cli.output).await,
        Command::Rm(args) => pool::rm(args, &cli.conn, cli.output).await,
        Command::Ls => pool::ls(&cli.conn, cli.output).await,
        Command::Context(args) => cli::context::run(args, &cli.conn, cli.output).await,
        Command::Workload(args) => cli::workload::run(args, &cli.conn, cli.output).await,
    };
    result.unwrap_or_else(|e| cli::fail(&e))
}
