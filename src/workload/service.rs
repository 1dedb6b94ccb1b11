//! The workload service type, its settings, and the lifecycle of a workload:
//! create, read, list, activate, locate, open and delete.

use std::io;
use std::sync::Arc;

use super::admission::UploadGate;
use super::metrics::Reader;
use super::names::{self, Revision, WorkloadName};
use super::recovery::{self, RecoveryReport};
use super::settings::WorkloadSettings;
use super::state::{blocking, now_ms, random_bytes, Inner};
use super::{WorkloadError, WorkloadMetrics, WorkloadView};
use crate::bundle::{manifest_of_bundle, TempBudget, TreeManifest};
use crate::cache::{BundleCache, CachedBundle};
use crate::store::{
    MetadataStore, OwnerMigration, RevisionRecord, Storage, StoreError, WorkloadRecord,
    WorkloadStatus, SCHEMA_OWNER_KINDS,
};

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

    /// Opens the bundle (as [`WorkloadService::open_bundle`] does, counted
    /// as a delivery read, not a download).
    pub async fn open(&self) -> Result<CachedBundle, WorkloadError> {
        self.workloads
            .open_for(Reader::Delivery, &self.name, &self.revision)
            .await
    }
}

/// The workload service. Cheap to clone.
#[derive(Debug, Clone)]
pub struct WorkloadService {
    pub(super) inner: Arc<Inner>,
}

impl WorkloadService {
    /// The service over `storage` (see [`Storage::open`]), after start-up
    /// recovery, which runs before anything is served.
    pub async fn open(
        storage: Storage,
        settings: WorkloadSettings,
        cache: Arc<BundleCache>,
    ) -> Result<(Self, RecoveryReport), WorkloadError> {
        let metrics = WorkloadMetrics::default();
        let inner = Arc::new(Inner {
            store: storage.metadata().clone(),
            blobs: storage.blobs().clone(),
            cache,
            uploads: Arc::new(UploadGate::new(settings.uploads, metrics.uploads_running())),
            temp_budget: TempBudget::new(settings.upload_temp_bytes),
            settings,
            spool_dir: storage.spool_dir().to_owned(),
            metrics,
        });
        let report = inner.recover().await?;
        if let Some(every) = inner.blobs.sweep_every() {
            recovery::spawn_object_sweeper(&inner, every);
        }
        Ok((Self { inner }, report))
    }

    /// Makes sure the bundle `digest` of `size` bytes is on local disk
    /// (see [`crate::store::Blobs::ensure_local`]).
    pub(super) async fn ensure_local(&self, digest: &str, size: u64) -> Result<(), WorkloadError> {
        Ok(self.inner.blobs.ensure_local(digest, size).await?)
    }

    /// Brings stored owners to the current schema (see
    /// [`MetadataStore::migrate_owners`]): each owner recorded before
    /// owners had kinds becomes `legacy(owner)`. Idempotent; `None` when
    /// there was nothing to do. Run before serving.
    pub async fn migrate_owners(
        &self,
        legacy: fn(&str) -> String,
    ) -> Result<Option<OwnerMigration>, WorkloadError> {
        Ok(self
            .inner
            .store
            .migrate_owners(SCHEMA_OWNER_KINDS, legacy)
            .await?)
    }

    /// The settings in force.
    pub fn settings(&self) -> &WorkloadSettings {
        &self.inner.settings
    }

    /// The service's metrics (register them on the process registry).
    pub fn metrics(&self) -> &WorkloadMetrics {
        &self.inner.metrics
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
        match self
            .inner
            .store
            .insert_workload(&record, &grant, quota)
            .await
        {
            Ok(()) => {}
            Err(StoreError::NameTaken) => return Err(WorkloadError::NameTaken(record.name)),
            Err(StoreError::QuotaExceeded(q)) => return Err(WorkloadError::QuotaExceeded(q)),
            Err(e) => return Err(e.into()),
        }
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
        let records = self.inner.store.workloads_of(owner).await?;
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
            match self.inner.store.replace_workload(&record, None).await {
                Ok(stored) => return Ok(WorkloadView::of(&stored)),
                // Lost a race with an upload or another activation: re-read.
                Err(StoreError::Conflict) => continue,
                Err(StoreError::NotFound) => return Err(WorkloadError::NotFound(record.name)),
                Err(e) => return Err(e.into()),
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
                // Best effort: a lost race only means computing it again.
                let _ = self.inner.store.replace_workload(&record, None).await;
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

    /// Opens a located revision's bundle through the cache, for a download.
    pub async fn open_bundle(
        &self,
        name: &str,
        revision: &RevisionRecord,
    ) -> Result<CachedBundle, WorkloadError> {
        self.open_for(Reader::Download, name, revision).await
    }

    /// Opens a located revision's bundle through the cache for `reader`.
    async fn open_for(
        &self,
        reader: Reader,
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
        if matches!(&opened, Err(e) if e.kind() == io::ErrorKind::NotFound) {
            // A disk copy of object storage dropped for the budget between
            // the check and the open: fetch it again, once. (Without object
            // storage the fetch is a no-op and the open fails again.)
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
                self.inner.metrics.opened(reader, b.is_memory());
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
        self.inner.delete(owner, name).await?;
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
        let found = self.store.workload(owner, name).await?;
        match found {
            Some(r) if r.status != WorkloadStatus::Deleting => Ok(r),
            _ => Err(WorkloadError::NotFound(name.to_string())),
        }
    }

    /// Marks the record `deleting`, then finishes the delete.
    async fn delete(&self, owner: &str, name: &WorkloadName) -> Result<(), WorkloadError> {
        let name = name.as_str();
        loop {
            let mut record = self
                .store
                .workload(owner, name)
                .await?
                .ok_or_else(|| WorkloadError::NotFound(name.to_owned()))?;
            if record.status != WorkloadStatus::Deleting {
                record.status = WorkloadStatus::Deleting;
                record.updated_at_ms = now_ms();
                record = match self.store.replace_workload(&record, None).await {
                    Ok(r) => r,
                    Err(StoreError::Conflict) => continue,
                    Err(StoreError::NotFound) => {
                        return Err(WorkloadError::NotFound(name.to_owned()))
                    }
                    Err(e) => return Err(e.into()),
                };
            }
            if self.finish_delete(&record).await? {
                return Ok(());
            }
            // The record changed under us (a concurrent retry): re-read.
        }
    }
}
