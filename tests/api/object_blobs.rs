//! The object-storage blob store against a real S3 server (SeaweedFS from
//! `tests/scale/seaweedfs.sh`): round trip, multipart, no overwrite,
//! verification of digest and size, missing keys, unreachable storage.
//!
//! Needs `eval "$(tests/scale/seaweedfs.sh env)"`; without it every test
//! says so and passes, unless `CONTEXT_SERVICE_REQUIRE_S3` is set (CI's
//! object-storage phase sets it, so a missing server fails there).

use std::io::Write;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use context_service::store::{ObjectBlobs, ObjectError, PutOutcome};
use object_store::aws::AmazonS3Builder;
use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt, PutMode, PutOptions, PutPayload};
use sha2::{Digest, Sha256};

/// The test bucket, or `None` (after saying why) when no S3 server is set up.
fn bucket() -> Option<String> {
    match std::env::var("CONTEXT_SERVICE_TEST_S3_BUCKET") {
        Ok(b) if !b.is_empty() => Some(b),
        _ => {
            assert!(
                std::env::var_os("CONTEXT_SERVICE_REQUIRE_S3").is_none(),
                "CONTEXT_SERVICE_REQUIRE_S3 is set but no S3 server is configured: \
                 eval \"$(tests/scale/seaweedfs.sh env)\""
            );
            eprintln!("skipped: no S3 server (eval \"$(tests/scale/seaweedfs.sh env)\")");
            None
        }
    }
}

/// A fresh prefix in the test bucket: blobs through the product, and the
/// raw store to look behind their back.
fn fresh(bucket: &str) -> (ObjectBlobs, Arc<dyn ObjectStore>, String) {
    let prefix = format!("blobtest-{}", hex::encode(rand_bytes()));
    let url = format!("s3://{bucket}/{prefix}");
    let blobs = ObjectBlobs::from_url(&url).expect("blob URL");
    let raw = AmazonS3Builder::from_env()
        .with_bucket_name(bucket)
        .with_virtual_hosted_style_request(false)
        .build()
        .expect("raw S3 client");
    (blobs, Arc::new(raw), prefix)
}

fn rand_bytes() -> [u8; 8] {
    let mut b = [0u8; 8];
    let t = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    b.copy_from_slice(&(t as u64 ^ std::process::id() as u64).to_le_bytes());
    b
}

/// `len` pseudo-random bytes (incompressible, distinct per `seed`).
fn data(len: usize, seed: u8) -> Vec<u8> {
    let mut out = Vec::with_capacity(len);
    let mut block = Sha256::digest([seed]).to_vec();
    while out.len() < len {
        block = Sha256::digest(&block).to_vec();
        out.extend_from_slice(&block);
    }
    out.truncate(len);
    out
}

fn sha(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

fn file_with(bytes: &[u8]) -> tempfile::NamedTempFile {
    let mut f = tempfile::NamedTempFile::new().unwrap();
    f.write_all(bytes).unwrap();
    f.flush().unwrap();
    f
}

async fn fetch(blobs: &ObjectBlobs, digest: &str, size: u64) -> Result<Vec<u8>, ObjectError> {
    let out = tempfile::NamedTempFile::new().unwrap();
    blobs
        .fetch_into(digest, size, out.as_file().try_clone().unwrap())
        .await?;
    Ok(std::fs::read(out.path()).unwrap())
}

#[tokio::test]
async fn put_and_fetch_round_trip_under_a_content_addressed_key() {
    let Some(bucket) = bucket() else { return };
    let (blobs, raw, prefix) = fresh(&bucket);
    let bytes = data(100_000, 1);
    let digest = sha(&bytes);
    let file = file_with(&bytes);
    assert_eq!(
        blobs
            .put_file(file.path(), &digest, bytes.len() as u64)
            .await
            .unwrap(),
        PutOutcome::Written
    );
    // The key layout other replicas (and operators) rely on.
    let key = Path::from(format!("{prefix}/sha256/{}/{digest}", &digest[..2]));
    let stored = raw.get(&key).await.unwrap().bytes().await.unwrap();
    assert_eq!(stored.as_ref(), bytes.as_slice());
    assert_eq!(blobs.size(&digest).await.unwrap(), Some(bytes.len() as u64));
    assert_eq!(
        fetch(&blobs, &digest, bytes.len() as u64).await.unwrap(),
        bytes
    );
    let listed = blobs.list().await.unwrap();
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0].digest, digest);
    assert_eq!(listed[0].size, bytes.len() as u64);
    blobs.delete(&digest).await.unwrap();
    assert_eq!(blobs.size(&digest).await.unwrap(), None);
}

#[tokio::test]
async fn a_blob_larger_than_the_part_size_goes_up_in_parts() {
    let Some(bucket) = bucket() else { return };
    let (blobs, _raw, _) = fresh(&bucket);
    let part = 5 << 20;
    let blobs = blobs.with_part_bytes(part);
    let bytes = data(2 * part + 12_345, 2);
    let digest = sha(&bytes);
    let file = file_with(&bytes);
    assert_eq!(
        blobs
            .put_file(file.path(), &digest, bytes.len() as u64)
            .await
            .unwrap(),
        PutOutcome::Written
    );
    assert_eq!(blobs.size(&digest).await.unwrap(), Some(bytes.len() as u64));
    let back = fetch(&blobs, &digest, bytes.len() as u64).await.unwrap();
    assert!(back == bytes, "multipart object differs from the file");
    blobs.delete(&digest).await.unwrap();
}

#[tokio::test]
async fn an_existing_key_is_never_overwritten() {
    let Some(bucket) = bucket() else { return };
    let (blobs, raw, prefix) = fresh(&bucket);
    let bytes = data(4096, 3);
    let digest = sha(&bytes);
    let key = Path::from(format!("{prefix}/sha256/{}/{digest}", &digest[..2]));
    // Other bytes of the same length already sit under the key.
    let squatter = data(4096, 4);
    raw.put(&key, PutPayload::from(squatter.clone()))
        .await
        .unwrap();
    let file = file_with(&bytes);
    // Same size: content addressing says same bytes; success, untouched.
    assert_eq!(
        blobs.put_file(file.path(), &digest, 4096).await.unwrap(),
        PutOutcome::Existing
    );
    let stored = raw.get(&key).await.unwrap().bytes().await.unwrap();
    assert_eq!(
        stored.as_ref(),
        squatter.as_slice(),
        "the object was overwritten"
    );
    // ... and reading it back refuses the wrong bytes.
    match fetch(&blobs, &digest, 4096).await {
        Err(ObjectError::Corrupt(m)) => assert!(m.contains("does not hold bundle"), "{m}"),
        other => panic!("tampered object served: {other:?}"),
    }
    // A different size under the key is refused, still not overwritten.
    raw.put(&key, PutPayload::from(data(10, 5))).await.unwrap();
    match blobs.put_file(file.path(), &digest, 4096).await {
        Err(ObjectError::Corrupt(m)) => {
            assert!(
                m.contains("holds 10 bytes") && m.contains("not overwritten"),
                "{m}"
            );
        }
        other => panic!("expected a refusal, got {other:?}"),
    }
    assert_eq!(blobs.size(&digest).await.unwrap(), Some(10));
    // The engine honours create-only puts, which guard concurrent writers.
    let create = PutOptions {
        mode: PutMode::Create,
        ..PutOptions::default()
    };
    let second = raw
        .put_opts(&key, PutPayload::from(bytes.clone()), create)
        .await;
    assert!(
        matches!(
            second,
            Err(object_store::Error::AlreadyExists { .. }
                | object_store::Error::Precondition { .. })
        ),
        "create-only put over an existing key: {second:?}"
    );
    raw.delete(&key).await.unwrap();
}

#[tokio::test]
async fn a_file_whose_digest_or_size_is_wrong_is_refused_and_not_stored() {
    let Some(bucket) = bucket() else { return };
    let (blobs, _raw, _) = fresh(&bucket);
    let bytes = data(2048, 6);
    let digest = sha(&bytes);
    let file = file_with(&bytes);
    let wrong = sha(b"other");
    match blobs.put_file(file.path(), &wrong, 2048).await {
        Err(ObjectError::Corrupt(m)) => assert!(m.contains(&format!("sha256 {digest}")), "{m}"),
        other => panic!("expected a refusal, got {other:?}"),
    }
    assert_eq!(blobs.size(&wrong).await.unwrap(), None);
    match blobs.put_file(file.path(), &digest, 2047).await {
        Err(ObjectError::Corrupt(m)) => assert!(m.contains("2048 bytes"), "{m}"),
        other => panic!("expected a refusal, got {other:?}"),
    }
    assert_eq!(blobs.size(&digest).await.unwrap(), None);
    assert!(blobs.list().await.unwrap().is_empty());
}

#[tokio::test]
async fn a_missing_key_is_not_found_and_a_wrong_size_is_refused() {
    let Some(bucket) = bucket() else { return };
    let (blobs, _raw, _) = fresh(&bucket);
    let digest = sha(b"never stored");
    assert_eq!(blobs.size(&digest).await.unwrap(), None);
    match fetch(&blobs, &digest, 12).await {
        Err(ObjectError::NotFound(k)) => assert!(k.ends_with(&digest), "{k}"),
        other => panic!("expected not found, got {other:?}"),
    }
    blobs.delete(&digest).await.unwrap();
    // Stored, but the metadata claims another size.
    let bytes = data(300, 7);
    let d = sha(&bytes);
    blobs
        .put_file(file_with(&bytes).path(), &d, 300)
        .await
        .unwrap();
    match fetch(&blobs, &d, 299).await {
        Err(ObjectError::Corrupt(m)) => assert!(m.contains("300 bytes"), "{m}"),
        other => panic!("expected a refusal, got {other:?}"),
    }
    blobs.delete(&d).await.unwrap();
}

#[tokio::test]
async fn the_sweep_lists_only_old_unnamed_objects() {
    let Some(bucket) = bucket() else { return };
    let (blobs, _raw, _) = fresh(&bucket);
    let (a, b) = (data(100, 8), data(100, 9));
    let (da, db) = (sha(&a), sha(&b));
    blobs
        .put_file(file_with(&a).path(), &da, 100)
        .await
        .unwrap();
    blobs
        .put_file(file_with(&b).path(), &db, 100)
        .await
        .unwrap();
    let named: std::collections::HashSet<String> = [da.clone()].into();
    let grace = Duration::from_secs(600);
    // Young: nothing to delete yet.
    let now = SystemTime::now();
    assert!(blobs
        .deletable(&named, grace, now)
        .await
        .unwrap()
        .is_empty());
    // Past the grace: only the unnamed one.
    let later = now + grace + Duration::from_secs(5);
    let old: Vec<String> = blobs
        .deletable(&named, grace, later)
        .await
        .unwrap()
        .into_iter()
        .map(|o| o.digest)
        .collect();
    assert_eq!(old, vec![db.clone()]);
    blobs.delete(&da).await.unwrap();
    blobs.delete(&db).await.unwrap();
}

#[tokio::test]
async fn unreachable_storage_is_unavailable() {
    // A port nothing listens on (bound, then closed).
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    context_service::client::install_crypto_provider();
    let store = AmazonS3Builder::new()
        .with_bucket_name("b")
        .with_region("us-east-1")
        .with_endpoint(format!("http://127.0.0.1:{port}"))
        .with_allow_http(true)
        .with_access_key_id("k")
        .with_secret_access_key("s")
        .with_retry(object_store::RetryConfig {
            max_retries: 0,
            ..Default::default()
        })
        .build()
        .unwrap();
    let blobs = ObjectBlobs::new(Arc::new(store), "p", "s3://b/p");
    let bytes = data(10, 10);
    let digest = sha(&bytes);
    match blobs.put_file(file_with(&bytes).path(), &digest, 10).await {
        Err(ObjectError::Unavailable(m)) => assert!(!m.is_empty()),
        other => panic!("expected unavailable, got {other:?}"),
    }
    match fetch(&blobs, &digest, 10).await {
        Err(ObjectError::Unavailable(_)) => {}
        other => panic!("expected unavailable, got {other:?}"),
    }
}
