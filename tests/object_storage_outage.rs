//! Object storage going away and coming back, over real HTTP: with its own
//! SeaweedFS (`tests/scale/seaweedfs.sh` on a private state dir, so the
//! shared test server keeps running), a stopped S3 server makes uploads and
//! cache-miss downloads answer `503 storage_unavailable`, bundles held in
//! memory or on local disk keep being served, and once S3 is back uploads
//! work again without restarting the service.
//!
//! Alone in its binary: it points this process's `AWS_*` variables at its
//! own server. Needs the SeaweedFS binary (`tests/scale/seaweedfs.sh
//! build`); without `CONTEXT_SERVICE_TEST_S3_BUCKET` it says so and passes,
//! unless `CONTEXT_SERVICE_REQUIRE_S3` is set.

#[path = "common/mod.rs"]
mod common;

use std::path::Path;
use std::process::Command;

use common::workload_bundles::{noise, tgz};
use common::{assert_error, Caller, TestServer};

const SCRIPT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/scale/seaweedfs.sh");

/// Runs `seaweedfs.sh <cmd>` on `state`; its stdout.
fn seaweedfs(state: &Path, cmd: &str) -> String {
    let out = Command::new(SCRIPT)
        .arg(cmd)
        .env("CONTEXT_SERVICE_SEAWEEDFS_STATE", state)
        .output()
        .expect("run seaweedfs.sh");
    assert!(
        out.status.success(),
        "seaweedfs.sh {cmd}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Stops the private server however the test ends.
struct Private(std::path::PathBuf);

impl Drop for Private {
    fn drop(&mut self) {
        let _ = Command::new(SCRIPT)
            .arg("down")
            .env("CONTEXT_SERVICE_SEAWEEDFS_STATE", &self.0)
            .status();
    }
}

fn local_blob(data_dir: &Path, digest: &str) -> std::path::PathBuf {
    data_dir
        .join("blobs/sha256")
        .join(&digest[..2])
        .join(digest)
}

async fn download(caller: &Caller, name: &str, revision: &str) -> reqwest::Response {
    caller
        .get(&format!("/v1/workloads/{name}/revisions/{revision}/bundle"))
        .await
}

#[tokio::test]
async fn an_outage_answers_503_keeps_serving_local_copies_and_heals_without_a_restart() {
    if std::env::var("CONTEXT_SERVICE_TEST_S3_BUCKET").is_err() {
        assert!(
            std::env::var_os("CONTEXT_SERVICE_REQUIRE_S3").is_none(),
            "CONTEXT_SERVICE_REQUIRE_S3 is set but no S3 server is configured"
        );
        eprintln!("skipped: no S3 server (eval \"$(tests/scale/seaweedfs.sh env)\")");
        return;
    }
    let state = tempfile::tempdir().unwrap();
    let guard = Private(state.path().join("seaweedfs"));
    seaweedfs(&guard.0, "up");
    // This process talks to the private server only.
    let mut bucket = String::new();
    for line in seaweedfs(&guard.0, "env").lines() {
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
    // 1 MiB of memory cache: the big bundle streams from its local file.
    let server = TestServer::start_with(|c| {
        c.blob_url = Some(format!("s3://{bucket}/outage"));
        c.cache_bytes = 1 << 20;
    })
    .await;
    let client = server.client("alice");
    let alice = Caller::user(&server, "alice");
    let mut ready = Vec::new();
    for (name, files) in [
        ("small", vec![("a.txt", b"in memory\n".to_vec())]),
        ("big", vec![("big.bin", noise(3 << 20, 1))]),
        (
            "cold",
            vec![("c.txt", b"not on this replica's disk\n".to_vec())],
        ),
    ] {
        let files: Vec<(&str, &[u8])> = files.iter().map(|(n, d)| (*n, d.as_slice())).collect();
        client.create_workload(Some(name), None).await.unwrap();
        let rev = client.upload_bundle(name, tgz(&files)).await.unwrap();
        client.activate_workload(name, &rev.revision).await.unwrap();
        ready.push(rev);
    }
    let (small, big, cold) = (&ready[0], &ready[1], &ready[2]);
    // `small` into the memory cache, `big` served from disk.
    for rev in [small, big] {
        let resp = download(&alice, &rev.name, &rev.revision).await;
        assert_eq!(resp.status().as_u16(), 200);
        assert_eq!(resp.bytes().await.unwrap().len() as u64, rev.bytes);
    }
    // `cold` is only in object storage (as on a replica that never used it).
    std::fs::remove_file(local_blob(&server.data_dir, &cold.bundle_digest)).unwrap();
    client.create_workload(Some("later"), None).await.unwrap();
    let pool = serde_json::json!({"name": "p", "replicas": 1,
        "workspace": {"size": "1Gi", "accessMode": "ReadWriteOnce"}});
    let resp = alice.post("/v1/sandbox-pools", &pool).await;
    assert_eq!(
        resp.status().as_u16(),
        201,
        "{}",
        resp.text().await.unwrap()
    );

    seaweedfs(&guard.0, "stop");

    let later_files: &[(&str, &[u8])] = &[("l.txt", b"uploaded during the outage\n")];
    let resp = alice
        .put(
            "/v1/workloads/later/bundle",
            common::workload_bundles::MEDIA,
            tgz(later_files),
        )
        .await;
    assert_error(
        resp,
        503,
        "storage_unavailable",
        "object storage holding bundles is unavailable",
    )
    .await;
    // Nothing of the refused upload is named or left behind.
    let view = client.workload("later").await.unwrap();
    assert!(view.candidate_revision.is_none(), "{view:?}");
    assert_eq!(
        std::fs::read_dir(server.data_dir.join("blobs/sha256"))
            .unwrap()
            .filter(|e| e.as_ref().unwrap().file_type().unwrap().is_file())
            .count(),
        0,
        "a temp blob of the refused upload is left"
    );
    assert_error(
        download(&alice, &cold.name, &cold.revision).await,
        503,
        "storage_unavailable",
        "try again later",
    )
    .await;
    assert!(!local_blob(&server.data_dir, &cold.bundle_digest).exists());
    // A delivery of it fails for its sandbox, saying why.
    let resp = alice
        .post(
            "/v1/workloads/cold/deliveries",
            &serde_json::json!({"runId": "run-1", "sandbox": "sandbox-p-0"}),
        )
        .await;
    assert_error(
        resp,
        502,
        "delivery_failed",
        "object storage holding bundles is unavailable",
    )
    .await;
    for rev in [small, big] {
        let resp = download(&alice, &rev.name, &rev.revision).await;
        assert_eq!(
            resp.status().as_u16(),
            200,
            "{} during the outage",
            rev.name
        );
        assert_eq!(resp.bytes().await.unwrap().len() as u64, rev.bytes);
    }

    seaweedfs(&guard.0, "up");

    // The same service, not restarted.
    let rev = client
        .upload_bundle("later", tgz(later_files))
        .await
        .unwrap();
    assert_eq!(rev.files, 1);
    let resp = download(&alice, &cold.name, &cold.revision).await;
    assert_eq!(resp.status().as_u16(), 200);
    assert_eq!(resp.bytes().await.unwrap().len() as u64, cold.bytes);
    assert!(local_blob(&server.data_dir, &cold.bundle_digest).exists());
}
