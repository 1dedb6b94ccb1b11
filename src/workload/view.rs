//! The public JSON shapes of workloads. They never show the owner, the
//! incarnation id or storage paths.

use std::time::{Duration, UNIX_EPOCH};

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use crate::store::{RevisionRecord, WorkloadRecord};

/// Media type of bundles (uploads and downloads).
pub const BUNDLE_MEDIA_TYPE: &str = "application/vnd.rossoctl.context";

/// A workload as the API shows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct WorkloadView {
    /// The name (the id in URLs).
    pub name: String,
    /// Context type.
    #[serde(rename = "type")]
    pub kind: String,
    /// `awaiting_upload`, `ready` or `failed`.
    pub status: String,
    /// The frozen revision, when ready.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub revision: Option<String>,
    /// The latest upload, waiting for activation.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub candidate_revision: Option<String>,
    /// Digest of the stored bundle (active, else candidate).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bundle_digest: Option<String>,
    /// Files in that bundle.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub files: Option<u64>,
    /// Size of that bundle.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bytes: Option<u64>,
    /// Size of its canonical tar.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub inflated_bytes: Option<u64>,
    /// Why the workload failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// Creation time, RFC 3339.
    pub created_at: String,
    /// Last change, RFC 3339.
    pub updated_at: String,
    /// The upload grant (only in the answer to create).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub upload: Option<UploadGrantView>,
}

/// A one-time upload grant as handed to the client.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct UploadGrantView {
    /// Root-relative URL to `PUT` the bundle to.
    pub url: String,
    /// Secret for `Authorization: Bearer`; single use.
    pub token: String,
    /// Expiry, RFC 3339.
    pub expires_at: String,
    /// Always `PUT`.
    pub method: String,
    /// The media type to send.
    pub content_type: String,
    /// Largest accepted body.
    pub max_bytes: u64,
}

/// The answer to an upload.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct RevisionView {
    /// The workload.
    pub name: String,
    /// sha256 of the canonical tar.
    pub revision: String,
    /// sha256 of the stored bundle (the download `ETag`).
    pub bundle_digest: String,
    /// Regular files.
    pub files: u64,
    /// Tar entries.
    pub entries: u64,
    /// Size of the stored bundle.
    pub bytes: u64,
    /// Size of the canonical tar.
    pub inflated_bytes: u64,
}

/// Formats ms since the epoch as RFC 3339 (UTC, milliseconds).
pub fn rfc3339(ms: u64) -> String {
    humantime::format_rfc3339_millis(UNIX_EPOCH + Duration::from_millis(ms)).to_string()
}

impl WorkloadView {
    /// The public view of `record`.
    pub fn of(record: &WorkloadRecord) -> Self {
        let shown = record.active.as_ref().or(record.candidate.as_ref());
        Self {
            name: record.name.clone(),
            kind: record.kind.clone(),
            status: record.status.as_str().to_owned(),
            revision: record.active.as_ref().map(|r| r.revision.clone()),
            candidate_revision: record.candidate.as_ref().map(|r| r.revision.clone()),
            bundle_digest: shown.map(|r| r.bundle_digest.clone()),
            files: shown.map(|r| r.files),
            bytes: shown.map(|r| r.bytes),
            inflated_bytes: shown.map(|r| r.inflated_bytes),
            reason: record.failure.clone(),
            created_at: rfc3339(record.created_at_ms),
            updated_at: rfc3339(record.updated_at_ms),
            upload: None,
        }
    }
}

impl RevisionView {
    /// The public view of an upload of workload `name`.
    pub fn of(name: &str, r: &RevisionRecord) -> Self {
        Self {
            name: name.to_owned(),
            revision: r.revision.clone(),
            bundle_digest: r.bundle_digest.clone(),
            files: r.files,
            entries: r.entries,
            bytes: r.bytes,
            inflated_bytes: r.inflated_bytes,
        }
    }
}
