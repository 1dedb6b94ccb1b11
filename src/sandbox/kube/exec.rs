//! Exec into sandbox pods through the Kubernetes API (`pods/exec` over a
//! WebSocket, kube-rs [`Api::exec`]): the `kube` side of the delivery exec
//! port.
//!
//! One exec runs one command with stdin, stdout and stderr attached. The
//! caller writes stdin and reads stdout concurrently; stderr is drained here
//! (a stalled stderr would stall the whole stream) and only logged. The exit
//! status comes from the status channel: a real kubelet reports a non-zero
//! exit as reason `NonZeroExitCode` with an `ExitCode` cause, kwok only as
//! `… exit status N` in the message; both are understood.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use futures::future::BoxFuture;
use futures::FutureExt;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Status;
use kube::api::AttachParams;
use kube::{Api, Client};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, ReadBuf};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tokio_util::sync::{CancellationToken, WaitForCancellationFutureOwned};

use crate::delivery::{ExecError, ExecSession, ExecTarget, SandboxExec};

/// Size of the stdin pipe between the caller and the WebSocket task: the
/// caller's writes complete as soon as they fit, so one delivery buffer of
/// about this size is in flight per exec.
pub const STDIN_BUFFER: usize = 1 << 20;

/// Size of the stdout pipe; the scripts print a few short lines.
const STDOUT_BUFFER: usize = 64 << 10;

/// How much of stderr is kept for the log (the end: errors come last).
const STDERR_KEEP: usize = 4 << 10;

/// How long the end of an exec waits for the stderr drain after the status
/// arrived (the stream is closed by then, so this is a safety net).
const STDERR_GRACE: Duration = Duration::from_secs(5);

/// Why an exec could not be started or did not report an exit status.
#[derive(Debug, thiserror::Error)]
pub enum KubeExecError {
    /// The pod does not exist (any more).
    #[error("pod {0} not found")]
    PodNotFound(String),
    /// The pod spec lists no container.
    #[error("pod {0} has no container")]
    NoContainer(String),
    /// Reading the pod or opening the exec stream failed.
    #[error("{context}: {source}")]
    Api {
        /// What was being done.
        context: String,
        /// The cause.
        #[source]
        source: kube::Error,
    },
    /// The WebSocket stream broke.
    #[error("exec stream: {0}")]
    Stream(#[source] Box<dyn std::error::Error + Send + Sync + 'static>),
    /// The stream ended without a status (connection dropped).
    #[error("exec ended without an exit status")]
    NoStatus,
    /// The command did not run or was killed: the status is a failure that
    /// carries no exit code (e.g. missing container, signal).
    #[error("exec failed: {0}")]
    Failed(String),
}

/// Execs into the pods of one namespace.
#[derive(Clone)]
pub struct KubeExec {
    client: Client,
    namespace: Arc<str>,
    container: Option<Arc<str>>,
}

impl std::fmt::Debug for KubeExec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KubeExec")
            .field("namespace", &self.namespace)
            .field("container", &self.container)
            .finish_non_exhaustive()
    }
}

/// A running exec: write `stdin` and read `stdout` concurrently, then await
/// `done` for the exit code.
pub struct KubeExecSession {
    /// The command's stdin (never closed on kwok; see the module docs of
    /// the delivery script: it reads exactly the bytes it asked for).
    pub stdin: Box<dyn AsyncWrite + Send + Unpin>,
    /// The command's stdout; ends when the command's status arrived.
    pub stdout: Box<dyn AsyncRead + Send + Unpin>,
    /// The exit code (0 on success), or why there is none.
    pub done: BoxFuture<'static, Result<i32, KubeExecError>>,
}

impl KubeExec {
    /// Execs into pods of `namespace`, into `container` when given (the
    /// operator's `CS_DELIVERY_CONTAINER`), else into each pod's first
    /// container.
    pub fn new(client: Client, namespace: &str, container: Option<String>) -> Self {
        Self {
            client,
            namespace: namespace.into(),
            container: container.map(Into::into),
        }
    }

    fn pods(&self) -> Api<Pod> {
        Api::namespaced(self.client.clone(), &self.namespace)
    }

    /// The container to exec into: the configured one, or the pod's first.
    pub async fn container_of(&self, pod: &str) -> Result<String, KubeExecError> {
        if let Some(container) = &self.container {
            return Ok(container.to_string());
        }
        let found = self
            .pods()
            .get_opt(pod)
            .await
            .map_err(|source| KubeExecError::Api {
                context: format!("read pod {pod}"),
                source,
            })?
            .ok_or_else(|| KubeExecError::PodNotFound(pod.to_string()))?;
        found
            .spec
            .and_then(|spec| spec.containers.into_iter().next())
            .map(|container| container.name)
            .ok_or_else(|| KubeExecError::NoContainer(pod.to_string()))
    }

    /// Starts `argv` in `pod`. The session's streams are live as soon as this
    /// returns; dropping its `done` aborts the exec.
    pub async fn start(
        &self,
        pod: &str,
        argv: &[String],
    ) -> Result<KubeExecSession, KubeExecError> {
        let container = self.container_of(pod).await?;
        let params = AttachParams::default()
            .container(container)
            .stdin(true)
            .stdout(true)
            .stderr(true)
            .max_stdin_buf_size(STDIN_BUFFER)
            .max_stdout_buf_size(STDOUT_BUFFER)
            .max_stderr_buf_size(STDERR_KEEP);
        let mut process = self
            .pods()
            .exec(pod, argv.to_vec(), &params)
            .await
            .map_err(|source| match &source {
                kube::Error::Api(status) if status.code == 404 => {
                    KubeExecError::PodNotFound(pod.to_string())
                }
                _ => KubeExecError::Api {
                    context: format!("exec into pod {pod}"),
                    source,
                },
            })?;
        let missing = || KubeExecError::Failed("exec stream without stdio".to_string());
        let stdin = process.stdin().ok_or_else(missing)?;
        let stdout = process.stdout().ok_or_else(missing)?;
        let stderr = process.stderr().ok_or_else(missing)?;
        let status = process.take_status().ok_or_else(missing)?;
        // Fires when kube-rs's stream task has finished (or was aborted).
        let ended = CancellationToken::new();
        // Drained from the start: a full stderr pipe would block the task
        // that also carries stdout and the status.
        let stderr = tokio::spawn(drain_tail(
            EndsWith::new(stderr, ended.clone()),
            STDERR_KEEP,
        ));
        let (outcome_tx, outcome_rx) = oneshot::channel();
        let pod = pod.to_string();
        let supervisor = tokio::spawn({
            let ended = ended.clone();
            async move {
                let ended = ended.drop_guard();
                let status = status.await;
                let joined = process.join().await;
                drop(ended);
                let stderr = tokio::time::timeout(STDERR_GRACE, stderr)
                    .await
                    .ok()
                    .and_then(Result::ok)
                    .unwrap_or_default();
                let outcome = match status {
                    Some(status) => exit_code(&status),
                    None => Err(joined
                        .err()
                        .map_or(KubeExecError::NoStatus, |e| KubeExecError::Stream(e.into()))),
                };
                if !stderr.is_empty() {
                    let stderr = String::from_utf8_lossy(&stderr);
                    match &outcome {
                        Ok(0) => tracing::debug!(%pod, %stderr, "exec stderr"),
                        _ => tracing::warn!(%pod, %stderr, "exec stderr"),
                    }
                }
                let _ = outcome_tx.send(outcome);
            }
        });
        // Dropping `done` before the end aborts the exec (and its stream).
        let abort = AbortOnDrop(supervisor);
        let done = async move {
            let _abort = abort;
            outcome_rx.await.unwrap_or(Err(KubeExecError::NoStatus))
        }
        .boxed();
        Ok(KubeExecSession {
            stdin: Box::new(EndsWith::new(stdin, ended.clone())),
            stdout: Box::new(EndsWith::new(stdout, ended)),
            done,
        })
    }
}

/// Aborts a task when dropped.
struct AbortOnDrop(JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// One of kube-rs's stdio pipes, made to end with the exec: its halves see
/// neither EOF nor a broken pipe when the stream task fails, so once `ended`
/// fires, an empty stdout reads as EOF and a full stdin fails to write.
struct EndsWith<T> {
    inner: T,
    ended: Pin<Box<WaitForCancellationFutureOwned>>,
    is_ended: bool,
}

impl<T> EndsWith<T> {
    fn new(inner: T, ended: CancellationToken) -> Self {
        Self {
            inner,
            ended: Box::pin(ended.cancelled_owned()),
            is_ended: false,
        }
    }

    /// Whether the exec has ended (registers for a wake-up if not).
    fn poll_ended(&mut self, cx: &mut Context<'_>) -> bool {
        if !self.is_ended && self.ended.as_mut().poll(cx).is_ready() {
            self.is_ended = true;
        }
        self.is_ended
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for EndsWith<T> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let this = self.get_mut();
        let ended = this.poll_ended(cx);
        match Pin::new(&mut this.inner).poll_read(cx, buf) {
            // Nothing buffered and nothing will come: EOF.
            Poll::Pending if ended => Poll::Ready(Ok(())),
            other => other,
        }
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for EndsWith<T> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        let this = self.get_mut();
        if this.poll_ended(cx) {
            return Poll::Ready(Err(exec_ended()));
        }
        Pin::new(&mut this.inner).poll_write(cx, buf)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        let this = self.get_mut();
        if this.poll_ended(cx) {
            return Poll::Ready(Ok(()));
        }
        Pin::new(&mut this.inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        let this = self.get_mut();
        if this.poll_ended(cx) {
            return Poll::Ready(Ok(()));
        }
        Pin::new(&mut this.inner).poll_shutdown(cx)
    }
}

fn exec_ended() -> std::io::Error {
    std::io::Error::new(std::io::ErrorKind::BrokenPipe, "the exec has ended")
}

#[async_trait::async_trait]
impl SandboxExec for KubeExec {
    async fn exec(&self, target: &ExecTarget, argv: &[String]) -> Result<ExecSession, ExecError> {
        // agent-sandbox names the pod after the Sandbox unless it says otherwise.
        let pod = target.pod.as_deref().unwrap_or(&target.sandbox);
        let session = self.start(pod, argv).await.map_err(|error| match error {
            KubeExecError::PodNotFound(_) => ExecError::NotFound(target.sandbox.clone()),
            other => ExecError::transport(format!("exec in pod {pod}"), other),
        })?;
        let sandbox = target.sandbox.clone();
        let done = async move {
            session
                .done
                .await
                .map_err(|error| ExecError::transport(format!("exec in sandbox {sandbox}"), error))
        }
        .boxed();
        Ok(ExecSession {
            stdin: session.stdin,
            stdout: session.stdout,
            done,
        })
    }
}

/// Reads `reader` to its end and keeps the last `keep` bytes.
async fn drain_tail(mut reader: impl AsyncRead + Unpin, keep: usize) -> Vec<u8> {
    let mut tail = Vec::with_capacity(keep);
    let mut buf = vec![0u8; 4096];
    loop {
        match reader.read(&mut buf).await {
            Ok(0) | Err(_) => return tail,
            Ok(n) => {
                tail.extend_from_slice(&buf[..n]);
                if tail.len() > keep {
                    tail.drain(..tail.len() - keep);
                }
            }
        }
    }
}

/// The exit code in an exec status. A real kubelet reports success as
/// `Success` and a non-zero exit as `NonZeroExitCode` with an `ExitCode`
/// cause; kwok wraps the error, so only its message says `exit status N`.
/// Any other failure means the command did not run to an exit code.
pub fn exit_code(status: &Status) -> Result<i32, KubeExecError> {
    if status.status.as_deref() == Some("Success") {
        return Ok(0);
    }
    let from_cause = status
        .details
        .as_ref()
        .and_then(|details| details.causes.as_ref())
        .and_then(|causes| {
            causes
                .iter()
                .find(|cause| cause.reason.as_deref() == Some("ExitCode"))
        })
        .and_then(|cause| cause.message.as_deref()?.trim().parse().ok());
    let message = status.message.as_deref().unwrap_or_default();
    from_cause
        .or_else(|| {
            let rest = &message[message.rfind("exit status ")? + "exit status ".len()..];
            let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
            digits.parse().ok()
        })
        .ok_or_else(|| {
            let reason = status.reason.as_deref().unwrap_or("Failure");
            KubeExecError::Failed(if message.is_empty() {
                reason.to_string()
            } else {
                format!("{reason}: {message}")
            })
        })
}

#[cfg(test)]
mod tests;
