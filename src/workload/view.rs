//! The public JSON shapes of workloads. They never show the owner, the
//! incarnation id or storage paths.

use std::time::{Duration, UNIX_EPOCH};

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use crate::store::{RevisionRecord, WorkloadRecord, WorkloadStatus};

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
    /// `awaiting_upload` (no upload yet), `awaiting_activation` (an
    /// upload, `candidateRevision`, waits for activation), `ready` or
    /// `failed`.
    #[schema(value_type = ShownStatus, inline)]
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

/// The statuses a workload shows: the stored state, with an upload that
/// waits for activation told apart from no upload at all. (A workload
/// being deleted is never shown.)
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub(crate) enum ShownStatus {
    /// Created; nothing uploaded yet.
    AwaitingUpload,
    /// An upload (`candidateRevision`) waits for activation.
    AwaitingActivation,
    /// A revision is frozen and served.
    Ready,
    /// Its bundle went missing; never served.
    Failed,
}

impl ShownStatus {
    /// The name used in the API.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            ShownStatus::AwaitingUpload => "awaiting_upload",
            ShownStatus::AwaitingActivation => "awaiting_activation",
            ShownStatus::Ready => "ready",
            ShownStatus::Failed => "failed",
        }
    }
}

/// The status `record` shows: `None` for one being deleted, which no read
/// shows.
pub(crate) fn shown_status(record: &WorkloadRecord) -> Option<ShownStatus> {
    match record.status {
        WorkloadStatus::AwaitingUpload if record.candidate.is_some() => {
            Some(ShownStatus::AwaitingActivation)
        }
        WorkloadStatus::AwaitingUpload => Some(ShownStatus::AwaitingUpload),
        WorkloadStatus::Ready => Some(ShownStatus::Ready),
        WorkloadStatus::Failed => Some(ShownStatus::Failed),
        WorkloadStatus::Deleting => None,
    }
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
            status: shown_status(record)
                .map_or_else(|| record.status.as_str(), ShownStatus::as_str)
                .to_owned(),
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

#[cfg(test)]
mod tests {
    use super::*;

    fn record(status: WorkloadStatus, candidate: bool) -> WorkloadRecord {
        let revision = RevisionRecord {
            revision: "a".repeat(64),
            bundle_digest: "b".repeat(64),
            files: 1,
            entries: 1,
            bytes: 10,
            bundle_encoding: String::new(),
            inflated_bytes: 512,
            uploaded_at_ms: 0,
            tree: None,
        };
        WorkloadRecord {
            owner: "alice".into(),
            name: "docs".into(),
            uid: "u".into(),
            kind: "workspace".into(),
            status,
            candidate: candidate.then_some(revision),
            active: None,
            failure: None,
            created_at_ms: 0,
            updated_at_ms: 0,
            version: 0,
        }
    }

    #[test]
    fn an_upload_waiting_for_activation_is_its_own_status() {
        let shown = |status, candidate| WorkloadView::of(&record(status, candidate)).status;
        assert_eq!(
            shown(WorkloadStatus::AwaitingUpload, false),
            "awaiting_upload"
        );
        assert_eq!(
            shown(WorkloadStatus::AwaitingUpload, true),
            "awaiting_activation"
        );
        assert_eq!(shown(WorkloadStatus::Failed, true), "failed");
        assert_eq!(shown(WorkloadStatus::Ready, false), "ready");
    }

    #[test]
    fn the_schema_lists_every_shown_status() {
        let schema = serde_json::to_value(<WorkloadView as utoipa::PartialSchema>::schema())
            .expect("a schema serialises");
        assert_eq!(
            schema["properties"]["status"]["oneOf"][0]["enum"],
            serde_json::json!(["awaiting_upload", "awaiting_activation", "ready", "failed"]),
            "{schema}"
        );
    }
}
