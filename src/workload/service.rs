//! The workload service type, its settings, and the lifecycle of a workload:
//! create, read, list, activate, locate, open and delete.

use std::io;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rand::RngCore;
use sha2::{Digest, Sha256};

use super::admission::{UploadGate, UploadLimits};
use super::names::{self, Revision, WorkloadName};
use super::{RecoveryReport, WorkloadError, WorkloadMetrics, WorkloadView};
use crate::bundle::{manifest_of_bundle, Limits, TempBudget, TreeManifest};
use crate::cache::{BundleCache, CachedBundle};
pub(super) use crate::clock::now_ms;
use crate::fsutil;
use crate::store::{
    BlobStore, DatabaseUrl, MetadataStore, ObjectBlobs, OwnerMigration, PostgresStore, RedbStore,
    RevisionRecord, RunStore, StoreError, WorkloadRecord, WorkloadStatus, SCHEMA_OWNER_KINDS,
};

/// Tunables of the workload service.
#[derive(Debug, Clone)]
pub struct WorkloadSettings {
    /// Most workloads per owner.
    pub quota: usize,
    /// Lifetime of an upload grant.
    pub grant_ttl: Duration,
    /// Bundle limits.
    pub limits: Limits,
    /// How many uploads run at once.
    pub uploads: UploadLimits,
    /// Temporary disk all running uploads may hold together, in bytes.
    pub upload_temp_bytes: u64,
    /// Deflate threads of an upload's canonical gzip (`0`: one per core).
    pub deflate_threads: usize,
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
    /// Metadata on this PostgreSQL database; `None`: the embedded store
    /// under the data dir.
    pub database_url: Option<DatabaseUrl>,
}

/// Default of [`WorkloadSettings::blob_gc_grace`]: 15 minutes.
pub const DEFAULT_BLOB_GC_GRACE: Duration = Duration::from_secs(15 * 60);

/// Default of [`WorkloadSettings::blob_local_max_bytes`]: 8 GiB.
pub const DEFAULT_BLOB_LOCAL_BYTES: u64 = 8 << 30;

/// Default of [`WorkloadSettings::upload_temp_bytes`]: 4 GiB.
pub const DEFAULT_UPLOAD_TEMP_BYTES: u64 = 4 << 30;

impl Default for WorkloadSettings {
    fn default() -> Self {
        Self {
            quota: 20,
            grant_ttl: Duration::from_secs(300),
            limits: Limits::default(),
            uploads: UploadLimits::default(),
            upload_temp_bytes: DEFAULT_UPLOAD_TEMP_BYTES,
            deflate_threads: 0,
            blob_url: None,
            blob_gc_grace: DEFAULT_BLOB_GC_GRACE,
            blob_local_max_bytes: DEFAULT_BLOB_LOCAL_BYTES,
            database_url: None,
        }
    }
}

/// A create request, already parsed.
#[derive(Debug, Clone, Default)]
pub struct CreateWorkload {
    /// Requested name (default `wl-` + 8 hex).
    pub name: Option<String>,
    /// Context type (default `workspace`).
    pub kind: Option<String>,
}

/// A workload's active revision as a delivery reads it, in one call
/// ([`WorkloadService::active_bundle`]).
#[derive(Debug, Clone)]
pub struct ActiveBundle {
    /// The active revision.
    pub revision: RevisionRecord,
    /// Its tree manifest.
    pub manifest: TreeManifest,
    /// Where its bundle bytes come from.
    pub source: BundleSource,
}

/// The bundle of one located revision, opened on demand (through the
/// cache, fetched from object storage when needed).
#[derive(Debug, Clone)]
pub struct BundleSource {
    workloads: WorkloadService,
    name: WorkloadName,
    revision: RevisionRecord,
}

impl BundleSource {
    /// The revision whose bundle this is.
    pub fn revision(&self) -> &RevisionRecord {
        &self.revision
    }

    /// Opens the bundle (see [`WorkloadService::open_bundle`]).
    pub async fn open(&self) -> Result<CachedBundle, WorkloadError> {
        self.workloads.open_bundle(&self.name, &self.revision).await
    }
}

/// The workload service. Cheap to clone.
#[derive(Debug, Clone)]
pub struct WorkloadService {
    pub(super) inner: Arc<Inner>,
}

/// The shared state behind every clone; the other files of `workload` add
/// their methods to it.
#[derive(Debug)]
pub(super) struct Inner {
    pub(super) store: Arc<dyn MetadataStore>,
    /// The delivery run registry, in the same database.
    pub(super) runs: Arc<dyn RunStore>,
    pub(super) blobs: BlobStore,
    /// The object storage that holds every bundle, when configured; `blobs`
    /// is then this replica's disk copy of the bundles it has used.
    pub(super) objects: Option<ObjectBlobs>,
    pub(super) cache: Arc<BundleCache>,
    pub(super) settings: WorkloadSettings,
    pub(super) spool_dir: PathBuf,
    pub(super) metrics: WorkloadMetrics,
    /// Admits uploads.
    pub(super) uploads: Arc<UploadGate>,
    /// Temporary disk of running uploads.
    pub(super) temp_budget: TempBudget,
    /// Held while a blob is made durable and named, and while unnamed blobs
    /// are collected.
    pub(super) gc: Mutex<()>,
}

/// `N` bytes from the thread's CSPRNG.
pub(super) fn random_bytes<const N: usize>() -> [u8; N] {
    let mut b = [0u8; N];
    rand::rng().fill_bytes(&mut b);
    b
}

/// sha256 of `data` as 64 lowercase hex digits.
pub(super) fn sha256_hex(data: &[u8]) -> String {
    hex::encode(Sha256::digest(data))
}

/// Runs store and disk work on tokio's blocking pool.
pub(super) async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, WorkloadError> + Send + 'static,
) -> Result<T, WorkloadError> {
    // In the caller's span, so its log lines name the request.
    let span = tracing::Span::current();
    tokio::task::spawn_blocking(move || span.in_scope(f))
        .await
        .map_err(|e| WorkloadError::Internal(format!("blocking task failed: {e}")))?
}

impl WorkloadService {
    /// Opens the store — metadata in `data_dir/store/meta.redb`, or on
    /// PostgreSQL when [`WorkloadSettings::database_url`] is set; bundles in
    /// `data_dir/blobs` (this replica's copy of object storage when
    /// [`WorkloadSettings::blob_url`] is set), spool in `data_dir/tmp` — and runs start-up
    /// recovery before anything is served.
    pub async fn open(
        data_dir: &Path,
        settings: WorkloadSettings,
        cache: Arc<BundleCache>,
    ) -> Result<(Self, RecoveryReport), WorkloadError> {
        let data_dir = data_dir.to_owned();
        let objects = match &settings.blob_url {
            Some(url) => Some(
                ObjectBlobs::from_url(url)
                    .map_err(|e| WorkloadError::Internal(format!("--blob-url/CS_BLOB_URL: {e}")))?,
            ),
            None => None,
        };
        let copies_only = objects.is_some();
        let (service, report) = blocking(move || {
            let (store, runs): (Arc<dyn MetadataStore>, Arc<dyn RunStore>) =
                match &settings.database_url {
                    Some(url) => {
                        // On a blocking thread: connecting and migrating
                        // block on the store's own runtime.
                        let store = Arc::new(PostgresStore::connect(url)?);
                        (store.clone(), store)
                    }
                    None => {
                        let store_dir = data_dir.join("store");
                        fsutil::ensure_dir(&store_dir, 0o700)?;
                        let store = Arc::new(RedbStore::open(&store_dir.join("meta.redb"))?);
                        (store.clone(), store)
                    }
                };
            let blobs_dir = data_dir.join("blobs");
            let blobs = if copies_only {
                BlobStore::open_bounded(&blobs_dir, settings.blob_local_max_bytes)?
            } else {
                BlobStore::open(&blobs_dir)?
            };
            let spool_dir = data_dir.join("tmp");
            fsutil::ensure_dir(&spool_dir, 0o700)?;
            let metrics = WorkloadMetrics::default();
            let service = Self {
                inner: Arc::new(Inner {
                    store,
                    runs,
                    blobs,
                    objects,
                    cache,
                    uploads: Arc::new(UploadGate::new(settings.uploads, metrics.uploads_running())),
                    temp_budget: TempBudget::new(settings.upload_temp_bytes),
                    settings,
                    spool_dir,
                    metrics,
                    gc: Mutex::new(()),
                }),
            };
            let report = service.inner.recover()?;
            Ok((service, report))
        })
        .await?;
        if service.inner.objects.is_some() {
            super::recovery::spawn_object_sweeper(&service.inner);
        }
        Ok((service, report))
    }

    /// Makes sure the bundle `digest` of `size` bytes is on local disk:
    /// with object storage, a blob not on disk is fetched, verified (size
    /// and sha256) and persisted first. Without it, a no-op.
    pub(super) async fn ensure_local(&self, digest: &str, size: u64) -> Result<(), WorkloadError> {
        let Some(objects) = &self.inner.objects else {
            return Ok(());
        };
        if self.inner.blobs.exists(digest) {
            self.inner.blobs.touch(digest);
            return Ok(());
        }
        let temp = self.inner.blobs.temp()?;
        objects.fetch_into(digest, size, temp.writer()?).await?;
        let inner = self.inner.clone();
        let digest = digest.to_owned();
        blocking(move || {
            // Under `gc`, like an upload's persist: a concurrent collection
            // never sees a half-made blob.
            let _gc = inner.lock_gc();
            inner.blobs.persist(temp, &digest)?;
            inner.trim_copies();
            Ok(())
        })
        .await
    }

    /// Brings stored owners to the current schema (see
    /// [`MetadataStore::migrate_owners`]): each owner recorded before
    /// owners had kinds becomes `legacy(owner)`. Idempotent; `None` when
    /// there was nothing to do. Run before serving.
    pub async fn migrate_owners(
        &self,
        legacy: fn(&str) -> String,
    ) -> Result<Option<OwnerMigration>, WorkloadError> {
        let store = self.inner.store.clone();
        blocking(move || Ok(store.migrate_owners(SCHEMA_OWNER_KINDS, &legacy)?)).await
    }

    /// The settings in force.
    pub fn settings(&self) -> &WorkloadSettings {
        &self.inner.settings
    }

    /// The service's metrics (register them on the process registry).
    pub fn metrics(&self) -> &WorkloadMetrics {
        &self.inner.metrics
    }

    /// The delivery run registry, kept in the workload database (one file,
    /// one writer) for the delivery service.
    pub fn run_store(&self) -> Arc<dyn RunStore> {
        self.inner.runs.clone()
    }

    /// A weak handle on the metadata store: when no strong one is left the
    /// database has been dropped, which is its clean close (the next start
    /// then needs no repair).
    pub fn store_handle(&self) -> std::sync::Weak<dyn MetadataStore> {
        Arc::downgrade(&self.inner.store)
    }

    /// The bundle cache.
    pub fn cache(&self) -> &Arc<BundleCache> {
        &self.inner.cache
    }

    /// The temporary disk budget of uploads (its use and peak).
    pub fn temp_budget(&self) -> &TempBudget {
        &self.inner.temp_budget
    }

    /// Creates a workload for `owner` and its first upload grant.
    pub async fn create(
        &self,
        owner: &str,
        req: CreateWorkload,
    ) -> Result<WorkloadView, WorkloadError> {
        let name = match req.name {
            Some(n) if names::is_valid_name(&n) => n,
            Some(n) => return Err(WorkloadError::NameInvalid(n)),
            None => names::default_name(),
        };
        let kind = match req.kind {
            Some(k) if names::CONTEXT_TYPES.contains(&k.as_str()) => k,
            Some(k) => return Err(WorkloadError::TypeInvalid(k)),
            None => names::DEFAULT_CONTEXT_TYPE.to_owned(),
        };
        let now = now_ms();
        let record = WorkloadRecord {
            owner: owner.to_owned(),
            name: name.clone(),
            uid: hex::encode(random_bytes::<16>()),
            kind,
            status: WorkloadStatus::AwaitingUpload,
            candidate: None,
            active: None,
            failure: None,
            created_at_ms: now,
            updated_at_ms: now,
            version: 0,
        };
        let (grant, grant_view) = self.inner.new_grant(&record);
        let quota = self.inner.settings.quota;
        let store = self.inner.store.clone();
        let stored = record.clone();
        blocking(
            move || match store.insert_workload(&stored, &grant, quota) {
                Ok(()) => Ok(()),
                Err(StoreError::NameTaken) => Err(WorkloadError::NameTaken(stored.name.clone())),
                Err(StoreError::QuotaExceeded(q)) => Err(WorkloadError::QuotaExceeded(q)),
                Err(e) => Err(e.into()),
            },
        )
        .await?;
        let mut view = WorkloadView::of(&record);
        view.upload = Some(grant_view);
        Ok(view)
    }

    /// The owner's workload `name`.
    pub async fn get(
        &self,
        owner: &str,
        name: &WorkloadName,
    ) -> Result<WorkloadView, WorkloadError> {
        Ok(WorkloadView::of(&self.inner.visible(owner, name).await?))
    }

    /// The owner's workloads, by name.
    pub async fn list(&self, owner: &str) -> Result<Vec<WorkloadView>, WorkloadError> {
        let store = self.inner.store.clone();
        let owner = owner.to_owned();
        let records = blocking(move || Ok(store.workloads_of(&owner)?)).await?;
        Ok(records
            .iter()
            .filter(|r| r.status != WorkloadStatus::Deleting)
            .map(WorkloadView::of)
            .collect())
    }

    /// Freezes `revision` (which must be the latest upload). Idempotent for
    /// the active revision; another revision of a ready workload is refused.
    pub async fn activate(
        &self,
        owner: &str,
        name: &WorkloadName,
        revision: &Revision,
    ) -> Result<WorkloadView, WorkloadError> {
        let revision = revision.as_str();
        let mut computed: Option<(String, TreeManifest)> = None;
        loop {
            let mut record = self.inner.visible(owner, name).await?;
            match record.status {
                WorkloadStatus::Ready => {
                    let active = record.active.as_ref().map(|r| r.revision.as_str());
                    if active == Some(revision) {
                        return Ok(WorkloadView::of(&record));
                    }
                    return Err(WorkloadError::AlreadyActive(format!(
                        "workload {name:?} is already active with revision {}",
                        active.unwrap_or("?")
                    )));
                }
                WorkloadStatus::Failed => return Err(not_ready(&record)),
                WorkloadStatus::Deleting => return Err(WorkloadError::NotFound(name.to_string())),
                WorkloadStatus::AwaitingUpload => {}
            }
            let mut candidate = match record.candidate.take() {
                None => {
                    return Err(WorkloadError::RevisionMismatch(format!(
                        "nothing has been uploaded to workload {name:?} yet"
                    )))
                }
                Some(c) if c.revision != revision => {
                    return Err(WorkloadError::RevisionMismatch(format!(
                        "revision {revision} is not the latest upload of workload {name:?} (that is {})",
                        c.revision
                    )))
                }
                Some(c) => c,
            };
            if candidate.tree.is_none() {
                // Once per activation, also when a lost race loops back here.
                let tree = match &computed {
                    Some((digest, tree)) if *digest == candidate.bundle_digest => tree.clone(),
                    _ => self.compute_tree(&candidate).await?,
                };
                computed = Some((candidate.bundle_digest.clone(), tree.clone()));
                candidate.tree = Some(tree);
            }
            record.active = Some(candidate);
            record.status = WorkloadStatus::Ready;
            record.updated_at_ms = now_ms();
            let store = self.inner.store.clone();
            match blocking(move || match store.replace_workload(&record, None) {
                Ok(r) => Ok(Some(r)),
                Err(StoreError::Conflict) => Ok(None),
                Err(StoreError::NotFound) => Err(WorkloadError::NotFound(record.name.clone())),
                Err(e) => Err(e.into()),
            })
            .await?
            {
                Some(stored) => return Ok(WorkloadView::of(&stored)),
                // Lost a race with an upload or another activation: re-read.
                None => continue,
            }
        }
    }

    /// The frozen revision `revision` of the owner's ready workload `name`.
    pub async fn locate(
        &self,
        owner: &str,
        name: &WorkloadName,
        revision: &Revision,
    ) -> Result<RevisionRecord, WorkloadError> {
        let record = self.inner.visible(owner, name).await?;
        if record.status != WorkloadStatus::Ready {
            return Err(not_ready(&record));
        }
        match record.active {
            Some(active) if active.revision == revision.as_str() => Ok(active),
            _ => Err(WorkloadError::RevisionNotFound(revision.to_string())),
        }
    }

    /// What a delivery needs of the owner's workload `name`, from one read
    /// of its record: the active revision, its tree manifest and the source
    /// of its bundle bytes (opened only when a sandbox asks for them).
    pub async fn active_bundle(
        &self,
        owner: &str,
        name: &WorkloadName,
    ) -> Result<ActiveBundle, WorkloadError> {
        let record = self.inner.visible(owner, name).await?;
        let revision = match (&record.active, record.status) {
            (Some(active), WorkloadStatus::Ready) => active.clone(),
            (Some(_), _) => return Err(not_ready(&record)),
            (None, status) => {
                return Err(WorkloadError::NotReady(format!(
                    "workload {name:?} is {}; activate a revision first",
                    status.as_str()
                )))
            }
        };
        let manifest = self.tree_manifest(owner, name, &revision).await?;
        let source = BundleSource {
            workloads: self.clone(),
            name: name.clone(),
            revision: revision.clone(),
        };
        Ok(ActiveBundle {
            revision,
            manifest,
            source,
        })
    }

    /// The tree manifest of a located revision: the one recorded at
    /// activation, or (for revisions activated before manifests were
    /// recorded) computed from the bundle now and recorded if the revision
    /// is still active.
    async fn tree_manifest(
        &self,
        owner: &str,
        name: &WorkloadName,
        revision: &RevisionRecord,
    ) -> Result<TreeManifest, WorkloadError> {
        if let Some(tree) = &revision.tree {
            return Ok(tree.clone());
        }
        let tree = self.compute_tree(revision).await?;
        let mut record = self.inner.visible(owner, name).await?;
        if let Some(active) = record.active.as_mut() {
            if active.bundle_digest == revision.bundle_digest && active.tree.is_none() {
                active.tree = Some(tree.clone());
                let store = self.inner.store.clone();
                // Best effort: a lost race only means computing it again.
                let _ = blocking(move || match store.replace_workload(&record, None) {
                    Ok(_) | Err(StoreError::Conflict | StoreError::NotFound) => Ok(()),
                    Err(e) => Err(e.into()),
                })
                .await;
            }
        }
        Ok(tree)
    }

    /// Reads the revision's bundle from its blob and computes its tree
    /// manifest (inflate and hash every file: ~0.1 s for 64 MiB).
    async fn compute_tree(&self, revision: &RevisionRecord) -> Result<TreeManifest, WorkloadError> {
        self.ensure_local(&revision.bundle_digest, revision.bytes)
            .await?;
        let path = self.inner.blobs.path(&revision.bundle_digest)?;
        let digest = revision.bundle_digest.clone();
        blocking(move || {
            let file = std::fs::File::open(&path)
                .map_err(|e| WorkloadError::Internal(format!("opening bundle {digest}: {e}")))?;
            manifest_of_bundle(file).map_err(|e| {
                WorkloadError::Internal(format!("the tree manifest of bundle {digest}: {e}"))
            })
        })
        .await
    }

    /// Opens a located revision's bundle through the cache.
    pub async fn open_bundle(
        &self,
        name: &str,
        revision: &RevisionRecord,
    ) -> Result<CachedBundle, WorkloadError> {
        // A bundle held in memory needs no disk copy (and keeps being served
        // while object storage is down).
        if !self.inner.cache.contains(&revision.bundle_digest) {
            self.ensure_local(&revision.bundle_digest, revision.bytes)
                .await?;
        }
        let path = self.inner.blobs.path(&revision.bundle_digest)?;
        let mut opened = self
            .inner
            .cache
            .get(&revision.bundle_digest, revision.bytes, &path)
            .await;
        if matches!(&opened, Err(e) if e.kind() == io::ErrorKind::NotFound)
            && self.inner.objects.is_some()
        {
            // The disk copy was dropped for the budget between the check
            // and the open: fetch it again, once.
            self.ensure_local(&revision.bundle_digest, revision.bytes)
                .await?;
            opened = self
                .inner
                .cache
                .get(&revision.bundle_digest, revision.bytes, &path)
                .await;
        }
        match opened {
            Ok(b) => {
                self.inner.metrics.downloaded(b.is_memory());
                self.inner.metrics.cache(self.inner.cache.stats());
                Ok(b)
            }
            // Deleted between lookup and open.
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                Err(WorkloadError::NotFound(name.to_owned()))
            }
            Err(e) => Err(WorkloadError::Internal(format!(
                "opening bundle {}: {e}",
                revision.bundle_digest
            ))),
        }
    }

    /// Deletes the owner's workload `name`: marks it `deleting`, evicts its
    /// cached bytes, removes the record and its unshared blobs. A retry (or
    /// the next start) finishes an interrupted delete.
    pub async fn delete(&self, owner: &str, name: &WorkloadName) -> Result<(), WorkloadError> {
        let inner = self.inner.clone();
        let (owner, name) = (owner.to_owned(), name.clone());
        blocking(move || inner.delete(&owner, &name)).await?;
        self.inner.metrics.cache(self.inner.cache.stats());
        Ok(())
    }
}

/// The refusal for a workload that has no servable revision.
pub(super) fn not_ready(record: &WorkloadRecord) -> WorkloadError {
    let why = match (&record.status, &record.failure) {
        (WorkloadStatus::Failed, Some(f)) => format!("workload {:?} failed: {f}", record.name),
        _ => format!(
            "workload {:?} is {}; activate a revision first",
            record.name,
            record.status.as_str()
        ),
    };
    WorkloadError::NotReady(why)
}

impl Inner {
    /// The owner's record, unless absent or being deleted.
    pub(super) async fn visible(
        &self,
        owner: &str,
        name: &WorkloadName,
    ) -> Result<WorkloadRecord, WorkloadError> {
        let store = self.store.clone();
        let (o, n) = (owner.to_owned(), name.to_string());
        let found = blocking(move || Ok(store.workload(&o, &n)?)).await?;
        match found {
            Some(r) if r.status != WorkloadStatus::Deleting => Ok(r),
            _ => Err(WorkloadError::NotFound(name.to_string())),
        }
    }

    /// Marks the record `deleting`, then finishes the delete. Blocking.
    fn delete(&self, owner: &str, name: &WorkloadName) -> Result<(), WorkloadError> {
        let name = name.as_str();
        loop {
            let mut record = self
                .store
                .workload(owner, name)?
                .ok_or_else(|| WorkloadError::NotFound(name.to_owned()))?;
            if record.status != WorkloadStatus::Deleting {
                record.status = WorkloadStatus::Deleting;
                record.updated_at_ms = now_ms();
                record = match self.store.replace_workload(&record, None) {
                    Ok(r) => r,
                    Err(StoreError::Conflict) => continue,
                    Err(StoreError::NotFound) => {
                        return Err(WorkloadError::NotFound(name.to_owned()))
                    }
                    Err(e) => return Err(e.into()),
                };
            }
            if self.finish_delete(&record)? {
                return Ok(());
            }
            // The record changed under us (a concurrent retry): re-read.
        }
    }
}
