//! The exec port on the `local` backend: a child process in the sandbox's
//! directory (the stand-in for a container's working directory).
//!
//! The child gets a clean environment (only `PATH` and `LC_ALL=C`), so
//! nothing of the gateway's own environment leaks into a sandbox command.
//! stderr is kept (its first 4 KiB) for the log only. The child is killed
//! when the session's `done` future is dropped.

use std::process::Stdio;

use futures::FutureExt;
use tokio::io::AsyncReadExt;
use tokio::process::Command;

use super::LocalBackend;
use crate::delivery::{ExecError, ExecSession, ExecTarget, SandboxExec};

/// Most stderr bytes kept for the log.
const STDERR_KEEP: usize = 4096;

/// `PATH` when the gateway has none.
const DEFAULT_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

#[async_trait::async_trait]
impl SandboxExec for LocalBackend {
    async fn exec(&self, target: &ExecTarget, argv: &[String]) -> Result<ExecSession, ExecError> {
        let dir = self.exec_dir(&target.sandbox)?;
        let (program, args) = argv
            .split_first()
            .ok_or_else(|| ExecError::transport("exec", "empty argv"))?;
        let path = std::env::var_os("PATH").unwrap_or_else(|| DEFAULT_PATH.into());
        let mut child = Command::new(program)
            .args(args)
            .current_dir(&dir)
            .env_clear()
            .env("PATH", path)
            .env("LC_ALL", "C")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .map_err(|e| ExecError::transport(format!("exec in sandbox {}", target.sandbox), e))?;
        let missing = || ExecError::transport("exec", "a pipe of the child is missing");
        let stdin = child.stdin.take().ok_or_else(missing)?;
        let stdout = child.stdout.take().ok_or_else(missing)?;
        let mut stderr = child.stderr.take().ok_or_else(missing)?;
        let sandbox = target.sandbox.clone();
        let done = async move {
            let drain = async {
                let mut kept = Vec::new();
                let mut buf = [0u8; 1024];
                // Read to the end (so the child never blocks on a full
                // pipe), keeping only the head.
                while let Ok(n) = stderr.read(&mut buf).await {
                    if n == 0 {
                        break;
                    }
                    let room = STDERR_KEEP.saturating_sub(kept.len());
                    kept.extend_from_slice(&buf[..n.min(room)]);
                }
                kept
            };
            let (status, kept) = tokio::join!(child.wait(), drain);
            let status = status
                .map_err(|e| ExecError::transport(format!("wait for exec in {sandbox}"), e))?;
            let code = exit_code(status);
            if !kept.is_empty() {
                tracing::debug!(
                    sandbox = %sandbox,
                    code,
                    stderr = %String::from_utf8_lossy(&kept),
                    "exec stderr"
                );
            }
            Ok(code)
        }
        .boxed();
        Ok(ExecSession {
            stdin: Box::new(stdin),
            stdout: Box::new(stdout),
            done,
        })
    }
}

/// The exit code, or 128 + the signal that killed the process.
fn exit_code(status: std::process::ExitStatus) -> i32 {
    use std::os::unix::process::ExitStatusExt as _;
    status
        .code()
        .or_else(|| status.signal().map(|s| 128 + s))
        .unwrap_or(-1)
}
