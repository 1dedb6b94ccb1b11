//! Hostile clients over real HTTP (and raw TCP where a well-behaved client
//! cannot misbehave): stalled and half-sent requests, connection floods,
//! metric label floods, private files and error bodies. Each attack also
//! checks that another user is still served promptly.

use std::net::{IpAddr, SocketAddr};
use std::time::{Duration, Instant};

use crate::common::workload_bundles::{tgz, MEDIA};
use crate::common::{assert_error, TestServer};
use context_service::config::ServeConfig;
use futures::StreamExt as _;
use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpSocket, TcpStream};

/// How fast another user must be answered while an attack runs.
const PROMPT: Duration = Duration::from_secs(1);

/// The address of another client than the attacker (Linux routes all of
/// 127.0.0.0/8 to loopback).
const OTHER_CLIENT: &str = "127.0.0.2";

fn addr(server: &TestServer) -> SocketAddr {
    server
        .base
        .trim_start_matches("http://")
        .parse()
        .expect("server address")
}

/// A raw TCP connection to the server from `from` (the attacker uses
/// 127.0.0.1).
async fn connect_from(server: &TestServer, from: &str) -> TcpStream {
    let socket = TcpSocket::new_v4().unwrap();
    socket
        .bind(SocketAddr::new(from.parse().unwrap(), 0))
        .unwrap();
    socket.connect(addr(server)).await.unwrap()
}

async fn connect(server: &TestServer) -> TcpStream {
    connect_from(server, "127.0.0.1").await
}

/// An HTTP client whose connections come from [`OTHER_CLIENT`].
fn other_client() -> reqwest::Client {
    context_service::client::install_crypto_provider();
    reqwest::Client::builder()
        .local_address(OTHER_CLIENT.parse::<IpAddr>().unwrap())
        .build()
        .unwrap()
}

/// Asserts that another user gets `/healthz` and their workload list
/// within [`PROMPT`].
async fn assert_others_served(server: &TestServer, token: &str) {
    let http = other_client();
    let started = Instant::now();
    let health = tokio::time::timeout(
        PROMPT,
        http.get(format!("{}{}", server.base, "/healthz")).send(),
    )
    .await
    .expect("/healthz answers promptly during the attack")
    .unwrap();
    assert_eq!(health.status(), 200);
    let list = tokio::time::timeout(
        PROMPT,
        http.get(format!("{}{}", server.base, "/v1/workloads"))
            .bearer_auth(token)
            .send(),
    )
    .await
    .expect("the workloads API answers promptly during the attack")
    .unwrap();
    assert_eq!(list.status(), 200, "{}", list.text().await.unwrap());
    assert!(started.elapsed() < 2 * PROMPT);
}

/// Reads until the server closes the connection or `limit` passes; returns
/// what arrived and when the connection closed (`None`: still open).
async fn read_until_closed(stream: &mut TcpStream, limit: Duration) -> (Vec<u8>, Option<Duration>) {
    let started = Instant::now();
    let mut got = Vec::new();
    let mut buf = [0u8; 8192];
    loop {
        let left = limit.saturating_sub(started.elapsed());
        match tokio::time::timeout(left, stream.read(&mut buf)).await {
            Err(_) => return (got, None),
            Ok(Ok(0) | Err(_)) => return (got, Some(started.elapsed())),
            Ok(Ok(n)) => got.extend_from_slice(&buf[..n]),
        }
    }
}

/// A raw HTTP/1.1 response: status, lower-cased head, body.
struct RawResponse {
    status: u16,
    head: String,
    body: Vec<u8>,
}

impl RawResponse {
    fn parse(bytes: &[u8]) -> Self {
        let text = String::from_utf8_lossy(bytes);
        let (head, _) = text
            .split_once("\r\n\r\n")
            .unwrap_or_else(|| panic!("no complete response head in {text:?}"));
        let status = head
            .split(' ')
            .nth(1)
            .and_then(|s| s.parse().ok())
            .unwrap_or_else(|| panic!("no status in {head:?}"));
        let body = bytes[head.len() + 4..].to_vec();
        Self {
            status,
            head: head.to_ascii_lowercase(),
            body,
        }
    }

    /// Asserts the status and the JSON error body.
    fn assert_error(&self, status: u16, code: &str, message_part: &str) {
        let text = String::from_utf8_lossy(&self.body);
        assert_eq!(self.status, status, "{}\n\n{text}", self.head);
        assert!(
            self.head.contains("content-type: application/json"),
            "{}",
            self.head
        );
        let body: Value = serde_json::from_slice(&self.body)
            .unwrap_or_else(|e| panic!("error body is not JSON ({e}): {text}"));
        assert_eq!(body["error"], code, "{text}");
        let message = body["message"].as_str().expect("message");
        assert!(
            message.contains(message_part),
            "message {message:?} should contain {message_part:?}"
        );
    }
}

/// Creates the workload `name` for `token`'s owner.
async fn create_workload(server: &TestServer, token: &str, name: &str) {
    let resp = server
        .http()
        .post(format!("{}{}", server.base, "/v1/workloads"))
        .bearer_auth(token)
        .json(&serde_json::json!({ "name": name }))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 201, "{}", resp.text().await.unwrap());
}

fn files_in(dir: &std::path::Path) -> usize {
    std::fs::read_dir(dir)
        .map(std::iter::Iterator::count)
        .unwrap_or(0)
}

#[tokio::test]
async fn half_sent_and_idle_connections_are_closed_after_the_header_timeout() {
    let server = TestServer::start_with(|c| {
        c.header_read_timeout = Duration::from_secs(1);
        c.max_connections_per_ip = 0;
    })
    .await;
    let bob = server.user_token("bob");

    // 100 half request lines and 100 silent sockets.
    let mut attackers = Vec::new();
    for i in 0..200 {
        let mut stream = connect(&server).await;
        if i % 2 == 0 {
            stream.write_all(b"GET /heal").await.unwrap();
        }
        attackers.push(stream);
    }
    // A keep-alive connection that went idle after one request.
    let mut idle = connect(&server).await;
    idle.write_all(b"GET /healthz HTTP/1.1\r\nhost: x\r\n\r\n")
        .await
        .unwrap();
    let mut first = [0u8; 12];
    idle.read_exact(&mut first).await.unwrap();
    assert_eq!(&first, b"HTTP/1.1 200");
    let started = Instant::now();

    assert_others_served(&server, &bob).await;

    let (_, closed) = read_until_closed(&mut idle, Duration::from_secs(5)).await;
    let closed = closed.expect("an idle keep-alive connection is closed");
    assert!(closed <= Duration::from_secs(3), "{closed:?}");
    for mut stream in attackers {
        let (got, closed) = read_until_closed(&mut stream, Duration::from_secs(5)).await;
        assert!(closed.is_some(), "a stalled connection is closed");
        assert!(got.is_empty(), "closed without an answer: {got:?}");
    }
    let elapsed = started.elapsed();
    assert!(
        elapsed >= Duration::from_millis(800) && elapsed <= Duration::from_secs(4),
        "closed after {elapsed:?}, not after the 1s header timeout"
    );
    assert_others_served(&server, &bob).await;
}

#[tokio::test]
async fn stalled_chunked_upload_answers_408() {
    let server = TestServer::start_with(|c| c.body_idle_timeout = Duration::from_secs(1)).await;
    let alice = server.user_token("alice");
    let bob = server.user_token("bob");
    create_workload(&server, &alice, "w").await;

    let mut stream = connect(&server).await;
    let head = format!(
        "PUT /v1/workloads/w/bundle HTTP/1.1\r\nhost: x\r\nauthorization: Bearer {alice}\r\n\
         content-type: {MEDIA}\r\ntransfer-encoding: chunked\r\n\r\n"
    );
    stream.write_all(head.as_bytes()).await.unwrap();
    let bundle = tgz(&[("a", b"a")]);
    let chunk = &bundle[..bundle.len() / 2];
    stream
        .write_all(format!("{:x}\r\n", chunk.len()).as_bytes())
        .await
        .unwrap();
    stream.write_all(chunk).await.unwrap();
    stream.write_all(b"\r\n").await.unwrap();
    // ...and nothing more.
    assert_others_served(&server, &bob).await;
    let (got, closed) = read_until_closed(&mut stream, Duration::from_secs(5)).await;
    assert!(closed.is_some(), "the connection is closed after the 408");
    let resp = RawResponse::parse(&got);
    resp.assert_error(408, "request_timeout", "1s");
    assert!(resp.head.contains("connection: close"), "{}", resp.head);

    // Nothing of the stalled upload stays, and the workload still takes one.
    assert_eq!(files_in(&server.data_dir.join("tmp")), 0);
    let resp = server
        .http()
        .put(format!("{}{}", server.base, "/v1/workloads/w/bundle"))
        .bearer_auth(&alice)
        .header("content-type", MEDIA)
        .body(bundle)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 201, "{}", resp.text().await.unwrap());
}

#[tokio::test]
async fn body_shorter_than_its_content_length_answers_408() {
    let server = TestServer::start_with(|c| c.body_idle_timeout = Duration::from_secs(1)).await;
    let alice = server.user_token("alice");
    let bob = server.user_token("bob");
    create_workload(&server, &alice, "w").await;

    let requests = [
        format!(
            "POST /v1/workloads HTTP/1.1\r\nhost: x\r\nauthorization: Bearer {alice}\r\n\
             content-type: application/json\r\ncontent-length: 100\r\n\r\n{{\"name\":"
        ),
        format!(
            "PUT /v1/workloads/w/bundle HTTP/1.1\r\nhost: x\r\nauthorization: Bearer {alice}\r\n\
             content-type: {MEDIA}\r\ncontent-length: 5000\r\n\r\n"
        ),
    ];
    // The upload sends the first 20 bytes of a real bundle.
    let partial_bundle = tgz(&[("a", b"a")])[..20].to_vec();
    for (request, body) in requests.into_iter().zip([Vec::new(), partial_bundle]) {
        let mut stream = connect(&server).await;
        stream.write_all(request.as_bytes()).await.unwrap();
        stream.write_all(&body).await.unwrap();
        assert_others_served(&server, &bob).await;
        let (got, closed) = read_until_closed(&mut stream, Duration::from_secs(5)).await;
        assert!(closed.is_some());
        RawResponse::parse(&got).assert_error(
            408,
            "request_timeout",
            "no part of the request body",
        );
    }
}

#[tokio::test]
async fn slow_json_requests_meet_the_deadline_but_uploads_stream_past_it() {
    let server = TestServer::start_with(|c| {
        c.body_idle_timeout = Duration::from_secs(1);
        c.request_deadline = Duration::from_millis(1500);
    })
    .await;
    let alice = server.user_token("alice");
    let bob = server.user_token("bob");
    create_workload(&server, &alice, "w").await;

    // A JSON body trickled a byte every 300 ms: never idle for 1s, but past
    // the 1.5s deadline.
    let body = br#"{"name": "slow-workload-name"}"#;
    let mut stream = connect(&server).await;
    let head = format!(
        "POST /v1/workloads HTTP/1.1\r\nhost: x\r\nauthorization: Bearer {alice}\r\n\
         content-type: application/json\r\ncontent-length: {}\r\n\r\n",
        body.len()
    );
    stream.write_all(head.as_bytes()).await.unwrap();
    let started = Instant::now();
    let mut answer = Vec::new();
    for byte in body {
        if stream.write_all(&[*byte]).await.is_err() {
            break;
        }
        let mut buf = [0u8; 4096];
        match tokio::time::timeout(Duration::from_millis(300), stream.read(&mut buf)).await {
            Ok(Ok(n)) if n > 0 => {
                answer.extend_from_slice(&buf[..n]);
                break;
            }
            _ => {}
        }
    }
    let (rest, _) = read_until_closed(&mut stream, Duration::from_millis(500)).await;
    answer.extend_from_slice(&rest);
    let elapsed = started.elapsed();
    RawResponse::parse(&answer).assert_error(503, "deadline_exceeded", "1s 500ms");
    assert!(elapsed < Duration::from_secs(3), "{elapsed:?}");
    assert_others_served(&server, &bob).await;

    // A bundle upload sent in pieces 300 ms apart (about 2.4 s) is fine.
    let bundle = tgz(&[("README.md", b"hello, slowly\n")]);
    let pieces: Vec<Vec<u8>> = bundle
        .chunks(bundle.len().div_ceil(8))
        .map(<[u8]>::to_vec)
        .collect();
    let stream = futures::stream::iter(pieces).then(|piece| async move {
        tokio::time::sleep(Duration::from_millis(300)).await;
        Ok::<_, std::io::Error>(piece)
    });
    let resp = server
        .http()
        .put(format!("{}{}", server.base, "/v1/workloads/w/bundle"))
        .bearer_auth(&alice)
        .header("content-type", MEDIA)
        .body(reqwest::Body::wrap_stream(stream))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 201, "{}", resp.text().await.unwrap());
}

#[tokio::test]
async fn connections_over_the_per_address_cap_are_refused_with_503() {
    let server = TestServer::start_with(|c| {
        c.max_connections_per_ip = 4;
        c.header_read_timeout = Duration::from_secs(30);
    })
    .await;
    let bob = server.user_token("bob");
    let mut held = Vec::new();
    for _ in 0..4 {
        held.push(connect(&server).await);
    }
    // Wait until the server has admitted all four (accept is asynchronous).
    tokio::time::sleep(Duration::from_millis(200)).await;
    for _ in 0..3 {
        let mut extra = connect(&server).await;
        let (got, closed) = read_until_closed(&mut extra, Duration::from_secs(3)).await;
        assert!(closed.is_some(), "a refused connection is closed");
        let resp = RawResponse::parse(&got);
        resp.assert_error(503, "too_many_connections", "limit per address");
        assert!(resp.head.contains("retry-after: 1"), "{}", resp.head);
    }
    // Another address is served meanwhile.
    assert_others_served(&server, &bob).await;
    let metrics = other_client()
        .get(format!("{}{}", server.base, "/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        metrics.contains(
            "context_service_http_connections_refused_total{limit=\"max_connections_per_ip\"} 3"
        ),
        "{metrics}"
    );

    // Closing the held connections frees the address's slots.
    drop(held);
    let http = server.http();
    let deadline = Instant::now() + Duration::from_secs(3);
    loop {
        match http
            .get(format!("{}{}", server.base, "/healthz"))
            .send()
            .await
        {
            Ok(resp) if resp.status() == 200 => break,
            other => assert!(Instant::now() < deadline, "still refused: {other:?}"),
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test]
async fn connections_over_the_total_cap_are_refused_with_503() {
    let server = TestServer::start_with(|c| {
        c.max_connections = 3;
        c.max_connections_per_ip = 0;
        c.header_read_timeout = Duration::from_secs(30);
    })
    .await;
    let mut held = Vec::new();
    for _ in 0..3 {
        held.push(connect(&server).await);
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    let mut extra = connect_from(&server, OTHER_CLIENT).await;
    let (got, closed) = read_until_closed(&mut extra, Duration::from_secs(3)).await;
    assert!(closed.is_some());
    RawResponse::parse(&got).assert_error(503, "too_many_connections", "limit of 3 connections");

    held.pop();
    let http = other_client();
    let deadline = Instant::now() + Duration::from_secs(3);
    loop {
        match http
            .get(format!("{}{}", server.base, "/healthz"))
            .send()
            .await
        {
            Ok(resp) if resp.status() == 200 => break,
            other => assert!(Instant::now() < deadline, "still refused: {other:?}"),
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test]
async fn a_connection_serves_at_most_max_requests() {
    let server = TestServer::start_with(|c| c.max_requests_per_connection = 3).await;
    let mut stream = connect(&server).await;
    // Four pipelined requests: three answers, the last marked close.
    let request = "GET /healthz HTTP/1.1\r\nhost: x\r\n\r\n".repeat(4);
    stream.write_all(request.as_bytes()).await.unwrap();
    let (got, closed) = read_until_closed(&mut stream, Duration::from_secs(5)).await;
    assert!(closed.is_some(), "closed after the third answer");
    let text = String::from_utf8_lossy(&got).to_ascii_lowercase();
    assert_eq!(text.matches("http/1.1 200 ok").count(), 3, "{text}");
    let last = text.rsplit("http/1.1 200 ok").next().unwrap();
    assert!(last.contains("connection: close"), "{text}");
}

#[tokio::test]
async fn zero_timeouts_and_caps_are_refused_at_start() {
    let dir = tempfile::tempdir().unwrap();
    let listen: SocketAddr = "127.0.0.1:0".parse().unwrap();
    type Adjust = fn(&mut ServeConfig);
    let cases: [(&str, Adjust); 4] = [
        ("--header-read-timeout", |c| {
            c.header_read_timeout = Duration::ZERO;
        }),
        ("--body-idle-timeout", |c| {
            c.body_idle_timeout = Duration::ZERO;
        }),
        ("--request-deadline", |c| {
            c.request_deadline = Duration::ZERO;
        }),
        ("--max-connections", |c| c.max_connections = 0),
    ];
    for (flag, adjust) in cases {
        let mut config = ServeConfig::with_defaults(dir.path().to_owned(), listen);
        adjust(&mut config);
        let err = context_service::server::Server::bind(&config)
            .await
            .err()
            .unwrap_or_else(|| panic!("{flag} 0 is accepted"));
        assert!(err.to_string().contains(flag), "{err}");
    }
}

#[tokio::test]
async fn a_blocking_pool_the_running_uploads_would_fill_is_refused_at_start() {
    let dir = tempfile::tempdir().unwrap();
    let listen: SocketAddr = "127.0.0.1:0".parse().unwrap();
    let mut config = ServeConfig::with_defaults(dir.path().to_owned(), listen);
    config.upload_max_concurrent = 60;
    config.max_blocking_threads = 75;
    let err = context_service::server::Server::bind(&config)
        .await
        .err()
        .expect("a blocking pool of 75 threads for 60 uploads is accepted");
    assert_eq!(
        err.to_string(),
        "--max-blocking-threads (75) must be at least --upload-max-concurrent (60) + 16: \
         each running upload holds a blocking thread, and store calls need the rest"
    );
    // One more thread is enough.
    config.max_blocking_threads = 76;
    context_service::server::Server::bind(&config)
        .await
        .expect("76 threads for 60 uploads");
}

#[tokio::test]
async fn undecodable_paths_unknown_routes_and_methods_answer_json() {
    let server = TestServer::start().await;
    let alice = server.user_token("alice");
    let http = server.http();
    let get = |path: &str| {
        http.get(format!("{}{}", server.base, path))
            .bearer_auth(&alice)
            .send()
    };
    // %FF is not UTF-8 once percent-decoded.
    for path in [
        "/v1/workloads/%FF",
        "/v1/workloads/a%C3%28b/revisions/x/bundle",
        "/v1/sandbox-pools/%FF",
    ] {
        assert_error(get(path).await.unwrap(), 400, "invalid_request", "UTF-8").await;
    }
    let resp = http
        .put(format!("{}{}", server.base, "/v1/uploads/%FE%FF"))
        .bearer_auth("grant")
        .header("content-type", MEDIA)
        .body("x")
        .send()
        .await
        .unwrap();
    assert_error(resp, 400, "invalid_request", "UTF-8").await;

    // Unknown routes and wrong methods answer like Go's mux (upstream
    // compatibility), not JSON.
    assert_go_text(
        get("/v1/nothing-here").await.unwrap(),
        404,
        "404 page not found\n",
    )
    .await;
    let resp = http
        .patch(format!("{}{}", server.base, "/v1/workloads"))
        .bearer_auth(&alice)
        .send()
        .await
        .unwrap();
    let allow = resp.headers()["allow"].to_str().unwrap().to_owned();
    assert!(allow.contains("GET") && allow.contains("POST"), "{allow}");
    assert_go_text(resp, 405, "Method Not Allowed\n").await;
}

/// A random method token (`A-Z0-9`, 1 to 12 characters) that is not a
/// standard method.
fn random_method(rng: &mut impl rand::Rng) -> String {
    const CHARS: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
    loop {
        let len = rng.random_range(1..=12);
        let m: String = (0..len)
            .map(|_| CHARS[rng.random_range(0..CHARS.len())] as char)
            .collect();
        if !["GET", "HEAD", "POST", "PUT", "DELETE", "PATCH", "OPTIONS"].contains(&m.as_str()) {
            return m;
        }
    }
}

/// Sends 200 requests with invented methods and paths; returns the tokens
/// used, to look for in `/metrics`.
async fn label_flood(server: &TestServer, token: &str) -> Vec<String> {
    let http = server.http();
    let mut used = Vec::new();
    let mut rng = rand::rng();
    for i in 0..200 {
        let invented_method = random_method(&mut rng);
        let invented_path = format!("/zz{}/{}", rand::Rng::random::<u64>(&mut rng), i);
        let (method, path) = match i % 4 {
            // An invented method on a real route, on an invented path, and a
            // standard method on an invented path.
            0 => (invented_method.clone(), "/v1/workloads".to_owned()),
            1 => (invented_method.clone(), invented_path.clone()),
            2 => ("GET".to_owned(), invented_path.clone()),
            _ => ("DELETE".to_owned(), format!("/v1/workloads{invented_path}")),
        };
        let resp = http
            .request(
                reqwest::Method::from_bytes(method.as_bytes()).unwrap(),
                format!("{}{}", server.base, path),
            )
            .bearer_auth(token)
            .send()
            .await
            .unwrap();
        assert!(resp.status().is_client_error(), "{method} {path}");
        used.push(invented_method);
        used.push(invented_path);
    }
    // One 16 KiB method name.
    let long = "X".repeat(16 * 1024);
    let resp = http
        .request(
            reqwest::Method::from_bytes(long.as_bytes()).unwrap(),
            format!("{}{}", server.base, "/healthz"),
        )
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 405);
    used.push(long);
    used
}

async fn metrics_text(http: &reqwest::Client, url: &str) -> String {
    let resp = http.get(url).send().await.unwrap();
    assert_eq!(resp.status(), 200);
    resp.text().await.unwrap()
}

#[tokio::test]
async fn invented_methods_and_paths_add_no_metric_series() {
    let server = TestServer::start().await;
    let alice = server.user_token("alice");
    let http = server.http();
    // Once before, so that /metrics' own series exists in both readings.
    metrics_text(&http, &format!("{}{}", server.base, "/metrics")).await;
    let used = label_flood(&server, &alice).await;
    let first = metrics_text(&http, &format!("{}{}", server.base, "/metrics")).await;
    for token in &used {
        // Paths are long and unique; methods may be short (e.g. "A"), so
        // look for them as label values.
        let leaked = if token.starts_with('/') {
            first.contains(token.as_str())
        } else {
            first.contains(&format!("method=\"{token}\""))
        };
        assert!(!leaked, "{token:?} became a label:\n{first}");
    }
    for series in [
        "method=\"other\",route=\"/v1/workloads\",status=\"405\"",
        "method=\"other\",route=\"unmatched\",status=\"404\"",
        "method=\"GET\",route=\"unmatched\",status=\"404\"",
        "method=\"other\",route=\"/healthz\",status=\"405\"",
    ] {
        assert!(first.contains(series), "{series} missing:\n{first}");
    }

    // A second flood of new names adds no lines.
    label_flood(&server, &alice).await;
    let second = metrics_text(&http, &format!("{}{}", server.base, "/metrics")).await;
    assert_eq!(
        first.lines().count(),
        second.lines().count(),
        "{first}\n----\n{second}"
    );
    assert!(second.len() < 64 * 1024, "{} bytes", second.len());
}

#[tokio::test]
async fn metrics_can_have_their_own_address() {
    let dir = tempfile::tempdir().unwrap();
    let mut config =
        ServeConfig::with_defaults(dir.path().to_owned(), "127.0.0.1:0".parse().unwrap());
    config.metrics_addr = Some("127.0.0.1:0".parse().unwrap());
    config.shutdown_grace = Duration::ZERO;
    let server = context_service::server::Server::bind(&config)
        .await
        .unwrap();
    let api = format!("http://{}", server.local_addr().unwrap());
    let metrics = format!("http://{}", server.metrics_addr().unwrap().unwrap());
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let running = tokio::spawn(server.run(async move {
        let _ = stopped.await;
    }));

    context_service::client::install_crypto_provider();
    let http = reqwest::Client::new();
    assert_eq!(
        http.get(format!("{api}/healthz"))
            .send()
            .await
            .unwrap()
            .status(),
        200
    );
    // Not on the API address...
    assert_go_text(
        http.get(format!("{api}/metrics")).send().await.unwrap(),
        404,
        "404 page not found\n",
    )
    .await;
    // ...but on its own, counting the API's requests.
    let text = metrics_text(&http, &format!("{metrics}/metrics")).await;
    assert!(
        text.contains("method=\"GET\",route=\"/healthz\",status=\"200\"} 1"),
        "{text}"
    );
    // The metrics address serves nothing else.
    assert_go_text(
        http.get(format!("{metrics}/healthz")).send().await.unwrap(),
        404,
        "404 page not found\n",
    )
    .await;

    let _ = stop.send(());
    tokio::time::timeout(Duration::from_secs(10), running)
        .await
        .expect("both listeners stop")
        .unwrap()
        .unwrap();
}

fn mode_of(path: &std::path::Path) -> u32 {
    use std::os::unix::fs::PermissionsExt;
    std::fs::symlink_metadata(path)
        .unwrap()
        .permissions()
        .mode()
        & 0o7777
}

fn chmod(path: &std::path::Path, mode: u32) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
}

/// Every path under `root` but the contents of `root/local` (the local
/// backend's sandboxes), with its mode.
fn modes_under(root: &std::path::Path) -> Vec<(std::path::PathBuf, bool, u32)> {
    let mut out = Vec::new();
    let mut stack = vec![root.to_owned()];
    while let Some(path) = stack.pop() {
        let meta = std::fs::symlink_metadata(&path).unwrap();
        out.push((path.clone(), meta.is_dir(), mode_of(&path)));
        if meta.is_dir() && path != root.join("local") {
            stack.extend(std::fs::read_dir(&path).unwrap().map(|e| e.unwrap().path()));
        }
    }
    out
}

#[tokio::test]
async fn files_under_the_data_dir_are_private_whatever_the_umask() {
    use tokio::io::AsyncBufReadExt;

    // A data dir an older version (or a person) left readable.
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    std::fs::create_dir_all(data.join("old")).unwrap();
    std::fs::write(data.join("notes.txt"), b"n").unwrap();
    std::fs::write(data.join("old/file"), b"f").unwrap();
    chmod(&data, 0o755);
    chmod(&data.join("old"), 0o755);
    chmod(&data.join("notes.txt"), 0o644);
    chmod(&data.join("old/file"), 0o666);

    // The service under umask 000, so that only explicit modes protect.
    let mut child = tokio::process::Command::new("sh")
        .arg("-c")
        .arg(r#"umask 000 && exec "$0" serve --listen 127.0.0.1:0 --data-dir "$1" --log-format json"#)
        .arg(env!("CARGO_BIN_EXE_context-service"))
        .arg(&data)
        .env("RUST_LOG", "info")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut log = tokio::io::BufReader::new(child.stderr.take().unwrap()).lines();
    let mut tightened = None;
    let addr = tokio::time::timeout(Duration::from_secs(60), async {
        while let Some(line) = log.next_line().await.unwrap() {
            let Ok(entry) = serde_json::from_str::<Value>(&line) else {
                continue;
            };
            let fields = &entry["fields"];
            let message = fields["message"].as_str().unwrap_or("");
            if message.contains("data dir private") {
                tightened = Some(fields.clone());
            }
            if message == "listening" {
                return fields["addr"].as_str().unwrap().to_owned();
            }
        }
        panic!("the service exited before listening");
    })
    .await
    .expect("the service starts");
    // The data dir, notes.txt, old/ and old/file were narrowed.
    let tightened = tightened.expect("the tightening is logged");
    assert_eq!(tightened["changed"], 4, "{tightened}");
    assert!(
        tightened["first"].as_str().unwrap().contains("notes.txt"),
        "{tightened}"
    );

    // Use it, so that blobs, spools and the store exist.
    let token = std::fs::read_to_string(data.join("auth/dev-token")).unwrap();
    let base = format!("http://{addr}");
    context_service::client::install_crypto_provider();
    let http = reqwest::Client::new();
    let resp = http
        .post(format!("{base}/v1/workloads"))
        .bearer_auth(token.trim())
        .json(&serde_json::json!({"name": "w"}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 201);
    let resp = http
        .put(format!("{base}/v1/workloads/w/bundle"))
        .bearer_auth(token.trim())
        .header("content-type", MEDIA)
        .body(tgz(&[("a", b"a")]))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 201);

    let modes = modes_under(&data);
    for expected in [
        "store/meta.redb",
        "auth/signing-key.pem",
        "auth/dev-token",
        "auth/server-secret",
        "blobs/sha256",
        "tmp",
        "local",
    ] {
        assert!(
            modes.iter().any(|(p, _, _)| p.ends_with(expected)),
            "{expected} missing from {modes:?}"
        );
    }
    for (path, is_dir, mode) in &modes {
        // Stored blobs are read-only even to the service (they are mapped).
        let want = if *is_dir {
            0o700
        } else if path
            .parent()
            .and_then(|p| p.parent())
            .is_some_and(|p| p.ends_with("blobs/sha256"))
        {
            0o400
        } else {
            0o600
        };
        assert_eq!(*mode, want, "{} is {mode:o}", path.display());
    }
    child.kill().await.unwrap();
}

#[tokio::test]
async fn bundle_size_rejections_answer_their_own_413_code() {
    let server = TestServer::start_with(|c| {
        c.bundle_max_bytes = 64 * 1024;
        c.bundle_max_inflated_bytes = 8192;
        c.bundle_max_entries = 3;
        c.bundle_max_file_bytes = 4000;
    })
    .await;
    let alice = server.user_token("alice");
    let bob = server.user_token("bob");
    let filler = [b'x'; 3000];
    let big = [b'y'; 5000];
    let noisy = crate::common::workload_bundles::noise(100 * 1024, 7);
    let cases: [(Vec<u8>, &str, &str); 4] = [
        // Three files of 3000 bytes: 3 x (512 + 3072) tar bytes > 8192.
        (
            tgz(&[("a", &filler), ("b", &filler), ("c", &filler)]),
            "inflated_too_large",
            "inflates to more than 8192 bytes",
        ),
        (
            tgz(&[("a", b"1"), ("b", b"2"), ("c", b"3"), ("d", b"4")]),
            "too_many_entries",
            "more than 3 entries (at \"d\")",
        ),
        (
            tgz(&[("big", &big)]),
            "file_too_large",
            "\"big\" is 5000 bytes, over the 4000-byte limit",
        ),
        // The compressed size keeps the generic code.
        (
            tgz(&[("n", &noisy)]),
            "upload_too_large",
            "limit is 65536 bytes",
        ),
    ];
    for (i, (bundle, code, message)) in cases.into_iter().enumerate() {
        let name = format!("w{i}");
        create_workload(&server, &alice, &name).await;
        let resp = server
            .http()
            .put(format!("{}/v1/workloads/{name}/bundle", server.base))
            .bearer_auth(&alice)
            .header("content-type", MEDIA)
            .body(bundle)
            .send()
            .await
            .unwrap();
        assert_error(resp, 413, code, message).await;
        assert_others_served(&server, &bob).await;
    }
}

/// A plain-text answer exactly as Go's `net/http` writes it.
async fn assert_go_text(resp: reqwest::Response, status: u16, body: &str) {
    assert_eq!(resp.status().as_u16(), status);
    assert_eq!(
        resp.headers()["content-type"],
        "text/plain; charset=utf-8",
        "content type"
    );
    assert_eq!(resp.text().await.unwrap(), body);
}
