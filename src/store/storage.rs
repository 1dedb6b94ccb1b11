//! [`Storage`]: the one face of the store, built from [`StorageSettings`] in
//! one place. Metadata and runs live in redb under the data dir or on
//! PostgreSQL; bundle bytes live in [`Blobs`]: local blob files, or local
//! copies in front of object storage. Callers use it without knowing which.

use std::collections::HashSet;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Weak};
use std::time::{Duration, SystemTime};

use tokio::sync::{Mutex, MutexGuard};

use super::{
    BlobStore, DatabaseUrl, MetadataStore, ObjectBlobs, ObjectError, PostgresStore, RedbStore,
    RunStore, StoreError, TempBlob,
};
use crate::fsutil;

/// Where the store keeps what, as configured.
#[derive(Debug, Clone)]
pub struct StorageSettings {
    /// Metadata on this PostgreSQL database; `None`: the embedded store
    /// under the data dir.
    pub database_url: Option<DatabaseUrl>,
    /// Object storage holding the bundle bytes (`s3://bucket/prefix`); the
    /// local blobs are then this replica's copy of it. `None`: local blobs
    /// only.
    pub blob_url: Option<String>,
    /// How old an object no workload names must be before it is deleted
    /// from object storage (another replica may be about to name it).
    pub blob_gc_grace: Duration,
    /// With `blob_url`: about how many bytes this replica's disk copies may
    /// take; the least recently used are dropped beyond it (and fetched
    /// again when needed).
    pub blob_local_max_bytes: u64,
}

/// Default of [`StorageSettings::blob_gc_grace`]: 15 minutes.
pub const DEFAULT_BLOB_GC_GRACE: Duration = Duration::from_secs(15 * 60);

/// Default of [`StorageSettings::blob_local_max_bytes`]: 8 GiB.
pub const DEFAULT_BLOB_LOCAL_BYTES: u64 = 8 << 30;

impl Default for StorageSettings {
    fn default() -> Self {
        Self {
            database_url: None,
            blob_url: None,
            blob_gc_grace: DEFAULT_BLOB_GC_GRACE,
            blob_local_max_bytes: DEFAULT_BLOB_LOCAL_BYTES,
        }
    }
}

/// Why the store could not be opened.
#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    /// The object storage URL is unusable.
    #[error("--blob-url/CS_BLOB_URL: {0}")]
    BlobUrl(#[source] ObjectError),
    /// The metadata database failed to open.
    #[error(transparent)]
    Metadata(#[from] StoreError),
    /// A directory or file under the data dir failed.
    #[error("storage: {0}")]
    Disk(#[from] io::Error),
}

/// Why a blob operation failed: object storage, or the local disk.
#[derive(Debug, thiserror::Error)]
pub enum BlobError {
    /// The object storage failed (or holds other bytes).
    #[error(transparent)]
    Object(#[from] ObjectError),
    /// The local blob files failed.
    #[error(transparent)]
    Disk(#[from] io::Error),
}

/// The store: workload metadata, the delivery run registry (in the same
/// database) and the bundle bytes. Cheap to clone.
#[derive(Debug, Clone)]
pub struct Storage {
    metadata: Arc<dyn MetadataStore>,
    runs: Arc<dyn RunStore>,
    blobs: Blobs,
    spool_dir: PathBuf,
}

impl Storage {
    /// Opens what `settings` name under `data_dir`: metadata in
    /// `store/meta.redb` or on PostgreSQL, bundles in `blobs` (this
    /// replica's copies of object storage with a blob URL), scratch space
    /// in `tmp`.
    pub async fn open(data_dir: &Path, settings: &StorageSettings) -> Result<Self, OpenError> {
        let shared = match &settings.blob_url {
            Some(url) => Some(ObjectBlobs::from_url(url).map_err(OpenError::BlobUrl)?),
            None => None,
        };
        let (metadata, runs): (Arc<dyn MetadataStore>, Arc<dyn RunStore>) =
            match &settings.database_url {
                Some(url) => {
                    let store = Arc::new(PostgresStore::connect(url).await?);
                    (store.clone(), store)
                }
                None => {
                    let store_dir = data_dir.join("store");
                    let store = blocking(move || {
                        fsutil::ensure_dir(&store_dir, 0o700)?;
                        Ok(RedbStore::open(&store_dir.join("meta.redb"))?)
                    })
                    .await?;
                    let store = Arc::new(store);
                    (store.clone(), store)
                }
            };
        let (blobs_dir, spool_dir) = (data_dir.join("blobs"), data_dir.join("tmp"));
        let (bounded, budget) = (shared.is_some(), settings.blob_local_max_bytes);
        let (local, spool_dir) = blocking(move || {
            let local = if bounded {
                BlobStore::open_bounded(&blobs_dir, budget)?
            } else {
                BlobStore::open(&blobs_dir)?
            };
            fsutil::ensure_dir(&spool_dir, 0o700)?;
            Ok((local, spool_dir))
        })
        .await?;
        Ok(Self {
            metadata,
            runs,
            blobs: Blobs {
                local,
                shared,
                gc_grace: settings.blob_gc_grace,
                gc: Arc::new(Mutex::new(())),
            },
            spool_dir,
        })
    }

    /// The workload metadata.
    pub fn metadata(&self) -> &Arc<dyn MetadataStore> {
        &self.metadata
    }

    /// The delivery run registry (in the metadata database).
    pub fn runs(&self) -> &Arc<dyn RunStore> {
        &self.runs
    }

    /// A weak handle on the metadata store: when no strong one is left the
    /// database has been dropped, which is its clean close (the next start
    /// then needs no repair).
    pub fn metadata_handle(&self) -> Weak<dyn MetadataStore> {
        Arc::downgrade(&self.metadata)
    }

    /// The bundle bytes.
    pub fn blobs(&self) -> &Blobs {
        &self.blobs
    }

    /// Scratch space on the data disk (the bundle engine's spool files);
    /// nothing in it outlives a restart.
    pub fn spool_dir(&self) -> &Path {
        &self.spool_dir
    }
}

/// Runs disk work of opening on tokio's blocking pool.
async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, OpenError> + Send + 'static,
) -> Result<T, OpenError> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| OpenError::Disk(io::Error::other(format!("blocking task failed: {e}"))))?
}

/// The bundle bytes, in tiers: the local blob files, and — when configured
/// — the object storage that holds every bundle, of which the local blobs
/// are then this replica's copies (fetched when used, dropped beyond their
/// budget). Cheap to clone.
///
/// Blobs are collected under one lock ([`Blobs::lock_gc`]), held while a
/// blob is made durable and named and while unnamed blobs are removed, so a
/// concurrent upload of the same bytes is never collected between its
/// persist and the commit that names it.
#[derive(Debug, Clone)]
pub struct Blobs {
    local: BlobStore,
    shared: Option<ObjectBlobs>,
    gc_grace: Duration,
    gc: Arc<Mutex<()>>,
}

impl Blobs {
    /// The local blob files (blocking operations: call them from a
    /// blocking thread).
    pub fn local(&self) -> &BlobStore {
        &self.local
    }

    /// Takes the collection lock (see [`Blobs`]).
    pub async fn lock_gc(&self) -> MutexGuard<'_, ()> {
        self.gc.lock().await
    }

    /// A fresh temp blob for an upload.
    pub fn temp(&self) -> io::Result<TempBlob> {
        self.local.temp()
    }

    /// Where the local blob `digest` lives (it may be absent: see
    /// [`Blobs::ensure_local`]).
    pub fn path(&self, digest: &str) -> io::Result<PathBuf> {
        self.local.path(digest)
    }

    /// Whether the bundle `digest` is gone for good: not on local disk, and
    /// no object storage to fetch it from.
    pub fn lost(&self, digest: &str) -> bool {
        self.shared.is_none() && !self.local.exists(digest)
    }

    /// Makes sure the bundle `digest` of `size` bytes is on local disk:
    /// with object storage, a blob not on disk is fetched, verified (size
    /// and sha256) and persisted first. Without it, a no-op.
    pub async fn ensure_local(&self, digest: &str, size: u64) -> Result<(), BlobError> {
        let Some(shared) = &self.shared else {
            return Ok(());
        };
        if self.local.exists(digest) {
            self.local.touch(digest);
            return Ok(());
        }
        let temp = self.local.temp()?;
        shared.fetch_into(digest, size, temp.writer()?).await?;
        // Under the lock, like an upload's persist: a concurrent collection
        // never sees a half-made blob.
        let _gc = self.lock_gc().await;
        let blobs = self.clone();
        let digest = digest.to_owned();
        in_blocking(move || {
            blobs.local.persist(temp, &digest)?;
            blobs.trim_copies();
            Ok(())
        })
        .await
    }

    /// Stores the uploaded `temp` blob (`size` bytes, digest `digest`) in
    /// object storage, verified, before anything names it. Without object
    /// storage, a no-op: [`Blobs::persist`] is what makes it durable.
    pub async fn share(&self, temp: &TempBlob, digest: &str, size: u64) -> Result<(), BlobError> {
        if let Some(shared) = &self.shared {
            shared.put_file(temp.path(), digest, size).await?;
        }
        Ok(())
    }

    /// After the metadata names the bundle `digest`: an object that was
    /// already in object storage may have been swept by another replica
    /// between [`Blobs::share`] and the commit (it was old and unnamed), so
    /// it is checked, and put back from the local blob if it went.
    pub async fn reshare(&self, digest: &str, size: u64) -> Result<(), BlobError> {
        let Some(shared) = &self.shared else {
            return Ok(());
        };
        match shared.size(digest).await? {
            Some(n) if n == size => Ok(()),
            _ => {
                let path = self.local.path(digest)?;
                shared.put_file(&path, digest, size).await?;
                Ok(())
            }
        }
    }

    /// Makes `temp` durable as the local blob `digest`. Blocking; the
    /// caller holds the collection lock.
    pub fn persist(&self, temp: TempBlob, digest: &str) -> io::Result<PathBuf> {
        self.local.persist(temp, digest)
    }

    /// Removes the local blob `digest` (absent is fine); object storage is
    /// swept on its own ([`Blobs::sweepable`]). Blocking; the caller holds
    /// the collection lock.
    pub fn remove(&self, digest: &str) -> io::Result<()> {
        self.local.remove(digest)
    }

    /// Drops the least recently used local copies of object storage beyond
    /// their budget (a no-op without object storage). Blocking; the caller
    /// holds the collection lock (or is the start-up recovery). A failure
    /// only leaves the disk fuller: logged, never the caller's.
    pub fn trim_copies(&self) {
        match self.local.trim() {
            Ok(dropped) if !dropped.is_empty() => {
                let (budget, bytes) = self.local.usage().unwrap_or_default();
                tracing::debug!(
                    dropped = dropped.len(),
                    bytes,
                    budget,
                    "dropped local copies of stored bundles beyond the budget"
                );
            }
            Ok(_) => {}
            Err(e) => tracing::warn!(error = %e, "dropping local copies of stored bundles failed"),
        }
    }

    /// How often object storage should be swept: a quarter of the grace
    /// period, between 1 s and 5 min; `None` without object storage.
    pub fn sweep_every(&self) -> Option<Duration> {
        self.shared
            .as_ref()
            .map(|_| (self.gc_grace / 4).clamp(Duration::from_secs(1), Duration::from_secs(300)))
    }

    /// Digests of the objects a sweep may delete: not in `named`, and
    /// older than the grace period (a younger one may be another replica's
    /// upload that is not named yet). Empty without object storage.
    pub async fn sweepable(&self, named: &HashSet<String>) -> Result<Vec<String>, BlobError> {
        let Some(shared) = &self.shared else {
            return Ok(Vec::new());
        };
        let objects = shared
            .deletable(named, self.gc_grace, SystemTime::now())
            .await?;
        Ok(objects.into_iter().map(|o| o.digest).collect())
    }

    /// Deletes the object `digest` from object storage (a no-op without
    /// it). The caller has removed the local copy and checked, under the
    /// collection lock, that nothing names it.
    pub async fn delete_shared(&self, digest: &str) -> Result<(), BlobError> {
        if let Some(shared) = &self.shared {
            shared.delete(digest).await?;
        }
        Ok(())
    }
}

/// Runs blocking blob work on tokio's blocking pool, in the caller's span.
async fn in_blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, BlobError> + Send + 'static,
) -> Result<T, BlobError> {
    let span = tracing::Span::current();
    tokio::task::spawn_blocking(move || span.in_scope(f))
        .await
        .map_err(|e| BlobError::Disk(io::Error::other(format!("blocking task failed: {e}"))))?
}
