//! `context-service migrate`, end to end with real engines: a service on
//! the embedded store over HTTP makes workloads, bundles and grants; the
//! real binary copies its data dir into a throwaway PostgreSQL
//! (`tests/common/postgres.rs`) and a private SeaweedFS
//! (`tests/scale/seaweedfs.sh`); a service on PostgreSQL + S3 on an empty
//! data dir then serves the same workloads.
//!
//! Alone in its binary: it points this process's `AWS_*` variables at its
//! own SeaweedFS. Needs the SeaweedFS binary (`tests/scale/seaweedfs.sh
//! build`); without it each test says so and passes, unless
//! `CONTEXT_SERVICE_REQUIRE_S3` is set (`make s3`).

#[path = "common/mod.rs"]
mod common;

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use serde_json::Value;

use common::postgres::Cluster;
use common::workload_bundles::{noise, tgz, MEDIA};
use common::{assert_error, Caller, TestServer};
use context_service::store::{
    DatabaseUrl, MetadataStore, ObjectBlobs, PostgresStore, RedbSource, RedbStore, RunRecord,
    RunSandbox, RunStore,
};

const SCRIPT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/scale/seaweedfs.sh");

/// A private SeaweedFS, stopped when the last test using it is done.
struct S3 {
    state: tempfile::TempDir,
    bucket: String,
}

impl Drop for S3 {
    fn drop(&mut self) {
        let _ = Command::new(SCRIPT)
            .arg("down")
            .env("CONTEXT_SERVICE_SEAWEEDFS_STATE", self.state.path())
            .status();
    }
}

/// The private S3 server (started on first use, shared by the tests running
/// at the time), or `None` when there is no SeaweedFS binary.
fn s3() -> Option<Arc<S3>> {
    static CURRENT: Mutex<Weak<S3>> = Mutex::new(Weak::new());
    let mut current = CURRENT
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    if let Some(s3) = current.upgrade() {
        return Some(s3);
    }
    let state = tempfile::tempdir().unwrap();
    let run = |cmd: &str| {
        Command::new(SCRIPT)
            .arg(cmd)
            .env("CONTEXT_SERVICE_SEAWEEDFS_STATE", state.path())
            .output()
            .expect("run seaweedfs.sh")
    };
    let up = run("up");
    if !up.status.success() {
        let why = String::from_utf8_lossy(&up.stderr).into_owned();
        assert!(
            std::env::var_os("CONTEXT_SERVICE_REQUIRE_S3").is_none(),
            "CONTEXT_SERVICE_REQUIRE_S3 is set but SeaweedFS did not start: {why}"
        );
        eprintln!("skipped: no S3 server ({why})");
        let _ = run("down");
        return None;
    }
    let env = run("env");
    let mut bucket = String::new();
    for line in String::from_utf8_lossy(&env.stdout).lines() {
        let Some((k, v)) = line.trim_start_matches("export ").split_once('=') else {
            continue;
        };
        if k.starts_with("AWS_") {
            std::env::set_var(k, v);
        }
        if k == "CONTEXT_SERVICE_TEST_S3_BUCKET" {
            bucket = v.to_owned();
        }
    }
    assert!(!bucket.is_empty(), "seaweedfs.sh env names no bucket");
    let s3 = Arc::new(S3 { state, bucket });
    *current = Arc::downgrade(&s3);
    Some(s3)
}

/// A fresh prefix of the test bucket.
fn blob_url(s3: &S3, name: &str) -> String {
    format!(
        "s3://{}/migrate-{name}-{}-{}",
        s3.bucket,
        std::process::id(),
        rand_suffix()
    )
}

fn rand_suffix() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos() as u64
}

/// Runs `context-service migrate --from-data-dir DIR ARGS...` into `url`
/// and `blobs`.
fn migrate(dir: &Path, url: &DatabaseUrl, blobs: &str, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_context-service"))
        .arg("migrate")
        .arg("--from-data-dir")
        .arg(dir)
        .args(args)
        .env("CS_DATABASE_URL", url.expose())
        .env("CS_BLOB_URL", blobs)
        .output()
        .expect("run context-service migrate")
}

fn text(out: &[u8]) -> String {
    String::from_utf8_lossy(out).into_owned()
}

/// A service on the embedded store only (whatever the test settings say).
async fn embedded_source() -> TestServer {
    TestServer::start_with(|c| {
        c.database_url = None;
        c.blob_url = None;
    })
    .await
}

/// A service on PostgreSQL + S3 on an empty data dir, with `key` as its
/// owner-scope key.
async fn scaled_target(url: &DatabaseUrl, blobs: &str, key: Option<&Path>) -> TestServer {
    let (url, blobs, key) = (url.clone(), blobs.to_owned(), key.map(Path::to_owned));
    TestServer::start_with(move |c| {
        c.database_url = Some(url);
        c.blob_url = Some(blobs);
        c.owner_scope_secret_file = key;
    })
    .await
}

fn blob_file(data_dir: &Path, digest: &str) -> PathBuf {
    data_dir
        .join("blobs/sha256")
        .join(&digest[..2])
        .join(digest)
}

async fn body_of(caller: &Caller, name: &str, revision: &str) -> Vec<u8> {
    let resp = caller
        .get(&format!("/v1/workloads/{name}/revisions/{revision}/bundle"))
        .await;
    assert_eq!(resp.status().as_u16(), 200, "download {name}@{revision}");
    resp.bytes().await.unwrap().to_vec()
}

async fn listing(caller: &Caller) -> Value {
    let resp = caller.get("/v1/workloads").await;
    assert_eq!(resp.status().as_u16(), 200);
    resp.json::<Value>().await.unwrap()["workloads"].clone()
}

/// The target store.
async fn target_store(url: &DatabaseUrl) -> Arc<PostgresStore> {
    Arc::new(PostgresStore::connect(url).await.unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn migrate_copies_a_single_replica_into_postgres_and_object_storage() {
    let Some(s3) = s3() else { return };
    let url = Cluster::shared().create_database();
    let blobs = blob_url(&s3, "main");

    // The single replica: two active workloads, one with a candidate only,
    // one awaiting its upload with a fresh grant.
    let mut source = embedded_source().await;
    let alice = source.client("alice");
    let mut revisions = Vec::new();
    for (name, files) in [
        ("docs", vec![("guide.md", b"# guide\n".to_vec())]),
        ("tools", vec![("big.bin", noise(200 << 10, 7))]),
    ] {
        let files: Vec<(&str, &[u8])> = files.iter().map(|(n, d)| (*n, d.as_slice())).collect();
        alice.create_workload(Some(name), None).await.unwrap();
        let rev = alice.upload_bundle(name, tgz(&files)).await.unwrap();
        alice.activate_workload(name, &rev.revision).await.unwrap();
        revisions.push(rev);
    }
    alice.create_workload(Some("draft"), None).await.unwrap();
    let draft = alice
        .upload_bundle("draft", tgz(&[("notes.txt", b"not active yet\n")]))
        .await
        .unwrap();
    alice.create_workload(Some("inbox"), None).await.unwrap();
    let grant = alice.upload_grant("inbox").await.unwrap();
    let before = listing(&Caller::user(&source, "alice")).await;

    // While the service runs on it, the source is refused.
    let out = migrate(&source.data_dir, &url, &blobs, &[]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stderr));
    let stderr = text(&out.stderr);
    assert!(
        stderr.contains(&format!(
            "data dir {} in use by another context-service (pid {}): stop it first; \
             migrate must be its only user",
            source.data_dir.display(),
            std::process::id()
        )),
        "{stderr}"
    );
    assert_eq!(stderr.lines().count(), 1, "one line: {stderr}");

    source.stop().await;
    // A delivery run record (deliveries need sandboxes; the record is what
    // migrate copies).
    let run = RunRecord {
        owner: "sub:alice".into(),
        workload: "docs".into(),
        run_id: "run-1".into(),
        revision: revisions[0].revision.clone(),
        scope: "s".repeat(32),
        sandboxes: vec![RunSandbox {
            sandbox: "sb-1".into(),
            pod: None,
            root: "/workspace/.context".into(),
            path: "/workspace/.context/runs/run-1".into(),
        }],
        created_at_ms: 1,
    };
    {
        let store = RedbStore::open(&source.data_dir.join("store/meta.redb")).unwrap();
        store.add_to_run(&run).await.unwrap();
        let grant_id = grant.url.rsplit('/').next().unwrap();
        assert!(
            store.grant(grant_id).await.unwrap().is_some(),
            "{}",
            grant.url
        );
    }
    let redb_before = std::fs::read(source.data_dir.join("store/meta.redb")).unwrap();
    // The grants migrate copies: the unexpired ones (every one here).
    let grants = {
        let src = RedbSource::open(&source.data_dir.join("store/meta.redb")).unwrap();
        src.grants().unwrap().len()
    };
    assert!(grants >= 1, "the inbox grant at least");

    let key = tempfile::tempdir().unwrap();
    let key_file = key.path().join("owner-scope-key");
    let key_arg = key_file.to_str().unwrap();
    let out = migrate(
        &source.data_dir,
        &url,
        &blobs,
        &["--write-owner-scope-key", key_arg],
    );
    let stdout = text(&out.stdout);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{stdout}\n{}",
        text(&out.stderr)
    );
    assert!(
        stdout.contains("workloads: 4 copied, 0 already there, 0 conflicts"),
        "{stdout}"
    );
    assert!(
        stdout.contains("runs:      1 copied, 0 already there, 0 conflicts"),
        "{stdout}"
    );
    assert!(
        stdout.contains(&format!(
            "grants:    {grants} copied, 0 already there, 0 conflicts"
        )),
        "{stdout}"
    );
    let bytes: u64 = revisions.iter().map(|r| r.bytes).sum::<u64>() + draft.bytes;
    assert!(
        stdout.contains(&format!(
            "blobs:     3 copied ({bytes} bytes), 0 already there"
        )),
        "{stdout}"
    );
    assert!(
        stdout.contains(&format!("owner-scope key written to {key_arg}")),
        "{stdout}"
    );
    // The key: `hex:` and the source's server secret, private.
    let secret = std::fs::read_to_string(source.data_dir.join("auth/server-secret")).unwrap();
    assert_eq!(
        std::fs::read_to_string(&key_file).unwrap(),
        format!("hex:{}\n", secret.trim())
    );
    assert_eq!(
        std::fs::metadata(&key_file).unwrap().permissions().mode() & 0o777,
        0o600
    );
    assert_eq!(
        std::fs::read(source.data_dir.join("store/meta.redb")).unwrap(),
        redb_before,
        "the source is not modified"
    );

    // Again: nothing copied, exit 0, and it says so.
    let out = migrate(&source.data_dir, &url, &blobs, &[]);
    let stdout = text(&out.stdout);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{stdout}\n{}",
        text(&out.stderr)
    );
    assert!(
        stdout.contains("workloads: 0 copied, 4 already there, 0 conflicts"),
        "{stdout}"
    );
    assert!(
        stdout.contains("blobs:     0 copied (0 bytes), 3 already there"),
        "{stdout}"
    );
    assert!(
        stdout.contains(&format!(
            "grants:    0 copied, {grants} already there, 0 conflicts"
        )),
        "{stdout}"
    );
    assert!(
        stdout.contains("nothing to copy: the target already holds everything"),
        "{stdout}"
    );
    // Without --write-owner-scope-key: the next step, exactly.
    assert!(
        stdout.contains(&format!(
            "kubectl -n context-service create secret generic context-service-owner-scope \
             --from-literal=key=\"hex:$(cat {})\"",
            source.data_dir.join("auth/server-secret").display()
        )),
        "{stdout}"
    );

    // A service on PostgreSQL + S3 on an empty data dir serves it all.
    let target = scaled_target(&url, &blobs, Some(&key_file)).await;
    let alice_t = Caller::user(&target, "alice");
    assert_eq!(listing(&alice_t).await, before, "the same workloads");
    for rev in &revisions {
        let source_bytes = std::fs::read(blob_file(&source.data_dir, &rev.bundle_digest)).unwrap();
        assert_eq!(
            body_of(&alice_t, &rev.name, &rev.revision).await,
            source_bytes,
            "{} downloads byte-identical",
            rev.name
        );
    }
    let activated = target
        .client("alice")
        .activate_workload("draft", &draft.revision)
        .await
        .unwrap();
    assert_eq!(activated.status, "ready");
    assert_eq!(
        body_of(&alice_t, "draft", &draft.revision).await,
        std::fs::read(blob_file(&source.data_dir, &draft.bundle_digest)).unwrap()
    );
    // The grant works once.
    let bundle = tgz(&[("mail.txt", b"hello\n")]);
    let resp = Caller::with_token(&target, &grant.token)
        .put(&grant.url, MEDIA, bundle.clone())
        .await;
    assert_eq!(
        resp.status().as_u16(),
        201,
        "{}",
        resp.text().await.unwrap()
    );
    let used_again = Caller::with_token(&target, &grant.token)
        .put(&grant.url, MEDIA, bundle.clone())
        .await;
    assert_error(
        used_again,
        401,
        "token_invalid",
        "the upload grant is invalid or was already used",
    )
    .await;
    let store = target_store(&url).await;
    let copied_run = store.run("sub:alice", "docs", "run-1").await.unwrap();
    assert_eq!(copied_run, Some(run));

    // Now the target moved on (draft activated, inbox uploaded): a third
    // run reports both as conflicts, leaves them alone, and does not bring
    // the used grant back.
    let out = migrate(&source.data_dir, &url, &blobs, &[]);
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    assert_eq!(out.status.code(), Some(1), "{stdout}\n{stderr}");
    assert!(
        stdout.contains("workloads: 0 copied, 2 already there, 2 conflicts"),
        "{stdout}"
    );
    for name in ["draft", "inbox"] {
        assert!(
            stderr.lines().any(|l| l.starts_with(&format!(
                "context-service: conflict: workload sub:alice/{name} is in the target \
                 already and differs (version "
            )) && l.ends_with("; left alone")),
            "{stderr}"
        );
    }
    assert_eq!(stderr.lines().count(), 2, "{stderr}");
    assert!(stdout.contains("grants:    0 copied, "), "{stdout}");
    let view = target.client("alice").workload("draft").await.unwrap();
    assert_eq!(view.status, "ready", "the newer record is kept");
    assert_error(
        Caller::with_token(&target, &grant.token)
            .put(&grant.url, MEDIA, bundle)
            .await,
        401,
        "token_invalid",
        "the upload grant is invalid or was already used",
    )
    .await;
    drop(s3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_corrupt_blob_is_refused_and_its_workload_left_out() {
    let Some(s3) = s3() else { return };
    let url = Cluster::shared().create_database();
    let blobs = blob_url(&s3, "corrupt");
    let mut source = embedded_source().await;
    let alice = source.client("alice");
    let mut revs = Vec::new();
    for name in ["good", "bad"] {
        alice.create_workload(Some(name), None).await.unwrap();
        let rev = alice
            .upload_bundle(name, tgz(&[("f.txt", name.as_bytes())]))
            .await
            .unwrap();
        alice.activate_workload(name, &rev.revision).await.unwrap();
        revs.push(rev);
    }
    source.stop().await;
    let bad = &revs[1];
    let path = blob_file(&source.data_dir, &bad.bundle_digest);
    let mut bytes = std::fs::read(&path).unwrap();
    let mid = bytes.len() / 2;
    bytes[mid] ^= 0xff;
    std::fs::write(&path, &bytes).unwrap();

    let out = migrate(&source.data_dir, &url, &blobs, &[]);
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    assert_eq!(out.status.code(), Some(1), "{stdout}\n{stderr}");
    assert_eq!(stderr.lines().count(), 1, "one line: {stderr}");
    let digest = &bad.bundle_digest;
    let expected = format!(
        "context-service: workload sub:alice/bad: bundle {digest} does not match its record: {} holds {} bytes with sha256 ",
        path.display(),
        bytes.len()
    );
    assert!(stderr.starts_with(&expected), "{stderr}");
    assert!(
        stderr.trim_end().ends_with("; workload not copied"),
        "{stderr}"
    );
    assert!(
        stdout.contains("workloads: 1 copied, 0 already there, 0 conflicts"),
        "{stdout}"
    );

    // Nothing of `bad` in the target: no record, no grant, no object.
    let store = target_store(&url).await;
    let good = store.workload("sub:alice", "good").await.unwrap();
    let bad_rec = store.workload("sub:alice", "bad").await.unwrap();
    assert!(good.is_some());
    assert!(bad_rec.is_none(), "{bad_rec:?}");
    let objects = ObjectBlobs::from_url(&blobs).unwrap();
    assert_eq!(objects.size(digest).await.unwrap(), None);
    assert_eq!(
        objects.size(&revs[0].bundle_digest).await.unwrap(),
        Some(revs[0].bytes)
    );
    let target = scaled_target(&url, &blobs, None).await;
    let names: Vec<String> = listing(&Caller::user(&target, "alice"))
        .await
        .as_array()
        .unwrap()
        .iter()
        .map(|w| w["name"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(names, ["good"]);
    drop(s3);
}

/// A data dir that is no store, and bad usage: the documented exit codes.
#[test]
fn usage_errors_exit_2_and_a_missing_store_exits_1() {
    let out = Command::new(env!("CARGO_BIN_EXE_context-service"))
        .args(["migrate", "--database-url", "postgres://cs@127.0.0.1:1/cs"])
        .env("CS_BLOB_URL", "s3://b/p")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2), "{}", text(&out.stderr));
    assert!(
        text(&out.stderr).contains("--from-data-dir <DIR>"),
        "{}",
        text(&out.stderr)
    );
    let empty = tempfile::tempdir().unwrap();
    let url: DatabaseUrl = "postgres://cs@127.0.0.1:1/cs".parse().unwrap();
    let out = migrate(empty.path(), &url, "s3://b/p", &[]);
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(
        text(&out.stderr),
        format!(
            "context-service: no embedded store at {}\n",
            empty.path().join("store/meta.redb").display()
        )
    );
    assert!(
        std::fs::read_dir(empty.path()).unwrap().next().is_none(),
        "nothing created"
    );
}

/// The docs' migrate example (docs/scale-out.md, "Moving a single replica
/// up"), run as written against PostgreSQL and S3: the copy, the second
/// run, and a replica on the copied stores with the written key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readme_migrate_example_runs() {
    // Whichever page holds it: README.md or one under docs/. Found before
    // the S3 check, so a lost marker fails even where no S3 server runs.
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut pages = vec![root.join("README.md")];
    pages.extend(
        std::fs::read_dir(root.join("docs"))
            .expect("docs/")
            .map(|e| e.expect("a docs/ entry").path())
            .filter(|p| p.extension().is_some_and(|x| x == "md")),
    );
    let page = pages
        .iter()
        .map(|p| std::fs::read_to_string(p).expect("a doc page"))
        .find(|text| text.lines().any(|l| l.starts_with("<!-- migrate:")))
        .expect("the migrate example's marker");
    let mut lines = page.lines();
    lines.by_ref().find(|l| l.starts_with("<!-- migrate:"));
    assert_eq!(lines.next(), Some("```sh"));
    let block = lines
        .take_while(|l| *l != "```")
        .collect::<Vec<_>>()
        .join("\n");
    assert!(block.contains("context-service migrate"), "{block}");
    let Some(s3) = s3() else { return };

    let work = tempfile::tempdir().unwrap();
    let data = work.path().join("data");
    std::fs::create_dir_all(&data).unwrap();
    let mut source = TestServer::start_in(&data, |c| {
        c.database_url = None;
        c.blob_url = None;
    })
    .await;
    // The development token's subject, as contextctl uses it.
    let dev = source.client("dev");
    dev.create_workload(Some("handbook"), None).await.unwrap();
    let rev = dev
        .upload_bundle("handbook", tgz(&[("index.md", b"# handbook\n")]))
        .await
        .unwrap();
    dev.activate_workload("handbook", &rev.revision)
        .await
        .unwrap();
    source.stop().await;

    let url = Cluster::shared().create_database();
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .unwrap()
        .port();
    let bin_dir = Path::new(env!("CARGO_BIN_EXE_contextctl"))
        .parent()
        .unwrap();
    let path = format!(
        "{}:{}",
        bin_dir.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let mut cmd = tokio::process::Command::new("bash");
    cmd.arg("-ec")
        .arg(&block)
        .current_dir(work.path())
        .env("PATH", path)
        .env("CS_DATABASE_URL", url.expose())
        .env("CS_BLOB_URL", blob_url(&s3, "readme"))
        .env("CS_LISTEN_ADDR", format!("127.0.0.1:{port}"))
        .env("CONTEXT_SERVICE_URL", format!("http://127.0.0.1:{port}"))
        .env("CS_SHUTDOWN_GRACE", "0s")
        .env_remove("CONTEXT_SERVICE_TOKEN")
        .env_remove("CS_DATA_DIR")
        .env_remove("CS_OWNER_SCOPE_SECRET_FILE")
        .kill_on_drop(true);
    let out = tokio::time::timeout(Duration::from_secs(120), cmd.output())
        .await
        .expect("the example finishes")
        .expect("bash runs");
    let stdout = text(&out.stdout);
    assert!(
        out.status.success(),
        "doc block failed ({}):\n{block}\n--- stdout\n{stdout}\n--- stderr\n{}",
        out.status,
        text(&out.stderr)
    );
    assert!(
        stdout.contains("workloads: 1 copied, 0 already there, 0 conflicts"),
        "{stdout}"
    );
    assert!(stdout.contains("nothing to copy"), "{stdout}");
    assert!(
        stdout.lines().any(|l| l.starts_with("handbook")),
        "the replica lists the copied workload: {stdout}"
    );
    assert!(
        !work.path().join("replica-a/store/meta.redb").exists(),
        "the replica keeps no embedded store"
    );
    drop(s3);
}
