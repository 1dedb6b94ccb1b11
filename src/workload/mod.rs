//! The workload service: lifecycle, states, names, quota, upload grants,
//! revisions, downloads and start-up recovery.
//!
//! States: `awaiting_upload → ready`; `deleting → deleted` (a deleted
//! workload is gone: reads answer 404 and the name is free again). `failed`
//! marks a workload whose bundle start-up recovery found missing.
//!
//! Every upload goes through the bundle engine into a temp blob; the blob is
//! made durable before the metadata that names it commits, and blobs no
//! record names are collected under one lock so a concurrent upload of the
//! same bytes is never collected between its rename and its commit.

mod error;
mod metrics;
pub mod names;
mod view;

pub use error::WorkloadError;
pub use metrics::WorkloadMetrics;
pub use view::{rfc3339, RevisionView, UploadGrantView, WorkloadView, BUNDLE_MEDIA_TYPE};

use std::collections::HashSet;
use std::io;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use base64::Engine as _;
use bytes::Bytes;
use futures::{Stream, StreamExt};
use rand::RngCore;
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

use crate::bundle::{self, BundleError, CanonicalOptions, Limits};
use crate::cache::{BundleCache, CachedBundle};
use crate::fsutil;
use crate::store::{
    BlobStore, GrantRecord, MetadataStore, RedbStore, RevisionRecord, StoreError, WorkloadRecord,
    WorkloadStatus,
};

/// A request body: chunks of bytes or an I/O error.
pub type BodyStream = Pin<Box<dyn Stream<Item = io::Result<Bytes>> + Send>>;

/// Tunables of the workload service.
#[derive(Debug, Clone)]
pub struct WorkloadSettings {
    /// Most workloads per owner.
    pub quota: usize,
    /// Lifetime of an upload grant.
    pub grant_ttl: Duration,
    /// Bundle limits.
    pub limits: Limits,
}

impl Default for WorkloadSettings {
    fn default() -> Self {
        Self {
            quota: 20,
            grant_ttl: Duration::from_secs(300),
            limits: Limits::default(),
        }
    }
}

/// What start-up recovery found and did.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct RecoveryReport {
    /// Temp files left by a crash, removed.
    pub temp_files_removed: usize,
    /// Workloads marked `failed` because a bundle is missing (`owner scope`
    /// is not logged; names only).
    pub failed: Vec<String>,
    /// Deletes interrupted by a crash, finished.
    pub deletes_finished: usize,
    /// Blobs no record names (a crash between blob and metadata), removed.
    pub orphan_blobs_removed: usize,
    /// Expired grants removed.
    pub grants_purged: usize,
}

/// Who may upload, as established before the body is read.
#[derive(Debug, Clone)]
pub struct UploadTicket {
    owner: String,
    name: String,
    uid: String,
    grant_id: Option<String>,
}

/// A create request, already parsed.
#[derive(Debug, Clone, Default)]
pub struct CreateWorkload {
    /// Requested name (default `wl-` + 8 hex).
    pub name: Option<String>,
    /// Context type (default `workspace`).
    pub kind: Option<String>,
}

/// The workload service. Cheap to clone.
#[derive(Debug, Clone)]
pub struct WorkloadService {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    store: Arc<dyn MetadataStore>,
    blobs: BlobStore,
    cache: Arc<BundleCache>,
    settings: WorkloadSettings,
    spool_dir: PathBuf,
    metrics: WorkloadMetrics,
    /// Held while a blob is made durable and named, and while unnamed blobs
    /// are collected.
    gc: Mutex<()>,
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or_default()
}

fn random_bytes<const N: usize>() -> [u8; N] {
    let mut b = [0u8; N];
    rand::rng().fill_bytes(&mut b);
    b
}

fn sha256_hex(data: &[u8]) -> String {
    hex::encode(Sha256::digest(data))
}

async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, WorkloadError> + Send + 'static,
) -> Result<T, WorkloadError> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| WorkloadError::Internal(format!("blocking task failed: {e}")))?
}

impl WorkloadService {
    /// Opens the embedded store under `data_dir` (`meta.redb`, `blobs/`,
    /// `tmp/`) and runs start-up recovery before anything is served.
    pub async fn open(
        data_dir: &Path,
        settings: WorkloadSettings,
        cache: Arc<BundleCache>,
    ) -> Result<(Self, RecoveryReport), WorkloadError> {
        let data_dir = data_dir.to_owned();
        blocking(move || {
            let store_dir = data_dir.join("store");
            fsutil::ensure_dir(&store_dir, 0o700)?;
            let store = RedbStore::open(&store_dir.join("meta.redb"))?;
            let blobs = BlobStore::open(&data_dir.join("blobs"))?;
            let spool_dir = data_dir.join("tmp");
            fsutil::ensure_dir(&spool_dir, 0o700)?;
            let service = Self {
                inner: Arc::new(Inner {
                    store: Arc::new(store),
                    blobs,
                    cache,
                    settings,
                    spool_dir,
                    metrics: WorkloadMetrics::default(),
                    gc: Mutex::new(()),
                }),
            };
            let report = service.inner.recover()?;
            Ok((service, report))
        })
        .await
    }

    /// The settings in force.
    pub fn settings(&self) -> &WorkloadSettings {
        &self.inner.settings
    }

    /// The service's metrics (register them on the process registry).
    pub fn metrics(&self) -> &WorkloadMetrics {
        &self.inner.metrics
    }

    /// The bundle cache.
    pub fn cache(&self) -> &Arc<BundleCache> {
        &self.inner.cache
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
    pub async fn get(&self, owner: &str, name: &str) -> Result<WorkloadView, WorkloadError> {
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

    /// A fresh upload grant for the owner's workload `name`.
    pub async fn grant(&self, owner: &str, name: &str) -> Result<UploadGrantView, WorkloadError> {
        let record = self.inner.visible(owner, name).await?;
        Inner::check_uploadable(&record)?;
        let (grant, view) = self.inner.new_grant(&record);
        let store = self.inner.store.clone();
        blocking(move || {
            // Grants die with expiry anyway; purge old ones while here.
            store.purge_expired_grants(now_ms())?;
            Ok(store.insert_grant(&grant)?)
        })
        .await?;
        Ok(view)
    }

    /// Authorises an upload by the owner (before reading the body).
    pub async fn owner_upload(
        &self,
        owner: &str,
        name: &str,
    ) -> Result<UploadTicket, WorkloadError> {
        let record = self.inner.visible(owner, name).await?;
        Inner::check_uploadable(&record)?;
        Ok(UploadTicket {
            owner: record.owner,
            name: record.name,
            uid: record.uid,
            grant_id: None,
        })
    }

    /// Authorises an upload by grant `id` and its secret `token` (before
    /// reading the body). The grant is consumed only by a successful upload.
    pub async fn grant_upload(&self, id: &str, token: &str) -> Result<UploadTicket, WorkloadError> {
        let store = self.inner.store.clone();
        let key = id.to_owned();
        let grant = blocking(move || Ok(store.grant(&key)?))
            .await?
            .ok_or(WorkloadError::GrantInvalid)?;
        let presented = sha256_hex(token.as_bytes());
        if !bool::from(presented.as_bytes().ct_eq(grant.token_sha256.as_bytes())) {
            return Err(WorkloadError::GrantInvalid);
        }
        if grant.expires_at_ms < now_ms() {
            return Err(WorkloadError::GrantExpired);
        }
        let record = self
            .inner
            .visible(&grant.owner, &grant.name)
            .await
            .map_err(|_| WorkloadError::GrantInvalid)?;
        if record.uid != grant.workload_uid {
            return Err(WorkloadError::GrantInvalid);
        }
        Inner::check_uploadable(&record)?;
        Ok(UploadTicket {
            owner: record.owner,
            name: record.name,
            uid: record.uid,
            grant_id: Some(grant.id),
        })
    }

    /// Streams `body` through the bundle engine into a new candidate
    /// revision. Nothing of a refused upload stays on disk, and a refused
    /// upload leaves its grant usable.
    pub async fn upload(
        &self,
        ticket: UploadTicket,
        body: BodyStream,
    ) -> Result<RevisionView, WorkloadError> {
        let limits = self.inner.settings.limits.clone();
        let max = limits.compressed_bytes;
        let over = Arc::new(AtomicBool::new(false));
        let flag = over.clone();
        let mut seen = 0u64;
        // Chunked bodies have no Content-Length: count what arrives.
        let counted = body.map(move |chunk| {
            let chunk = chunk?;
            seen += chunk.len() as u64;
            if seen > max {
                flag.store(true, Ordering::Release);
                return Err(io::Error::other("upload exceeds the size limit"));
            }
            Ok(chunk)
        });
        let reader = tokio_util::io::StreamReader::new(Box::pin(counted));
        let temp = self.inner.blobs.temp()?;
        let out = temp.writer()?;
        let opts = CanonicalOptions {
            temp_dir: Some(self.inner.spool_dir.clone()),
            ..CanonicalOptions::default()
        };
        let result = bundle::canonicalize_async(reader, limits, opts, out).await;
        let report = match result {
            Ok(r) => r,
            Err(_) if over.load(Ordering::Acquire) => {
                self.inner.metrics.rejected("upload_too_large");
                return Err(WorkloadError::TooLarge(format!(
                    "the upload exceeds the limit of {max} bytes"
                )));
            }
            Err(e) => {
                if e.is_rejection() {
                    self.inner.metrics.rejected(e.code());
                }
                return Err(classify_bundle_error(e));
            }
        };
        let revision = RevisionRecord {
            revision: report.revision,
            bundle_digest: report.bundle_digest,
            files: report.files,
            entries: report.entries,
            bytes: report.bundle_bytes,
            inflated_bytes: report.inflated_bytes,
            uploaded_at_ms: now_ms(),
        };
        let name = ticket.name.clone();
        let inner = self.inner.clone();
        let stored = revision.clone();
        blocking(move || inner.commit_upload(&ticket, temp, stored)).await?;
        self.inner.metrics.uploaded();
        Ok(RevisionView::of(&name, &revision))
    }

    /// Freezes `revision` (which must be the latest upload). Idempotent for
    /// the active revision; another revision of a ready workload is refused.
    pub async fn activate(
        &self,
        owner: &str,
        name: &str,
        revision: &str,
    ) -> Result<WorkloadView, WorkloadError> {
        // Checked before the lookup, so a malformed revision is always 400.
        if !names::is_valid_revision(revision) {
            return Err(WorkloadError::RevisionInvalid(revision.to_owned()));
        }
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
                WorkloadStatus::Deleting => return Err(WorkloadError::NotFound(name.to_owned())),
                WorkloadStatus::AwaitingUpload => {}
            }
            let candidate = match record.candidate.take() {
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
        name: &str,
        revision: &str,
    ) -> Result<RevisionRecord, WorkloadError> {
        let record = self.inner.visible(owner, name).await?;
        if !names::is_valid_revision(revision) {
            return Err(WorkloadError::RevisionInvalid(revision.to_owned()));
        }
        if record.status != WorkloadStatus::Ready {
            return Err(not_ready(&record));
        }
        match record.active {
            Some(active) if active.revision == revision => Ok(active),
            _ => Err(WorkloadError::RevisionNotFound(revision.to_owned())),
        }
    }

    /// Opens a located revision's bundle through the cache.
    pub async fn open_bundle(
        &self,
        name: &str,
        revision: &RevisionRecord,
    ) -> Result<CachedBundle, WorkloadError> {
        let path = self.inner.blobs.path(&revision.bundle_digest)?;
        match self
            .inner
            .cache
            .get(&revision.bundle_digest, revision.bytes, &path)
            .await
        {
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
    pub async fn delete(&self, owner: &str, name: &str) -> Result<(), WorkloadError> {
        let inner = self.inner.clone();
        let (owner, name) = (owner.to_owned(), name.to_owned());
        blocking(move || inner.delete(&owner, &name)).await?;
        self.inner.metrics.cache(self.inner.cache.stats());
        Ok(())
    }
}

/// Maps an engine error to the API's classes. Only the compressed size is
/// `TooLarge` (`upload_too_large`); the other size limits keep their own
/// reason (`inflated_too_large`, ...) as a bundle rejection.
fn classify_bundle_error(e: BundleError) -> WorkloadError {
    if matches!(e, BundleError::CompressedTooLarge { .. }) {
        return WorkloadError::TooLarge(e.to_string());
    }
    if e.is_rejection() {
        return WorkloadError::Bundle(e);
    }
    match e {
        BundleError::Io { .. } => WorkloadError::UploadBroken(e.to_string()),
        other => WorkloadError::Internal(format!("bundle engine: {other}")),
    }
}

fn not_ready(record: &WorkloadRecord) -> WorkloadError {
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
    async fn visible(&self, owner: &str, name: &str) -> Result<WorkloadRecord, WorkloadError> {
        if !names::is_valid_name(name) {
            // An invalid name can never exist: answer like a missing one.
            return Err(WorkloadError::NotFound(name.to_owned()));
        }
        let store = self.store.clone();
        let (o, n) = (owner.to_owned(), name.to_owned());
        let found = blocking(move || Ok(store.workload(&o, &n)?)).await?;
        match found {
            Some(r) if r.status != WorkloadStatus::Deleting => Ok(r),
            _ => Err(WorkloadError::NotFound(name.to_owned())),
        }
    }

    fn check_uploadable(record: &WorkloadRecord) -> Result<(), WorkloadError> {
        match record.status {
            WorkloadStatus::AwaitingUpload => Ok(()),
            // A failed workload that never activated may be uploaded again.
            WorkloadStatus::Failed if record.active.is_none() => Ok(()),
            WorkloadStatus::Failed => Err(not_ready(record)),
            WorkloadStatus::Ready => Err(WorkloadError::AlreadyActive(format!(
                "workload {:?} is active and frozen; create a new workload for new files",
                record.name
            ))),
            WorkloadStatus::Deleting => Err(WorkloadError::NotFound(record.name.clone())),
        }
    }

    fn new_grant(&self, record: &WorkloadRecord) -> (GrantRecord, UploadGrantView) {
        let id = hex::encode(random_bytes::<16>());
        let token = base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(random_bytes::<32>());
        let expires_at_ms = now_ms() + self.settings.grant_ttl.as_millis() as u64;
        let grant = GrantRecord {
            id: id.clone(),
            token_sha256: sha256_hex(token.as_bytes()),
            owner: record.owner.clone(),
            name: record.name.clone(),
            workload_uid: record.uid.clone(),
            expires_at_ms,
        };
        let view = UploadGrantView {
            url: format!("/v1/uploads/{id}"),
            token,
            expires_at: rfc3339(expires_at_ms),
            method: "PUT".to_owned(),
            content_type: BUNDLE_MEDIA_TYPE.to_owned(),
            max_bytes: self.settings.limits.compressed_bytes,
        };
        (grant, view)
    }

    fn lock_gc(&self) -> std::sync::MutexGuard<'_, ()> {
        self.gc.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Makes the blob durable, then names it in the record (consuming the
    /// grant) in one transaction. Blocking.
    fn commit_upload(
        &self,
        ticket: &UploadTicket,
        temp: crate::store::TempBlob,
        revision: RevisionRecord,
    ) -> Result<(), WorkloadError> {
        let _gc = self.lock_gc();
        self.blobs.persist(temp, &revision.bundle_digest)?;
        let outcome = loop {
            let record = match self.store.workload(&ticket.owner, &ticket.name)? {
                Some(r) if r.uid == ticket.uid && r.status != WorkloadStatus::Deleting => r,
                _ => break Err(WorkloadError::NotFound(ticket.name.clone())),
            };
            if let Err(e) = Self::check_uploadable(&record) {
                break Err(e);
            }
            let replaced = record.candidate.as_ref().map(|c| c.bundle_digest.clone());
            let mut next = record;
            next.candidate = Some(revision.clone());
            next.status = WorkloadStatus::AwaitingUpload;
            next.failure = None;
            next.updated_at_ms = now_ms();
            match self
                .store
                .replace_workload(&next, ticket.grant_id.as_deref())
            {
                Ok(_) => break Ok(replaced),
                Err(StoreError::Conflict) => continue,
                Err(StoreError::GrantUsed) => break Err(WorkloadError::GrantInvalid),
                Err(e) => break Err(e.into()),
            }
        };
        // The replaced candidate, or this upload's blob when it lost, may now
        // be unnamed.
        let mut maybe_unused = vec![revision.bundle_digest.clone()];
        if let Ok(Some(old)) = &outcome {
            maybe_unused.push(old.clone());
        }
        self.collect(&maybe_unused)?;
        outcome.map(|_| ())
    }

    /// Removes those of `digests` that no record names. Caller holds `gc`.
    fn collect(&self, digests: &[String]) -> Result<usize, WorkloadError> {
        let named: HashSet<String> = self
            .store
            .all_workloads()?
            .iter()
            .flat_map(|r| r.blob_digests().map(str::to_owned).collect::<Vec<_>>())
            .collect();
        let mut removed = 0;
        for d in digests.iter().filter(|d| !named.contains(*d)) {
            self.cache.evict(d);
            self.blobs.remove(d)?;
            removed += 1;
        }
        Ok(removed)
    }

    fn delete(&self, owner: &str, name: &str) -> Result<(), WorkloadError> {
        if !names::is_valid_name(name) {
            return Err(WorkloadError::NotFound(name.to_owned()));
        }
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

    /// Removes a `deleting` record and its unnamed blobs; `false` when the
    /// record changed meanwhile.
    fn finish_delete(&self, record: &WorkloadRecord) -> Result<bool, WorkloadError> {
        let digests: Vec<String> = record.blob_digests().map(str::to_owned).collect();
        for d in &digests {
            self.cache.evict(d);
        }
        let _gc = self.lock_gc();
        match self
            .store
            .remove_workload(&record.owner, &record.name, record.version)
        {
            Ok(()) | Err(StoreError::NotFound) => {}
            Err(StoreError::Conflict) => return Ok(false),
            Err(e) => return Err(e.into()),
        }
        self.collect(&digests)?;
        Ok(true)
    }

    /// Start-up recovery. Blocking; runs before the first request.
    fn recover(&self) -> Result<RecoveryReport, WorkloadError> {
        let mut report = RecoveryReport::default();
        for path in self.blobs.remove_temp_files()? {
            tracing::warn!(path = %path.display(), "removed a temp file left by a crash");
            report.temp_files_removed += 1;
        }
        // Spool files of the bundle engine are unnamed, but clear the dir
        // in case a crash left anything.
        if let Ok(entries) = std::fs::read_dir(&self.spool_dir) {
            for entry in entries.flatten() {
                if entry.file_type().map(|t| t.is_file()).unwrap_or(false) {
                    let _ = std::fs::remove_file(entry.path());
                    report.temp_files_removed += 1;
                }
            }
        }
        for record in self.store.all_workloads()? {
            if record.status == WorkloadStatus::Deleting {
                self.finish_delete(&record)?;
                report.deletes_finished += 1;
                continue;
            }
            let missing: Vec<&RevisionRecord> = record
                .candidate
                .iter()
                .chain(record.active.iter())
                .filter(|r| !self.blobs.exists(&r.bundle_digest))
                .collect();
            if missing.is_empty() {
                continue;
            }
            let reason = format!(
                "the stored bundle of revision {} is missing; {}",
                missing[0].revision,
                if record.active.is_some() {
                    "delete this workload and create it again"
                } else {
                    "upload the bundle again"
                }
            );
            tracing::error!(workload = %record.name, reason = %reason, "marking workload failed");
            let mut next = record.clone();
            next.status = WorkloadStatus::Failed;
            if next
                .candidate
                .as_ref()
                .is_some_and(|c| !self.blobs.exists(&c.bundle_digest))
            {
                next.candidate = None;
            }
            next.failure = Some(reason);
            next.updated_at_ms = now_ms();
            self.store.replace_workload(&next, None)?;
            report.failed.push(record.name.clone());
        }
        let named: HashSet<String> = self
            .store
            .all_workloads()?
            .iter()
            .flat_map(|r| r.blob_digests().map(str::to_owned).collect::<Vec<_>>())
            .collect();
        for digest in self.blobs.digests()? {
            if !named.contains(&digest) {
                tracing::warn!(digest = %digest, "removing a bundle no workload names");
                self.blobs.remove(&digest)?;
                report.orphan_blobs_removed += 1;
            }
        }
        report.grants_purged = self.store.purge_expired_grants(now_ms())?;
        Ok(report)
    }
}

#[cfg(test)]
mod tests;
