//! Persistence across restarts and recovery from a crash (simulated by
//! leaving what a `kill -9` would leave on disk).

use crate::common::workload_bundles::{sha256, tgz, unpack};
use crate::common::{assert_error, embedded_only, Caller, TestServer};
use context_service::store::{MetadataStore, RedbStore, WorkloadStatus};

#[tokio::test]
async fn restart_keeps_everything() {
    let server = TestServer::start().await;
    let alice = server.client("alice");
    alice
        .create_workload(Some("kept"), Some("memory"))
        .await
        .unwrap();
    let rev = alice
        .upload_bundle("kept", tgz(&[("f", b"persisted")]))
        .await
        .unwrap();
    alice
        .activate_workload("kept", &rev.revision)
        .await
        .unwrap();
    alice.create_workload(Some("pending"), None).await.unwrap();
    let pending = alice
        .upload_bundle("pending", tgz(&[("g", b"candidate")]))
        .await
        .unwrap();
    let grant = alice.upload_grant("pending").await.unwrap();
    let before = alice.workloads().await.unwrap();

    let server = server.restart().await;
    let alice = server.client("alice");
    assert_eq!(alice.workloads().await.unwrap(), before);
    let kept = alice.workload("kept").await.unwrap();
    assert_eq!(
        (kept.status.as_str(), kept.kind.as_str()),
        ("ready", "memory")
    );
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("k.tgz");
    alice
        .download_bundle("kept", &rev.revision, &out, |_, _| {})
        .await
        .unwrap();
    assert_eq!(
        unpack(&std::fs::read(&out).unwrap()),
        vec![("f".to_owned(), b"persisted".to_vec())]
    );
    // The candidate and the grant survived too.
    alice
        .activate_workload("pending", &pending.revision)
        .await
        .ok();
    let w = alice.workload("pending").await.unwrap();
    assert_eq!(w.revision.as_deref(), Some(pending.revision.as_str()));
    let err = alice
        .upload_with_grant(&grant, tgz(&[("x", b"y")]))
        .await
        .unwrap_err();
    // Grant still known, but the workload is now frozen.
    assert_eq!(err.code(), Some("workload_already_active"));
}

#[tokio::test]
async fn recovery_after_a_crash() {
    // Local blobs only: it deletes a blob file and expects the workload to
    // fail; with object storage the file is only a copy, fetched again
    // (object_storage::a_replica_without_its_local_copy_...).
    if crate::common::s3_blobs() {
        eprintln!("skipped with CONTEXT_SERVICE_TEST_BLOBS=s3: inspects local blob files");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let mut server = TestServer::start_in(dir.path(), embedded_only).await;
    let alice = server.client("alice");
    // 1. A ready workload whose blob will vanish.
    alice.create_workload(Some("lost"), None).await.unwrap();
    let lost = alice
        .upload_bundle("lost", tgz(&[("a", b"lost")]))
        .await
        .unwrap();
    alice
        .activate_workload("lost", &lost.revision)
        .await
        .unwrap();
    // 2. A workload awaiting upload whose candidate blob will vanish.
    alice.create_workload(Some("retry"), None).await.unwrap();
    let retry = alice
        .upload_bundle("retry", tgz(&[("b", b"retry")]))
        .await
        .unwrap();
    // 3. A healthy workload.
    alice.create_workload(Some("fine"), None).await.unwrap();
    let fine = alice
        .upload_bundle("fine", tgz(&[("c", b"fine")]))
        .await
        .unwrap();
    alice
        .activate_workload("fine", &fine.revision)
        .await
        .unwrap();
    // 4. A delete interrupted half-way.
    alice.create_workload(Some("doomed"), None).await.unwrap();
    let doomed = alice
        .upload_bundle("doomed", tgz(&[("d", b"doomed")]))
        .await
        .unwrap();
    server.stop().await;

    let blobs = dir.path().join("blobs/sha256");
    let blob = |d: &str| blobs.join(&d[..2]).join(d);
    std::fs::remove_file(blob(&lost.bundle_digest)).unwrap();
    std::fs::remove_file(blob(&retry.bundle_digest)).unwrap();
    // What a kill -9 mid-upload leaves: temp files of the blob store and of
    // the bundle engine's spool, and a durable blob whose metadata never
    // committed.
    std::fs::write(blobs.join(".tmp-upload1"), b"half a bundle").unwrap();
    std::fs::create_dir_all(blobs.join("ff")).unwrap();
    std::fs::write(blobs.join("ff/.tmp-upload2"), b"half").unwrap();
    std::fs::write(dir.path().join("tmp/spool-left"), b"spool").unwrap();
    let orphan = format!("ff{}", "0".repeat(62));
    std::fs::write(blobs.join("ff").join(&orphan), b"orphan").unwrap();
    {
        // The delete got as far as marking the record.
        let store = RedbStore::open(&dir.path().join("store/meta.redb")).unwrap();
        let mut rec = store
            .workload("sub:alice", "doomed")
            .await
            .unwrap()
            .unwrap();
        rec.status = WorkloadStatus::Deleting;
        store.replace_workload(&rec, None).await.unwrap();
    }

    let server = TestServer::start_in(dir.path(), embedded_only).await;
    let alice = server.client("alice");
    assert!(!blobs.join(".tmp-upload1").exists());
    assert!(!blobs.join("ff/.tmp-upload2").exists());
    assert!(!dir.path().join("tmp/spool-left").exists());
    assert!(
        !blobs.join("ff").join(&orphan).exists(),
        "unnamed blob removed"
    );
    assert!(
        !blob(&doomed.bundle_digest).exists(),
        "interrupted delete finished"
    );
    assert!(blob(&fine.bundle_digest).exists());

    let w = alice.workload("lost").await.unwrap();
    assert_eq!(w.status, "failed");
    assert!(w.reason.as_deref().unwrap().contains("missing"), "{w:?}");
    let resp = Caller::user(&server, "alice")
        .get(&format!(
            "/v1/workloads/lost/revisions/{}/bundle",
            lost.revision
        ))
        .await;
    assert_error(resp, 409, "workload_not_ready", "missing").await;
    let err = alice
        .activate_workload("lost", &lost.revision)
        .await
        .unwrap_err();
    assert_eq!(err.code(), Some("workload_not_ready"));

    // The never-activated one failed too, and takes a new upload.
    let w = alice.workload("retry").await.unwrap();
    assert_eq!(w.status, "failed");
    assert!(w.candidate_revision.is_none());
    let again = alice
        .upload_bundle("retry", tgz(&[("b", b"retry")]))
        .await
        .unwrap();
    assert_eq!(again.revision, retry.revision);
    let w = alice
        .activate_workload("retry", &again.revision)
        .await
        .unwrap();
    assert_eq!(w.status, "ready");

    let err = alice.workload("doomed").await.unwrap_err();
    assert_eq!(err.code(), Some("workload_not_found"));
    let out = dir.path().join("fine.tgz");
    let report = alice
        .download_bundle("fine", &fine.revision, &out, |_, _| {})
        .await
        .unwrap();
    assert_eq!(sha256(&std::fs::read(&out).unwrap()), report.bundle_digest);
    // A failed workload can still be deleted.
    alice.delete_workload("lost").await.unwrap();
}
