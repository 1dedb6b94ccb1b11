//! `contextctl` command implementations, one module per command group.
//!
//! Every command returns an [`ExitCode`]; failures print one line to stderr
//! (or a JSON error object with `--output json`) and exit non-zero.

use std::process::ExitCode;

pub mod bundle;

/// How a command prints its result.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum OutputFormat {
    /// Human-readable text.
    #[default]
    Text,
    /// One JSON document on stdout.
    Json,
}

/// Exit code for a command that failed because of the user's input or the
/// server's answer (a rejected bundle, a 4xx, ...).
pub const EXIT_FAILURE: u8 = 1;
/// Exit code for usage errors (bad flags), as clap uses.
pub const EXIT_USAGE: u8 = 2;

/// Prints `err` as a one-line message and returns the failure exit code.
pub fn fail(err: &anyhow::Error) -> ExitCode {
    eprintln!("contextctl: {err:#}");
    ExitCode::from(EXIT_FAILURE)
}
