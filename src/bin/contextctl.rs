//! `contextctl`: the command-line client for Context Service.

use std::process::ExitCode;

use clap::{Parser, Subcommand};
use context_service::cli::bundle::BundleCommand;
use context_service::cli::OutputFormat;

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
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::Bundle { cmd } => context_service::cli::bundle::run(cmd, cli.output),
    }
}
