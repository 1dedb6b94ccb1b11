//! Connections under file-descriptor pressure (issue 37): with a small
//! open-file limit, sockets that connect and send nothing, or idle
//! keep-alive connections, are closed oldest first to make room, and a
//! request in flight is never cut.

use std::path::Path;
use std::time::Duration;

use futures::StreamExt as _;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::TcpStream;

use crate::common::process::{fresh_client, Process};
use crate::common::workload_bundles::{tgz, MEDIA};
use crate::common::TestServer;

/// The open-file limit of the issue.
const OPEN_FILES: u64 = 256;

/// Idle sockets the attacker opens: more than the limit holds.
const IDLE_SOCKETS: usize = 320;

/// Longer than the service spares a connection that has sent nothing.
const PAST_GRACE: Duration = Duration::from_millis(1500);

fn token(data_dir: &Path) -> String {
    std::fs::read_to_string(context_service::auth::dev::dev_token_path(data_dir))
        .expect("the development token")
        .trim()
        .to_owned()
}

/// Raises this test process's soft open-file limit to the hard one, so
/// that the idle sockets do not starve the tests running beside.
fn raise_own_open_file_limit() {
    use rustix::process::{getrlimit, setrlimit, Resource, Rlimit};
    let limit = getrlimit(Resource::Nofile);
    let _ = setrlimit(
        Resource::Nofile,
        Rlimit {
            current: limit.maximum,
            maximum: limit.maximum,
        },
    );
}

/// `IDLE_SOCKETS` connections to `p` that never send a byte.
async fn idle_sockets(p: &Process) -> Vec<TcpStream> {
    let mut sockets = Vec::with_capacity(IDLE_SOCKETS);
    for _ in 0..IDLE_SOCKETS {
        sockets.push(TcpStream::connect(p.addr).await.expect("connect"));
    }
    sockets
}

/// The value of the counter line `series` in `/metrics`.
async fn counter(p: &Process, series: &str) -> f64 {
    let text = fresh_client()
        .get(p.url("/metrics"))
        .send()
        .await
        .expect("/metrics")
        .text()
        .await
        .expect("/metrics text");
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.trim().parse().ok())
        .unwrap_or_else(|| panic!("no {series} in {text}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_sockets_over_the_open_file_limit_leave_room_for_health_and_uploads() {
    raise_own_open_file_limit();
    let dir = tempfile::tempdir().unwrap();
    let data_dir = dir.path().join("data");
    let p = Process::start_with_open_file_limit(&data_dir, &[], OPEN_FILES);
    let _idle = idle_sockets(&p).await;
    tokio::time::sleep(PAST_GRACE).await;

    // Answered at the first try: idle sockets were closed to make room.
    let health = fresh_client().get(p.url("/healthz")).send().await.unwrap();
    assert_eq!(health.status(), 200, "{}", health.text().await.unwrap());
    let client =
        context_service::client::Client::new(p.url(""), Some(token(&data_dir))).expect("client");
    client.create_workload(Some("w"), None).await.unwrap();
    let upload = fresh_client()
        .put(p.url("/v1/workloads/w/bundle"))
        .bearer_auth(token(&data_dir))
        .header("content-type", MEDIA)
        .body(tgz(&[("README.md", b"room was made\n")]))
        .send()
        .await
        .unwrap();
    assert_eq!(upload.status(), 201, "{}", upload.text().await.unwrap());

    let closed = counter(
        &p,
        "context_service_http_connections_closed_idle_total{state=\"never_sent\"}",
    )
    .await;
    assert!(closed >= 1.0, "{closed} idle connections closed");
    let warned = p
        .logs()
        .iter()
        .any(|l| l.contains("cannot hold the files' reserve"));
    assert!(
        warned,
        "no warning about the open-file limit: {:?}",
        p.logs()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upload_in_flight_is_not_cut_while_idle_connections_are_closed() {
    raise_own_open_file_limit();
    let dir = tempfile::tempdir().unwrap();
    let data_dir = dir.path().join("data");
    let p = Process::start_with_open_file_limit(&data_dir, &[], OPEN_FILES);
    let client =
        context_service::client::Client::new(p.url(""), Some(token(&data_dir))).expect("client");
    client.create_workload(Some("w"), None).await.unwrap();

    // An upload sent in 10 pieces 300 ms apart: its connection is the
    // oldest, and in flight the whole time the idle ones are closed.
    let bundle = tgz(&[("README.md", b"sent slowly, never cut\n")]);
    let pieces: Vec<Vec<u8>> = bundle
        .chunks(bundle.len().div_ceil(10))
        .map(<[u8]>::to_vec)
        .collect();
    let body = futures::stream::iter(pieces).then(|piece| async move {
        tokio::time::sleep(Duration::from_millis(300)).await;
        Ok::<_, std::io::Error>(piece)
    });
    let upload = tokio::spawn(
        fresh_client()
            .put(p.url("/v1/workloads/w/bundle"))
            .bearer_auth(token(&data_dir))
            .header("content-type", MEDIA)
            .body(reqwest::Body::wrap_stream(body))
            .send(),
    );
    tokio::time::sleep(Duration::from_millis(100)).await;
    let _idle = idle_sockets(&p).await;
    tokio::time::sleep(PAST_GRACE).await;
    // Each new connection makes room while the upload goes on.
    for _ in 0..10 {
        let health = fresh_client().get(p.url("/healthz")).send().await.unwrap();
        assert_eq!(health.status(), 200);
    }
    let upload = upload.await.unwrap().expect("the upload is answered");
    assert_eq!(upload.status(), 201, "{}", upload.text().await.unwrap());
    let closed = counter(
        &p,
        "context_service_http_connections_closed_idle_total{state=\"never_sent\"}",
    )
    .await;
    assert!(closed >= 1.0, "{closed} idle connections closed");
}

/// A raw connection that has been answered once and stays open.
async fn keep_alive(server: &TestServer) -> TcpStream {
    let addr = server.base.trim_start_matches("http://");
    let mut stream = TcpStream::connect(addr).await.unwrap();
    stream
        .write_all(b"GET /healthz HTTP/1.1\r\nhost: x\r\n\r\n")
        .await
        .unwrap();
    let mut head = [0u8; 12];
    stream.read_exact(&mut head).await.unwrap();
    assert_eq!(&head, b"HTTP/1.1 200");
    stream
}

/// Whether the server closed `stream` within `limit` (reads what is left
/// of the answer first).
async fn closed_within(stream: &mut TcpStream, limit: Duration) -> bool {
    let mut buf = [0u8; 1024];
    let deadline = tokio::time::Instant::now() + limit;
    loop {
        match tokio::time::timeout_at(deadline, stream.read(&mut buf)).await {
            Ok(Ok(0) | Err(_)) => return true,
            Ok(Ok(_)) => {}
            Err(_) => return false,
        }
    }
}

#[tokio::test]
async fn idle_keep_alive_connections_are_closed_oldest_first() {
    let server = TestServer::start_with(|c| {
        c.max_connections = 16;
        c.max_connections_per_ip = 0;
        c.header_read_timeout = Duration::from_secs(30);
    })
    .await;
    let mut held = Vec::new();
    for _ in 0..14 {
        held.push(keep_alive(&server).await);
        // Distinct idle times, so that "oldest" is well defined.
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    // 14 open is 7/8 of 16: the next one closes the two oldest (down to
    // 3/4), at once, for they are keep-alive, not silent.
    let health = server
        .http()
        .get(format!("{}/healthz", server.base))
        .send()
        .await
        .unwrap();
    assert_eq!(health.status(), 200);
    for (i, stream) in held.iter_mut().enumerate() {
        let closed = closed_within(
            stream,
            Duration::from_millis(if i < 2 { 3000 } else { 200 }),
        )
        .await;
        assert_eq!(closed, i < 2, "connection {i} closed: {closed}");
    }
    let metrics = server
        .http()
        .get(format!("{}/metrics", server.base))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        metrics
            .contains("context_service_http_connections_closed_idle_total{state=\"keep_alive\"} 2"),
        "{metrics}"
    );
}

/// A connection to `p` from `from` that has been answered once and stays
/// open.
async fn keep_alive_from(p: &Process, from: &str) -> TcpStream {
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket
        .bind(std::net::SocketAddr::new(from.parse().unwrap(), 0))
        .unwrap();
    let mut stream = socket.connect(p.addr).await.unwrap();
    stream
        .write_all(b"GET /healthz HTTP/1.1\r\nhost: x\r\n\r\n")
        .await
        .unwrap();
    let mut head = [0u8; 12];
    stream.read_exact(&mut head).await.unwrap();
    assert_eq!(&head, b"HTTP/1.1 200");
    stream
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn out_of_descriptors_idle_connections_are_closed_and_accept_goes_on() {
    raise_own_open_file_limit();
    let dir = tempfile::tempdir().unwrap();
    let data_dir = dir.path().join("data");
    // So few descriptors (about a dozen connections) that the connections
    // being refused over the per-address cap use them up.
    let p = Process::start_with_open_file_limit(&data_dir, &["--max-connections-per-ip", "2"], 64);
    // Idle keep-alive connections, under 7/8 of the budget.
    let mut held = Vec::new();
    for i in 0..4 {
        for _ in 0..2 {
            held.push(keep_alive_from(&p, &format!("127.0.0.{}", 10 + i)).await);
        }
    }
    // A flood from one address: all but two refused, each refusal holding
    // a descriptor while it is written.
    let mut flood = Vec::new();
    for _ in 0..60 {
        flood.push(TcpStream::connect(p.addr).await.expect("connect"));
    }
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    let freed = loop {
        let logs = p.logs();
        if logs
            .iter()
            .any(|l| l.contains("out of file descriptors: closing idle connections"))
        {
            break true;
        }
        if std::time::Instant::now() > deadline {
            break false;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert!(
        freed,
        "no idle connection closed for accept: {:?}",
        p.logs()
    );
    // The oldest keep-alive connection was closed for it.
    let mut buf = [0u8; 1024];
    let mut first = held.remove(0);
    let got = tokio::time::timeout(Duration::from_secs(3), async {
        loop {
            match first.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(_) => {}
            }
        }
    })
    .await;
    assert!(got.is_ok(), "the oldest idle connection is still open");
    // Another client is answered once refusals have let go of theirs.
    context_service::client::install_crypto_provider();
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    loop {
        let other = reqwest::Client::builder()
            .local_address("127.0.0.20".parse::<std::net::IpAddr>().unwrap())
            .build()
            .unwrap();
        match other.get(p.url("/healthz")).send().await {
            Ok(resp) if resp.status() == 200 => break,
            got => assert!(
                std::time::Instant::now() < deadline,
                "/healthz still not answered: {got:?}"
            ),
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    drop((held, flood));
}
