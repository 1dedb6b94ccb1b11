//! Driving one exec of a rendered script: the stdout protocol of
//! `script` (`RESEND reason` on a damaged cache dir, `NEED n`, then the
//! final JSON line or `ERROR code reason`),
//! the bundle bytes on a miss, and the exit status.

use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncReadExt, BufReader};

use tokio::io::AsyncWriteExt;

use super::agent::AgentSet;
use super::error::SandboxFailure;
use super::payload::{Payload, SendError};
use super::port::{ExecError, ExecSession, ExecTarget, SandboxExec};
use super::script::{parse_line, DeliveredBy, ScriptLine};
use crate::workload::WorkloadError;

/// Longest stdout line read; the protocol's lines are far shorter.
const MAX_LINE: u64 = 8 * 1024;

/// A delivery that completed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Placed {
    /// The run's view in the sandbox.
    pub(super) path: String,
    /// True on a verified cache hit.
    pub(super) cached: bool,
    /// Bundle bytes written.
    pub(super) bytes_sent: u64,
    /// What delivered.
    pub(super) transport: DeliveredBy,
    /// Whether the agent was sent (injected) during this delivery.
    pub(super) agent_sent: bool,
}

/// Why a delivery or release in one sandbox failed, with every cause (the
/// caller logs them); [`Failure::client_failure`] is what a client sees.
#[derive(Debug)]
pub(super) enum Failure {
    /// The script refused or failed: its `ERROR` line.
    Script {
        /// e.g. `disk_full`.
        code: String,
        /// Its one-line reason.
        reason: String,
    },
    /// The exec could not be run or observed.
    Exec(ExecError),
    /// The script broke the protocol (or died without a final line).
    Protocol(String),
    /// The gateway could not open or read the bundle.
    Source(WorkloadError),
    /// Writing the bundle failed and the script said nothing about it.
    Write(std::io::Error),
}

impl Failure {
    /// What a client sees. Exec and source causes are logged by the
    /// caller, not shown; object-storage trouble is shown (the client may
    /// retry).
    pub(super) fn client_failure(&self) -> SandboxFailure {
        match self {
            Failure::Script { code, reason } => SandboxFailure::Script {
                code: code.clone(),
                reason: reason.clone(),
            },
            Failure::Exec(ExecError::NotFound(s)) => SandboxFailure::NotFound(s.clone()),
            Failure::Exec(ExecError::Suspended(s)) => SandboxFailure::Suspended(s.clone()),
            Failure::Exec(ExecError::Transport { .. }) => SandboxFailure::ExecFailed,
            Failure::Protocol(why) => SandboxFailure::Protocol(why.clone()),
            Failure::Source(WorkloadError::StorageUnavailable(m)) => {
                SandboxFailure::StorageUnavailable(m.clone())
            }
            Failure::Source(WorkloadError::BundleCorrupt(m)) => {
                SandboxFailure::BundleCorrupt(m.clone())
            }
            Failure::Source(_) => SandboxFailure::BundleUnreadable,
            Failure::Write(_) => SandboxFailure::TransferFailed,
        }
    }
}

type Lines = BufReader<Box<dyn AsyncRead + Send + Unpin>>;

/// The next stdout line without its newline; `None` at the end.
async fn next_line(out: &mut Lines) -> Result<Option<String>, Failure> {
    let mut buf = Vec::new();
    let n = (&mut *out)
        .take(MAX_LINE)
        .read_until(b'\n', &mut buf)
        .await
        .map_err(|e| Failure::Exec(ExecError::transport("reading the script's output", e)))?;
    if n == 0 {
        return Ok(None);
    }
    if !buf.ends_with(b"\n") && n as u64 == MAX_LINE {
        return Err(Failure::Protocol(format!(
            "an output line is longer than {MAX_LINE} bytes"
        )));
    }
    Ok(Some(String::from_utf8_lossy(&buf).into_owned()))
}

/// A parsed line, or a protocol failure naming what was expected.
fn parse(line: Option<String>, expected: &str) -> Result<Option<ScriptLine>, Failure> {
    match line {
        None => Ok(None),
        Some(l) => parse_line(&l)
            .map(Some)
            .map_err(|e| Failure::Protocol(format!("expected {expected}, got {:?}", e.line))),
    }
}

async fn start(
    exec: &dyn SandboxExec,
    target: &ExecTarget,
    script: String,
) -> Result<(ExecSession, Lines), Failure> {
    let argv = ["sh".to_owned(), "-c".to_owned(), script];
    let mut session = exec.exec(target, &argv).await.map_err(Failure::Exec)?;
    let stdout = std::mem::replace(&mut session.stdout, Box::new(tokio::io::empty()));
    Ok((session, BufReader::new(stdout)))
}

/// Waits for the exit of a script that printed its final line.
async fn finish(session: ExecSession) -> Result<(), Failure> {
    let ExecSession { stdin, done, .. } = session;
    // Closing stdin is a courtesy; the scripts never wait for EOF.
    drop(stdin);
    match done.await.map_err(Failure::Exec)? {
        0 => Ok(()),
        code => Err(Failure::Protocol(format!(
            "the script printed success but exited with {code}"
        ))),
    }
}

/// A script's `ERROR` line, once the script has ended: it cleans up (its
/// staging dir) after printing, and dropping the session would kill it.
async fn script_error(session: ExecSession, code: String, reason: String) -> Failure {
    let ExecSession { stdin, done, .. } = session;
    drop(stdin);
    if let Err(e) = done.await {
        tracing::debug!(error = %e, "the failed script's end was not observed");
    }
    Failure::Script { code, reason }
}

/// The end of a script that printed no final line.
async fn no_output(session: ExecSession, after: &str) -> Failure {
    match session.done.await {
        Ok(127) => Failure::Script {
            code: "missing_tool".into(),
            reason: "sh not found in the sandbox".into(),
        },
        Ok(code) => Failure::Protocol(format!(
            "the script exited with {code} without a result {after}"
        )),
        Err(e) => Failure::Exec(e),
    }
}

/// Runs the rendered deliver `script` in `target`, sending an agent of
/// `agents` when the launcher asks for one and `payload` when the script
/// (or the agent) asks for it, and checks the result names `revision`.
pub(super) async fn deliver(
    exec: &dyn SandboxExec,
    target: &ExecTarget,
    script: String,
    revision: &str,
    payload: &Payload,
    agents: Option<&AgentSet>,
) -> Result<Placed, Failure> {
    let (mut session, mut out) = start(exec, target, script).await?;
    // A plain script says nothing about its transport.
    let mut transport = DeliveredBy::Script;
    let mut agent_sent = false;
    let need = loop {
        match parse(next_line(&mut out).await?, "NEED")? {
            Some(ScriptLine::Need(n)) => break n,
            Some(ScriptLine::Agent(arch)) if !agent_sent => {
                let agent = agents.and_then(|a| a.get(&arch)).ok_or_else(|| {
                    Failure::Protocol(format!(
                        "the launcher asked for an agent for {arch:?}, which was not offered"
                    ))
                })?;
                if let Err(e) = session.stdin.write_all(&agent.bytes).await {
                    // The launcher falls back to the script, or says why
                    // it stopped; either way the next lines tell.
                    tracing::debug!(sandbox = %target.sandbox, error = %e, "sending the agent");
                }
                let _ = session.stdin.flush().await;
                agent_sent = true;
            }
            Some(ScriptLine::Resend(reason)) => {
                // Bytes are about to go out again where a cache hit was
                // possible: say why, or repeated transfers look like a
                // cache that never works.
                tracing::warn!(
                    sandbox = %target.sandbox,
                    revision,
                    reason = %reason,
                    "the sandbox's cache dir failed its check; sending the bundle again"
                );
            }
            Some(ScriptLine::Transport(by)) => transport = by,
            Some(ScriptLine::Error { code, reason }) => {
                return Err(Failure::Script { code, reason })
            }
            Some(other) => return Err(Failure::Protocol(format!("expected NEED, got {other:?}"))),
            None => return Err(no_output(session, "before NEED").await),
        }
    };
    let mut write_error = None;
    if need > 0 {
        if need != payload.len() {
            return Err(Failure::Protocol(format!(
                "the script asked for {need} bytes; the bundle has {}",
                payload.len()
            )));
        }
        match payload.write_to(&mut *session.stdin).await {
            Ok(()) => {}
            Err(SendError::Source(e)) => return Err(Failure::Source(e)),
            // The script may have stopped reading on purpose (disk full):
            // its ERROR line, read next, says why.
            Err(SendError::Write(e)) => write_error = Some(e),
        }
    }
    let line = parse(next_line(&mut out).await?, "the result line")?;
    match line {
        Some(ScriptLine::Done {
            path,
            revision: got,
            cached,
        }) => {
            if got != revision {
                return Err(Failure::Protocol(format!(
                    "the script delivered revision {got}, not {revision}"
                )));
            }
            if let Some(e) = write_error {
                return Err(Failure::Write(e));
            }
            finish(session).await?;
            let bytes_sent = if need > 0 { need } else { 0 };
            Ok(Placed {
                path,
                cached,
                bytes_sent,
                transport,
                agent_sent,
            })
        }
        Some(ScriptLine::Error { code, reason }) => Err(script_error(session, code, reason).await),
        Some(other) => Err(Failure::Protocol(format!(
            "expected the result line, got {other:?}"
        ))),
        None => match write_error {
            Some(e) => Err(Failure::Write(e)),
            None => Err(no_output(session, "after NEED").await),
        },
    }
}

/// Runs the rendered release `script` in `target`: `true` when the run was
/// there, `false` when there was nothing to release.
pub(super) async fn release(
    exec: &dyn SandboxExec,
    target: &ExecTarget,
    script: String,
) -> Result<bool, Failure> {
    let (session, mut out) = start(exec, target, script).await?;
    match parse(next_line(&mut out).await?, "the release result")? {
        Some(ScriptLine::Released(released)) => {
            finish(session).await?;
            Ok(released)
        }
        Some(ScriptLine::Error { code, reason }) => Err(script_error(session, code, reason).await),
        Some(other) => Err(Failure::Protocol(format!(
            "expected the release result, got {other:?}"
        ))),
        None => Err(no_output(session, "of the release").await),
    }
}
