//! Issue 10, item 3: uploads cannot exhaust the blocking pool or the disk.
//! Stalled uploads are bounded per owner and in the whole service (`429
//! too_many_uploads` with `Retry-After`), one grant carries one upload at a
//! time (`409 upload_in_progress`), other users' calls stay prompt, the
//! process's threads stay bounded, and a gzip bomb spools little.

use std::io::Write;
use std::path::Path;
use std::time::{Duration, Instant};

use bytes::Bytes;
use flate2::write::GzEncoder;
use flate2::Compression;
use futures::channel::mpsc::{unbounded, UnboundedSender};
use reqwest::{header, Method, Response};
use serde_json::{json, Value};
use tokio::task::JoinHandle;

use crate::common::workload_bundles::{noise, tgz, MEDIA};
use crate::common::{assert_error, raw_header, Caller, TestServer};

type Chunk = Result<Bytes, std::io::Error>;

/// An upload whose body was started and then held open.
struct Stalled {
    rest: UnboundedSender<Chunk>,
    response: JoinHandle<Response>,
}

impl Stalled {
    /// Sends `bytes` and ends the body; returns the answer.
    async fn finish(self, bytes: Vec<u8>) -> Response {
        self.rest.unbounded_send(Ok(Bytes::from(bytes))).unwrap();
        drop(self.rest);
        self.response.await.unwrap()
    }
}

/// Starts `PUT path` with `first` as the body's first bytes, and keeps the
/// body open.
fn stall(caller: &Caller, path: &str, first: &[u8]) -> Stalled {
    let (tx, rx) = unbounded::<Chunk>();
    tx.unbounded_send(Ok(Bytes::copy_from_slice(first)))
        .unwrap();
    let req = caller
        .request(Method::PUT, path)
        .header(header::CONTENT_TYPE, MEDIA)
        .body(reqwest::Body::wrap_stream(rx));
    let response = tokio::spawn(async move { req.send().await.expect("upload answers") });
    Stalled { rest: tx, response }
}

async fn metric(server: &TestServer, name: &str) -> i64 {
    let text = Caller::anonymous(server)
        .get("/metrics")
        .await
        .text()
        .await
        .unwrap();
    text.lines()
        .find_map(|l| l.strip_prefix(&format!("{name} ")))
        .unwrap_or_else(|| panic!("no {name} in /metrics"))
        .trim()
        .parse()
        .unwrap()
}

/// Waits until exactly `n` uploads are admitted.
async fn until_running(server: &TestServer, n: i64) {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let running = metric(server, "context_service_uploads_running").await;
        if running == n {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{running} uploads running, not {n}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn threads() -> Vec<String> {
    std::fs::read_dir("/proc/self/task")
        .unwrap()
        .filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("comm")).ok())
        .map(|name| name.trim().to_owned())
        .collect()
}

/// A workload of `caller` named `name`; returns its create answer.
async fn workload(caller: &Caller, name: &str) -> Value {
    let resp = caller.post("/v1/workloads", &json!({ "name": name })).await;
    assert_eq!(resp.status(), 201);
    resp.json().await.unwrap()
}

/// Another user's workloads API answers, and promptly.
async fn responsive(bob: &Caller, name: &str) {
    let started = Instant::now();
    workload(bob, name).await;
    let resp = bob.get("/v1/workloads").await;
    assert_eq!(resp.status(), 200);
    let elapsed = started.elapsed();
    assert!(elapsed < Duration::from_secs(2), "took {elapsed:?}");
}

async fn assert_too_many(resp: Response, message: &str) {
    let retry = resp
        .headers()
        .get(header::RETRY_AFTER)
        .map(|v| v.to_str().unwrap().to_owned());
    assert_eq!(retry.as_deref(), Some("5"), "Retry-After");
    assert_error(resp, 429, "too_many_uploads", message).await;
}

/// Sends `bytes` as a whole upload, with a deadline.
async fn put(caller: &Caller, path: &str, bytes: Vec<u8>) -> Response {
    tokio::time::timeout(Duration::from_secs(10), caller.put(path, MEDIA, bytes))
        .await
        .expect("a refused upload is answered at once")
}

#[tokio::test]
async fn stalled_uploads_are_bounded_and_others_stay_served() {
    // Defaults: 4 uploads per owner, 16 in the service.
    let server = TestServer::start().await;
    let bundle = tgz(&[("big.bin", &noise(256 * 1024, 7))]);
    let (head, tail) = bundle.split_at(1024);
    let threads_before = threads().len();

    let mallory = Caller::user(&server, "mallory");
    workload(&mallory, "w").await;
    let path = "/v1/workloads/w/bundle";
    let mut stalled: Vec<Stalled> = (0..4).map(|_| stall(&mallory, path, head)).collect();
    until_running(&server, 4).await;

    // The fifth from the same owner is refused before its body is read.
    let resp = put(&mallory, path, bundle.clone()).await;
    assert_too_many(resp, "the owner already has 4 uploads in progress").await;

    // Another user is served: API calls, and an upload.
    let bob = Caller::user(&server, "bob");
    responsive(&bob, "b1").await;
    let resp = put(&bob, "/v1/workloads/b1/bundle", bundle.clone()).await;
    assert_eq!(resp.status(), 201, "{}", resp.text().await.unwrap());

    // Three more owners fill the service-wide limit of 16...
    for owner in ["o1", "o2", "o3"] {
        let caller = Caller::user(&server, owner);
        workload(&caller, "w").await;
        stalled.extend((0..4).map(|_| stall(&caller, path, head)));
    }
    until_running(&server, 16).await;
    // ...and then everyone's uploads wait, with a clear answer.
    let resp = put(&bob, "/v1/workloads/b1/bundle", bundle.clone()).await;
    assert_too_many(resp, "the service is processing its limit of 16 uploads").await;
    // A crowd of stalled attempts from more owners gets no thread.
    let mut crowd = Vec::new();
    for i in 0..10 {
        let caller = Caller::user(&server, &format!("crowd{i}"));
        workload(&caller, "w").await;
        crowd.extend((0..4).map(|_| stall(&caller, path, head)));
    }
    for s in crowd {
        let resp = s.response.await.unwrap();
        assert_too_many(resp, "limit of 16 uploads").await;
    }
    responsive(&bob, "b2").await;
    let now = threads();
    // A running upload holds one blocking thread and the bundle engine's
    // threads: a deflate worker per core (at most 4), a writer and a hasher.
    let cores = std::thread::available_parallelism().map_or(2, |n| n.get().min(4));
    let per_upload = 1 + cores + 2;
    let engine = now.iter().filter(|n| n.starts_with("bundle-")).count();
    // 16 running uploads (other tests in this binary may upload meanwhile,
    // hence the slack); 56 unbounded uploads would hold 56 times as many.
    assert!(
        engine <= (16 + 4) * (per_upload - 1),
        "{engine} engine threads"
    );
    let grown = now.len().saturating_sub(threads_before);
    eprintln!("16 uploads running, 41 refused: {engine} engine threads, {grown} more threads");
    assert!(grown <= 16 * per_upload + 30, "{grown} more threads");

    // The stalled uploads end (one completes); the places come back.
    let mut first = true;
    for s in stalled {
        let resp = s
            .finish(if first { tail.to_vec() } else { Vec::new() })
            .await;
        let expected = if first { 201 } else { 400 };
        assert_eq!(resp.status(), expected, "{}", resp.text().await.unwrap());
        first = false;
    }
    until_running(&server, 0).await;
    let resp = put(&mallory, path, bundle.clone()).await;
    assert_eq!(resp.status(), 201);
}

#[tokio::test]
async fn one_grant_carries_one_upload_at_a_time() {
    let server = TestServer::start().await;
    let alice = Caller::user(&server, "alice");
    let created = workload(&alice, "w").await;
    let url = created["upload"]["url"].as_str().unwrap().to_owned();
    let token = created["upload"]["token"].as_str().unwrap().to_owned();
    let holder = Caller::with_token(&server, token);
    let bundle = tgz(&[("a.txt", b"a\n"), ("b.bin", &noise(100_000, 3))]);
    let (head, tail) = bundle.split_at(512);

    let first = stall(&holder, &url, head);
    until_running(&server, 1).await;
    let resp = put(&holder, &url, bundle.clone()).await;
    assert!(resp.headers().get(header::RETRY_AFTER).is_none());
    assert_error(
        resp,
        409,
        "upload_in_progress",
        "another upload is using this upload grant",
    )
    .await;
    responsive(&Caller::user(&server, "bob"), "b").await;

    let resp = first.finish(tail.to_vec()).await;
    assert_eq!(resp.status(), 201);
    // The grant is used up now.
    let resp = put(&holder, &url, bundle).await;
    assert_error(resp, 401, "token_invalid", "already used").await;
}

/// Bytes of the upload temp files under `dir` that this process holds open
/// (they are unnamed: only their descriptors show them).
fn open_temp_bytes(dir: &Path) -> u64 {
    let dir = dir.to_string_lossy().into_owned();
    std::fs::read_dir("/proc/self/fd")
        .map(|fds| {
            fds.filter_map(|fd| {
                let fd = fd.ok()?.path();
                let target = std::fs::read_link(&fd).ok()?;
                if !target.to_string_lossy().starts_with(&dir) {
                    return None;
                }
                Some(std::fs::metadata(&fd).ok()?.len())
            })
            .sum()
        })
        .unwrap_or(0)
}

const MIB: usize = 1024 * 1024;

/// ~1.3 MB of gzip: five 250 MiB files of zeros, then zeros past the end
/// marker, so only the inflated limit (1,280 MiB) can stop it.
fn bomb() -> Vec<u8> {
    let mut enc = GzEncoder::new(Vec::new(), Compression::best());
    let zeros = vec![0u8; MIB];
    for i in 0..5 {
        let h = raw_header(format!("f{i}").as_bytes(), b'0', 250 * MIB as u64);
        enc.write_all(h.as_bytes()).unwrap();
        for _ in 0..250 {
            enc.write_all(&zeros).unwrap();
        }
    }
    for _ in 0..80 {
        enc.write_all(&zeros).unwrap();
    }
    enc.finish().unwrap()
}

#[tokio::test]
async fn a_gzip_bomb_spools_little_before_it_is_rejected() {
    let server = TestServer::start().await;
    let alice = Caller::user(&server, "alice");
    workload(&alice, "w").await;
    let bomb = bomb();
    assert!(bomb.len() < 2 * MIB, "{}", bomb.len());

    let upload = {
        let alice = alice.clone();
        tokio::spawn(async move { alice.put("/v1/workloads/w/bundle", MEDIA, bomb).await })
    };
    let tmp = server.data_dir.join("tmp");
    let mut peak = 0u64;
    while !upload.is_finished() {
        let tmp = tmp.clone();
        let held = tokio::task::spawn_blocking(move || open_temp_bytes(&tmp))
            .await
            .unwrap();
        peak = peak.max(held);
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    let resp = upload.await.unwrap();
    let status = resp.status().as_u16();
    let body: Value = resp.json().await.unwrap();
    assert_eq!(status, 413, "{body}");
    let message = body["message"].as_str().unwrap();
    assert!(message.contains("inflates to more than"), "{body}");
    // The spool is LZ4-compressed: 1.25 GiB of zeros take a few MiB.
    eprintln!("gzip bomb of 1.3 GiB: peak temp files {peak} bytes");
    assert!(peak < 64 * MIB as u64, "spooled {peak} bytes");
    responsive(&alice, "after").await;
}

#[tokio::test]
async fn uploads_share_a_temp_disk_budget() {
    let server = TestServer::start_with(|c| c.upload_temp_max_bytes = 256 * 1024).await;
    let alice = Caller::user(&server, "alice");
    workload(&alice, "w").await;
    // 2 MiB of incompressible content cannot spool within 256 KiB.
    let big = tgz(&[("noise.bin", &noise(2 * MIB, 11))]);
    let resp = put(&alice, "/v1/workloads/w/bundle", big).await;
    let retry = resp.headers().get(header::RETRY_AFTER).cloned();
    assert_error(
        resp,
        503,
        "temp_space_exhausted",
        "temporary space for uploads (262144 bytes)",
    )
    .await;
    assert_eq!(retry.unwrap(), "5");
    // What it held was given back: a small upload fits.
    let small = tgz(&[("a.txt", b"hello\n")]);
    let resp = put(&alice, "/v1/workloads/w/bundle", small).await;
    assert_eq!(resp.status(), 201);
}
