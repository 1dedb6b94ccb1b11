//! `contextctl` command implementations, one module per command group.
//!
//! Every command returns an [`ExitCode`]; failures print one line to stderr
//! and exit 1, usage errors exit 2 (`bundle inspect --output json` also
//! prints its rejection as a JSON object on stdout, for scripts).

use std::process::ExitCode;

pub mod bundle;
pub mod call;
pub mod values;

pub use call::{About, CallFailed};

/// How a command prints its result (`-o/--output`, as kubectl spells it).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum OutputFormat {
    /// Human-readable text.
    #[default]
    Text,
    /// One JSON document on stdout.
    Json,
    /// One YAML document on stdout (the same fields as `json`).
    Yaml,
    /// `kind/name` of each resource, one a line (commands that show
    /// resources only).
    Name,
    /// Text with more detail where a command has any (e.g. the sandboxes of
    /// every pool in `ls`); else the same as `text`.
    Wide,
}

impl OutputFormat {
    /// Whether the result is printed as a document (`json` or `yaml`).
    pub fn is_document(self) -> bool {
        matches!(self, OutputFormat::Json | OutputFormat::Yaml)
    }

    /// The usage error for a format that `command` cannot print.
    pub fn unsupported(self, command: &str) -> anyhow::Error {
        let name = clap::ValueEnum::to_possible_value(&self)
            .map(|v| v.get_name().to_owned())
            .unwrap_or_else(|| format!("{self:?}"));
        UsageError(format!(
            "--output {name} is not supported by `contextctl {command}`"
        ))
        .into()
    }
}

/// A usage error found after parsing (an `--output` a command cannot print):
/// exit code [`EXIT_USAGE`], like clap's own.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct UsageError(pub String);

/// Exit code for a command that failed because of the user's input or the
/// server's answer (a rejected bundle, a 4xx, ...).
pub const EXIT_FAILURE: u8 = 1;
/// Exit code for usage errors (bad flags), as clap uses.
pub const EXIT_USAGE: u8 = 2;

/// Prints `err` as a one-line message and returns its exit code:
/// [`EXIT_USAGE`] for a [`UsageError`], else [`EXIT_FAILURE`].
pub fn fail(err: &anyhow::Error) -> ExitCode {
    eprintln!("contextctl: {err:#}");
    let client_error = err
        .downcast_ref::<crate::client::ClientError>()
        .or_else(|| err.downcast_ref::<CallFailed>().map(|c| &c.error));
    let bad_url = matches!(
        client_error,
        Some(crate::client::ClientError::InvalidUrl(_))
    );
    if err.is::<UsageError>() || bad_url {
        ExitCode::from(EXIT_USAGE)
    } else {
        ExitCode::from(EXIT_FAILURE)
    }
}

/// Prints a clap parse error as one line, `contextctl: <message>`, and
/// returns its exit code; help and version requests print as clap prints
/// them (exit 0).
pub fn usage_failure(err: &clap::Error) -> ExitCode {
    use clap::error::ErrorKind;
    if matches!(
        err.kind(),
        ErrorKind::DisplayHelp
            | ErrorKind::DisplayVersion
            | ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand
    ) {
        let _ = err.print();
        return ExitCode::from(u8::try_from(err.exit_code()).unwrap_or(EXIT_USAGE));
    }
    // clap's first paragraph is the message (a missing argument's name and
    // the accepted values are on its next lines); usage and "for more
    // information" go, tips stay in brackets.
    let rendered = err.to_string();
    let mut paragraphs = rendered
        .split("\n\n")
        .map(|p| p.split_whitespace().collect::<Vec<_>>().join(" "));
    let first = paragraphs.next().unwrap_or_default();
    let mut line = first.strip_prefix("error: ").unwrap_or(&first).to_owned();
    for tip in paragraphs.filter(|p| p.starts_with("tip: ")) {
        line.push_str(&format!(" ({tip})"));
    }
    eprintln!("contextctl: {line}");
    ExitCode::from(EXIT_USAGE)
}

pub mod context;
pub mod pool;
pub mod pull_secret;
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

/// Lets a write to a closed pipe end the process silently, as it ends
/// `cat` or `ls` (`contextctl workload ls | head`): Rust ignores `SIGPIPE`,
/// which turns every later `println!` into a panic. Call first in `main`.
pub fn die_quietly_on_closed_stdout() {
    // SAFETY: restoring a signal's default disposition at start-up, before
    // any thread exists; no handler code is installed.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
}

/// Prints `value` as a document on stdout: YAML for `--output yaml`, else
/// pretty JSON.
pub fn print_doc(value: &impl serde::Serialize, output: OutputFormat) -> anyhow::Result<()> {
    if output == OutputFormat::Yaml {
        // serde-saphyr ends the document with a newline itself.
        print!("{}", serde_saphyr::to_string(value)?);
    } else {
        println!("{}", serde_json::to_string_pretty(value)?);
    }
    Ok(())
}

/// Runs `contextctl health`.
pub async fn health(conn: &ConnectionArgs, output: OutputFormat) -> anyhow::Result<ExitCode> {
    if output == OutputFormat::Name {
        return Err(output.unsupported("health"));
    }
    let client = conn.settings().client()?;
    let status = client
        .health()
        .await
        .about(|| client.base_url().to_owned())?;
    if output.is_document() {
        print_doc(&status, output)?;
    } else {
        println!(
            "{}: {}",
            client.base_url(),
            status["status"].as_str().unwrap_or("unknown")
        );
    }
    Ok(ExitCode::SUCCESS)
}
