//! `contextctl`: the command-line client for Context Service.

use std::process::ExitCode;

use clap::{Parser, Subcommand};
use context_service::cli::OutputFormat;

#[derive(Debug, Parser)]
#[command(name = "contextctl", version, about = "Command-line client for Context Service")]
struct Cli {
    /// Output format.
    #[arg(long, short = 'o', global = true, value_enum, default_value_t = OutputFormat::Text)]
    output: OutputFormat,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {}
}
