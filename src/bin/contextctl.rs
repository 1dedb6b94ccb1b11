//! `contextctl`: the command-line client for Context Service.

use std::process::ExitCode;

use clap::{CommandFactory, Parser, Subcommand};
use context_service::cli::bundle::BundleCommand;
use context_service::cli::{self, token::TokenArgs, ConnectionArgs, OutputFormat};
use context_service::cli::{context::ContextArgs, pool};

#[derive(Debug, Parser)]
#[command(
    name = "contextctl",
    version,
    about = "Command-line client for Context Service",
    after_help = "\
Examples:
  contextctl health
  contextctl -o json get team        # -o/--output goes before or after the command
  contextctl workload ls -o wide
  source <(contextctl completion bash)

Environment: CONTEXT_SERVICE_URL, CONTEXT_SERVICE_TOKEN, CS_DATA_DIR (flags win).

Exit status:
  0  the command succeeded
  1  it failed: the service refused or could not be reached, a bundle was rejected,
     `wait` timed out (the reason is one line on stderr)
  2  usage error: unknown command or flag, a missing or bad value, an --output the command
     cannot print"
)]
struct Cli {
    /// Output format.
    #[arg(
        short = 'o',
        long,
        global = true,
        value_enum,
        default_value_t = OutputFormat::Text
    )]
    output: OutputFormat,
    #[command(flatten)]
    conn: ConnectionArgs,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Validate or pack workload bundles offline.
    #[command(after_help = "\
Examples:
  contextctl bundle inspect ./my-workload
  contextctl bundle pack ./my-workload -f workload.tar.gz")]
    Bundle {
        #[command(subcommand)]
        cmd: BundleCommand,
    },
    /// Check that the service answers.
    #[command(after_help = "\
Examples:
  contextctl health
  contextctl health --url http://context-service:8080 -o json")]
    Health,
    /// Print the local development token, or mint one.
    Token(TokenArgs),
    /// Create a sandbox pool (see `contextctl help create`).
    Create(pool::CreateArgs),
    /// Show a sandbox pool and its sandboxes.
    Get(pool::GetArgs),
    /// Wait until a sandbox pool is ready (exit 1 if it fails or times out).
    Wait(pool::WaitArgs),
    /// Suspend a sandbox pool: its pods stop, volumes and names stay.
    Suspend(pool::SuspendArgs),
    /// Resume a suspended sandbox pool: new pods on the kept volumes.
    Resume(pool::SuspendArgs),
    /// Delete a sandbox pool: its sandboxes and managed workspaces.
    #[command(visible_alias = "delete")]
    Rm(pool::RmArgs),
    /// List your sandbox pools.
    #[command(after_help = "\
Examples:
  contextctl ls
  contextctl ls -o wide               # with every pool's sandboxes
  contextctl ls -o name               # pool/team, one a line")]
    Ls,
    /// Named contexts: standalone volumes (workspace, memory, knowledge, artifacts).
    Context(ContextArgs),
    /// Create, upload, activate, inspect, download and delete workloads.
    #[command(alias = "workloads")]
    Workload(cli::workload::WorkloadArgs),
    /// Print a shell completion script.
    #[command(after_help = "\
Examples:
  source <(contextctl completion bash)                       # this shell
  contextctl completion zsh > \"${fpath[1]}/_contextctl\"     # zsh, every new shell
  contextctl completion fish > ~/.config/fish/completions/contextctl.fish
  contextctl completion powershell >> $PROFILE")]
    Completion {
        /// The shell.
        shell: clap_complete::Shell,
    },
}

fn main() -> ExitCode {
    cli::die_quietly_on_closed_stdout();
    // A missing .env is normal; a broken one is worth saying.
    if let Err(e) = dotenvy::dotenv() {
        if !e.not_found() {
            eprintln!("contextctl: ignoring .env: {e}");
        }
    }
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => return cli::usage_failure(&e),
    };
    // Offline commands run without an async runtime: starting one (and
    // its threads) is a measurable share of a quick `bundle inspect`.
    let result = match cli.command {
        Command::Bundle { cmd } => Ok(cli::bundle::run(cmd, cli.output)),
        Command::Token(args) => cli::token::run(args, &cli.conn, cli.output),
        Command::Completion { shell } => {
            clap_complete::generate(
                shell,
                &mut Cli::command(),
                "contextctl",
                &mut std::io::stdout(),
            );
            Ok(ExitCode::SUCCESS)
        }
        command => match tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .build()
        {
            Ok(rt) => {
                let (conn, output) = (cli.conn, cli.output);
                context_service::runtime::run_to_end(&rt, async move {
                    online(command, &conn, output).await
                })
                .and_then(|done| done)
            }
            Err(e) => Err(anyhow::Error::new(e).context("cannot start the async runtime")),
        },
    };
    result.unwrap_or_else(|e| cli::fail(&e))
}

/// The commands that talk to the service.
async fn online(
    command: Command,
    conn: &ConnectionArgs,
    output: OutputFormat,
) -> anyhow::Result<ExitCode> {
    match command {
        Command::Health => cli::health(conn, output).await,
        Command::Create(args) => pool::create(args, conn, output).await,
        Command::Get(args) => pool::get(args, conn, output).await,
        Command::Wait(args) => pool::wait(args, conn, output).await,
        Command::Rm(args) => pool::rm(args, conn, output).await,
        Command::Suspend(args) => pool::set_suspended(args, conn, output, true).await,
        Command::Resume(args) => pool::set_suspended(args, conn, output, false).await,
        Command::Ls => pool::ls(conn, output).await,
        Command::Context(args) => cli::context::run(args, conn, output).await,
        Command::Workload(args) => cli::workload::run(args, conn, output).await,
        Command::Bundle { .. } | Command::Token(_) | Command::Completion { .. } => {
            anyhow::bail!("internal error: an offline command reached the online dispatcher")
        }
    }
}
