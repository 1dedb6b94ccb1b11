//! The exec port: what delivery needs from a sandbox backend to run one
//! command inside a sandbox with its stdin and stdout attached.
//!
//! Implemented by `crate::sandbox::local` (`sh` in the sandbox directory,
//! a child process) and `crate::sandbox::kube` (`pods/exec` over a
//! websocket). The delivery service only ever talks to [`SandboxExec`].
//!
//! Contract every implementation keeps:
//! - stdin is a byte pipe; the command must never need EOF (some transports,
//!   e.g. kwok, never deliver it), so the caller may keep it open until the
//!   command ends;
//! - stdout is returned raw; stderr is never returned (implementations log
//!   it, bounded), because it may hold text no client should see;
//! - dropping the session (or its [`ExecSession::done`] future) ends the
//!   command: a timed-out delivery leaves no process behind in the gateway.

use std::error::Error as StdError;

use futures::future::BoxFuture;
use tokio::io::{AsyncRead, AsyncWrite};

/// Where to run a command: a sandbox, and its pod where there is one.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ExecTarget {
    /// The sandbox's name (a Kubernetes name, already validated).
    pub sandbox: String,
    /// The pod running it (`None` on the `local` backend, which has no pods).
    pub pod: Option<String>,
}

/// One started command.
pub struct ExecSession {
    /// The command's stdin.
    pub stdin: Box<dyn AsyncWrite + Send + Unpin>,
    /// The command's stdout.
    pub stdout: Box<dyn AsyncRead + Send + Unpin>,
    /// Resolves when the command has ended: its exit code (128 + signal
    /// number when it was killed by a signal), or why the exit status could
    /// not be learnt.
    pub done: BoxFuture<'static, Result<i32, ExecError>>,
}

impl std::fmt::Debug for ExecSession {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ExecSession(..)")
    }
}

/// Why a command could not be run, or its end not observed.
#[derive(Debug, thiserror::Error)]
pub enum ExecError {
    /// The sandbox (or its pod) does not exist (any more).
    #[error("sandbox {0} not found")]
    NotFound(String),
    /// The sandbox is suspended: it keeps its files but runs nothing.
    #[error("sandbox {0} is suspended")]
    Suspended(String),
    /// Starting the command or talking to it failed (spawn error, websocket
    /// or API error, a lost status channel). The text is logged; clients get
    /// a generic reason.
    #[error("{context}: {source}")]
    Transport {
        /// What was being done, e.g. `exec in pod p`.
        context: String,
        /// The cause.
        #[source]
        source: Box<dyn StdError + Send + Sync + 'static>,
    },
}

impl ExecError {
    /// A transport error: `context` says what was being done.
    pub fn transport(
        context: impl Into<String>,
        source: impl Into<Box<dyn StdError + Send + Sync + 'static>>,
    ) -> Self {
        ExecError::Transport {
            context: context.into(),
            source: source.into(),
        }
    }
}

/// Runs commands in sandboxes.
#[async_trait::async_trait]
pub trait SandboxExec: Send + Sync + 'static {
    /// Starts `argv` (e.g. `["sh", "-c", script]`) in `target`, returning as
    /// soon as it runs, with stdin and stdout attached. The caller bounds
    /// the whole session with its own timeout.
    async fn exec(&self, target: &ExecTarget, argv: &[String]) -> Result<ExecSession, ExecError>;
}
