//! Bundle bytes in S3-compatible object storage (AWS S3, GCS interop, Ceph
//! RGW, SeaweedFS, MinIO), for a service that runs as several replicas.
//!
//! # Design
//!
//! The object store is the **source of truth** for bundle bytes; each
//! replica's local [`BlobStore`](super::BlobStore) under its data dir is
//! only its disk copy of the objects it has used (and the file the bundle
//! cache and sendfile serve from, unchanged). Keys are content-addressed,
//! `<prefix>/sha256/<2 hex>/<64 hex>`, so every replica names the same bytes
//! the same way and two uploads of the same bundle share one object.
//!
//! * **Writes** ([`ObjectBlobs::put_file`]) hash the local file first and
//!   refuse it when its size or sha256 is not the one the metadata will
//!   name, so a wrong object is never written. An existing key is never
//!   overwritten: a key that exists with the expected size is success (the
//!   same digest is the same bytes); small blobs are put with
//!   `PutMode::Create` (`If-None-Match: *`) so a concurrent writer cannot be
//!   overwritten either, large ones with a multipart upload (S3 has no
//!   create-only multipart complete that every engine supports; two
//!   concurrent writers of one key write the same bytes). The written
//!   object's size is checked before the caller names it.
//! * **Reads** ([`ObjectBlobs::fetch_into`]) stream the object into a
//!   temp file while hashing it and refuse it unless size and sha256 match:
//!   a tampered or truncated object is never served or kept.
//! * **Deletes** happen only in [`ObjectBlobs::deletable`]'s sweep: objects
//!   no workload names *and* older than a grace period, because another
//!   replica may be between "written to the object store" and "named in the
//!   metadata" for a while. "No workload names it" is read from this
//!   service's metadata store, so every service sweeping one prefix must
//!   share that store (with the embedded redb store: one service per prefix).
//!
//! Unavailable storage is [`ObjectError::Unavailable`] (the API answers
//! `503`); requests are retried only briefly so that a client learns of an
//! outage in seconds, not minutes.

use std::io::{self, Read};
use std::path::Path as FsPath;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use bytes::Bytes;
use futures::StreamExt;
use object_store::aws::{AmazonS3Builder, AmazonS3ConfigKey};
use object_store::path::Path;
use object_store::{
    ClientConfigKey, ObjectStore, ObjectStoreExt, PutMode, PutOptions, PutPayload, RetryConfig,
    WriteMultipart,
};
use sha2::{Digest, Sha256};
use tokio::io::AsyncWriteExt;

use super::blob::is_digest;

/// Default multipart part size (S3's minimum part is 5 MiB).
pub const DEFAULT_PART_BYTES: usize = 8 << 20;

/// Parts of one multipart upload in flight at once.
const PARTS_IN_FLIGHT: usize = 2;

/// Why an object-store operation failed.
#[derive(Debug, thiserror::Error)]
pub enum ObjectError {
    /// The object storage cannot be reached or refused the request.
    #[error("object storage is unavailable: {0}")]
    Unavailable(String),
    /// No object under the key.
    #[error("bundle {0} is not in object storage")]
    NotFound(String),
    /// The bytes (local or stored) are not the ones their digest names.
    #[error("{0}")]
    Corrupt(String),
    /// A bad URL or digest (a bug or a misconfiguration).
    #[error("{0}")]
    Invalid(String),
    /// A local file failed.
    #[error("local blob file: {0}")]
    Io(#[from] io::Error),
}

fn classify(e: object_store::Error, key: &Path) -> ObjectError {
    match e {
        object_store::Error::NotFound { .. } => ObjectError::NotFound(key.to_string()),
        other => ObjectError::Unavailable(with_causes(&other)),
    }
}

/// `e` and its sources (object_store's own text stops at "HTTP error").
fn with_causes(e: &dyn std::error::Error) -> String {
    let mut out = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        let text = s.to_string();
        if !out.contains(&text) {
            out.push_str(": ");
            out.push_str(&text);
        }
        source = s.source();
    }
    out
}

/// What [`ObjectBlobs::put_file`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PutOutcome {
    /// The object was written.
    Written,
    /// An object of that digest and size was there already (kept as is).
    Existing,
}

/// An object in the store, as listed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredObject {
    /// Its digest (from the key).
    pub digest: String,
    /// Its size.
    pub size: u64,
    /// When it was written.
    pub last_modified: SystemTime,
}

/// Content-addressed bundle objects under one bucket and prefix.
#[derive(Debug, Clone)]
pub struct ObjectBlobs {
    store: Arc<dyn ObjectStore>,
    /// `<prefix>/sha256`.
    root: Path,
    url: String,
    part_bytes: usize,
}

impl ObjectBlobs {
    /// The store `url` names (`s3://bucket/prefix`), with endpoint, region
    /// and credentials from the usual `AWS_*` environment variables
    /// (`AWS_ENDPOINT_URL`, `AWS_REGION`, `AWS_ACCESS_KEY_ID`,
    /// `AWS_SECRET_ACCESS_KEY`, `AWS_SESSION_TOKEN`, `AWS_ALLOW_HTTP`, ...).
    pub fn from_url(url: &str) -> Result<Self, ObjectError> {
        let parsed = url::Url::parse(url)
            .map_err(|e| ObjectError::Invalid(format!("blob URL {url:?}: {e}")))?;
        if parsed.scheme() != "s3" || parsed.host_str().unwrap_or_default().is_empty() {
            return Err(ObjectError::Invalid(format!(
                "blob URL {url:?}: expected s3://<bucket>[/<prefix>]"
            )));
        }
        let bucket = parsed.host_str().unwrap_or_default().to_owned();
        let prefix = parsed.path().trim_matches('/').to_owned();
        // reqwest is built without a TLS provider of its own: https endpoints
        // use the process-wide one (ring).
        crate::tls::install_crypto_provider();
        let mut builder = AmazonS3Builder::from_env().with_bucket_name(&bucket);
        // SeaweedFS, MinIO and RGW serve buckets by path, not by host name.
        if std::env::var_os("AWS_VIRTUAL_HOSTED_STYLE_REQUEST").is_none() {
            builder = builder.with_virtual_hosted_style_request(false);
        }
        // Short connect timeout: an outage answers 503 in seconds. Set as
        // config keys, so `AWS_ALLOW_HTTP` and the like from the environment
        // stay in force (and `AWS_CONNECT_TIMEOUT` / `AWS_TIMEOUT` win).
        for (var, key, value) in [
            ("AWS_CONNECT_TIMEOUT", ClientConfigKey::ConnectTimeout, "3s"),
            ("AWS_TIMEOUT", ClientConfigKey::Timeout, "120s"),
        ] {
            if std::env::var_os(var).is_none() {
                builder = builder.with_config(AmazonS3ConfigKey::Client(key), value);
            }
        }
        let store = builder
            .with_retry(RetryConfig {
                max_retries: 2,
                retry_timeout: Duration::from_secs(10),
                ..RetryConfig::default()
            })
            .build()
            .map_err(|e| ObjectError::Invalid(format!("blob URL {url:?}: {e}")))?;
        Ok(Self::new(Arc::new(store), &prefix, url))
    }

    /// Blobs in `store` under `prefix`; `url` is for messages.
    pub fn new(store: Arc<dyn ObjectStore>, prefix: &str, url: &str) -> Self {
        let root = Path::from(prefix).join("sha256");
        Self {
            store,
            root,
            url: url.to_owned(),
            part_bytes: DEFAULT_PART_BYTES,
        }
    }

    /// The same store with another multipart part size (blobs larger than
    /// it are uploaded in parts).
    pub fn with_part_bytes(mut self, part_bytes: usize) -> Self {
        self.part_bytes = part_bytes.max(1);
        self
    }

    /// The URL it was opened from.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// The key of blob `digest`.
    pub fn key(&self, digest: &str) -> Result<Path, ObjectError> {
        if !is_digest(digest) {
            return Err(ObjectError::Invalid(format!(
                "not a sha256 digest: {digest:?}"
            )));
        }
        Ok(self.root.clone().join(&digest[..2]).join(digest))
    }

    /// The stored size of blob `digest`, `None` when absent.
    pub async fn size(&self, digest: &str) -> Result<Option<u64>, ObjectError> {
        let key = self.key(digest)?;
        match self.store.head(&key).await {
            Ok(meta) => Ok(Some(meta.size)),
            Err(object_store::Error::NotFound { .. }) => Ok(None),
            Err(e) => Err(classify(e, &key)),
        }
    }

    /// Stores the file at `path` as blob `digest` of `size` bytes, after
    /// checking that the file has that size and digest. Never overwrites.
    pub async fn put_file(
        &self,
        path: &FsPath,
        digest: &str,
        size: u64,
    ) -> Result<PutOutcome, ObjectError> {
        let key = self.key(digest)?;
        let owned = path.to_owned();
        let (actual_size, actual) = tokio::task::spawn_blocking(move || hash_file(&owned))
            .await
            .map_err(|e| ObjectError::Io(io::Error::other(e)))??;
        if actual_size != size || actual != digest {
            return Err(ObjectError::Corrupt(format!(
                "refusing to store {}: it has {actual_size} bytes with sha256 {actual}, \
                 not {size} bytes with sha256 {digest}",
                path.display()
            )));
        }
        if let Some(existing) = self.size(digest).await? {
            return self.existing(digest, existing, size);
        }
        if size as usize <= self.part_bytes {
            let data = tokio::fs::read(path).await?;
            let opts = PutOptions {
                mode: PutMode::Create,
                ..PutOptions::default()
            };
            match self
                .store
                .put_opts(&key, PutPayload::from(Bytes::from(data)), opts)
                .await
            {
                Ok(_) => {}
                // A concurrent writer won: same digest, so same bytes, if its size is right.
                Err(
                    object_store::Error::AlreadyExists { .. }
                    | object_store::Error::Precondition { .. },
                ) => {
                    let found = self.size(digest).await?.unwrap_or_default();
                    return self.existing(digest, found, size);
                }
                Err(e) => return Err(classify(e, &key)),
            }
        } else {
            self.put_multipart(&key, path).await?;
        }
        match self.size(digest).await? {
            Some(stored) if stored == size => Ok(PutOutcome::Written),
            Some(stored) => Err(ObjectError::Corrupt(format!(
                "object {key} has {stored} bytes after the upload, expected {size}"
            ))),
            None => Err(ObjectError::Unavailable(format!(
                "object {key} is missing right after its upload"
            ))),
        }
    }

    fn existing(&self, digest: &str, found: u64, size: u64) -> Result<PutOutcome, ObjectError> {
        if found == size {
            Ok(PutOutcome::Existing)
        } else {
            Err(ObjectError::Corrupt(format!(
                "object storage holds {found} bytes under bundle {digest}, expected {size}; \
                 the object is not overwritten (remove it from the bucket)"
            )))
        }
    }

    async fn put_multipart(&self, key: &Path, path: &FsPath) -> Result<(), ObjectError> {
        let upload = self
            .store
            .put_multipart(key)
            .await
            .map_err(|e| classify(e, key))?;
        let mut writer = WriteMultipart::new_with_chunk_size(upload, self.part_bytes);
        let mut file = tokio::fs::File::open(path).await?;
        let mut buf = vec![0u8; 1 << 20];
        let result: Result<(), ObjectError> = async {
            loop {
                let n = tokio::io::AsyncReadExt::read(&mut file, &mut buf).await?;
                if n == 0 {
                    break;
                }
                writer
                    .wait_for_capacity(PARTS_IN_FLIGHT)
                    .await
                    .map_err(|e| classify(e, key))?;
                writer.write(&buf[..n]);
            }
            Ok(())
        }
        .await;
        match result {
            Ok(()) => {
                writer.finish().await.map_err(|e| classify(e, key))?;
                Ok(())
            }
            Err(e) => {
                // Best effort: the store also expires abandoned uploads.
                let _ = writer.abort().await;
                Err(e)
            }
        }
    }

    /// Streams blob `digest` into `dest` (truncated first) and checks that
    /// it is `size` bytes with that sha256; on a mismatch `dest` holds
    /// garbage and the caller drops it.
    pub async fn fetch_into(
        &self,
        digest: &str,
        size: u64,
        dest: std::fs::File,
    ) -> Result<(), ObjectError> {
        let key = self.key(digest)?;
        let got = self.store.get(&key).await.map_err(|e| classify(e, &key))?;
        if got.meta.size != size {
            return Err(ObjectError::Corrupt(format!(
                "object {key} has {} bytes, but bundle {digest} has {size}; not served",
                got.meta.size
            )));
        }
        let mut stream = got.into_stream();
        let mut out = tokio::fs::File::from_std(dest);
        out.set_len(0).await?;
        let mut hasher = Sha256::new();
        let mut seen = 0u64;
        while let Some(chunk) = stream.next().await {
            let chunk = chunk.map_err(|e| classify(e, &key))?;
            seen += chunk.len() as u64;
            if seen > size {
                break;
            }
            hasher.update(&chunk);
            out.write_all(&chunk).await?;
        }
        out.flush().await?;
        let actual = hex::encode(hasher.finalize());
        if seen != size || actual != digest {
            return Err(ObjectError::Corrupt(format!(
                "object {key} does not hold bundle {digest} (read {seen} bytes with sha256 \
                 {actual}); not served"
            )));
        }
        Ok(())
    }

    /// Deletes blob `digest` (absent is fine).
    pub async fn delete(&self, digest: &str) -> Result<(), ObjectError> {
        let key = self.key(digest)?;
        match self.store.delete(&key).await {
            Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
            Err(e) => Err(classify(e, &key)),
        }
    }

    /// Every blob object under the prefix (keys that are not
    /// `sha256/<2 hex>/<64 hex>` are ignored, never deleted).
    pub async fn list(&self) -> Result<Vec<StoredObject>, ObjectError> {
        let mut out = Vec::new();
        let mut listing = self.store.list(Some(&self.root));
        while let Some(meta) = listing.next().await {
            let meta = meta.map_err(|e| classify(e, &self.root))?;
            let Some(digest) = meta.location.filename().filter(|d| is_digest(d)) else {
                continue;
            };
            if self.key(digest).ok().as_ref() != Some(&meta.location) {
                continue;
            }
            out.push(StoredObject {
                digest: digest.to_owned(),
                size: meta.size,
                last_modified: meta.last_modified.into(),
            });
        }
        Ok(out)
    }

    /// The objects a sweep may delete: not in `named`, and written before
    /// `now - grace` (younger ones may be another replica's upload that is
    /// not named yet).
    pub async fn deletable(
        &self,
        named: &std::collections::HashSet<String>,
        grace: Duration,
        now: SystemTime,
    ) -> Result<Vec<StoredObject>, ObjectError> {
        let cutoff = now.checked_sub(grace).unwrap_or(SystemTime::UNIX_EPOCH);
        Ok(self
            .list()
            .await?
            .into_iter()
            .filter(|o| !named.contains(&o.digest) && o.last_modified <= cutoff)
            .collect())
    }
}

/// Size and sha256 (hex) of the file at `path`. Blocking.
pub fn hash_file(path: &FsPath) -> io::Result<(u64, String)> {
    let mut file = std::fs::File::open(path)?;
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    let mut total = 0u64;
    loop {
        let n = file.read(&mut buf)?;
        if n == 0 {
            break;
        }
        total += n as u64;
        hasher.update(&buf[..n]);
    }
    Ok((total, hex::encode(hasher.finalize())))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_content_addressed_under_the_prefix() {
        let blobs = ObjectBlobs::new(
            Arc::new(object_store::memory::InMemory::new()),
            "team/a",
            "s3://b/team/a",
        );
        let d = "ab".repeat(32);
        assert_eq!(
            blobs.key(&d).unwrap().to_string(),
            format!("team/a/sha256/ab/{d}")
        );
        assert!(blobs.key("../x").is_err());
    }

    #[test]
    fn urls_must_be_s3_with_a_bucket() {
        for bad in ["http://x/y", "s3:///p", "nonsense"] {
            let e = ObjectBlobs::from_url(bad).unwrap_err();
            assert!(e.to_string().contains("blob URL"), "{bad}: {e}");
        }
    }
}
