//! `contextctl` command implementations, one module per command group.
//!
//! Every command returns an [`ExitCode`]; failures print one line to stderr
//! and exit non-zero (`bundle inspect --output json` also prints its
//! rejection as a JSON object on stdout, for scripts).

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

pub mod context;
pub mod pool;
pub mod token;
pub mod workload;

use std::path::PathBuf;

use crate::client::ClientSettings;

/// How `contextctl` reaches the service; flags win over the environment.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct ConnectionArgs {
    /// Service URL [env: CONTEXT_SERVICE_URL; default http://127.0.0.1:8080].
    #[arg(long, global = true)]
    pub url: Option<String>,
    /// Bearer token [env: CONTEXT_SERVICE_TOKEN; default: the local service's
    /// development token].
    #[arg(long, global = true, hide_env_values = true)]
    pub token: Option<String>,
    /// Data dir of a local service, to find its development token
    /// [env: CS_DATA_DIR; default ./data].
    #[arg(long, global = true)]
    pub data_dir: Option<PathBuf>,
}

impl ConnectionArgs {
    /// The client settings these flags describe.
    pub fn settings(&self) -> ClientSettings {
        ClientSettings {
            url: self.url.clone(),
            token: self.token.clone(),
            data_dir: self.data_dir.clone(),
        }
    }
}

/// Prints `value` as pretty JSON on stdout.
pub fn print_json(value: &impl serde::Serialize) -> anyhow::Result<()> {
    println!("{}", serde_json::to_string_pretty(value)?);
    Ok(())
}

/// Runs `contextctl health`.
pub async fn health(conn: &ConnectionArgs, output: OutputFormat) -> anyhow::Result<ExitCode> {
    let client = conn.settings().client()?;
    let status = client.health().await?;
    match output {
        OutputFormat::Json => print_json(&status)?,
        OutputFormat::Text => println!(
            "{}: {}",
            client.base_url(),
            status["status"].as_str().unwrap_or("unknown")
        ),
    }
    Ok(ExitCode::SUCCESS)
}
