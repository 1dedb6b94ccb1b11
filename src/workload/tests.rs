//! Service-level tests of what HTTP cannot observe directly: the cache is
//! filled by downloads and emptied by delete.

use std::io;
use std::sync::Arc;

use bytes::Bytes;
use flate2::write::GzEncoder;

use super::*;
use crate::cache::BundleCache;
use crate::store::{BlobStore, Storage, StorageSettings};

/// The service over the default storage under `dir`.
async fn open(
    dir: &std::path::Path,
    cache: Arc<BundleCache>,
) -> Result<(WorkloadService, RecoveryReport), WorkloadError> {
    let storage = Storage::open(dir, &StorageSettings::default())
        .await
        .unwrap();
    WorkloadService::open(storage, WorkloadSettings::default(), cache).await
}

fn tgz(files: &[(&str, &[u8])]) -> Vec<u8> {
    let mut builder = tar::Builder::new(GzEncoder::new(Vec::new(), flate2::Compression::fast()));
    for (path, data) in files {
        let mut header = tar::Header::new_gnu();
        header.set_size(data.len() as u64);
        header.set_mode(0o644);
        header.set_entry_type(tar::EntryType::Regular);
        builder
            .append_data(&mut header, path, *data)
            .expect("append");
    }
    builder
        .into_inner()
        .and_then(flate2::write::GzEncoder::finish)
        .expect("finish")
}

fn body(bytes: Vec<u8>) -> BodyStream {
    Box::pin(futures::stream::iter(
        bytes
            .chunks(1000)
            .map(|c| Ok::<_, io::Error>(Bytes::copy_from_slice(c)))
            .collect::<Vec<_>>(),
    ))
}

#[tokio::test]
async fn downloads_fill_the_cache_and_delete_evicts() {
    let dir = tempfile::tempdir().unwrap();
    let cache = Arc::new(BundleCache::new(1 << 20));
    let (svc, report) = open(dir.path(), cache.clone()).await.unwrap();
    assert_eq!(report, RecoveryReport::default());
    svc.create(
        "o",
        CreateWorkload {
            name: Some("w".into()),
            kind: None,
        },
    )
    .await
    .unwrap();
    let w = WorkloadName::try_from("w").unwrap();
    let ticket = svc.owner_upload("o", &w).await.unwrap();
    let rev = svc
        .upload(ticket, body(tgz(&[("f", b"data")])))
        .await
        .unwrap();
    let revision = Revision::try_from(rev.revision.as_str()).unwrap();
    svc.activate("o", &w, &revision).await.unwrap();

    let located = svc.locate("o", &w, &revision).await.unwrap();
    assert!(!cache.contains(&rev.bundle_digest));
    let opened = svc.open_bundle("w", &located).await.unwrap();
    assert!(opened.is_memory());
    assert!(cache.contains(&rev.bundle_digest));
    drop(opened);

    svc.delete("o", &w).await.unwrap();
    assert!(!cache.contains(&rev.bundle_digest));
    assert_eq!(cache.stats().resident_bytes, 0);
    assert!(matches!(
        svc.locate("o", &w, &revision).await,
        Err(WorkloadError::NotFound(_))
    ));
}

#[tokio::test]
async fn identical_bundles_share_one_blob_until_the_last_owner_deletes() {
    let dir = tempfile::tempdir().unwrap();
    let cache = Arc::new(BundleCache::new(1 << 20));
    let (svc, _) = open(dir.path(), cache).await.unwrap();
    let files: &[(&str, &[u8])] = &[("same", b"bytes")];
    let w = WorkloadName::try_from("w").unwrap();
    let mut digest = String::new();
    for owner in ["a", "b"] {
        svc.create(
            owner,
            CreateWorkload {
                name: Some("w".into()),
                kind: None,
            },
        )
        .await
        .unwrap();
        let ticket = svc.owner_upload(owner, &w).await.unwrap();
        digest = svc
            .upload(ticket, body(tgz(files)))
            .await
            .unwrap()
            .bundle_digest;
    }
    let blobs = BlobStore::open(&dir.path().join("blobs")).unwrap();
    assert!(blobs.exists(&digest));
    svc.delete("a", &w).await.unwrap();
    assert!(blobs.exists(&digest), "b still names it");
    svc.delete("b", &w).await.unwrap();
    assert!(!blobs.exists(&digest));
}
