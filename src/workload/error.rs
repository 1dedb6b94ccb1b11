//! What can go wrong with a workload operation.

use crate::bundle::BundleError;
use crate::store::StoreError;

/// A workload operation's failure. The API maps each variant to one status
/// and error code.
#[derive(Debug, thiserror::Error)]
pub enum WorkloadError {
    /// No such workload for this owner (also: another owner's).
    #[error("workload {0:?} not found")]
    NotFound(String),
    /// The requested name is not a lowercase DNS label.
    #[error("invalid workload name {0:?}: use at most 50 lowercase letters, digits and '-', starting and ending with a letter or digit")]
    NameInvalid(String),
    /// Unknown context type.
    #[error("invalid type {0:?}: expected one of workspace, state, memory, knowledge, artifacts")]
    TypeInvalid(String),
    /// The owner already has a workload of that name.
    #[error("a workload named {0:?} already exists")]
    NameTaken(String),
    /// The owner has reached the quota.
    #[error("the quota of {0} workloads is reached; delete one first")]
    QuotaExceeded(usize),
    /// A revision that is not 64 lowercase hex digits.
    #[error("invalid revision {0:?}: expected 64 lowercase hex digits")]
    RevisionInvalid(String),
    /// Activation of a revision that is not the latest upload.
    #[error("{0}")]
    RevisionMismatch(String),
    /// The workload is active with another revision, or frozen for uploads.
    #[error("{0}")]
    AlreadyActive(String),
    /// The workload has no servable revision.
    #[error("{0}")]
    NotReady(String),
    /// The workload is ready but not with that revision.
    #[error("revision {0} is not the active revision of this workload")]
    RevisionNotFound(String),
    /// The upload grant is unknown, malformed or already used.
    #[error("the upload grant is invalid or was already used")]
    GrantInvalid,
    /// The upload grant has expired.
    #[error("the upload grant has expired; ask for a new one")]
    GrantExpired,
    /// The bundle engine refused the upload.
    #[error("bundle rejected: {0}")]
    Bundle(#[source] BundleError),
    /// Too many uploads are running, for the owner or the service; the
    /// text says which.
    #[error("{0}")]
    TooManyUploads(String),
    /// Another upload is using the same grant.
    #[error("another upload is using this upload grant; wait for it to finish")]
    UploadInProgress,
    /// The temporary space uploads share is in use.
    #[error("{0}")]
    TempSpaceExhausted(String),
    /// The upload exceeded the size limit.
    #[error("{0}")]
    TooLarge(String),
    /// Reading the upload failed (client went away, broken body).
    #[error("reading the upload failed: {0}")]
    UploadBroken(String),
    /// The object storage holding bundle bytes cannot be reached; nothing
    /// was changed.
    #[error("{0}")]
    StorageUnavailable(String),
    /// The object storage holds other bytes (or none) under a bundle's
    /// digest; they are not served.
    #[error("{0}")]
    BundleCorrupt(String),
    /// The metadata database cannot be reached for now; the cause is
    /// logged, the client is told to retry.
    #[error("{0}")]
    StoreUnavailable(String),
    /// A store, disk or task failure.
    #[error("{0}")]
    Internal(String),
}

impl From<crate::store::ObjectError> for WorkloadError {
    fn from(e: crate::store::ObjectError) -> Self {
        use crate::store::ObjectError as O;
        match e {
            O::Unavailable(cause) => {
                // The cause (endpoint, engine message) goes to the log only.
                tracing::warn!(error = %cause, "object storage unavailable");
                WorkloadError::StorageUnavailable(
                    "the object storage holding bundles is unavailable; try again later".to_owned(),
                )
            }
            O::Corrupt(why) => WorkloadError::BundleCorrupt(why),
            O::NotFound(key) => WorkloadError::BundleCorrupt(format!(
                "the stored bundle {key} is missing from object storage"
            )),
            other => WorkloadError::Internal(other.to_string()),
        }
    }
}

impl From<crate::store::BlobError> for WorkloadError {
    fn from(e: crate::store::BlobError) -> Self {
        match e {
            crate::store::BlobError::Object(e) => e.into(),
            crate::store::BlobError::Disk(e) => e.into(),
        }
    }
}

impl From<StoreError> for WorkloadError {
    fn from(e: StoreError) -> Self {
        match e {
            StoreError::Unavailable(_) => WorkloadError::StoreUnavailable(e.to_string()),
            _ => WorkloadError::Internal(e.to_string()),
        }
    }
}

impl From<std::io::Error> for WorkloadError {
    fn from(e: std::io::Error) -> Self {
        WorkloadError::Internal(format!("storage: {e}"))
    }
}
