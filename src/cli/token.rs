//! `contextctl token`: print the local service's development token, or mint
//! one for another user with the embedded signing key.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context as _;

use super::{print_doc, ConnectionArgs, OutputFormat};
use crate::auth::dev::{dev_token_path, DevIssuer};
use crate::auth::{Scope, TokenPolicy};

/// `contextctl token [mint ...]`.
#[derive(Debug, clap::Args)]
#[command(after_help = "\
Examples:
  contextctl token                                  # the local service's development token
  BOB=$(contextctl token mint --sub bob --ttl 1h)   # a token for another user")]
pub struct TokenArgs {
    #[command(subcommand)]
    mint: Option<TokenCommand>,
}

#[derive(Debug, clap::Subcommand)]
enum TokenCommand {
    /// Mint a token with the local service's signing key (for testing with
    /// several users).
    #[command(after_help = "\
Examples:
  contextctl token mint --sub bob --ttl 1h
  contextctl token mint --sub ci --scope 'workloads:read' -o json")]
    Mint {
        /// Subject (the owner the token speaks for).
        #[arg(long, value_parser = super::values::subject)]
        sub: String,
        /// Space-separated scopes [default: every user scope].
        #[arg(long)]
        scope: Option<String>,
        /// Lifetime, e.g. `30m`, `1h`, `7d`.
        #[arg(long, default_value = "1h", value_parser = positive_duration)]
        ttl: Duration,
        /// Required issuer, as the service is configured [env: CS_TOKEN_ISSUER].
        #[arg(long, env = "CS_TOKEN_ISSUER", default_value = "context-service")]
        issuer: String,
        /// Required audience, as the service is configured [env: CS_TOKEN_AUDIENCE].
        #[arg(long, env = "CS_TOKEN_AUDIENCE", default_value = "context-service")]
        audience: String,
    },
}

/// A lifetime longer than zero: `0s` would mint a token that is already
/// expired.
fn positive_duration(text: &str) -> Result<Duration, String> {
    match humantime::parse_duration(text) {
        Ok(d) if d.is_zero() => Err("a token must live longer than 0s".to_owned()),
        Ok(d) => Ok(d),
        Err(e) => Err(e.to_string()),
    }
}

/// Runs `contextctl token`.
pub fn run(
    args: TokenArgs,
    conn: &ConnectionArgs,
    output: OutputFormat,
) -> anyhow::Result<ExitCode> {
    if output == OutputFormat::Name {
        return Err(output.unsupported("token"));
    }
    let data_dir = conn
        .data_dir
        .clone()
        .or_else(|| std::env::var_os("CS_DATA_DIR").map(PathBuf::from))
        .unwrap_or_else(|| PathBuf::from("./data"));
    let token = match args.mint {
        None => {
            let path = dev_token_path(&data_dir);
            let text = std::fs::read_to_string(&path).with_context(|| {
                format!(
                    "no development token at {} (start `context-service serve --data-dir {}` first)",
                    path.display(),
                    data_dir.display()
                )
            })?;
            text.trim().to_owned()
        }
        Some(TokenCommand::Mint {
            sub,
            scope,
            ttl,
            issuer,
            audience,
        }) => {
            let issuer_key = DevIssuer::load(&data_dir)?;
            let policy = TokenPolicy {
                issuer,
                audience,
                ..TokenPolicy::default()
            };
            let scope = scope.unwrap_or_else(Scope::user_scopes);
            issuer_key.mint(&policy, &sub, &scope, ttl)?
        }
    };
    if output.is_document() {
        print_doc(&serde_json::json!({ "token": token }), output)?;
    } else {
        println!("{token}");
    }
    Ok(ExitCode::SUCCESS)
}
