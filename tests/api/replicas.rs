//! Two replicas on one PostgreSQL database and one S3 bucket, over real
//! HTTP, as a scaled-out deployment runs them: what one replica stores the
//! other downloads and delivers; a delete on one is a `404` on the other at
//! once, even for a bundle the other holds in its cache; a replica killed
//! (`SIGKILL`) in the middle of an upload leaves no visible partial state,
//! its grant usable, and no orphan object once the other replica's
//! collection ran.
//!
//! Needs the S3 test server (`eval "$(tests/scale/seaweedfs.sh env)"`, as
//! `make s3` does); without it each test says so and passes, unless
//! `CONTEXT_SERVICE_REQUIRE_S3` is set.

use std::path::{Path, PathBuf};
use std::time::Duration;

use rustix::process::Signal;
use serde_json::{json, Value};

use super::scale_out::{json_of, share_auth};
use crate::common::postgres::Cluster;
use crate::common::process::Process;
use crate::common::s3::{bucket, digests_under, fresh_prefix, local_blob, raw};
use crate::common::workload_bundles::{noise, sha256, tgz, MEDIA};
use crate::common::{assert_error, deliver, eventually, Caller, TestServer};
use context_service::config::ServeConfig;
use context_service::store::DatabaseUrl;

/// The settings both replicas share: one database, one bucket prefix.
fn shared_stores(db: &DatabaseUrl, blob_url: &str) -> impl Fn(&mut ServeConfig) {
    let (db, blob_url) = (db.clone(), blob_url.to_owned());
    move |c| {
        c.database_url = Some(db.clone());
        c.blob_url = Some(blob_url.clone());
    }
}

#[tokio::test]
async fn what_one_replica_stores_the_other_serves_delivers_and_forgets_on_delete() {
    let Some(bucket) = bucket() else { return };
    let db = Cluster::shared().create_database();
    let blob_url = format!("s3://{bucket}/{}", fresh_prefix("replicas"));
    let a = TestServer::start_with(shared_stores(&db, &blob_url)).await;
    let dir = tempfile::tempdir().unwrap();
    share_auth(&a.data_dir, dir.path());
    let b = TestServer::start_in(dir.path(), shared_stores(&db, &blob_url))
        .await
        .owning(dir);
    let (alice_a, alice_b) = (Caller::user(&a, "alice"), Caller::user(&b, "alice"));

    // Stored and activated through A.
    let files: &[(&str, &[u8])] = &[("README.md", b"hello\n"), ("data.bin", &noise(400_000, 3))];
    let client = a.client("alice");
    client.create_workload(Some("docs"), None).await.unwrap();
    let rev = client.upload_bundle("docs", tgz(files)).await.unwrap();
    client
        .activate_workload("docs", &rev.revision)
        .await
        .unwrap();

    // B never saw the upload: it fetches the bundle from the bucket, and
    // serves the bytes A stored.
    assert!(!local_blob(&b.data_dir, &rev.bundle_digest).exists());
    let path = format!("/v1/workloads/docs/revisions/{}/bundle", rev.revision);
    let resp = alice_b.get(&path).await;
    assert_eq!(resp.status().as_u16(), 200);
    assert_eq!(
        resp.headers()["etag"].to_str().unwrap(),
        format!("\"sha256:{}\"", rev.bundle_digest)
    );
    let body = resp.bytes().await.unwrap();
    assert_eq!(body.len() as u64, rev.bytes);
    assert_eq!(sha256(&body), rev.bundle_digest);
    assert!(local_blob(&b.data_dir, &rev.bundle_digest).exists());

    // And delivers it into one of its own sandboxes.
    let pool = json!({"name": "p", "replicas": 1,
        "workspace": {"size": "1Gi", "accessMode": "ReadWriteOnce"}});
    json_of(alice_b.post("/v1/sandbox-pools", &pool).await, 201).await;
    let delivered = json_of(deliver(&alice_b, "docs", "run-1", "sandbox-p-0").await, 201).await;
    let d = &delivered["deliveries"][0];
    assert_eq!(delivered["revision"], rev.revision.as_str(), "{delivered}");
    let root = PathBuf::from(d["path"].as_str().expect("delivery path"));
    assert_eq!(std::fs::read(root.join("README.md")).unwrap(), b"hello\n");
    assert_eq!(
        std::fs::read(root.join("data.bin")).unwrap(),
        noise(400_000, 3)
    );

    // Deleted through A: B, which holds the bundle in its cache, refuses it
    // at once, as a download and as a delivery.
    let resp = alice_a.delete("/v1/workloads/docs").await;
    assert_eq!(resp.status().as_u16(), 204);
    assert_error(
        alice_b.get(&path).await,
        404,
        "workload_not_found",
        "workload \"docs\" not found",
    )
    .await;
    assert_error(
        deliver(&alice_b, "docs", "run-2", "sandbox-p-0").await,
        404,
        "workload_not_found",
        "workload \"docs\" not found",
    )
    .await;
}

/// The bundle engine's temp files of a service on `data_dir` (an upload in
/// progress, or one a crash left).
fn temp_files(data_dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for dir in [data_dir.join("blobs/sha256"), data_dir.join("tmp")] {
        for entry in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            let is_file = entry.file_type().map(|t| t.is_file()).unwrap_or(false);
            if is_file && (name.starts_with(".tmp") || dir.ends_with("tmp")) {
                out.push(entry.path());
            }
        }
    }
    out
}

// Multi-threaded, and the child is started off the runtime: replica B's
// database connections run on this test's runtime, and a blocked runtime
// would leave B's transactions unfinished (holding their locks) while A
// starts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_killed_mid_upload_leaves_no_partial_state_and_no_orphan_after_collection() {
    let Some(bucket) = bucket() else { return };
    let raw = raw(&bucket);
    let db = Cluster::shared().create_database();
    let prefix = fresh_prefix("killed");
    let blob_url = format!("s3://{bucket}/{prefix}");
    // B collects unnamed objects older than 1 s (a sweep every second).
    let b = TestServer::start_with(|c| {
        shared_stores(&db, &blob_url)(c);
        c.blob_gc_grace = Duration::from_secs(1);
    })
    .await;
    let a_dir = tempfile::tempdir().unwrap();
    share_auth(&b.data_dir, a_dir.path());
    let args = ["--database-url", db.expose(), "--blob-url", &blob_url];
    let mut a = start_replica(a_dir.path(), &args).await;

    let alice_b = Caller::user(&b, "alice");
    let created = json_of(
        alice_b
            .post("/v1/workloads", &json!({"name": "docs"}))
            .await,
        201,
    )
    .await;
    let (grant_url, grant_token) = (
        created["upload"]["url"].as_str().unwrap().to_owned(),
        created["upload"]["token"].as_str().unwrap().to_owned(),
    );

    // The upload goes to A as a stream we control.
    let bundle = tgz(&[("big.bin", &noise(3 << 20, 9))]);
    let (tx, rx) = tokio::sync::mpsc::channel::<Result<Vec<u8>, std::io::Error>>(4);
    let put = reqwest::Client::new()
        .put(a.url(&grant_url))
        .bearer_auth(&grant_token)
        .header("content-type", MEDIA)
        .body(reqwest::Body::wrap_stream(futures::stream::unfold(
            rx,
            |mut rx| async move { rx.recv().await.map(|chunk| (chunk, rx)) },
        )))
        .send();
    let upload = tokio::spawn(put);
    tx.send(Ok(bundle[..64 << 10].to_vec())).await.unwrap();
    // A took the upload (its grant checked, the bundle engine writing).
    assert!(
        eventually(Duration::from_secs(20), async || !temp_files(a_dir.path())
            .is_empty())
        .await,
        "A never started writing the upload"
    );
    // Hold the workloads table, so A stops between "the object is stored"
    // and "the metadata names it": the one window an orphan can come from.
    let (mut pg, connection) = tokio_postgres::connect(db.expose(), tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(connection);
    let lock = pg.transaction().await.unwrap();
    lock.batch_execute("LOCK TABLE cs_workloads IN ACCESS EXCLUSIVE MODE")
        .await
        .unwrap();
    tx.send(Ok(bundle[64 << 10..].to_vec())).await.unwrap();
    drop(tx);
    let mut stored = Vec::new();
    assert!(
        eventually(Duration::from_secs(30), async || {
            stored = digests_under(&raw, &prefix).await;
            !stored.is_empty()
        })
        .await,
        "A never stored the bundle"
    );
    // Killed there: the object is in the bucket, nothing names it.
    a.signal(Signal::KILL);
    assert!(!a.wait(Duration::from_secs(10)).success());
    assert!(upload.await.unwrap().is_err(), "the upload cannot succeed");
    assert_eq!(stored.len(), 1, "{stored:?}");
    let orphan = stored[0].clone();
    // On A's disk: the bundle as a temp file, or already made durable as
    // its copy (the kill may land on either side of that step).
    assert!(
        !temp_files(a_dir.path()).is_empty() || local_blob(a_dir.path(), &orphan).exists(),
        "the crash left nothing on A's disk"
    );
    lock.rollback().await.unwrap();

    // Nothing of the upload is visible, on either replica's database view.
    let shown = json_of(alice_b.get("/v1/workloads/docs").await, 200).await;
    assert_eq!(shown["status"], "awaiting_upload", "{shown}");
    assert_eq!(shown["candidateRevision"], Value::Null, "{shown}");
    assert_eq!(shown["bundleDigest"], Value::Null, "{shown}");

    // B's collection removes the orphan once it is older than the grace.
    assert!(
        eventually(Duration::from_secs(30), async || digests_under(
            &raw, &prefix
        )
        .await
        .is_empty())
        .await,
        "the orphan {orphan} is still in the bucket"
    );

    // The grant was never consumed: the user uploads again, through B.
    let retry = tgz(&[("small.txt", b"second try\n")]);
    let uploaded = json_of(
        Caller::with_token(&b, &grant_token)
            .put(&grant_url, MEDIA, retry)
            .await,
        201,
    )
    .await;
    let named = uploaded["bundleDigest"].as_str().unwrap().to_owned();
    assert_ne!(named, orphan);
    // A named object outlives the sweeps (three of them).
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(digests_under(&raw, &prefix).await, vec![named]);

    // A's next start clears what the crash left on its disk: temp files,
    // and the copy nothing names.
    let restarted = start_replica(a_dir.path(), &args).await;
    assert_eq!(temp_files(a_dir.path()), Vec::<PathBuf>::new());
    assert!(!local_blob(a_dir.path(), &orphan).exists());
    let shown = restarted
        .get_json("/v1/workloads/docs", &b.user_token("alice"))
        .await;
    assert_eq!(shown["candidateRevision"], uploaded["revision"], "{shown}");
}

/// `Process::start` (which blocks until the child listens) off the runtime.
async fn start_replica(dir: &std::path::Path, args: &[&str]) -> Process {
    let dir = dir.to_owned();
    let args: Vec<String> = args.iter().map(|a| (*a).to_owned()).collect();
    tokio::task::spawn_blocking(move || {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        Process::start(&dir, &args)
    })
    .await
    .expect("the replica starts")
}
