//! The store: workload metadata in a transactional database behind the
//! async [`MetadataStore`] trait — embedded ([`RedbStore`], the default) or
//! shared by replicas ([`PostgresStore`]) — and bundle bytes in [`Blobs`]:
//! a content-addressed [`BlobStore`], alone or as copies of object storage
//! ([`ObjectBlobs`]). The same database holds the delivery run registry
//! ([`RunStore`]). [`Storage::open`] builds all of it from
//! [`StorageSettings`], the one place that knows the backends.
//!
//! Write order makes crashes harmless: a blob is durable (fsync + rename +
//! directory fsync) before any metadata that names it commits.

mod blob;
mod copies;
mod object;
mod postgres;
mod redb_source;
mod redb_store;
mod runs;
mod storage;

pub use blob::{is_digest, BlobStore, TempBlob};
pub use object::{
    hash_file, ObjectBlobs, ObjectError, PutOutcome, StoredObject, DEFAULT_PART_BYTES,
};
pub use postgres::{DatabaseUrl, PostgresStore};
pub use redb_source::{RedbSource, SourceError, SourceRecord};
pub use redb_store::RedbStore;
pub use runs::{RunRecord, RunSandbox, RunStore};
pub use storage::{
    BlobError, Blobs, OpenError, Storage, StorageSettings, DEFAULT_BLOB_GC_GRACE,
    DEFAULT_BLOB_LOCAL_BYTES,
};

use serde::{Deserialize, Serialize};

/// Lifecycle state of a workload.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum WorkloadStatus {
    /// Created; takes uploads until activated.
    AwaitingUpload,
    /// A revision is frozen and served.
    Ready,
    /// Startup recovery found its bundle missing; never served.
    Failed,
    /// Being deleted; invisible to reads, finished by a retry or at startup.
    Deleting,
}

impl WorkloadStatus {
    /// The name used in the API.
    pub fn as_str(self) -> &'static str {
        match self {
            WorkloadStatus::AwaitingUpload => "awaiting_upload",
            WorkloadStatus::Ready => "ready",
            WorkloadStatus::Failed => "failed",
            WorkloadStatus::Deleting => "deleting",
        }
    }
}

/// The encoding of bundles stored before encodings were recorded: one
/// zlib-rs level-1 gzip stream.
pub const LEGACY_ENCODING: &str = "gzip+zlib-rs+level-1";

fn legacy_encoding() -> String {
    LEGACY_ENCODING.to_owned()
}

/// One uploaded, canonicalised bundle.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RevisionRecord {
    /// sha256 of the canonical tar (64 lowercase hex).
    pub revision: String,
    /// sha256 of the stored gzip bundle (64 lowercase hex); the blob's key.
    pub bundle_digest: String,
    /// Regular files.
    pub files: u64,
    /// Tar entries (files and directories).
    pub entries: u64,
    /// Size of the stored bundle.
    pub bytes: u64,
    /// How the stored bundle was made (see
    /// [`Report::bundle_encoding`](crate::bundle::Report::bundle_encoding));
    /// records from before it was kept read as [`LEGACY_ENCODING`].
    #[serde(default = "legacy_encoding")]
    pub bundle_encoding: String,
    /// Size of the canonical tar.
    pub inflated_bytes: u64,
    /// When it was uploaded (ms since the epoch).
    pub uploaded_at_ms: u64,
    /// The extracted tree's manifest, recorded at activation (deliveries
    /// check sandbox caches against it); `None` before activation and in
    /// records from before it was kept (computed on first delivery then).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tree: Option<crate::bundle::TreeManifest>,
}

/// A workload's metadata.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WorkloadRecord {
    /// The owner (token subject). Never shown by the API.
    pub owner: String,
    /// The workload's name, unique per owner.
    pub name: String,
    /// Random id of this incarnation: a grant for a deleted workload never
    /// applies to a new one of the same name.
    pub uid: String,
    /// Context type (`workspace`, `state`, ...).
    pub kind: String,
    /// Lifecycle state.
    pub status: WorkloadStatus,
    /// The latest upload, waiting for activation.
    pub candidate: Option<RevisionRecord>,
    /// The frozen revision.
    pub active: Option<RevisionRecord>,
    /// Why the workload is `failed`.
    pub failure: Option<String>,
    /// Creation time (ms since the epoch).
    pub created_at_ms: u64,
    /// Last change (ms since the epoch).
    pub updated_at_ms: u64,
    /// Bumped by the store on every write, for compare-and-swap.
    pub version: u64,
}

impl WorkloadRecord {
    /// Digests of the blobs this record keeps alive.
    pub fn blob_digests(&self) -> impl Iterator<Item = &str> {
        self.candidate
            .iter()
            .chain(self.active.iter())
            .map(|r| r.bundle_digest.as_str())
    }
}

/// A one-time upload grant. Only the sha256 of its secret is stored.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GrantRecord {
    /// Public id (in the upload URL).
    pub id: String,
    /// sha256 of the secret token, hex.
    pub token_sha256: String,
    /// Owner of the workload it uploads to.
    pub owner: String,
    /// The workload's name.
    pub name: String,
    /// The workload incarnation it is bound to.
    pub workload_uid: String,
    /// Expiry (ms since the epoch).
    pub expires_at_ms: u64,
}

/// Schema version of records whose owners carry their kind (`sub:<sub>`,
/// `user:<id>`). Version 1 (no version recorded) stored bare owners.
pub const SCHEMA_OWNER_KINDS: u64 = 2;

/// What an owner migration rewrote.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct OwnerMigration {
    /// The schema version found.
    pub from_version: u64,
    /// Workload records re-keyed.
    pub workloads: usize,
    /// Grants rewritten.
    pub grants: usize,
}

/// Why a store operation failed.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The owner already has a workload of that name.
    #[error("the name is taken")]
    NameTaken,
    /// The owner has reached the workload quota.
    #[error("the quota of {0} workloads is reached")]
    QuotaExceeded(usize),
    /// No such record.
    #[error("no such record")]
    NotFound,
    /// The record changed since it was read (compare-and-swap lost).
    #[error("the record changed concurrently")]
    Conflict,
    /// The grant to consume is gone (used by a concurrent upload).
    #[error("the upload grant was already used")]
    GrantUsed,
    /// The database failed.
    #[error("metadata database: {0}")]
    Database(String),
    /// The database cannot be reached for now (down, restarting, out of
    /// connections): the operation may succeed when retried later.
    #[error("metadata database unavailable: {0}")]
    Unavailable(String),
    /// A stored record does not decode.
    #[error("corrupt metadata record {key}: {detail}")]
    Corrupt {
        /// The record's key.
        key: String,
        /// What is wrong.
        detail: String,
    },
}

/// Workload metadata storage. Every method is one transaction.
#[async_trait::async_trait]
pub trait MetadataStore: Send + Sync + std::fmt::Debug {
    /// Inserts a new workload (and its first grant) unless the owner has one
    /// of that name or already `quota` workloads.
    async fn insert_workload(
        &self,
        record: &WorkloadRecord,
        grant: &GrantRecord,
        quota: usize,
    ) -> Result<(), StoreError>;

    /// The owner's workload `name`.
    async fn workload(&self, owner: &str, name: &str)
        -> Result<Option<WorkloadRecord>, StoreError>;

    /// The owner's workloads, by name.
    async fn workloads_of(&self, owner: &str) -> Result<Vec<WorkloadRecord>, StoreError>;

    /// Every workload of every owner (recovery, blob collection).
    async fn all_workloads(&self) -> Result<Vec<WorkloadRecord>, StoreError>;

    /// Replaces the record if its stored version is still `record.version`
    /// (else [`StoreError::Conflict`]), bumping the version; consumes the
    /// grant `consume_grant` in the same transaction when given (else
    /// [`StoreError::GrantUsed`]). Returns the stored record.
    async fn replace_workload(
        &self,
        record: &WorkloadRecord,
        consume_grant: Option<&str>,
    ) -> Result<WorkloadRecord, StoreError>;

    /// Removes the record (if still at `version`) and its grants.
    async fn remove_workload(
        &self,
        owner: &str,
        name: &str,
        version: u64,
    ) -> Result<(), StoreError>;

    /// Stores a grant.
    async fn insert_grant(&self, grant: &GrantRecord) -> Result<(), StoreError>;

    /// The grant with public id `id`.
    async fn grant(&self, id: &str) -> Result<Option<GrantRecord>, StoreError>;

    /// Removes the grant `id` (it can never be used again); whether it
    /// was there.
    async fn remove_grant(&self, id: &str) -> Result<bool, StoreError>;

    /// Removes grants that expired before `now_ms`; returns how many.
    async fn purge_expired_grants(&self, now_ms: u64) -> Result<usize, StoreError>;

    /// Brings records older than schema `version` to it in one
    /// transaction: every owner (of workloads, their keys, and grants)
    /// becomes `map(owner)`, then `version` is recorded. `None` when the
    /// records were at `version` already (so running it again is a no-op).
    async fn migrate_owners(
        &self,
        version: u64,
        map: for<'m> fn(&'m str) -> String,
    ) -> Result<Option<OwnerMigration>, StoreError>;
}
