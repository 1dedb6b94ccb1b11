//! Shutdown and request logs of the real `context-service` process: on
//! SIGTERM `/readyz` turns unready, then the listener closes (new
//! connections are refused), an in-flight download finishes within
//! `--shutdown-timeout` (and is cut at it), then the store is closed
//! cleanly; Ctrl-C skips the grace once no request is in flight;
//! `--log-format json` writes JSON lines that carry the request's
//! `x-request-id`.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rustix::process::Signal;
use serde_json::Value;
use sha2::{Digest as _, Sha256};

use crate::common::process::{fresh_client, Process};
use crate::common::workload_bundles::{noise, tgz};

fn token(data_dir: &Path) -> String {
    std::fs::read_to_string(context_service::auth::dev::dev_token_path(data_dir))
        .expect("the development token")
        .trim()
        .to_owned()
}

/// Creates and activates workload `name` holding `bytes` of noise; returns
/// its bundle digest and revision.
async fn big_workload(p: &Process, data_dir: &Path, name: &str, bytes: usize) -> (String, String) {
    let client =
        context_service::client::Client::new(p.url(""), Some(token(data_dir))).expect("client");
    client.create_workload(Some(name), None).await.unwrap();
    let rev = client
        .upload_bundle(name, tgz(&[("blob.bin", &noise(bytes, 7))]))
        .await
        .unwrap();
    client.activate_workload(name, &rev.revision).await.unwrap();
    (rev.bundle_digest, rev.revision)
}

/// Whether redb had to repair the store file when opened: it does after an
/// unclean shutdown, never after a clean close.
fn store_needed_repair(data_dir: &Path) -> bool {
    let repaired = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let flag = repaired.clone();
    let mut builder = redb::Builder::new();
    builder.set_repair_callback(move |_| flag.store(true, std::sync::atomic::Ordering::SeqCst));
    let db = builder
        .create(data_dir.join("store/meta.redb"))
        .expect("the store opens");
    drop(db);
    repaired.load(std::sync::atomic::Ordering::SeqCst)
}

/// `8-4-4-4-12` lowercase hex digits.
fn is_uuid(id: &str) -> bool {
    let groups: Vec<&str> = id.split('-').collect();
    groups.iter().map(|g| g.len()).eq([8, 4, 4, 4, 12])
        && groups.iter().all(|g| {
            g.bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
        })
}

async fn refused(addr: SocketAddr) -> bool {
    matches!(
        tokio::net::TcpStream::connect(addr).await,
        Err(e) if e.kind() == std::io::ErrorKind::ConnectionRefused
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_drains_a_slow_download_then_closes_the_store() {
    let dir = tempfile::tempdir().unwrap();
    let data_dir: PathBuf = dir.path().join("data");
    let grace = Duration::from_millis(1500);
    let mut p = Process::start(
        &data_dir,
        &["--shutdown-grace", "1500ms", "--shutdown-timeout", "20s"],
    );
    // Incompressible, so the bundle is as large as the file: far more than
    // the socket buffers hold while the client does not read.
    let (digest, revision) = big_workload(&p, &data_dir, "big", 24 << 20).await;
    let http = fresh_client();
    let ready = http.get(p.url("/readyz")).send().await.unwrap();
    assert_eq!(ready.status(), 200);

    let mut download = http
        .get(p.url(&format!("/v1/workloads/big/revisions/{revision}/bundle")))
        .bearer_auth(token(&data_dir))
        .send()
        .await
        .unwrap();
    assert_eq!(download.status(), 200);
    let mut hasher = Sha256::new();
    let mut received = 0usize;
    let first = download.chunk().await.unwrap().expect("a first chunk");
    hasher.update(&first);
    received += first.len();

    let signalled = Instant::now();
    p.signal(Signal::TERM);
    // 1. Unready at once, while new connections are still served.
    let mut unready = None;
    while signalled.elapsed() < grace {
        let resp = http.get(p.url("/readyz")).send().await.unwrap();
        if resp.status() == 503 {
            unready = Some(resp.json::<Value>().await.unwrap());
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let unready = unready.expect("/readyz answered 503 within the grace");
    assert_eq!(unready["error"], "shutting_down", "{unready}");
    assert_eq!(
        unready["message"], "the service is shutting down",
        "{unready}"
    );
    // Liveness is unaffected: the process is healthy, only leaving.
    assert_eq!(
        http.get(p.url("/healthz")).send().await.unwrap().status(),
        200
    );
    // 2. After the grace, the listener is closed.
    while !refused(p.addr).await {
        assert!(
            signalled.elapsed() < grace + Duration::from_secs(5),
            "new connections still accepted"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(
        signalled.elapsed() >= grace,
        "refused before the grace ended"
    );
    // 3. The download still finishes, slowly, with every byte.
    assert!(p.child.try_wait().unwrap().is_none(), "exited mid-download");
    while let Some(chunk) = download.chunk().await.unwrap() {
        hasher.update(&chunk);
        received += chunk.len();
        if received < 8 << 20 {
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    }
    assert_eq!(hex::encode(hasher.finalize()), digest, "{received} bytes");
    // 4. Then the process exits 0 well within the deadline, the store
    // closed cleanly.
    let status = p.wait(Duration::from_secs(20));
    assert!(status.success(), "{status:?}");
    let logs = p.logs().join("\n");
    assert!(logs.contains("store closed"), "{logs}");
    assert!(
        !store_needed_repair(&data_dir),
        "the store was not closed cleanly"
    );
    // The grace's 503s on /readyz are expected answers: a warning each,
    // never an error line.
    let lines: Vec<Value> = p
        .logs()
        .iter()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}")))
        .collect();
    let readyz_503: Vec<&Value> = lines
        .iter()
        .filter(|l| {
            l["span"]["path"] == "/readyz" && l["fields"]["message"] == "service unavailable"
        })
        .collect();
    assert!(!readyz_503.is_empty(), "{logs}");
    assert!(
        readyz_503.iter().all(|l| l["level"] == "WARN"),
        "{readyz_503:#?}"
    );
    let errors: Vec<&Value> = lines.iter().filter(|l| l["level"] == "ERROR").collect();
    assert!(errors.is_empty(), "{errors:#?}");

    // The store reopens with the workload.
    let again = Process::start(&data_dir, &[]);
    let got = again.get_json("/v1/workloads/big", &token(&data_dir)).await;
    assert_eq!(got["status"], "ready", "{got}");
    assert_eq!(got["bundleDigest"], digest.as_str());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_shutdown_timeout_cuts_a_stalled_download() {
    let dir = tempfile::tempdir().unwrap();
    let data_dir = dir.path().join("data");
    let mut p = Process::start(
        &data_dir,
        &["--shutdown-grace", "0s", "--shutdown-timeout", "1s"],
    );
    let (_, revision) = big_workload(&p, &data_dir, "big", 24 << 20).await;
    let mut download = fresh_client()
        .get(p.url(&format!("/v1/workloads/big/revisions/{revision}/bundle")))
        .bearer_auth(token(&data_dir))
        .send()
        .await
        .unwrap();
    let mut received = download.chunk().await.unwrap().map_or(0, |c| c.len());
    let signalled = Instant::now();
    p.signal(Signal::TERM);
    // The client never reads on: the process gives up on it at the
    // deadline, still exits 0 and closes the store.
    let status = p.wait(Duration::from_secs(15));
    let took = signalled.elapsed();
    assert!(status.success(), "{status:?}");
    assert!(took >= Duration::from_secs(1), "exited after {took:?}");
    let logs = p.logs().join("\n");
    assert!(logs.contains("closing 1 connection"), "{logs}");
    assert!(!store_needed_repair(&data_dir));
    // What the client still gets ends early.
    while let Ok(Some(c)) = download.chunk().await {
        received += c.len();
    }
    assert!(received < 24 << 20, "{received} bytes");
}

/// Ctrl-C on an idle server exits without waiting the grace; SIGTERM
/// (Kubernetes) keeps the whole grace even when idle, since load balancers
/// may still send requests until they notice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ctrl_c_on_an_idle_server_skips_the_grace_sigterm_keeps_it() {
    let dir = tempfile::tempdir().unwrap();
    let data_dir = dir.path().join("data");
    // A grace no test run would wait out.
    let long_grace = Duration::from_secs(120);
    let mut p = Process::start(&data_dir, &["--shutdown-grace", "120s"]);
    // A request served and finished before: idle is about now.
    let listed = p.get_json("/v1/workloads", &token(&data_dir)).await;
    assert_eq!(listed["workloads"], serde_json::json!([]));
    let signalled = Instant::now();
    p.signal(Signal::INT);
    let status = p.wait(long_grace / 2);
    assert!(status.success(), "{status:?}");
    assert!(signalled.elapsed() < long_grace);
    let logs = p.logs().join("\n");
    assert!(
        logs.contains("no request in flight: the grace is skipped"),
        "{logs}"
    );
    assert!(logs.contains("store closed"), "{logs}");
    assert!(!store_needed_repair(&data_dir));

    let grace = Duration::from_millis(1500);
    let mut p = Process::start(&data_dir, &["--shutdown-grace", "1500ms"]);
    let signalled = Instant::now();
    p.signal(Signal::TERM);
    let status = p.wait(Duration::from_secs(30));
    assert!(status.success(), "{status:?}");
    assert!(signalled.elapsed() >= grace, "{:?}", signalled.elapsed());
    assert!(!p.logs().join("\n").contains("the grace is skipped"));
}

/// Ctrl-C with a download in flight keeps serving, new connections
/// included, until the download is done; then it leaves without waiting
/// out the rest of the grace.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ctrl_c_keeps_the_grace_while_a_request_is_in_flight() {
    let dir = tempfile::tempdir().unwrap();
    let data_dir = dir.path().join("data");
    let long_grace = Duration::from_secs(120);
    let mut p = Process::start(&data_dir, &["--shutdown-grace", "120s"]);
    let (digest, revision) = big_workload(&p, &data_dir, "big", 24 << 20).await;
    let http = fresh_client();
    let mut download = http
        .get(p.url(&format!("/v1/workloads/big/revisions/{revision}/bundle")))
        .bearer_auth(token(&data_dir))
        .send()
        .await
        .unwrap();
    assert_eq!(download.status(), 200);
    let mut hasher = Sha256::new();
    hasher.update(download.chunk().await.unwrap().expect("a first chunk"));
    let signalled = Instant::now();
    p.signal(Signal::INT);
    // Unready, and still accepting while the download is unfinished.
    let mut unready = false;
    for _ in 0..100 {
        let resp = http.get(p.url("/readyz")).send().await.unwrap();
        if resp.status() == 503 {
            unready = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(unready, "/readyz never answered 503");
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(
        http.get(p.url("/healthz")).send().await.unwrap().status(),
        200,
        "the listener closed with a download in flight"
    );
    while let Some(chunk) = download.chunk().await.unwrap() {
        hasher.update(&chunk);
    }
    assert_eq!(hex::encode(hasher.finalize()), digest);
    // Done: the rest of the grace is skipped.
    let status = p.wait(long_grace / 2);
    assert!(status.success(), "{status:?}");
    assert!(signalled.elapsed() < long_grace);
    assert!(p.logs().join("\n").contains("the grace is skipped"));
}

#[test]
fn a_killed_process_leaves_a_store_that_needs_repair() {
    // The control for `store_needed_repair`: it does see an unclean close.
    let dir = tempfile::tempdir().unwrap();
    let data_dir = dir.path().join("data");
    let mut p = Process::start(&data_dir, &[]);
    p.signal(Signal::KILL);
    p.wait(Duration::from_secs(10));
    assert!(store_needed_repair(&data_dir));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn json_logs_carry_the_request_id() {
    let dir = tempfile::tempdir().unwrap();
    let data_dir = dir.path().join("data");
    let p = Process::start(&data_dir, &[]);
    let http = fresh_client();
    let resp = http
        .post(p.url("/v1/workloads"))
        .bearer_auth(token(&data_dir))
        .header("x-request-id", "abc-123")
        .json(&serde_json::json!({"name": "logged"}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 201);
    assert_eq!(resp.headers()["x-request-id"], "abc-123");

    // Without one, or with one that is too long or not visible ASCII, the
    // service makes its own (a UUID).
    for sent in [None, Some("x".repeat(129)), Some("a b".to_owned())] {
        let mut req = http.get(p.url("/healthz"));
        if let Some(id) = &sent {
            req = req.header("x-request-id", id);
        }
        let resp = req.send().await.unwrap();
        let id = resp.headers()["x-request-id"].to_str().unwrap().to_owned();
        assert!(is_uuid(&id), "{sent:?} -> {id}");
    }
    let longest = "y".repeat(128);
    let resp = http
        .get(p.url("/healthz"))
        .header("x-request-id", &longest)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.headers()["x-request-id"], longest.as_str());

    // Every line is JSON; the request's lines (the workload's creation and
    // the access line) all name its id.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let logs = p.logs();
    let parsed: Vec<Value> = logs
        .iter()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}")))
        .collect();
    let of_request: Vec<&Value> = parsed
        .iter()
        .filter(|l| l.to_string().contains("abc-123"))
        .collect();
    assert!(of_request.len() >= 2, "{logs:#?}");
    for line in &of_request {
        assert_eq!(line["span"]["request_id"], "abc-123", "{line}");
    }
    assert!(
        of_request
            .iter()
            .any(|l| l["fields"]["message"] == "workload created"),
        "{of_request:#?}"
    );
    let access = of_request
        .iter()
        .find(|l| l["fields"]["status"] == 201)
        .unwrap_or_else(|| panic!("no access line: {of_request:#?}"));
    assert_eq!(access["span"]["method"], "POST");
    assert_eq!(access["span"]["path"], "/v1/workloads");
    // No line of another request carries it.
    assert!(parsed
        .iter()
        .filter(|l| l["span"]["request_id"].is_string())
        .filter(|l| l["span"]["request_id"] != "abc-123")
        .all(|l| !l.to_string().contains("abc-123")));
}

/// Text logs written to a pipe or a file carry no terminal colour codes
/// (a log collector or `less` would show them as `^[[2m…`).
#[test]
fn text_logs_to_a_pipe_carry_no_colour_codes() {
    use std::io::{BufRead as _, BufReader};
    use std::process::{Command, Stdio};
    let dir = tempfile::tempdir().unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_context-service"))
        .args(["serve", "--listen", "127.0.0.1:0", "--log-format", "text"])
        .arg("--data-dir")
        .arg(dir.path())
        .env("RUST_LOG", "info")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("context-service starts");
    let stderr = child.stderr.take().expect("stderr");
    let mut seen = Vec::new();
    for line in BufReader::new(stderr).lines().map_while(Result::ok) {
        let listening = line.contains("listening");
        seen.push(line);
        if listening {
            break;
        }
    }
    let _ = child.kill();
    let _ = child.wait();
    assert!(
        seen.iter().any(|l| l.contains("listening")),
        "no listening line: {seen:?}"
    );
    let coloured: Vec<_> = seen.iter().filter(|l| l.contains('\u{1b}')).collect();
    assert!(
        coloured.is_empty(),
        "colour codes in piped logs: {coloured:?}"
    );
}
