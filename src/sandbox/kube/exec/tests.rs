//! [`KubeExec`] against a fake `pods/exec` endpoint: a real WebSocket server
//! on 127.0.0.1 speaking `v5.channel.k8s.io` or `v4.channel.k8s.io` (kube's
//! `connect` needs a real HTTP upgrade), and a `tower-test` mock for the pod
//! reads.

use std::sync::{Arc, Mutex};

use futures::future::BoxFuture;
use futures::{FutureExt, SinkExt, StreamExt};
use http::{Request, Response, StatusCode};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Status;
use kube::client::Body;
use kube::Client;
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio_tungstenite::tungstenite::handshake::server::Response as WsResponse;
use tokio_tungstenite::tungstenite::handshake::server::{ErrorResponse, Request as WsRequest};
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::WebSocketStream;
use tower_test::mock;

use super::{exit_code, KubeExec, KubeExecError, STDIN_BUFFER, STDIN_FRAME};

const NS: &str = "sandboxes";
const V5: &str = "v5.channel.k8s.io";
const V4: &str = "v4.channel.k8s.io";

type Ws = WebSocketStream<TcpStream>;
type Script = Arc<dyn Fn(Ws, Seen) -> BoxFuture<'static, ()> + Send + Sync>;

/// What the fake endpoint saw.
#[derive(Clone, Default)]
struct Seen {
    /// Path and query of every exec request.
    uris: Arc<Mutex<Vec<String>>>,
    /// Payload size of every stdin message.
    stdin_frames: Arc<Mutex<Vec<usize>>>,
}

impl Seen {
    fn uris(&self) -> Vec<String> {
        self.uris.lock().expect("uris").clone()
    }

    fn frames(&self) -> Vec<usize> {
        self.stdin_frames.lock().expect("frames").clone()
    }
}

/// Serves every connection with `script`; answers `404` with a `Status`
/// body when `missing` is the pod in the path.
async fn fake_endpoint(missing: Option<&'static str>, script: Script) -> (Client, Seen) {
    fake_endpoint_speaking(V5, missing, script).await
}

/// [`fake_endpoint`] answering with subprotocol `protocol`.
async fn fake_endpoint_speaking(
    protocol: &'static str,
    missing: Option<&'static str>,
    script: Script,
) -> (Client, Seen) {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    let seen = Seen::default();
    let server_seen = seen.clone();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let seen = server_seen.clone();
            let script = script.clone();
            tokio::spawn(async move {
                let uris = seen.uris.clone();
                // The handshake callback's signature is tungstenite's.
                #[allow(clippy::result_large_err)]
                let callback = move |request: &WsRequest, mut response: WsResponse| {
                    let uri = request.uri().to_string();
                    uris.lock().expect("uris").push(uri.clone());
                    if missing.is_some_and(|pod| uri.contains(&format!("/pods/{pod}/"))) {
                        let body = json!({
                            "kind": "Status", "apiVersion": "v1", "metadata": {},
                            "status": "Failure", "reason": "NotFound", "code": 404,
                            "message": "pods \"gone\" not found",
                        })
                        .to_string();
                        let mut error = ErrorResponse::new(Some(body));
                        *error.status_mut() = StatusCode::NOT_FOUND;
                        error.headers_mut().insert(
                            http::header::CONTENT_TYPE,
                            http::HeaderValue::from_static("application/json"),
                        );
                        return Err(error);
                    }
                    response.headers_mut().insert(
                        http::header::SEC_WEBSOCKET_PROTOCOL,
                        http::HeaderValue::from_static(protocol),
                    );
                    Ok(response)
                };
                if let Ok(ws) = tokio_tungstenite::accept_hdr_async(stream, callback).await {
                    script(ws, seen).await;
                }
            });
        }
    });
    let config = kube::Config::new(format!("http://{addr}").parse().expect("url"));
    let client = Client::try_from(config).expect("client");
    (client, seen)
}

/// Reads stdin messages until `n` bytes arrived, recording frame sizes.
async fn read_stdin(ws: &mut Ws, seen: &Seen, n: usize) -> Vec<u8> {
    let mut data = Vec::with_capacity(n);
    while data.len() < n {
        match ws.next().await {
            Some(Ok(Message::Binary(bin))) if bin.first() == Some(&0) => {
                seen.stdin_frames
                    .lock()
                    .expect("frames")
                    .push(bin.len() - 1);
                data.extend_from_slice(&bin[1..]);
            }
            Some(Ok(_)) => {}
            _ => break,
        }
    }
    data
}

async fn send(ws: &mut Ws, channel: u8, payload: &[u8]) {
    let mut message = Vec::with_capacity(payload.len() + 1);
    message.push(channel);
    message.extend_from_slice(payload);
    let _ = ws.send(Message::binary(message)).await;
}

fn kwok_status(code: i32) -> Vec<u8> {
    json!({
        "metadata": {}, "status": "Failure", "reason": "InternalError", "code": 500,
        "message": format!("Internal error occurred: cmd wait: sh -c …: exit status {code}"),
    })
    .to_string()
    .into_bytes()
}

fn run(argv: &[&str]) -> Vec<String> {
    argv.iter().map(std::string::ToString::to_string).collect()
}

/// Writes `input` and reads stdout at the same time, then awaits the end.
async fn exchange(
    exec: &KubeExec,
    pod: &str,
    input: Vec<u8>,
) -> (Vec<u8>, Result<i32, KubeExecError>) {
    let session = exec
        .start(pod, &run(&["sh", "-c", "head -c N"]))
        .await
        .expect("start");
    let mut stdin = session.stdin;
    let write = async move {
        stdin.write_all(&input).await.expect("write stdin");
        // Kept open, as kwok would: the remote side must not need EOF.
        stdin
    };
    let mut stdout = session.stdout;
    let read = async move {
        let mut out = Vec::new();
        stdout.read_to_end(&mut out).await.expect("read stdout");
        out
    };
    let (_stdin, out) = tokio::join!(write, read);
    (out, session.done.await)
}

#[tokio::test]
async fn streams_stdin_and_stdout_and_reads_kwoks_exit_status() {
    const N: usize = 3 * STDIN_BUFFER + 12_345;
    let script: Script = Arc::new(|mut ws, seen| {
        async move {
            let data = read_stdin(&mut ws, &seen, N).await;
            for chunk in data.chunks(64 << 10) {
                send(&mut ws, 1, chunk).await;
            }
            // Far more stderr than its pipe holds: it must be drained.
            send(&mut ws, 2, &vec![b'e'; 256 << 10]).await;
            send(&mut ws, 3, &kwok_status(3)).await;
            let _ = ws.close(None).await;
        }
        .boxed()
    });
    let (client, seen) = fake_endpoint(None, script).await;
    let exec = KubeExec::new(client, NS, Some("work".into()));
    let input: Vec<u8> = (0..N).map(|i| (i % 251) as u8).collect();
    let (out, done) = exchange(&exec, "box-0", input.clone()).await;
    assert_eq!(out.len(), input.len());
    assert!(out == input, "stdout differs from stdin");
    assert_eq!(done.expect("exit"), 3);

    let uris = seen.uris();
    assert_eq!(uris.len(), 1, "{uris:?}");
    let uri = &uris[0];
    assert!(
        uri.starts_with(&format!("/api/v1/namespaces/{NS}/pods/box-0/exec?")),
        "{uri}"
    );
    for part in [
        "container=work",
        "stdin=true",
        "stdout=true",
        "stderr=true",
        "command=sh",
        "command=-c",
    ] {
        assert!(uri.contains(part), "{part} missing in {uri}");
    }
    // Written at once, the bundle goes out in full 1 MiB messages (kube-rs's
    // AttachedProcess sent 4 KiB ones), then the rest.
    let frames = seen.frames();
    assert_eq!(frames.iter().sum::<usize>(), N);
    assert_eq!(
        frames,
        [STDIN_FRAME, STDIN_FRAME, STDIN_FRAME, N - 3 * STDIN_FRAME],
        "stdin message sizes"
    );
}

#[tokio::test]
async fn a_short_write_goes_out_at_once() {
    let script: Script = Arc::new(|mut ws, seen| {
        async move {
            let data = read_stdin(&mut ws, &seen, 5).await;
            send(&mut ws, 1, &data).await;
            let data = read_stdin(&mut ws, &seen, 3).await;
            send(&mut ws, 1, &data).await;
            send(&mut ws, 3, &kwok_status(0)).await;
        }
        .boxed()
    });
    let (client, seen) = fake_endpoint(None, script).await;
    let exec = KubeExec::new(client, NS, Some("work".into()));
    let mut session = exec.start("box-0", &run(&["cat"])).await.expect("start");
    let mut echo = [0u8; 5];
    // Neither write fills a frame, and nothing is flushed or closed: each
    // must still reach the command before the next is made.
    session.stdin.write_all(b"hello").await.expect("write");
    session.stdout.read_exact(&mut echo).await.expect("echo");
    assert_eq!(&echo, b"hello");
    session.stdin.write_all(b"abc").await.expect("write");
    session
        .stdout
        .read_exact(&mut echo[..3])
        .await
        .expect("echo");
    assert_eq!(&echo[..3], b"abc");
    assert_eq!(session.done.await.expect("exit"), 0);
    assert_eq!(seen.frames(), [5, 3]);
}

/// Writes `hello`, closes stdin and expects exit 0; `ws_end` is what the
/// server saw after the 5 bytes: the messages up to the client's close
/// frame, or up to a 500 ms pause, whichever comes first.
async fn close_stdin_with(protocol: &'static str) -> Vec<Vec<u8>> {
    let after = Arc::new(Mutex::new(Vec::new()));
    let recorded = after.clone();
    let script: Script = Arc::new(move |mut ws, seen| {
        let recorded = recorded.clone();
        async move {
            let data = read_stdin(&mut ws, &seen, 5).await;
            let pause = std::time::Duration::from_millis(500);
            while let Ok(Some(Ok(message))) = tokio::time::timeout(pause, ws.next()).await {
                match message {
                    Message::Binary(bin) => recorded.lock().expect("after").push(bin.to_vec()),
                    Message::Close(_) => break,
                    _ => {}
                }
            }
            // The connection is still up: the output and status arrive.
            send(&mut ws, 1, &data).await;
            send(&mut ws, 3, br#"{"metadata":{},"status":"Success"}"#).await;
            let _ = ws.close(None).await;
        }
        .boxed()
    });
    let (client, _) = fake_endpoint_speaking(protocol, None, script).await;
    let exec = KubeExec::new(client, NS, Some("work".into()));
    let session = exec.start("box-0", &run(&["cat"])).await.expect("start");
    let mut stdin = session.stdin;
    stdin.write_all(b"hello").await.expect("write");
    drop(stdin);
    let mut out = Vec::new();
    let mut stdout = session.stdout;
    stdout.read_to_end(&mut out).await.expect("read");
    assert_eq!(out, b"hello");
    assert_eq!(session.done.await.expect("exit"), 0);
    let seen = after.lock().expect("after").clone();
    seen
}

#[tokio::test]
async fn v5_says_when_stdin_is_closed() {
    assert_eq!(close_stdin_with(V5).await, [vec![255u8, 0]]);
}

#[tokio::test]
async fn v4_cannot_close_stdin_so_leaves_the_stream_open() {
    // Closing the socket instead (kube-rs's way) would lose the status.
    assert!(close_stdin_with(V4).await.is_empty());
}

#[tokio::test]
async fn a_close_frame_without_a_status_is_no_status() {
    let script: Script = Arc::new(|mut ws, _| {
        async move {
            send(&mut ws, 1, b"NEED 10\n").await;
            send(&mut ws, 2, b"killed").await;
            let _ = ws.close(None).await;
            // Drain until the client answers the close.
            while let Some(Ok(_)) = ws.next().await {}
        }
        .boxed()
    });
    let (client, _) = fake_endpoint(None, script).await;
    let exec = KubeExec::new(client, NS, Some("work".into()));
    let (out, done) = exchange(&exec, "box-0", Vec::new()).await;
    assert_eq!(out, b"NEED 10\n");
    let error = done.expect_err("no status");
    assert!(matches!(error, KubeExecError::NoStatus), "{error:?}");
}

#[tokio::test]
async fn the_client_closes_the_socket_after_the_status() {
    let closed = Arc::new(Mutex::new(false));
    let recorded = closed.clone();
    let script: Script = Arc::new(move |mut ws, _| {
        let recorded = recorded.clone();
        async move {
            send(&mut ws, 3, &kwok_status(4)).await;
            let wait = std::time::Duration::from_secs(10);
            while let Ok(Some(Ok(message))) = tokio::time::timeout(wait, ws.next()).await {
                if let Message::Close(_) = message {
                    *recorded.lock().expect("closed") = true;
                    break;
                }
            }
        }
        .boxed()
    });
    let (client, _) = fake_endpoint(None, script).await;
    let exec = KubeExec::new(client, NS, Some("work".into()));
    let (out, done) = exchange(&exec, "box-0", Vec::new()).await;
    assert!(out.is_empty());
    assert_eq!(done.expect("exit"), 4);
    // The server's side sees the close frame shortly after.
    for _ in 0..100 {
        if *closed.lock().expect("closed") {
            return;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    panic!("no close frame after the status");
}

#[tokio::test]
async fn a_bad_status_is_a_stream_error() {
    let script: Script = Arc::new(|mut ws, _| {
        async move {
            send(&mut ws, 3, b"not json").await;
        }
        .boxed()
    });
    let (client, _) = fake_endpoint(None, script).await;
    let exec = KubeExec::new(client, NS, Some("work".into()));
    let (_, done) = exchange(&exec, "box-0", Vec::new()).await;
    let error = done.expect_err("bad status");
    assert!(matches!(error, KubeExecError::Stream(_)), "{error:?}");
}

#[tokio::test]
async fn success_status_is_exit_zero() {
    let script: Script = Arc::new(|mut ws, seen| {
        async move {
            let data = read_stdin(&mut ws, &seen, 5).await;
            send(&mut ws, 1, &data).await;
            send(&mut ws, 3, br#"{"metadata":{},"status":"Success"}"#).await;
            let _ = ws.close(None).await;
        }
        .boxed()
    });
    let (client, _) = fake_endpoint(None, script).await;
    let exec = KubeExec::new(client, NS, Some("work".into()));
    let (out, done) = exchange(&exec, "box-0", b"hello".to_vec()).await;
    assert_eq!(out, b"hello");
    assert_eq!(done.expect("exit"), 0);
}

#[tokio::test]
async fn a_dropped_connection_is_an_error_not_an_exit_code() {
    let script: Script = Arc::new(|mut ws, _| {
        async move {
            send(&mut ws, 1, b"NEED 10\n").await;
            drop(ws);
        }
        .boxed()
    });
    let (client, _) = fake_endpoint(None, script).await;
    let exec = KubeExec::new(client, NS, Some("work".into()));
    let (out, done) = exchange(&exec, "box-0", Vec::new()).await;
    assert_eq!(out, b"NEED 10\n");
    let error = done.expect_err("no status");
    assert!(
        matches!(error, KubeExecError::NoStatus | KubeExecError::Stream(_)),
        "{error:?}"
    );
}

#[tokio::test]
async fn exec_into_a_missing_pod_is_pod_not_found() {
    let script: Script = Arc::new(|_, _| async {}.boxed());
    let (client, _) = fake_endpoint(Some("gone"), script).await;
    let exec = KubeExec::new(client, NS, Some("work".into()));
    let error = exec
        .start("gone", &run(&["true"]))
        .await
        .err()
        .expect("missing pod");
    assert!(
        matches!(&error, KubeExecError::PodNotFound(pod) if pod == "gone"),
        "{error:?}"
    );
}

#[test]
fn exit_codes_from_a_kubelet_and_from_kwok() {
    let parse = |value: serde_json::Value| {
        exit_code(&serde_json::from_value::<Status>(value).expect("status"))
    };
    assert_eq!(parse(json!({"status": "Success"})).expect("ok"), 0);
    let kubelet = json!({
        "status": "Failure", "reason": "NonZeroExitCode",
        "message": "command terminated with non-zero exit code: error executing command [sh -c exit 7], exit code 7",
        "details": {"causes": [{"reason": "ExitCode", "message": "7"}]},
    });
    assert_eq!(parse(kubelet).expect("code"), 7);
    let kwok = json!({
        "status": "Failure", "reason": "InternalError",
        "message": "Internal error occurred: cmd wait: sh -c 'exit status 9': exit status 42",
    });
    assert_eq!(parse(kwok).expect("code"), 42);
    let no_code = json!({
        "status": "Failure", "reason": "InternalError",
        "message": "Internal error occurred: no exec found for container \"main\" in pod \"ns/p\"",
    });
    match parse(no_code) {
        Err(KubeExecError::Failed(message)) => {
            assert!(message.starts_with("InternalError: "), "{message}");
            assert!(message.contains("no exec found"), "{message}");
        }
        other => panic!("expected Failed, got {other:?}"),
    }
    match parse(json!({"status": "Failure"})) {
        Err(KubeExecError::Failed(message)) => assert_eq!(message, "Failure"),
        other => panic!("expected Failed, got {other:?}"),
    }
}

/// A client whose pod reads are answered by `answer` (path → response).
fn pod_api(
    answer: impl Fn(&str) -> (StatusCode, serde_json::Value) + Send + 'static,
) -> (Client, Arc<Mutex<Vec<String>>>) {
    let (service, mut handle) = mock::pair::<Request<Body>, Response<reqwest::Body>>();
    let paths = Arc::new(Mutex::new(Vec::new()));
    let recorded = paths.clone();
    tokio::spawn(async move {
        while let Some((request, respond)) = handle.next_request().await {
            let path = request.uri().path().to_string();
            recorded.lock().expect("paths").push(path.clone());
            let (status, body) = answer(&path);
            let response = Response::builder()
                .status(status)
                .header("content-type", "application/json")
                .body(reqwest::Body::from(body.to_string()))
                .expect("response");
            respond.send_response(response);
        }
    });
    (Client::new(service, NS), paths)
}

#[tokio::test]
async fn the_container_is_the_configured_one_or_the_pods_first() {
    let (client, paths) = pod_api(|path| {
        if path.ends_with("/pods/box-0") {
            let pod = json!({
                "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "box-0"},
                "spec": {"containers": [
                    {"name": "sandbox", "image": "x"}, {"name": "sidecar", "image": "y"},
                ]},
            });
            (StatusCode::OK, pod)
        } else if path.ends_with("/pods/empty") {
            let pod = json!({
                "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "empty"},
                "spec": {"containers": []},
            });
            (StatusCode::OK, pod)
        } else {
            let status = json!({
                "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                "reason": "NotFound", "code": 404, "message": "pods not found",
            });
            (StatusCode::NOT_FOUND, status)
        }
    });
    let exec = KubeExec::new(client.clone(), NS, None);
    assert_eq!(exec.container_of("box-0").await.expect("first"), "sandbox");
    assert_eq!(
        paths.lock().expect("paths").as_slice(),
        [format!("/api/v1/namespaces/{NS}/pods/box-0")]
    );
    let error = exec.container_of("gone").await.expect_err("missing");
    assert!(
        matches!(&error, KubeExecError::PodNotFound(pod) if pod == "gone"),
        "{error:?}"
    );
    let error = exec.container_of("empty").await.expect_err("no container");
    assert!(
        matches!(&error, KubeExecError::NoContainer(pod) if pod == "empty"),
        "{error:?}"
    );

    let configured = KubeExec::new(client, NS, Some("sidecar".into()));
    paths.lock().expect("paths").clear();
    assert_eq!(
        configured.container_of("box-0").await.expect("configured"),
        "sidecar"
    );
    assert!(
        paths.lock().expect("paths").is_empty(),
        "no pod read needed"
    );
}

#[tokio::test]
async fn writing_into_a_dead_exec_fails_instead_of_hanging() {
    let script: Script = Arc::new(|ws, _| async move { drop(ws) }.boxed());
    let (client, _) = fake_endpoint(None, script).await;
    let exec = KubeExec::new(client, NS, Some("work".into()));
    let mut session = exec.start("box-0", &run(&["true"])).await.expect("start");
    // Far more than the stdin pipe holds: without the end signal the write
    // would wait forever for a reader that is gone.
    let payload = vec![0u8; 4 * STDIN_BUFFER];
    let write = tokio::time::timeout(
        std::time::Duration::from_secs(30),
        session.stdin.write_all(&payload),
    )
    .await
    .expect("the write must end");
    let error = write.expect_err("broken pipe");
    assert_eq!(error.kind(), std::io::ErrorKind::BrokenPipe);
    assert!(session.done.await.is_err());
}
