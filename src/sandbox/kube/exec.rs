//! Exec into sandbox pods through the Kubernetes API: the `kube` side of the
//! delivery exec port.
//!
//! One exec runs one command with stdin, stdout and stderr attached, over a
//! `pods/exec` WebSocket opened with [`Client::connect`] (subprotocol
//! `v5.channel.k8s.io`, falling back to `v4.channel.k8s.io`). The channel
//! framing is done here rather than by kube-rs's `AttachedProcess`, which
//! sends stdin in 4 KiB messages: every message costs a flush, a TLS record
//! and a round through the API server's proxy, so bundles go out in messages
//! of up to [`STDIN_FRAME`] bytes instead.
//!
//! Every message is one channel byte and its payload: `0` stdin, `1` stdout,
//! `2` stderr, `3` the exit status (a JSON `Status`), and in v5 only `255`
//! "this channel is closed" with the channel as payload. The caller writes
//! stdin and reads stdout concurrently; stderr is kept here (its tail, for
//! the log). A real kubelet reports a non-zero exit as reason
//! `NonZeroExitCode` with an `ExitCode` cause, kwok only as `… exit status N`
//! in the message; both are understood.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures::future::BoxFuture;
use futures::stream::{SplitSink, SplitStream};
use futures::{FutureExt, SinkExt, StreamExt};
use hyper_util::rt::TokioIo;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Status;
use kube::api::AttachParams;
use kube::{Api, Client, Resource};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, DuplexStream};
use tokio::task::JoinHandle;
use tokio_tungstenite::tungstenite::{self, Message};
use tokio_tungstenite::WebSocketStream;
use tokio_util::sync::CancellationToken;

use crate::delivery::{ExecError, ExecSession, ExecTarget, SandboxExec};

/// Largest stdin payload of one WebSocket message (the issue's "~1 MiB
/// frames"); smaller when the caller has written less so far.
pub const STDIN_FRAME: usize = 1 << 20;

/// Size of the stdin pipe between the caller and the WebSocket task: the
/// caller's writes complete as soon as they fit, so about this much plus
/// one frame is in flight per exec.
pub const STDIN_BUFFER: usize = 1 << 20;

/// Size of the stdout pipe; the scripts print a few short lines.
const STDOUT_BUFFER: usize = 64 << 10;

/// How much of stderr is kept for the log (the end: errors come last).
const STDERR_KEEP: usize = 4 << 10;

/// Keeps an otherwise quiet connection (a long scan after the bundle was
/// received) alive through proxies with idle timeouts.
const PING_EVERY: Duration = Duration::from_secs(60);

/// How long the end of an exec waits to send its close frame.
const CLOSE_GRACE: Duration = Duration::from_secs(1);

/// Channel ids of the `channel.k8s.io` subprotocols.
const STDIN: u8 = 0;
const STDOUT: u8 = 1;
const STDERR: u8 = 2;
const STATUS: u8 = 3;
/// v5 only: the channel in the payload is closed (sent for stdin at EOF).
const CLOSE: u8 = 255;

type Socket = WebSocketStream<TokioIo<hyper::upgrade::Upgraded>>;

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
            .stderr(true);
        let api_error = |source: kube::Error| match &source {
            kube::Error::Api(status) if status.code == 404 => {
                KubeExecError::PodNotFound(pod.to_string())
            }
            _ => KubeExecError::Api {
                context: format!("exec into pod {pod}"),
                source,
            },
        };
        let request = kube::core::Request::new(Pod::url_path(&(), Some(&self.namespace)))
            .exec(pod, argv, &params)
            .map_err(|e| api_error(kube::Error::BuildRequest(e)))?;
        let connection = self.client.connect(request).await.map_err(api_error)?;
        let v5 = connection.supports_stream_close();
        let (stdin, stdin_pump) = tokio::io::duplex(STDIN_BUFFER);
        let (stdout, stdout_pump) = tokio::io::duplex(STDOUT_BUFFER);
        let pod = pod.to_string();
        // The pump owns the far ends of both pipes: when it ends (status,
        // broken stream, abort), the caller's stdout reads EOF and its
        // stdin writes fail instead of waiting for a reader that is gone.
        let pump = tokio::spawn(async move {
            let (status, stderr) =
                pump(connection.into_stream(), v5, stdin_pump, stdout_pump).await;
            let outcome = status.and_then(|status| exit_code(&status));
            if !stderr.is_empty() {
                let stderr = String::from_utf8_lossy(&stderr);
                match &outcome {
                    Ok(0) => tracing::debug!(%pod, %stderr, "exec stderr"),
                    _ => tracing::warn!(%pod, %stderr, "exec stderr"),
                }
            }
            outcome
        });
        // Dropping `done` before the end aborts the exec (and its stream).
        let mut pump = AbortOnDrop(pump);
        let done =
            async move { (&mut pump.0).await.unwrap_or(Err(KubeExecError::NoStatus)) }.boxed();
        Ok(KubeExecSession {
            stdin: Box::new(stdin),
            stdout: Box::new(stdout),
            done,
        })
    }
}

/// Aborts a task when dropped.
struct AbortOnDrop<T>(JoinHandle<T>);

impl<T> Drop for AbortOnDrop<T> {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Runs one exec's stream to its end: stdin out, stdout and stderr in,
/// until the status arrives or the stream ends. Returns the status and the
/// tail of stderr.
async fn pump(
    socket: Socket,
    v5: bool,
    stdin: DuplexStream,
    stdout: DuplexStream,
) -> (Result<Status, KubeExecError>, Vec<u8>) {
    let (sink, stream) = socket.split();
    let stop = CancellationToken::new();
    // Sending and receiving run side by side: a send that waits on a
    // server that stopped reading must not keep its status from us.
    let send = send_stdin(sink, stdin, v5, stop.clone());
    let receive = receive(stream, stdout);
    tokio::pin!(send, receive);
    let mut sent = None;
    let (status, stderr) = loop {
        tokio::select! {
            received = &mut receive => break received,
            result = &mut send, if sent.is_none() => sent = Some(result),
        }
    };
    stop.cancel();
    if sent.is_none() {
        sent = tokio::time::timeout(CLOSE_GRACE, &mut send).await.ok();
    }
    let status = match (status, sent) {
        // A stream that ended without a status broke on the way out, if
        // that is what happened.
        (Err(KubeExecError::NoStatus), Some(Err(error))) => {
            Err(KubeExecError::Stream(Box::new(error)))
        }
        (status, _) => status,
    };
    (status, stderr)
}

/// Sends stdin in messages of up to [`STDIN_FRAME`] bytes, and a ping now
/// and then, until `stop`; then closes the socket. At stdin's EOF a v5
/// stream is told that stdin is closed; v4 cannot say so, and closing the
/// socket would lose the status, so it is left open (the scripts never
/// wait for EOF).
async fn send_stdin(
    mut sink: SplitSink<Socket, Message>,
    mut stdin: DuplexStream,
    v5: bool,
    stop: CancellationToken,
) -> Result<(), tungstenite::Error> {
    let mut ping = tokio::time::interval_at(tokio::time::Instant::now() + PING_EVERY, PING_EVERY);
    ping.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut open = true;
    loop {
        tokio::select! {
            biased;
            () = stop.cancelled() => {
                let _ = sink.close().await;
                return Ok(());
            }
            _ = ping.tick() => sink.send(Message::Ping(Bytes::new())).await?,
            frame = read_frame(&mut stdin), if open => match frame {
                Some(frame) => sink.send(Message::Binary(frame)).await?,
                None => {
                    open = false;
                    if v5 {
                        sink.send(Message::binary(vec![CLOSE, STDIN])).await?;
                    }
                }
            },
        }
    }
}

/// The next stdin message: the channel byte and what the caller has
/// written so far, up to [`STDIN_FRAME`] bytes; `None` at EOF. Waits only
/// for the first bytes, so a short write still goes out at once.
/// Cancel-safe: nothing is consumed before the one await completes.
async fn read_frame(stdin: &mut DuplexStream) -> Option<Bytes> {
    let mut frame = vec![0u8; STDIN_FRAME + 1];
    frame[0] = STDIN;
    let mut filled = 1;
    match stdin.read(&mut frame[filled..]).await {
        Ok(0) | Err(_) => return None,
        Ok(n) => filled += n,
    }
    while filled < frame.len() {
        match stdin.read(&mut frame[filled..]).now_or_never() {
            Some(Ok(n)) if n > 0 => filled += n,
            _ => break,
        }
    }
    frame.truncate(filled);
    Some(Bytes::from(frame))
}

/// Receives until the status (or the end of the stream): stdout into the
/// caller's pipe, the last [`STDERR_KEEP`] bytes of stderr into the result.
async fn receive(
    mut stream: SplitStream<Socket>,
    mut stdout: DuplexStream,
) -> (Result<Status, KubeExecError>, Vec<u8>) {
    let mut stderr = Vec::new();
    let mut stdout_open = true;
    let status = loop {
        let bin = match stream.next().await {
            None => break Err(KubeExecError::NoStatus),
            Some(Err(error)) => break Err(KubeExecError::Stream(Box::new(error))),
            Some(Ok(Message::Binary(bin))) => bin,
            // Close, ping and pong frames are tungstenite's business.
            Some(Ok(_)) => continue,
        };
        // Every channel starts with a message of just its id.
        let Some((&channel, payload)) = bin.split_first() else {
            continue;
        };
        if payload.is_empty() {
            continue;
        }
        match channel {
            STDOUT if stdout_open => {
                // A caller that dropped stdout no longer wants it.
                stdout_open = stdout.write_all(payload).await.is_ok();
            }
            STDERR => {
                stderr.extend_from_slice(payload);
                if stderr.len() > STDERR_KEEP {
                    stderr.drain(..stderr.len() - STDERR_KEEP);
                }
            }
            STATUS => {
                break serde_json::from_slice::<Status>(payload)
                    .map_err(|error| KubeExecError::Stream(Box::new(error)));
            }
            _ => {}
        }
    };
    (status, stderr)
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
