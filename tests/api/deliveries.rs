//! Deliveries over real HTTP on the `local` backend: the script runs under
//! `sh` in real sandbox directories. Transfers, cache hits, sharing and
//! release, corruption and tampering, hostile values, owner isolation
//! (also in shared sandboxes), single-flight, disk full, pools, scopes,
//! delegation, restarts and metrics. Every test runs twice (see
//! `both_transports!`): through the script, and through the injected agent
//! (built by `tests/common/agent.rs`); the agent-only cases come last.

use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use context_service::app::BuildOptions;
use context_service::config::ServeConfig;
use context_service::delivery::{ExecError, ExecSession, ExecTarget, SandboxExec};
use serde_json::{json, Value};
use tokio::io::AsyncWrite;

use crate::common::agent::agent;
use crate::common::process::{fresh_client, Process};
use crate::common::workload_bundles::{noise, tgz};
use crate::common::{assert_error, Caller, TestServer};

// --- an exec port wrapper that counts execs and can corrupt a transfer ---

/// Counts execs; when `corrupt` is set, flips one bundle byte on its way
/// into the sandbox; when `replace` holds a script, runs that instead.
#[derive(Default)]
struct Probe {
    execs: AtomicUsize,
    corrupt: AtomicBool,
    /// Stdin bytes to pass before the flipped byte at offset 100 (the
    /// agent travels first on its first delivery).
    corrupt_skip: std::sync::atomic::AtomicU64,
    replace: std::sync::Mutex<Option<String>>,
    /// Put before every `sh -c` command (e.g. a fake `uname`).
    prefix: std::sync::Mutex<Option<String>>,
    /// Holds every exec this long before it starts (a slow sandbox).
    delay: std::sync::Mutex<Option<Duration>>,
}

struct Probed {
    inner: Arc<dyn SandboxExec>,
    probe: Arc<Probe>,
}

#[async_trait::async_trait]
impl SandboxExec for Probed {
    async fn exec(&self, target: &ExecTarget, argv: &[String]) -> Result<ExecSession, ExecError> {
        self.probe.execs.fetch_add(1, Ordering::SeqCst);
        let delay = *self.probe.delay.lock().unwrap();
        if let Some(delay) = delay {
            tokio::time::sleep(delay).await;
        }
        let replaced = self.probe.replace.lock().unwrap().clone();
        let mut argv = match replaced {
            Some(script) => vec!["sh".to_owned(), "-c".to_owned(), script],
            None => argv.to_vec(),
        };
        if let Some(prefix) = self.probe.prefix.lock().unwrap().clone() {
            argv[2] = format!("{prefix}\n{}", argv[2]);
        }
        let mut session = self.inner.exec(target, &argv).await?;
        if self.probe.corrupt.load(Ordering::SeqCst) {
            let stdin = std::mem::replace(&mut session.stdin, Box::new(tokio::io::sink()));
            session.stdin = Box::new(Flip {
                inner: stdin,
                at: 100 + self.probe.corrupt_skip.load(Ordering::SeqCst),
                pos: 0,
            });
        }
        Ok(session)
    }
}

/// Writes through, flipping the byte at offset `at`.
struct Flip {
    inner: Box<dyn AsyncWrite + Send + Unpin>,
    at: u64,
    pos: u64,
}

impl AsyncWrite for Flip {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        let mut data = buf.to_vec();
        if (self.pos..self.pos + buf.len() as u64).contains(&self.at) {
            let i = (self.at - self.pos) as usize;
            data[i] ^= 0xff;
        }
        let this = &mut *self;
        match Pin::new(&mut this.inner).poll_write(cx, &data) {
            Poll::Ready(Ok(n)) => {
                this.pos += n as u64;
                Poll::Ready(Ok(n))
            }
            other => other,
        }
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

/// What every test starts from: a server whose exec port goes through a
/// [`Probe`], and alice, the caller most tests act as.
struct Fixture {
    server: TestServer,
    probe: Arc<Probe>,
    alice: Caller,
    via: Via,
}

/// Which transport a test's deliveries use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Via {
    /// `--delivery-transport=script`.
    Script,
    /// `--delivery-transport=exec` with the built agent.
    Agent,
}

impl Via {
    /// Sets the transport (after which the test's own `adjust` runs).
    fn configure(self, c: &mut ServeConfig) {
        match self {
            Via::Script => c.delivery_transport = "script".into(),
            Via::Agent => {
                c.delivery_transport = "exec".into();
                c.delivery_agent_dir = Some(agent().dir.clone());
            }
        }
    }

    /// The `transport` a successful outcome reports.
    fn word(self) -> &'static str {
        match self {
            Via::Script => "script",
            Via::Agent => "agent",
        }
    }
}

/// Declares `mod NAME { script, agent }` tests calling `NAME(Via)`.
macro_rules! both_transports {
    ($($name:ident),* $(,)?) => {$(
        mod $name {
            #[tokio::test]
            async fn script() {
                super::$name(super::Via::Script).await;
            }
            #[tokio::test]
            async fn agent() {
                super::$name(super::Via::Agent).await;
            }
        }
    )*};
}

impl Fixture {
    /// A fresh server with settings from `adjust`.
    async fn start(via: Via, adjust: impl FnOnce(&mut ServeConfig)) -> Self {
        let probe = Arc::new(Probe::default());
        let p = probe.clone();
        let options = BuildOptions {
            exec_wrapper: Some(Arc::new(move |inner| {
                Arc::new(Probed {
                    inner,
                    probe: p.clone(),
                })
            })),
            ..BuildOptions::default()
        };
        let configure = move |c: &mut ServeConfig| {
            via.configure(c);
            adjust(c);
        };
        let server = TestServer::start_with_options(configure, options).await;
        let alice = Caller::user(&server, "alice");
        Fixture {
            server,
            probe,
            alice,
            via,
        }
    }

    /// The usual start: also alice's workload `name` holding `files`,
    /// activated, and her pool `p` of one sandbox (`sandbox-p-0`); returns
    /// the fixture with the bundle's size and revision.
    async fn ready(
        via: Via,
        adjust: impl FnOnce(&mut ServeConfig),
        name: &str,
        files: &[(&str, &[u8])],
    ) -> (Self, u64, String) {
        let f = Self::start(via, adjust).await;
        let (len, revision) = ready_workload(&f.server, "alice", name, files).await;
        pool(&f.alice, "p", 1).await;
        (f, len, revision)
    }
}

// --- helpers ---

/// A workload `name` of `sub` with `files`, uploaded and activated; returns
/// (bundle size, revision).
async fn ready_workload(
    server: &TestServer,
    sub: &str,
    name: &str,
    files: &[(&str, &[u8])],
) -> (u64, String) {
    let client = server.client(sub);
    client.create_workload(Some(name), None).await.unwrap();
    let rev = client.upload_bundle(name, tgz(files)).await.unwrap();
    client.activate_workload(name, &rev.revision).await.unwrap();
    (rev.bytes, rev.revision)
}

/// Creates the dedicated pool `name` with `replicas` sandboxes for `caller`.
async fn pool(caller: &Caller, name: &str, replicas: u32) {
    let body = json!({"name": name, "replicas": replicas,
        "workspace": {"size": "1Gi", "accessMode": "ReadWriteOnce"}});
    let resp = caller.post("/v1/sandbox-pools", &body).await;
    assert_eq!(
        resp.status().as_u16(),
        201,
        "{}",
        resp.text().await.unwrap()
    );
}

/// The delivery root of sandbox `name` (the default root, taken inside the
/// sandbox directory), with symlinks resolved.
fn root_of(server: &TestServer, name: &str) -> PathBuf {
    let sandbox = server
        .data_dir
        .join("local/namespaces/default/sandboxes")
        .join(name);
    let workspace = std::fs::canonicalize(sandbox.join("workspace")).expect("workspace");
    workspace.join(".context")
}

async fn deliver(caller: &Caller, workload: &str, body: Value) -> reqwest::Response {
    caller
        .post(&format!("/v1/workloads/{workload}/deliveries"), &body)
        .await
}

async fn json(resp: reqwest::Response, status: u16) -> Value {
    let got = resp.status().as_u16();
    let text = resp.text().await.unwrap();
    assert_eq!(got, status, "body: {text}");
    serde_json::from_str(&text).unwrap()
}

/// Names in `dir` (empty when it does not exist).
fn names_in(dir: &Path) -> Vec<String> {
    let mut out: Vec<String> = std::fs::read_dir(dir)
        .map(|d| {
            d.map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    out.sort();
    out
}

const FILES: &[(&str, &[u8])] = &[
    ("README.md", b"hello\n"),
    ("src/main.rs", b"fn main() {}\n"),
    ("src/lib/deep.txt", b"deep\n"),
];

// --- tests ---

both_transports!(
    send_once_then_hit_share_release_and_metrics,
    downloads_and_delivery_reads_are_counted_apart,
    a_corrupted_transfer_is_refused_and_nothing_is_published,
    a_tampered_cache_dir_is_detected_and_delivered_again,
    hostile_values_are_refused_before_any_exec,
    owners_are_isolated_also_in_shared_sandboxes,
    concurrent_runs_of_one_revision_make_one_transfer,
    disk_full_in_the_sandbox_fails_clearly_and_leaves_no_staging_dir,
    pool_wide_delivery_and_partial_failure,
    workload_state_scopes_and_delegation,
    runs_survive_a_restart,
    broken_sandboxes_time_out_or_break_the_protocol_without_leaking,
    bundles_outside_the_cache_are_read_from_disk_or_streamed,
    deliveries_are_bounded_by_the_delivery_timeout_not_the_request_deadline,
);

async fn send_once_then_hit_share_release_and_metrics(via: Via) {
    let (f, len, revision) = Fixture::ready(via, |_| {}, "docs", FILES).await;
    let Fixture { server, alice, .. } = &f;

    let first = json(
        deliver(
            alice,
            "docs",
            json!({"runId": "run-1", "sandbox": "sandbox-p-0"}),
        )
        .await,
        201,
    )
    .await;
    assert_eq!(first["workload"], "docs");
    assert_eq!(first["revision"], revision.as_str());
    let d = &first["deliveries"][0];
    assert_eq!(d["sandbox"], "sandbox-p-0");
    assert_eq!(d["pod"], Value::Null);
    assert_eq!(d["cached"], false);
    assert_eq!(d["bytesSent"], len);
    assert_eq!(d["transport"], via.word());
    assert!(d["durationMs"].is_u64());
    assert!(d.get("error").is_none());
    let path1 = PathBuf::from(d["path"].as_str().unwrap());
    assert!(path1.is_absolute(), "{path1:?}");
    assert!(path1.ends_with("docs/run-1"), "{path1:?}");
    assert_eq!(
        std::fs::read(path1.join("src/lib/deep.txt")).unwrap(),
        b"deep\n"
    );
    // Read-only (advisory: the tests run as root, who could still write).
    let mode = std::fs::metadata(path1.join("README.md"))
        .unwrap()
        .permissions();
    assert!(mode.readonly(), "{mode:?}");

    // Another run: a verified hit, no bytes.
    let second = json(
        deliver(
            alice,
            "docs",
            json!({"runId": "run-2", "sandbox": "sandbox-p-0", "verify": "full"}),
        )
        .await,
        201,
    )
    .await;
    let d = &second["deliveries"][0];
    assert_eq!(
        (d["cached"].clone(), d["bytesSent"].clone()),
        (json!(true), json!(0))
    );
    assert_eq!(d["transport"], via.word());
    let path2 = PathBuf::from(d["path"].as_str().unwrap());
    // Both runs share one cache dir.
    let root = root_of(server, "sandbox-p-0");
    assert_eq!(
        root.join("bin").exists(),
        via == Via::Agent,
        "the agent is kept"
    );
    let cache = root.join("cache");
    let dirs: Vec<String> = names_in(&cache);
    assert_eq!(dirs.len(), 1, "{dirs:?}");
    assert!(dirs[0].ends_with(&format!("-{revision}")), "{dirs:?}");
    assert_eq!(
        std::fs::canonicalize(&path1).unwrap(),
        std::fs::canonicalize(&path2).unwrap()
    );

    // Both runs are listed.
    let list = json(alice.get("/v1/workloads/docs/deliveries").await, 200).await;
    assert_eq!(
        list,
        json!({"deliveries": [
            {"runId": "run-1", "revision": revision, "sandboxes": [
                {"sandbox": "sandbox-p-0", "pod": null, "path": path1.to_str().unwrap()}]},
            {"runId": "run-2", "revision": revision, "sandboxes": [
                {"sandbox": "sandbox-p-0", "pod": null, "path": path2.to_str().unwrap()}]},
        ]})
    );

    // Release of one keeps the other's view.
    let resp = alice.delete("/v1/workloads/docs/deliveries/run-1").await;
    assert_eq!(resp.status().as_u16(), 204);
    assert!(
        std::fs::symlink_metadata(&path1).is_err(),
        "run-1's view is gone"
    );
    assert_eq!(std::fs::read(path2.join("README.md")).unwrap(), b"hello\n");
    // Release of the last removes the cache dir.
    let resp = alice.delete("/v1/workloads/docs/deliveries/run-2").await;
    assert_eq!(resp.status().as_u16(), 204);
    assert!(std::fs::symlink_metadata(&path2).is_err());
    assert_eq!(names_in(&cache), Vec::<String>::new());
    let resp = alice.delete("/v1/workloads/docs/deliveries/run-2").await;
    assert_error(resp, 404, "run_not_found", "run \"run-2\" not found").await;
    let list = json(alice.get("/v1/workloads/docs/deliveries").await, 200).await;
    assert_eq!(list, json!({"deliveries": []}));

    // Metrics: one transfer, one hit, the bundle's bytes, two releases.
    let text = Caller::anonymous(server)
        .get("/metrics")
        .await
        .text()
        .await
        .unwrap();
    for line in [
        "context_service_deliveries_total{outcome=\"sent\"} 1".to_owned(),
        "context_service_deliveries_total{outcome=\"cached\"} 1".to_owned(),
        format!("context_service_delivery_bytes_sent_total {len}"),
        "context_service_delivery_cache_hits_total 1".to_owned(),
        "context_service_delivery_duration_seconds_count 2".to_owned(),
        "context_service_delivery_releases_total{outcome=\"released\"} 2".to_owned(),
        // The transfer read the bundle once; the hit read nothing.
        "context_service_bundle_delivery_reads_total{source=\"memory\"} 1".to_owned(),
    ] {
        assert!(text.contains(&line), "missing {line:?} in\n{text}");
    }
    // Deliveries are not downloads.
    assert!(
        !text.contains("context_service_bundle_downloads_total{"),
        "{text}"
    );
}

/// A download and a delivery read the same cached bundle: each is counted
/// by its own counter, and the cache's counters see one load and one hit.
async fn downloads_and_delivery_reads_are_counted_apart(via: Via) {
    let (f, len, revision) = Fixture::ready(via, |_| {}, "w", FILES).await;
    let Fixture { server, alice, .. } = &f;
    let lines = || async {
        let text = Caller::anonymous(server)
            .get("/metrics")
            .await
            .text()
            .await
            .unwrap();
        text.lines()
            .filter(|l| {
                l.starts_with("context_service_bundle_downloads_total")
                    || l.starts_with("context_service_bundle_delivery_reads_total")
                    || l.starts_with("context_service_bundle_cache_hits_total")
                    || l.starts_with("context_service_bundle_cache_loads_total")
            })
            .map(str::to_owned)
            .collect::<Vec<_>>()
    };
    let bundle = alice
        .get(&format!("/v1/workloads/w/revisions/{revision}/bundle"))
        .await;
    assert_eq!(bundle.status(), 200);
    assert_eq!(bundle.bytes().await.unwrap().len() as u64, len);
    assert_eq!(
        lines().await,
        [
            "context_service_bundle_downloads_total{source=\"memory\"} 1",
            "context_service_bundle_cache_hits_total 0",
            "context_service_bundle_cache_loads_total 1",
        ]
    );
    let sent = json(
        deliver(alice, "w", json!({"runId": "a", "sandbox": "sandbox-p-0"})).await,
        201,
    )
    .await;
    assert_eq!(sent["deliveries"][0]["bytesSent"], len);
    assert_eq!(
        lines().await,
        [
            "context_service_bundle_downloads_total{source=\"memory\"} 1",
            "context_service_bundle_delivery_reads_total{source=\"memory\"} 1",
            "context_service_bundle_cache_hits_total 1",
            "context_service_bundle_cache_loads_total 1",
        ]
    );
}

async fn a_corrupted_transfer_is_refused_and_nothing_is_published(via: Via) {
    let big = noise(300_000, 7);
    let (f, _, revision) = Fixture::ready(via, |_| {}, "w", &[("blob.bin", &big)]).await;
    let Fixture {
        server,
        probe,
        alice,
        ..
    } = &f;

    if via == Via::Agent {
        // The agent travels first: flip a bundle byte, not one of its.
        let len = std::fs::metadata(&agent().binary).unwrap().len();
        probe.corrupt_skip.store(len, Ordering::SeqCst);
    }
    probe.corrupt.store(true, Ordering::SeqCst);
    let resp = deliver(alice, "w", json!({"runId": "r", "sandbox": "sandbox-p-0"})).await;
    let body = json(resp, 502).await;
    assert_eq!(body["error"], "delivery_failed");
    assert_eq!(
        body["message"],
        "digest_mismatch: sha256 of the received bytes is not the bundle digest"
    );
    assert_eq!(body["deliveries"][0]["sandbox"], "sandbox-p-0");
    assert_eq!(body["deliveries"][0]["bytesSent"], 0);
    assert_eq!(
        body["deliveries"][0]["error"], body["message"],
        "the outcome carries the same reason"
    );
    let root = root_of(server, "sandbox-p-0");
    assert_eq!(
        names_in(&root.join("cache")),
        Vec::<String>::new(),
        "no cache dir, no staging dir"
    );
    assert_eq!(names_in(&root.join("runs")), Vec::<String>::new());
    let list = json(alice.get("/v1/workloads/w/deliveries").await, 200).await;
    assert_eq!(list, json!({"deliveries": []}));

    // An honest transfer then succeeds.
    probe.corrupt.store(false, Ordering::SeqCst);
    let ok = json(
        deliver(alice, "w", json!({"runId": "r", "sandbox": "sandbox-p-0"})).await,
        201,
    )
    .await;
    assert_eq!(ok["revision"], revision.as_str());
    assert_eq!(ok["deliveries"][0]["transport"], f.via.word());
    let path = PathBuf::from(ok["deliveries"][0]["path"].as_str().unwrap());
    assert_eq!(std::fs::read(path.join("blob.bin")).unwrap(), big);
}

async fn a_tampered_cache_dir_is_detected_and_delivered_again(via: Via) {
    let (f, len, _) = Fixture::ready(via, |_| {}, "w", FILES).await;
    let Fixture { alice, .. } = &f;
    let first = json(
        deliver(alice, "w", json!({"runId": "a", "sandbox": "sandbox-p-0"})).await,
        201,
    )
    .await;
    let path = PathBuf::from(first["deliveries"][0]["path"].as_str().unwrap());
    // A co-tenant with the same uid edits a file (read-only is advisory).
    let file = std::fs::canonicalize(path.join("README.md")).unwrap();
    let mut perms = std::fs::metadata(&file).unwrap().permissions();
    #[allow(clippy::permissions_set_readonly_false)]
    perms.set_readonly(false);
    std::fs::set_permissions(&file, perms).unwrap();
    std::fs::write(&file, b"tampered and longer\n").unwrap();

    let again = json(
        deliver(alice, "w", json!({"runId": "b", "sandbox": "sandbox-p-0"})).await,
        201,
    )
    .await;
    let d = &again["deliveries"][0];
    assert_eq!(
        (d["cached"].clone(), d["bytesSent"].clone()),
        (json!(false), json!(len))
    );
    assert_eq!(std::fs::read(path.join("README.md")).unwrap(), b"hello\n");
    // Run "a" still sees the (re-delivered) revision.
    assert_eq!(
        std::fs::read(path.join("src/main.rs")).unwrap(),
        b"fn main() {}\n"
    );
}

/// The real process logs why a delivery sent bytes where the sandbox held
/// the revision: a WARN line naming the sandbox, the revision and the
/// reason the cache dir failed its check.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resent_delivery_logs_why() {
    let dir = tempfile::tempdir().unwrap();
    let data_dir = dir.path().join("data");
    let p = Process::start(&data_dir, &[]);
    let token = std::fs::read_to_string(context_service::auth::dev::dev_token_path(&data_dir))
        .unwrap()
        .trim()
        .to_owned();
    let client = context_service::client::Client::new(p.url(""), Some(token.clone())).unwrap();
    client.create_workload(Some("w"), None).await.unwrap();
    let rev = client.upload_bundle("w", tgz(FILES)).await.unwrap();
    client.activate_workload("w", &rev.revision).await.unwrap();
    let http = fresh_client();
    let post = |path: &str, body: Value| {
        http.post(p.url(path))
            .bearer_auth(&token)
            .json(&body)
            .send()
    };
    let resp = post(
        "/v1/sandbox-pools",
        json!({"name": "p", "replicas": 1,
            "workspace": {"size": "1Gi", "accessMode": "ReadWriteOnce"}}),
    )
    .await
    .unwrap();
    assert_eq!(resp.status(), 201, "{}", resp.text().await.unwrap());
    let deliver_run = |run: &'static str| {
        post(
            "/v1/workloads/w/deliveries",
            json!({"runId": run, "sandbox": "sandbox-p-0"}),
        )
    };
    let first = json(deliver_run("a").await.unwrap(), 201).await;
    let path = PathBuf::from(first["deliveries"][0]["path"].as_str().unwrap());
    const MESSAGE: &str = "the sandbox's cache dir failed its check; sending the bundle again";
    let resent = || -> Vec<Value> {
        p.logs()
            .iter()
            .filter_map(|l| serde_json::from_str::<Value>(l).ok())
            .filter(|l| l["fields"]["message"] == MESSAGE)
            .collect()
    };
    // A cache hit logs nothing of the kind.
    let hit = json(deliver_run("b").await.unwrap(), 201).await;
    assert_eq!(hit["deliveries"][0]["cached"], true);
    assert!(resent().is_empty(), "{:#?}", p.logs());

    let file = std::fs::canonicalize(path.join("README.md")).unwrap();
    let mut perms = std::fs::metadata(&file).unwrap().permissions();
    #[allow(clippy::permissions_set_readonly_false)]
    perms.set_readonly(false);
    std::fs::set_permissions(&file, perms).unwrap();
    std::fs::write(&file, b"tampered and longer\n").unwrap();
    let again = json(deliver_run("c").await.unwrap(), 201).await;
    assert_eq!(again["deliveries"][0]["cached"], false);

    // The line is written before the answer; the pipe may lag a little.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let lines = loop {
        let lines = resent();
        if !lines.is_empty() || std::time::Instant::now() > deadline {
            break lines;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(lines.len(), 1, "{:#?}", p.logs());
    let line = &lines[0];
    assert_eq!(line["level"], "WARN", "{line}");
    assert_eq!(line["fields"]["sandbox"], "sandbox-p-0", "{line}");
    assert_eq!(line["fields"]["revision"], rev.revision.as_str(), "{line}");
    assert_eq!(
        line["fields"]["reason"],
        "the cache dir failed verification: its file modes or sizes differ",
        "{line}"
    );
}

async fn hostile_values_are_refused_before_any_exec(via: Via) {
    let (f, ..) = Fixture::ready(via, |_| {}, "w", FILES).await;
    let Fixture {
        server,
        probe,
        alice,
        ..
    } = &f;

    const RUN_RULE: &str = "runId must match ^[a-z0-9][a-z0-9._-]{0,62}$";
    const SANDBOX_RULE: &str = "sandbox must be a Kubernetes name";
    const POOL_RULE: &str = "pool must be a pool name";
    let long = "a".repeat(64);
    let cases: Vec<(Value, &str)> = vec![
        (json!({"runId": "it's", "sandbox": "sandbox-p-0"}), RUN_RULE),
        (json!({"runId": "a b", "sandbox": "sandbox-p-0"}), RUN_RULE),
        (
            json!({"runId": "$(touch x)", "sandbox": "sandbox-p-0"}),
            RUN_RULE,
        ),
        (json!({"runId": "a\nb", "sandbox": "sandbox-p-0"}), RUN_RULE),
        (json!({"runId": "..", "sandbox": "sandbox-p-0"}), RUN_RULE),
        (json!({"runId": "../x", "sandbox": "sandbox-p-0"}), RUN_RULE),
        (json!({"runId": "Run", "sandbox": "sandbox-p-0"}), RUN_RULE),
        (json!({"runId": "", "sandbox": "sandbox-p-0"}), RUN_RULE),
        (json!({"runId": long, "sandbox": "sandbox-p-0"}), RUN_RULE),
        (
            json!({"runId": "r", "sandbox": "sandbox-p-0'; rm -rf /"}),
            SANDBOX_RULE,
        ),
        (
            json!({"runId": "r", "sandbox": "../sandbox-p-0"}),
            SANDBOX_RULE,
        ),
        (json!({"runId": "r", "sandbox": "a b"}), SANDBOX_RULE),
        (json!({"runId": "r", "sandbox": "$(id)"}), SANDBOX_RULE),
        (json!({"runId": "r", "sandbox": "x\ny"}), SANDBOX_RULE),
        (json!({"runId": "r", "pool": "p\"q"}), POOL_RULE),
        (json!({"runId": "r", "pool": ".."}), POOL_RULE),
        (
            json!({"runId": "r", "sandbox": "sandbox-p-0", "pool": "p"}),
            "exactly one of \"sandbox\" and \"pool\" is required",
        ),
        (
            json!({"runId": "r"}),
            "exactly one of \"sandbox\" and \"pool\" is required",
        ),
        (
            json!({"runId": "r", "sandbox": "sandbox-p-0", "verify": "fast"}),
            "unknown variant `fast`",
        ),
        (
            json!({"runId": "r", "sandbox": "sandbox-p-0", "root": "/etc"}),
            "unknown field `root`",
        ),
        (json!({"sandbox": "sandbox-p-0"}), "missing field `runId`"),
    ];
    for (body, message) in cases {
        let resp = deliver(alice, "w", body.clone()).await;
        assert_error(resp, 400, "invalid_request", message).await;
    }
    // The workload name in the path is a value too.
    let resp = alice
        .post(
            "/v1/workloads/w%27x/deliveries",
            &json!({"runId": "r", "sandbox": "sandbox-p-0"}),
        )
        .await;
    assert_error(resp, 400, "invalid_request", "the workload name must be").await;
    let resp = alice.delete("/v1/workloads/w/deliveries/a%20b").await;
    assert_error(resp, 400, "invalid_request", RUN_RULE).await;
    let resp = alice.delete("/v1/workloads/w/deliveries/..").await;
    assert!(resp.status().is_client_error());
    let resp = alice.get("/v1/workloads/w$(x)/deliveries").await;
    assert_error(resp, 400, "invalid_request", "the workload name must be").await;
    assert_eq!(probe.execs.load(Ordering::SeqCst), 0, "nothing ran");
    assert_eq!(
        names_in(&root_of(server, "sandbox-p-0")),
        Vec::<String>::new()
    );
}

async fn owners_are_isolated_also_in_shared_sandboxes(via: Via) {
    let Fixture { server, alice, .. } = Fixture::start(via, |c| {
        c.delivery_shared_selector = Some("context.rossoctl.io/pool=shared".into());
    })
    .await;
    let platform = Caller::user(&server, "platform");
    pool(&platform, "shared", 1).await;
    pool(&platform, "private", 1).await;
    // The same files: the same revision for both owners.
    let (len, rev_p) = ready_workload(&server, "platform", "w", FILES).await;
    let (_, rev_a) = ready_workload(&server, "alice", "w", FILES).await;
    assert_eq!(rev_p, rev_a);

    let mine = json(
        deliver(
            &platform,
            "w",
            json!({"runId": "p1", "sandbox": "sandbox-shared-0"}),
        )
        .await,
        201,
    )
    .await;
    // Alice reaches the shared sandbox through the operator's selector, and
    // gets her own copy: her scope is another directory.
    let hers = json(
        deliver(
            &alice,
            "w",
            json!({"runId": "a1", "sandbox": "sandbox-shared-0"}),
        )
        .await,
        201,
    )
    .await;
    assert_eq!(hers["deliveries"][0]["cached"], false);
    assert_eq!(hers["deliveries"][0]["bytesSent"], len);
    let scope_of = |v: &Value| -> String {
        let path = v["deliveries"][0]["path"].as_str().unwrap().to_owned();
        let parts: Vec<&str> = path.rsplit('/').collect();
        // .../runs/<scope>/<workload>/<run>
        assert_eq!(parts[3], "runs", "{path}");
        parts[2].to_owned()
    };
    let (scope_p, scope_a) = (scope_of(&mine), scope_of(&hers));
    assert_ne!(scope_p, scope_a);
    assert_eq!(scope_a.len(), 32);
    let cache = names_in(&root_of(&server, "sandbox-shared-0").join("cache"));
    assert_eq!(cache, {
        let mut v = vec![format!("{scope_a}-{rev_a}"), format!("{scope_p}-{rev_p}")];
        v.sort();
        v
    });

    // Neither sees nor releases the other's runs.
    let list = json(alice.get("/v1/workloads/w/deliveries").await, 200).await;
    let runs: Vec<&str> = list["deliveries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["runId"].as_str().unwrap())
        .collect();
    assert_eq!(runs, ["a1"]);
    let resp = alice.delete("/v1/workloads/w/deliveries/p1").await;
    assert_error(resp, 404, "run_not_found", "run \"p1\" not found").await;
    let resp = platform.delete("/v1/workloads/w/deliveries/a1").await;
    assert_error(resp, 404, "run_not_found", "run \"a1\" not found").await;
    let path_p = mine["deliveries"][0]["path"].as_str().unwrap();
    assert!(Path::new(path_p).join("README.md").is_file());

    // Another owner's private sandbox or pool answers exactly like a
    // missing one.
    {
        let (sandbox, missing) = ("sandbox-private-0", "sandbox-nope-0");
        let a = deliver(&alice, "w", json!({"runId": "x", "sandbox": sandbox})).await;
        let b = deliver(&alice, "w", json!({"runId": "x", "sandbox": missing})).await;
        assert_eq!(a.status().as_u16(), 404);
        assert_eq!(b.status().as_u16(), 404);
        let (a, b): (Value, Value) = (a.json().await.unwrap(), b.json().await.unwrap());
        assert_eq!(a["error"], "sandbox_not_found");
        assert_eq!(a["message"], format!("sandbox {sandbox:?} not found"));
        assert_eq!(
            a["message"].as_str().unwrap().replace(sandbox, missing),
            b["message"].as_str().unwrap()
        );
        assert_eq!(a["error"], b["error"]);
    }
    for p in ["private", "shared"] {
        let resp = deliver(&alice, "w", json!({"runId": "x", "pool": p})).await;
        assert_error(
            resp,
            404,
            "pool_not_found",
            &format!("sandbox pool {p:?} not found"),
        )
        .await;
    }
    let resp = deliver(&alice, "w", json!({"runId": "x", "pool": "nope"})).await;
    assert_error(
        resp,
        404,
        "pool_not_found",
        "sandbox pool \"nope\" not found",
    )
    .await;

    // Alice's release keeps the platform's copy.
    let resp = alice.delete("/v1/workloads/w/deliveries/a1").await;
    assert_eq!(resp.status().as_u16(), 204);
    assert_eq!(
        names_in(&root_of(&server, "sandbox-shared-0").join("cache")),
        vec![format!("{scope_p}-{rev_p}")]
    );
    assert!(Path::new(path_p).join("README.md").is_file());
}

async fn concurrent_runs_of_one_revision_make_one_transfer(via: Via) {
    let big = noise(2_000_000, 3);
    let (f, len, _) = Fixture::ready(via, |_| {}, "w", &[("big.bin", &big)]).await;
    let Fixture { probe, alice, .. } = &f;
    let mut tasks = Vec::new();
    for i in 0..8 {
        let alice = alice.clone();
        tasks.push(tokio::spawn(async move {
            let body = json!({"runId": format!("run-{i}"), "sandbox": "sandbox-p-0"});
            json(deliver(&alice, "w", body).await, 201).await
        }));
    }
    let mut sent = 0;
    let mut transfers = 0;
    for t in tasks {
        let d = t.await.unwrap()["deliveries"][0].clone();
        sent += d["bytesSent"].as_u64().unwrap();
        transfers += usize::from(d["cached"] == false);
    }
    assert_eq!(sent, len);
    assert_eq!(transfers, 1);
    assert_eq!(probe.execs.load(Ordering::SeqCst), 8, "one exec per run");
    let list = json(alice.get("/v1/workloads/w/deliveries").await, 200).await;
    assert_eq!(list["deliveries"].as_array().unwrap().len(), 8);
}

/// Unmounts on drop, so a failing assertion does not leave a mount behind.
struct Mount(PathBuf);

impl Drop for Mount {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount").arg(&self.0).status();
    }
}

/// Mounts a tmpfs of `size` over `dir` (the tests run as root).
fn mount_tmpfs(dir: &Path, size: &str) -> Mount {
    std::fs::create_dir_all(dir).unwrap();
    let status = std::process::Command::new("mount")
        .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
        .arg(dir)
        .status()
        .expect("running mount");
    assert!(
        status.success(),
        "mounting a {size} tmpfs over {} failed: this test needs root (CAP_SYS_ADMIN)",
        dir.display()
    );
    Mount(dir.to_owned())
}

async fn disk_full_in_the_sandbox_fails_clearly_and_leaves_no_staging_dir(via: Via) {
    let Fixture { server, alice, .. } = Fixture::start(via, |_| {}).await;
    let noisy = noise(1_000_000, 11);
    ready_workload(&server, "alice", "noisy", &[("big.bin", &noisy)]).await;
    // Tiny on the wire, 1 MiB inflated and again 1 MiB extracted.
    let zeros = vec![0u8; 1 << 20];
    ready_workload(&server, "alice", "zeros", &[("zeros.bin", &zeros)]).await;
    pool(&alice, "p", 1).await;
    let root = root_of(&server, "sandbox-p-0");

    // 64 KiB: refused before the transfer (bundle + tar cannot fit);
    // 1500 KiB: the bundle and its tar fit, extracting the tree does not.
    for (size, workload, during) in [("64k", "noisy", ""), ("1500k", "zeros", "extracting")] {
        let mount = mount_tmpfs(&root, size);
        let body = json!({"runId": "r", "sandbox": "sandbox-p-0"});
        let body = json(deliver(&alice, workload, body).await, 502).await;
        assert_eq!(body["error"], "delivery_failed");
        let message = body["message"].as_str().unwrap();
        assert!(message.starts_with("disk_full: "), "{message}");
        assert!(message.contains(during), "{message}");
        assert_eq!(body["deliveries"][0]["error"], message);
        let cache = names_in(&root.join("cache"));
        assert!(
            cache.iter().all(|n| !n.starts_with(".staging")),
            "staging dirs left: {cache:?}"
        );
        assert_eq!(cache, Vec::<String>::new());
        let list = json(
            alice
                .get(&format!("/v1/workloads/{workload}/deliveries"))
                .await,
            200,
        )
        .await;
        assert_eq!(list, json!({"deliveries": []}));
        drop(mount);
    }
}

async fn pool_wide_delivery_and_partial_failure(via: Via) {
    let Fixture { server, alice, .. } = Fixture::start(via, |_| {}).await;
    let (len, revision) = ready_workload(&server, "alice", "w", FILES).await;
    pool(&alice, "trio", 3).await;

    let all = json(
        deliver(&alice, "w", json!({"runId": "r1", "pool": "trio"})).await,
        201,
    )
    .await;
    let deliveries = all["deliveries"].as_array().unwrap();
    let names: Vec<&str> = deliveries
        .iter()
        .map(|d| d["sandbox"].as_str().unwrap())
        .collect();
    assert_eq!(
        names,
        ["sandbox-trio-0", "sandbox-trio-1", "sandbox-trio-2"]
    );
    for d in deliveries {
        assert_eq!(d["bytesSent"], len, "{d}");
        let path = Path::new(d["path"].as_str().unwrap());
        assert_eq!(std::fs::read(path.join("README.md")).unwrap(), b"hello\n");
    }
    let list = json(alice.get("/v1/workloads/w/deliveries").await, 200).await;
    assert_eq!(list["deliveries"][0]["revision"], revision.as_str());
    assert_eq!(
        list["deliveries"][0]["sandboxes"].as_array().unwrap().len(),
        3
    );
    let resp = alice.delete("/v1/workloads/w/deliveries/r1").await;
    assert_eq!(resp.status().as_u16(), 204);
    for d in deliveries {
        assert!(std::fs::symlink_metadata(d["path"].as_str().unwrap()).is_err());
    }

    // Sandbox 1's root cannot be created: it fails, the others succeed and
    // stay registered, and one DELETE cleans up everything.
    let broken = root_of(&server, "sandbox-trio-1");
    std::fs::remove_dir_all(&broken).unwrap();
    std::fs::write(&broken, b"not a directory").unwrap();
    let resp = deliver(&alice, "w", json!({"runId": "r2", "pool": "trio"})).await;
    let body = json(resp, 502).await;
    assert_eq!(body["error"], "delivery_failed");
    let message = body["message"].as_str().unwrap();
    assert!(
        message.starts_with("1 of 3 sandboxes failed; sandbox-trio-1: bad_root: "),
        "{message}"
    );
    let outcomes = body["deliveries"].as_array().unwrap();
    assert_eq!(outcomes.len(), 3);
    assert!(outcomes[0]["path"].is_string() && outcomes[2]["path"].is_string());
    assert!(outcomes[1]["error"]
        .as_str()
        .unwrap()
        .starts_with("bad_root: "));
    assert!(outcomes[1].get("path").is_none());
    let list = json(alice.get("/v1/workloads/w/deliveries").await, 200).await;
    let placed: Vec<&str> = list["deliveries"][0]["sandboxes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["sandbox"].as_str().unwrap())
        .collect();
    assert_eq!(placed, ["sandbox-trio-0", "sandbox-trio-2"]);
    let resp = alice.delete("/v1/workloads/w/deliveries/r2").await;
    assert_eq!(resp.status().as_u16(), 204);
    for i in [0, 2] {
        let cache = root_of(&server, &format!("sandbox-trio-{i}")).join("cache");
        assert_eq!(names_in(&cache), Vec::<String>::new());
    }
}

async fn workload_state_scopes_and_delegation(via: Via) {
    let Fixture {
        server,
        probe,
        alice,
        ..
    } = Fixture::start(via, |_| {}).await;
    pool(&alice, "p", 1).await;
    let body = json!({"runId": "r", "sandbox": "sandbox-p-0"});

    let resp = deliver(&alice, "missing", body.clone()).await;
    assert_error(
        resp,
        404,
        "workload_not_found",
        "workload \"missing\" not found",
    )
    .await;
    let resp = alice.get("/v1/workloads/missing/deliveries").await;
    assert_error(
        resp,
        404,
        "workload_not_found",
        "workload \"missing\" not found",
    )
    .await;
    server
        .client("alice")
        .create_workload(Some("empty"), None)
        .await
        .unwrap();
    let resp = deliver(&alice, "empty", body.clone()).await;
    assert_error(
        resp,
        409,
        "workload_not_ready",
        "workload \"empty\" is awaiting_upload; activate a revision first",
    )
    .await;
    // An upload that waits for activation is named as such.
    server
        .client("alice")
        .upload_bundle("empty", tgz(FILES))
        .await
        .unwrap();
    let resp = deliver(&alice, "empty", body.clone()).await;
    assert_error(
        resp,
        409,
        "workload_not_ready",
        "workload \"empty\" is awaiting_activation; activate its uploaded revision first",
    )
    .await;
    assert_eq!(probe.execs.load(Ordering::SeqCst), 0);

    ready_workload(&server, "alice", "w", FILES).await;
    let narrow = Caller::with_token(
        &server,
        server.token("alice", "workloads:read workloads:write"),
    );
    for resp in [
        deliver(&narrow, "w", body.clone()).await,
        narrow.get("/v1/workloads/w/deliveries").await,
        narrow.delete("/v1/workloads/w/deliveries/r").await,
    ] {
        assert_error(
            resp,
            403,
            "scope_missing",
            "the token lacks the scope \"workloads:deliver\"",
        )
        .await;
    }
    let resp = Caller::anonymous(&server)
        .post("/v1/workloads/w/deliveries", &body)
        .await;
    assert_error(resp, 401, "token_required", "").await;

    // A delegate acts only for users: `user:alice` is not the token subject
    // alice, so her workload is not one it can reach.
    let service = Caller::with_token(&server, server.token("svc", "delegate workloads:deliver"))
        .with_header("x-context-subject", "user:alice");
    let resp = deliver(&service, "w", body.clone()).await;
    assert_error(resp, 404, "workload_not_found", "workload \"w\" not found").await;
    let d = json(deliver(&alice, "w", body.clone()).await, 201).await;
    assert_eq!(d["deliveries"][0]["sandbox"], "sandbox-p-0");
    let list = json(alice.get("/v1/workloads/w/deliveries").await, 200).await;
    assert_eq!(list["deliveries"][0]["runId"], "r");
    // The run id is bound to its revision.
    let client = server.client("alice");
    client.delete_workload("w").await.unwrap();
    let other: &[(&str, &[u8])] = &[("other.txt", b"other\n")];
    let (_, new_rev) = ready_workload(&server, "alice", "w", other).await;
    let resp = deliver(&alice, "w", body.clone()).await;
    assert_error(
        resp,
        409,
        "run_conflict",
        "run \"r\" is registered with revision",
    )
    .await;
    let resp = alice.delete("/v1/workloads/w/deliveries/r").await;
    assert_eq!(resp.status().as_u16(), 204);
    let d = json(deliver(&alice, "w", body).await, 201).await;
    assert_eq!(d["revision"], new_rev.as_str());
}

async fn runs_survive_a_restart(via: Via) {
    let (Fixture { server, alice, .. }, ..) =
        Fixture::ready(via, |c| c.delivery_retention = 1, "w", FILES).await;
    let d = json(
        deliver(
            &alice,
            "w",
            json!({"runId": "keep", "sandbox": "sandbox-p-0"}),
        )
        .await,
        201,
    )
    .await;
    let path = d["deliveries"][0]["path"].as_str().unwrap().to_owned();

    let server = server.restart().await;
    let alice = Caller::user(&server, "alice");
    let list = json(alice.get("/v1/workloads/w/deliveries").await, 200).await;
    assert_eq!(list["deliveries"][0]["runId"], "keep");
    assert_eq!(list["deliveries"][0]["sandboxes"][0]["path"], path.as_str());
    // The scope survived too: a new run is a hit in the same cache dir.
    let again = json(
        deliver(
            &alice,
            "w",
            json!({"runId": "more", "sandbox": "sandbox-p-0"}),
        )
        .await,
        201,
    )
    .await;
    assert_eq!(again["deliveries"][0]["cached"], true);
    for run in ["keep", "more"] {
        let resp = alice
            .delete(&format!("/v1/workloads/w/deliveries/{run}"))
            .await;
        assert_eq!(resp.status().as_u16(), 204);
    }
    assert!(std::fs::symlink_metadata(&path).is_err());
    // Retention 1 keeps the unreferenced revision's cache dir.
    let cache = root_of(&server, "sandbox-p-0").join("cache");
    assert_eq!(names_in(&cache).len(), 1);
}

async fn broken_sandboxes_time_out_or_break_the_protocol_without_leaking(via: Via) {
    let adjust = |c: &mut ServeConfig| c.delivery_timeout = std::time::Duration::from_secs(1);
    let (f, ..) = Fixture::ready(via, adjust, "w", FILES).await;
    let Fixture { probe, alice, .. } = &f;
    let cases = [
        ("sleep 30", "timeout: the delivery did not finish within 1s"),
        ("echo hello", "protocol_error: expected NEED, got \"hello\""),
        (
            "echo secret detail >&2; exit 3",
            "protocol_error: the script exited with 3 without a result before NEED",
        ),
        (
            "echo 'NEED 1'; exit 0",
            "protocol_error: the script asked for 1 bytes; the bundle has",
        ),
        (
            "echo 'ERROR missing_tool tar not found on PATH'; exit 1",
            "missing_tool: tar not found on PATH",
        ),
    ];
    for (script, reason) in cases {
        *probe.replace.lock().unwrap() = Some(script.to_owned());
        let started = std::time::Instant::now();
        let resp = deliver(alice, "w", json!({"runId": "r", "sandbox": "sandbox-p-0"})).await;
        assert_error(resp, 502, "delivery_failed", reason).await;
        assert!(
            started.elapsed() < std::time::Duration::from_secs(10),
            "{script}"
        );
    }
    let list = json(alice.get("/v1/workloads/w/deliveries").await, 200).await;
    assert_eq!(list, json!({"deliveries": []}));
}

async fn bundles_outside_the_cache_are_read_from_disk_or_streamed(via: Via) {
    let big = noise(400_000, 5);
    // 1 KiB cache: the bundle is read from its blob file, held under the
    // in-flight budget (1 MiB) for both sandboxes; then a budget smaller
    // than the bundle: streamed from the file to each sandbox.
    for inflight in [1 << 20, 1024] {
        let Fixture { server, alice, .. } = Fixture::start(via, |c| {
            c.cache_bytes = 1024;
            c.delivery_inflight_bytes = inflight;
        })
        .await;
        let (len, _) = ready_workload(&server, "alice", "w", &[("big.bin", &big)]).await;
        pool(&alice, "p", 2).await;
        let d = json(
            deliver(&alice, "w", json!({"runId": "r", "pool": "p"})).await,
            201,
        )
        .await;
        for o in d["deliveries"].as_array().unwrap() {
            assert_eq!(o["bytesSent"], len, "{o}");
            let path = Path::new(o["path"].as_str().unwrap());
            assert_eq!(std::fs::read(path.join("big.bin")).unwrap(), big);
        }
    }
}

async fn deliveries_are_bounded_by_the_delivery_timeout_not_the_request_deadline(via: Via) {
    let adjust = |c: &mut ServeConfig| c.request_deadline = Duration::from_millis(500);
    let (f, ..) = Fixture::ready(via, adjust, "docs", FILES).await;
    let Fixture { probe, alice, .. } = &f;
    // Every exec into the sandbox takes longer than the request deadline.
    *probe.delay.lock().unwrap() = Some(Duration::from_millis(1200));

    let body = json(
        deliver(
            alice,
            "docs",
            json!({"runId": "slow", "sandbox": "sandbox-p-0"}),
        )
        .await,
        201,
    )
    .await;
    assert_eq!(body["deliveries"][0]["cached"], false);
    let resp = alice.delete("/v1/workloads/docs/deliveries/slow").await;
    assert_eq!(resp.status().as_u16(), 204);
}

// --- the agent only ---

async fn metric(server: &TestServer, name: &str) -> String {
    let text = Caller::anonymous(server)
        .get("/metrics")
        .await
        .text()
        .await
        .unwrap();
    text.lines()
        .find(|l| l.starts_with(name))
        .unwrap_or_else(|| panic!("no {name} in\n{text}"))
        .to_owned()
}

/// `auto` with an agent in the agent directory: sent on first use, kept at
/// `<root>/bin/<sha256>/context-agent`, reused after; every answer says
/// `"transport": "agent"`.
#[tokio::test]
async fn the_agent_is_injected_on_first_use_and_reused() {
    let adjust = |c: &mut ServeConfig| c.delivery_transport = "auto".into();
    let (f, len, _) = Fixture::ready(Via::Agent, adjust, "w", FILES).await;
    let Fixture { server, alice, .. } = &f;
    let root = root_of(server, "sandbox-p-0");
    let sha = hex::encode(<sha2::Sha256 as sha2::Digest>::digest(
        std::fs::read(&agent().binary).unwrap(),
    ));
    let bin = root.join("bin").join(&sha).join("context-agent");
    let mut inode = None;
    for (run, cached) in [("a", false), ("b", true)] {
        let body = json!({"runId": run, "sandbox": "sandbox-p-0"});
        let d = json(deliver(alice, "w", body).await, 201).await["deliveries"][0].clone();
        assert_eq!(d["transport"], "agent");
        assert_eq!(d["cached"], cached);
        assert_eq!(d["bytesSent"], if cached { 0 } else { len });
        let meta = std::fs::metadata(&bin).expect("the agent is kept in the sandbox");
        assert_eq!(
            std::os::unix::fs::PermissionsExt::mode(&meta.permissions()) & 0o7777,
            0o555
        );
        let ino = std::os::unix::fs::MetadataExt::ino(&meta);
        assert_eq!(*inode.get_or_insert(ino), ino, "not sent again");
    }
    assert_eq!(
        metric(server, "context_service_delivery_agent_injections_total").await,
        "context_service_delivery_agent_injections_total 1"
    );
    // Removed by someone in the sandbox: sent again.
    std::fs::remove_file(&bin).unwrap();
    let body = json!({"runId": "c", "sandbox": "sandbox-p-0"});
    let d = json(deliver(alice, "w", body).await, 201).await["deliveries"][0].clone();
    assert_eq!(d["transport"], "agent");
    assert!(bin.exists());
    assert_eq!(
        metric(server, "context_service_delivery_agent_injections_total").await,
        "context_service_delivery_agent_injections_total 2"
    );
}

/// The sandbox's `uname -m` names an arch without an agent (a shell
/// function in front of the launcher): the script delivers, and says so.
#[tokio::test]
async fn an_unknown_arch_is_served_by_the_script() {
    let (f, len, _) = Fixture::ready(Via::Agent, |_| {}, "w", FILES).await;
    let Fixture {
        server,
        alice,
        probe,
        ..
    } = &f;
    *probe.prefix.lock().unwrap() = Some("uname() { echo s390x; }".into());
    let body = json!({"runId": "a", "sandbox": "sandbox-p-0"});
    let d = json(deliver(alice, "w", body).await, 201).await["deliveries"][0].clone();
    assert_eq!(d["transport"], "script");
    assert_eq!(d["bytesSent"], len);
    let root = root_of(server, "sandbox-p-0");
    assert!(!root.join("bin").exists(), "nothing was sent");
    // The same sandbox with its real arch: the agent, which finds the
    // script's tree a verified hit.
    *probe.prefix.lock().unwrap() = None;
    let body = json!({"runId": "b", "sandbox": "sandbox-p-0"});
    let d = json(deliver(alice, "w", body).await, 201).await["deliveries"][0].clone();
    assert_eq!(
        (d["transport"].clone(), d["cached"].clone()),
        (json!("agent"), json!(true))
    );
}

/// `exec` insists on an agent; `auto` without one uses the script.
#[tokio::test]
async fn the_exec_transport_needs_an_agent() {
    let empty = tempfile::tempdir().unwrap();
    let dir = empty.path().to_owned();
    let err = TestServer::try_start_with(|c| {
        c.delivery_transport = "exec".into();
        c.delivery_agent_dir = Some(dir.clone());
    })
    .await
    .err()
    .expect("refused to start");
    assert!(
        format!("{err:#}").contains("the delivery transport exec needs an agent (context-agent-x86_64 or context-agent-aarch64) in the agent directory"),
        "{err:#}"
    );
    let (f, _, _) = Fixture::ready(
        Via::Script,
        |c| {
            c.delivery_transport = "auto".into();
            c.delivery_agent_dir = Some(dir.clone());
        },
        "w",
        FILES,
    )
    .await;
    let body = json!({"runId": "a", "sandbox": "sandbox-p-0"});
    let d = json(deliver(&f.alice, "w", body).await, 201).await["deliveries"][0].clone();
    assert_eq!(d["transport"], "script");
}
