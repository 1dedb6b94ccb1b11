//! Bundle bytes in object storage (`--blob-url`) over real HTTP, against a
//! real S3 server (`tests/scale/seaweedfs.sh`): a replica without its local
//! copy fetches and verifies the bundle, a tampered object is refused, and
//! objects are collected only when unnamed and past the grace period.
//!
//! Needs `eval "$(tests/scale/seaweedfs.sh env)"`; without it each test says
//! so and passes, unless `CONTEXT_SERVICE_REQUIRE_S3` is set (CI's
//! object-storage phase), where a missing server fails.

use std::path::Path as FsPath;
use std::time::Duration;

use object_store::{ObjectStoreExt, PutPayload};
use serde_json::{json, Value};

use crate::common::s3::{bucket, exists, fresh_prefix, key, local_blob, raw};
use crate::common::workload_bundles::{noise, sha256, tgz};
use crate::common::{assert_error, deliver, eventually, Caller, TestServer};

/// A server with its own prefix in the bucket; returns it and the prefix.
async fn server(bucket: &str, grace: Option<Duration>) -> (TestServer, String) {
    let prefix = fresh_prefix("svc");
    let url = format!("s3://{bucket}/{prefix}");
    let server = TestServer::start_with(|c| {
        c.blob_url = Some(url);
        if let Some(g) = grace {
            c.blob_gc_grace = g;
        }
    })
    .await;
    (server, prefix)
}

/// Empties the local blob directory (the replica's copy).
fn wipe_local_blobs(data_dir: &FsPath) {
    let dir = data_dir.join("blobs/sha256");
    std::fs::remove_dir_all(&dir).unwrap();
    std::fs::create_dir_all(&dir).unwrap();
}

async fn download(caller: &Caller, name: &str, revision: &str) -> reqwest::Response {
    caller
        .get(&format!("/v1/workloads/{name}/revisions/{revision}/bundle"))
        .await
}

async fn json_ok(resp: reqwest::Response, status: u16) -> Value {
    let got = resp.status().as_u16();
    let text = resp.text().await.unwrap();
    assert_eq!(got, status, "body: {text}");
    serde_json::from_str(&text).unwrap()
}

#[tokio::test]
async fn a_replica_without_its_local_copy_fetches_verifies_and_delivers_the_bundle() {
    let Some(bucket) = bucket() else { return };
    let raw = raw(&bucket);
    let (server, prefix) = server(&bucket, None).await;
    let client = server.client("alice");
    let files: &[(&str, &[u8])] = &[("README.md", b"hello\n"), ("data.bin", &noise(300_000, 1))];
    let body = tgz(files);
    client.create_workload(Some("docs"), None).await.unwrap();
    let rev = client.upload_bundle("docs", body).await.unwrap();
    let digest = rev.bundle_digest.clone();
    // Stored in object storage under its content address before it was named.
    let stored = raw
        .get(&key(&prefix, &digest))
        .await
        .unwrap()
        .bytes()
        .await
        .unwrap();
    assert_eq!(stored.len() as u64, rev.bytes);
    client
        .activate_workload("docs", &rev.revision)
        .await
        .unwrap();
    let first = download(&Caller::user(&server, "alice"), "docs", &rev.revision).await;
    assert_eq!(first.status().as_u16(), 200);
    let original = first.bytes().await.unwrap();
    assert_eq!(original, stored);

    // The replica loses its disk copy (and, restarted, its memory cache).
    let mut server = server;
    server.stop().await;
    wipe_local_blobs(&server.data_dir);
    assert!(!local_blob(&server.data_dir, &digest).exists());
    let server = server.restart().await;
    let alice = Caller::user(&server, "alice");
    let again = download(&alice, "docs", &rev.revision).await;
    assert_eq!(again.status().as_u16(), 200);
    assert_eq!(again.bytes().await.unwrap(), original);
    // Fetched, verified and kept as the local copy.
    assert_eq!(
        std::fs::read(local_blob(&server.data_dir, &digest)).unwrap(),
        original
    );

    // A delivery from a cold replica too (local backend, a real sandbox dir).
    let mut server = server;
    server.stop().await;
    wipe_local_blobs(&server.data_dir);
    let server = server.restart().await;
    let alice = Caller::user(&server, "alice");
    let pool = json!({"name": "p", "replicas": 1,
        "workspace": {"size": "1Gi", "accessMode": "ReadWriteOnce"}});
    let resp = alice.post("/v1/sandbox-pools", &pool).await;
    assert_eq!(
        resp.status().as_u16(),
        201,
        "{}",
        resp.text().await.unwrap()
    );
    let delivered = json_ok(deliver(&alice, "docs", "run-1", "sandbox-p-0").await, 201).await;
    let d = &delivered["deliveries"][0];
    assert!(d.get("error").is_none(), "{delivered}");
    let path = std::path::PathBuf::from(d["path"].as_str().unwrap());
    assert_eq!(std::fs::read(path.join("README.md")).unwrap(), b"hello\n");
    assert!(local_blob(&server.data_dir, &digest).exists());
}

#[tokio::test]
async fn a_tampered_object_is_refused_not_served_nor_kept() {
    let Some(bucket) = bucket() else { return };
    let raw = raw(&bucket);
    let (server, prefix) = server(&bucket, None).await;
    let client = server.client("alice");
    client.create_workload(Some("docs"), None).await.unwrap();
    let rev = client
        .upload_bundle("docs", tgz(&[("a.txt", &noise(50_000, 2))]))
        .await
        .unwrap();
    client
        .activate_workload("docs", &rev.revision)
        .await
        .unwrap();
    let digest = rev.bundle_digest.clone();
    // Other bytes of the same length under the key (a bad actor or a bad disk).
    let object = key(&prefix, &digest);
    let mut bytes = raw
        .get(&object)
        .await
        .unwrap()
        .bytes()
        .await
        .unwrap()
        .to_vec();
    bytes[100] ^= 0xff;
    raw.delete(&object).await.unwrap();
    raw.put(&object, PutPayload::from(bytes)).await.unwrap();

    let mut server = server;
    server.stop().await;
    wipe_local_blobs(&server.data_dir);
    let server = server.restart().await;
    let alice = Caller::user(&server, "alice");
    assert_error(
        download(&alice, "docs", &rev.revision).await,
        502,
        "bundle_corrupt",
        &format!("does not hold bundle {digest}"),
    )
    .await;
    assert!(
        !local_blob(&server.data_dir, &digest).exists(),
        "the tampered bytes were kept"
    );
    // Nor delivered: the sandbox's failure says why.
    let pool = json!({"name": "p", "replicas": 1,
        "workspace": {"size": "1Gi", "accessMode": "ReadWriteOnce"}});
    let resp = alice.post("/v1/sandbox-pools", &pool).await;
    assert_eq!(
        resp.status().as_u16(),
        201,
        "{}",
        resp.text().await.unwrap()
    );
    let resp = alice
        .post(
            "/v1/workloads/docs/deliveries",
            &json!({"runId": "run-1", "sandbox": "sandbox-p-0"}),
        )
        .await;
    assert_error(resp, 502, "delivery_failed", "bundle_corrupt: object").await;
    // A truncated object is refused as well.
    raw.delete(&object).await.unwrap();
    raw.put(&object, PutPayload::from(vec![0u8; 10]))
        .await
        .unwrap();
    assert_error(
        download(&alice, "docs", &rev.revision).await,
        502,
        "bundle_corrupt",
        "has 10 bytes",
    )
    .await;
    // And a missing one says so.
    raw.delete(&object).await.unwrap();
    assert_error(
        download(&alice, "docs", &rev.revision).await,
        502,
        "bundle_corrupt",
        "missing from object storage",
    )
    .await;
}

#[tokio::test]
async fn objects_are_collected_only_when_unnamed_and_past_the_grace_period() {
    let Some(bucket) = bucket() else { return };
    let raw = raw(&bucket);
    let grace = Duration::from_secs(3);
    let (server, prefix) = server(&bucket, Some(grace)).await;
    let client = server.client("alice");
    // Two workloads name one digest (same files, same canonical bundle).
    let files: &[(&str, &[u8])] = &[("shared.txt", b"same bytes\n")];
    client.create_workload(Some("one"), None).await.unwrap();
    client.create_workload(Some("two"), None).await.unwrap();
    let a = client.upload_bundle("one", tgz(files)).await.unwrap();
    let b = client.upload_bundle("two", tgz(files)).await.unwrap();
    assert_eq!(a.bundle_digest, b.bundle_digest);
    let shared = key(&prefix, &a.bundle_digest);

    // An object nobody names, as a replica leaves it between "stored" and
    // "named": kept while young.
    let stray_digest = "ee".repeat(32);
    let stray = key(&prefix, &stray_digest);
    raw.put(&stray, PutPayload::from(vec![1u8; 64]))
        .await
        .unwrap();
    // Sweeps run every second (a quarter of the grace, at least 1 s).
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert!(
        exists(&raw, &stray).await,
        "an object younger than the grace period was deleted"
    );

    client.delete_workload("one").await.unwrap();
    // Several sweeps later the shared object is still there: "two" names it.
    tokio::time::sleep(grace * 2).await;
    assert!(
        exists(&raw, &shared).await,
        "an object still named was deleted"
    );
    // The stray one went, but not before the grace period.
    let gone = eventually(Duration::from_secs(20), async || {
        !exists(&raw, &stray).await
    })
    .await;
    assert!(gone, "an unnamed object older than the grace period stayed");

    client.delete_workload("two").await.unwrap();
    let gone = eventually(Duration::from_secs(20), async || {
        !exists(&raw, &shared).await
    })
    .await;
    assert!(gone, "the object of deleted workloads stayed");
}

/// Bytes of the local copies under `data_dir`, and how many there are.
fn local_copies(data_dir: &FsPath) -> (u64, usize) {
    let mut total = (0, 0);
    let root = data_dir.join("blobs/sha256");
    for shard in std::fs::read_dir(root).unwrap().flatten() {
        if !shard.file_type().unwrap().is_dir() {
            continue;
        }
        for blob in std::fs::read_dir(shard.path()).unwrap().flatten() {
            total.0 += blob.metadata().unwrap().len();
            total.1 += 1;
        }
    }
    total
}

#[tokio::test]
async fn local_copies_stay_within_their_budget_and_dropped_ones_are_fetched_again() {
    let Some(bucket) = bucket() else { return };
    let prefix = fresh_prefix("budget");
    let budget: u64 = 700_000;
    let adjust = |c: &mut context_service::config::ServeConfig| {
        c.blob_url = Some(format!("s3://{bucket}/{prefix}"));
        c.blob_local_max_bytes = budget;
        // Every download reads the disk copy (nothing is held in memory).
        c.cache_bytes = 0;
    };
    let server = TestServer::start_with(adjust).await;
    let client = server.client("alice");
    // Three incompressible bundles of ≈300 kB: two fit the budget.
    let mut revisions = Vec::new();
    for i in 0..3u8 {
        let name = format!("w{i}");
        client.create_workload(Some(&name), None).await.unwrap();
        let body = tgz(&[("data.bin", &noise(300_000, u64::from(i)))]);
        let rev = client.upload_bundle(&name, body).await.unwrap();
        client
            .activate_workload(&name, &rev.revision)
            .await
            .unwrap();
        let (bytes, count) = local_copies(&server.data_dir);
        assert!(bytes <= budget, "{bytes} bytes on disk after upload {i}");
        assert_eq!(count, (i as usize + 1).min(2), "copies after upload {i}");
        revisions.push((name, rev));
    }
    // The oldest went first.
    assert!(!local_blob(&server.data_dir, &revisions[0].1.bundle_digest).exists());
    assert!(local_blob(&server.data_dir, &revisions[2].1.bundle_digest).exists());

    // Every bundle is still served, the dropped one fetched again (and
    // verified), and the disk stays within the budget each time.
    let alice = Caller::user(&server, "alice");
    for round in 0..2 {
        for (name, rev) in &revisions {
            let resp = download(&alice, name, &rev.revision).await;
            assert_eq!(resp.status().as_u16(), 200, "{name} in round {round}");
            let body = resp.bytes().await.unwrap();
            assert_eq!(sha256(&body), rev.bundle_digest);
            let (bytes, _) = local_copies(&server.data_dir);
            assert!(bytes <= budget, "{bytes} bytes on disk after {name}");
        }
    }

    // Restarted with a smaller budget, the service accounts for what is on
    // disk and trims it at once; the next copy it makes leaves one.
    let mut server = server;
    server.stop().await;
    let server = TestServer::start_in(&server.data_dir.clone(), |c| {
        adjust(c);
        c.blob_local_max_bytes = 400_000;
    })
    .await
    .owning(server.into_dir());
    let (bytes, count) = local_copies(&server.data_dir);
    assert!(
        bytes <= 400_000,
        "{bytes} bytes in {count} copies after the start"
    );
    let (name, rev) = &revisions[0];
    assert!(!local_blob(&server.data_dir, &rev.bundle_digest).exists());
    let resp = download(&Caller::user(&server, "alice"), name, &rev.revision).await;
    assert_eq!(resp.status().as_u16(), 200);
    let (bytes, count) = local_copies(&server.data_dir);
    assert_eq!(count, 1, "{bytes} bytes in {count} copies");
    assert!(local_blob(&server.data_dir, &rev.bundle_digest).exists());
}
