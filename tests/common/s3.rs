//! The S3 test server (`tests/scale/seaweedfs.sh env`) as tests see it: the
//! bucket (or a skip), a raw client to look at objects, and where a
//! service keeps its objects and its local copies.

use std::path::{Path as FsPath, PathBuf};
use std::sync::Arc;

use object_store::aws::AmazonS3Builder;
use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt};

/// The test bucket, or `None` (after saying why) without an S3 server;
/// with `CONTEXT_SERVICE_REQUIRE_S3` set (CI's object-storage phase) a
/// missing server fails instead.
pub(crate) fn bucket() -> Option<String> {
    match std::env::var("CONTEXT_SERVICE_TEST_S3_BUCKET") {
        Ok(b) if !b.is_empty() => Some(b),
        _ => {
            assert!(
                std::env::var_os("CONTEXT_SERVICE_REQUIRE_S3").is_none(),
                "CONTEXT_SERVICE_REQUIRE_S3 is set but no S3 server is configured"
            );
            eprintln!("skipped: no S3 server (eval \"$(tests/scale/seaweedfs.sh env)\")");
            None
        }
    }
}

/// A fresh prefix for one test's services.
pub(crate) fn fresh_prefix(label: &str) -> String {
    format!("{label}-{:016x}", rand::random::<u64>())
}

/// A raw client of the test bucket, to look at and tamper with objects.
pub(crate) fn raw(bucket: &str) -> Arc<dyn ObjectStore> {
    context_service::client::install_crypto_provider();
    Arc::new(
        AmazonS3Builder::from_env()
            .with_bucket_name(bucket)
            .with_virtual_hosted_style_request(false)
            .build()
            .expect("raw S3 client"),
    )
}

/// The key of bundle `digest` under `prefix`.
pub(crate) fn key(prefix: &str, digest: &str) -> Path {
    Path::from(format!("{prefix}/sha256/{}/{digest}", &digest[..2]))
}

/// The digests of every object under `prefix`, sorted.
pub(crate) async fn digests_under(raw: &Arc<dyn ObjectStore>, prefix: &str) -> Vec<String> {
    use futures::TryStreamExt;
    let root = Path::from(prefix);
    let mut digests: Vec<String> = raw
        .list(Some(&root))
        .map_ok(|meta| meta.location.filename().unwrap_or_default().to_owned())
        .try_collect()
        .await
        .unwrap_or_else(|e| panic!("list {prefix}: {e}"));
    digests.sort();
    digests
}

/// Where a service on `data_dir` keeps its local copy of `digest`.
pub(crate) fn local_blob(data_dir: &FsPath, digest: &str) -> PathBuf {
    data_dir
        .join("blobs/sha256")
        .join(&digest[..2])
        .join(digest)
}

/// Whether `key` exists.
pub(crate) async fn exists(raw: &Arc<dyn ObjectStore>, key: &Path) -> bool {
    match raw.head(key).await {
        Ok(_) => true,
        Err(object_store::Error::NotFound { .. }) => false,
        Err(e) => panic!("head {key}: {e}"),
    }
}
