//! Trusted Contexts: upstream's Moca API mapped onto workloads (not the
//! named-context volumes of `pool`, [`crate::pool::model::ContextVolumeSpec`]).
//!
//! A Context is a workload keyed by the delegated subject, the namespace and
//! the Context name ([`TrustedKey`]): it is stored under the owner key
//! `ctx:<namespace>/<subject key>` with the Context name as workload name, so
//! no other subject (and no caller of the public workload API, whose owner
//! keys never start with `ctx:`) can see it. Upstream's operations map as:
//!
//! - create: a workload of the Context's type (storage is validated as
//!   upstream does, but our store needs no volume);
//! - upload capability: a one-time upload grant with upstream's id and token
//!   shapes, bound to the workload incarnation (upstream: the PVC UID);
//! - freeze: activation of the latest upload;
//! - export: the active revision's canonical bundle;
//! - delete: the workload's delete.
//!
//! The revision is ours: sha256 of the bundle's canonical tar, not
//! upstream's content digest.

use base64::Engine as _;
use serde::Serialize;
use utoipa::ToSchema;

use super::state::{now_ms, random_bytes};
use super::{names, Revision, UploadTicket, WorkloadError, WorkloadName, WorkloadService};
use crate::auth::Owner;
use crate::bundle::BundleError;
use crate::cache::CachedBundle;
use crate::pool::quantity;
use crate::pool::validate::{is_dns1123_label, is_pool_name};
use crate::store::{RevisionRecord, WorkloadRecord, WorkloadStatus};

/// Prefix of the owner keys of trusted Contexts.
const OWNER_PREFIX: &str = "ctx:";

/// Length of a capability id: 18 random bytes, base64url without padding
/// (24 characters, so never a workload grant's 32 hex digits).
const CAPABILITY_ID_LEN: usize = 24;

/// The one Context a trusted call names: which subject, where, which name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TrustedKey {
    /// The namespace (a DNS-1123 label).
    pub namespace: String,
    /// The Context name.
    pub name: String,
    /// The delegated subject (`X-Context-Subject`).
    pub subject: Owner,
}

impl TrustedKey {
    /// The owner key the Context's workload is stored under:
    /// `ctx:<namespace>/<subject key>` (a namespace holds no `/`).
    pub fn owner_key(&self) -> String {
        format!("{OWNER_PREFIX}{}/{}", self.namespace, self.subject.key())
    }

    /// The Context's workload name, if the key can name a Context at all: a
    /// name and namespace that fail validation never exist, so they are
    /// simply not found. (A Context name is a pool name, whose rule is the
    /// workload name's.)
    fn workload_name(&self) -> Result<WorkloadName, TrustedContextError> {
        if !is_dns1123_label(&self.namespace) {
            return Err(TrustedContextError::NotFound);
        }
        WorkloadName::try_from(self.name.as_str()).map_err(|_| TrustedContextError::NotFound)
    }
}

/// Whether `id` has the shape of a trusted upload capability's id (the
/// public upload route serves both these and workload grants).
pub fn is_capability_id(id: &str) -> bool {
    id.len() == CAPABILITY_ID_LEN
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
}

/// Upstream's create request, decoded.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CreateTrustedContext {
    /// The Context name.
    pub name: String,
    /// The namespace.
    pub namespace: String,
    /// The Context type.
    pub kind: String,
    /// `storage.backend`.
    pub backend: String,
    /// `storage.size`.
    pub size: String,
    /// `storage.accessMode`.
    pub access_mode: String,
    /// `storage.storageClass` (accepted, unused).
    pub storage_class: String,
}

impl CreateTrustedContext {
    /// Upstream's checks, in its order and with its messages.
    pub fn validate(&self) -> Result<(), TrustedContextError> {
        let invalid = |m: &str| Err(TrustedContextError::Invalid(m.to_owned()));
        if !is_pool_name(&self.name) {
            return invalid(
                "name must be a lowercase Kubernetes name no longer than 50 characters",
            );
        }
        if !is_dns1123_label(&self.namespace) {
            return invalid("namespace must be a lowercase Kubernetes name");
        }
        if !names::CONTEXT_TYPES.contains(&self.kind.as_str()) {
            return invalid("type must be workspace, state, memory, knowledge, or artifacts");
        }
        if self.backend != "pvc" {
            return invalid("storage.backend must be pvc");
        }
        if !quantity::is_positive(&self.size) {
            return invalid("storage.size must be a positive Kubernetes quantity");
        }
        if self.access_mode != "ReadWriteOnce" && self.access_mode != "ReadWriteMany" {
            return invalid("storage.accessMode must be ReadWriteOnce or ReadWriteMany");
        }
        Ok(())
    }
}

/// A trusted operation's failure; the API maps each to upstream's status
/// and code.
#[derive(Debug, thiserror::Error)]
pub enum TrustedContextError {
    /// `400 invalid_request`.
    #[error("{0}")]
    Invalid(String),
    /// `404 not_found`: missing, or another subject's.
    #[error("context not found")]
    NotFound,
    /// `409 already_exists`.
    #[error("context already exists")]
    AlreadyExists,
    /// `409 context_frozen`.
    #[error("context is frozen")]
    Frozen,
    /// `409 upload_in_progress`.
    #[error("a context upload is in progress")]
    UploadInProgress,
    /// `409 revision_mismatch`.
    #[error("revision is not the context's current revision")]
    RevisionMismatch,
    /// `401 unauthorized` on the upload route.
    #[error("upload capability is invalid, expired, or already used")]
    CapabilityInvalid,
    /// `413 upload_too_large`; the limit in bytes.
    #[error("compressed context bundle exceeds {}", size_text(*.0))]
    UploadTooLarge(u64),
    /// `429 context_quota_exceeded`: the subject's Contexts in the
    /// namespace reached the workload quota.
    #[error("the quota of {0} contexts is reached; delete one first")]
    QuotaExceeded(usize),
    /// Ours only (upload admission, temporary space, storage failures):
    /// answered as the workload API answers it.
    #[error(transparent)]
    Workload(WorkloadError),
}

/// `256 MiB` for whole MiB, else the byte count.
fn size_text(bytes: u64) -> String {
    const MIB: u64 = 1 << 20;
    if bytes % MIB == 0 {
        format!("{} MiB", bytes / MIB)
    } else {
        format!("{bytes} bytes")
    }
}

/// The trusted view of a Context (upstream's `trustedContext`). It never
/// shows storage.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct TrustedContextView {
    /// The workload incarnation id (upstream: the PVC UID); it changes when
    /// the Context is deleted and created again.
    pub context_id: String,
    /// The Context name.
    pub name: String,
    /// The namespace.
    pub namespace: String,
    /// The Context type.
    #[serde(rename = "type")]
    pub kind: String,
    /// `ready`, or `failed` when its stored bundle was found missing.
    pub status: String,
    /// The latest upload (the frozen revision once frozen).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub current_revision: Option<String>,
    /// The frozen revision.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub frozen_revision: Option<String>,
}

impl TrustedContextView {
    fn of(key: &TrustedKey, record: &WorkloadRecord) -> Self {
        let status = match record.status {
            WorkloadStatus::Failed => "failed",
            _ => "ready",
        };
        let frozen = record.active.as_ref().map(|r| r.revision.clone());
        Self {
            context_id: record.uid.clone(),
            name: record.name.clone(),
            namespace: key.namespace.clone(),
            kind: record.kind.clone(),
            status: status.to_owned(),
            current_revision: record
                .candidate
                .as_ref()
                .map(|r| r.revision.clone())
                .or_else(|| frozen.clone()),
            frozen_revision: frozen,
        }
    }
}

/// An upload capability as handed to Moca (upstream's
/// `uploadCapabilityResponse`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct CapabilityView {
    /// `/v1/uploads/<id>`.
    pub upload_url: String,
    /// Secret for `Authorization: Bearer`; single use.
    pub token: String,
    /// Expiry, RFC 3339 as Go writes a `time.Time` (UTC).
    pub expires_at: String,
    /// Always `PUT`.
    pub method: String,
    /// The bundle media type.
    pub content_type: String,
    /// Largest accepted body.
    pub max_bytes: u64,
}

/// The answer to a capability upload (upstream's upload result).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct UploadResultView {
    /// The new current revision (sha256 of the canonical tar).
    pub revision: String,
    /// Regular files in the bundle.
    pub files: u64,
    /// Size of the stored bundle.
    pub bytes: u64,
    /// Upstream's materialized path for the revision; logical only (we
    /// store bundles, not trees).
    pub workspace_path: String,
}

/// Formats ms since the epoch as Go's `time.Time` JSON does for UTC:
/// RFC 3339 with the fraction's trailing zeros (and a bare `.`) dropped.
fn go_time(ms: u64) -> String {
    let s = super::rfc3339(ms);
    match s.strip_suffix('Z').and_then(|t| t.split_once('.')) {
        Some((whole, frac)) => {
            let frac = frac.trim_end_matches('0');
            if frac.is_empty() {
                format!("{whole}Z")
            } else {
                format!("{whole}.{frac}Z")
            }
        }
        None => s,
    }
}

impl WorkloadService {
    /// Creates the Context `req` for `subject`, who owns it.
    pub async fn create_trusted_context(
        &self,
        subject: &Owner,
        req: &CreateTrustedContext,
    ) -> Result<TrustedContextView, TrustedContextError> {
        req.validate()?;
        let key = TrustedKey {
            namespace: req.namespace.clone(),
            name: req.name.clone(),
            subject: subject.clone(),
        };
        let create = super::CreateWorkload {
            name: Some(req.name.clone()),
            kind: Some(req.kind.clone()),
        };
        self.create(&key.owner_key(), create)
            .await
            .map_err(|e| match e {
                WorkloadError::NameTaken(_) => TrustedContextError::AlreadyExists,
                WorkloadError::QuotaExceeded(q) => TrustedContextError::QuotaExceeded(q),
                other => TrustedContextError::Workload(other),
            })?;
        let record = self.context_record(&key).await?;
        Ok(TrustedContextView::of(&key, &record))
    }

    /// A fresh one-time upload capability for the Context; refused once it
    /// is frozen.
    pub async fn trusted_capability(
        &self,
        key: &TrustedKey,
    ) -> Result<CapabilityView, TrustedContextError> {
        let record = self.context_record(key).await?;
        if record.active.is_some() {
            return Err(TrustedContextError::Frozen);
        }
        let id = base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(random_bytes::<18>());
        let (grant, view) = self.inner.new_grant_with_id(&record, id);
        let expires_at = go_time(grant.expires_at_ms);
        // Expired capabilities are swept on each issue, as upstream.
        let store = &self.inner.store;
        let stored = match store.purge_expired_grants(now_ms()).await {
            Ok(_) => store.insert_grant(&grant).await,
            Err(e) => Err(e),
        };
        stored.map_err(|e| TrustedContextError::Workload(e.into()))?;
        Ok(CapabilityView {
            upload_url: view.url,
            token: view.token,
            expires_at,
            method: view.method,
            content_type: view.content_type,
            max_bytes: view.max_bytes,
        })
    }

    /// Redeems capability `id` with its `token` (before the body is read).
    /// A capability of a Context frozen since is consumed: it can never
    /// succeed again.
    pub async fn trusted_upload_ticket(
        &self,
        id: &str,
        token: &str,
    ) -> Result<UploadTicket, TrustedContextError> {
        match self.grant_upload(id, token).await {
            Ok(ticket) => Ok(ticket),
            Err(WorkloadError::AlreadyActive(_)) => {
                self.consume_capability(id).await;
                Err(TrustedContextError::Frozen)
            }
            Err(
                WorkloadError::GrantInvalid
                | WorkloadError::GrantExpired
                | WorkloadError::NotFound(_),
            ) => Err(TrustedContextError::CapabilityInvalid),
            Err(other) => Err(TrustedContextError::Workload(other)),
        }
    }

    /// Streams the upload of a redeemed capability into a new current
    /// revision. A failure leaves the capability usable until it expires,
    /// unless the Context was frozen meanwhile.
    pub async fn trusted_upload(
        &self,
        ticket: UploadTicket,
        body: super::BodyStream,
    ) -> Result<UploadResultView, TrustedContextError> {
        let grant = ticket.grant_id.clone();
        match self.upload(ticket, body).await {
            Ok(view) => Ok(UploadResultView {
                workspace_path: format!(".context-service/materialized/{}", view.revision),
                revision: view.revision,
                files: view.files,
                bytes: view.bytes,
            }),
            Err(WorkloadError::AlreadyActive(_)) => {
                if let Some(id) = grant {
                    self.consume_capability(&id).await;
                }
                Err(TrustedContextError::Frozen)
            }
            Err(WorkloadError::TooLarge(_)) => Err(TrustedContextError::UploadTooLarge(
                self.settings().limits.compressed_bytes,
            )),
            Err(WorkloadError::Bundle(b)) => Err(TrustedContextError::Invalid(rejection(&b))),
            Err(WorkloadError::UploadBroken(m)) => Err(TrustedContextError::Invalid(format!(
                "reading the upload failed: {m}"
            ))),
            Err(WorkloadError::GrantInvalid | WorkloadError::UploadInProgress) => {
                Err(TrustedContextError::CapabilityInvalid)
            }
            Err(WorkloadError::NotFound(_)) => Err(TrustedContextError::NotFound),
            Err(other) => Err(TrustedContextError::Workload(other)),
        }
    }

    /// Freezes the Context at `revision`, which must be its current one.
    /// Idempotent for the frozen revision.
    pub async fn freeze_trusted_context(
        &self,
        key: &TrustedKey,
        revision: &str,
    ) -> Result<TrustedContextView, TrustedContextError> {
        let revision = check_revision(revision)?;
        let record = self.context_record(key).await?;
        if self.inner.uploads.is_uploading(&record.uid) {
            return Err(TrustedContextError::UploadInProgress);
        }
        self.activate(&key.owner_key(), &key.workload_name()?, &revision)
            .await
            .map_err(|e| match e {
                // Frozen at another revision: that revision is the current
                // one (a frozen Context takes no uploads), so upstream's
                // current-revision check refuses first.
                WorkloadError::RevisionMismatch(_) | WorkloadError::AlreadyActive(_) => {
                    TrustedContextError::RevisionMismatch
                }
                WorkloadError::NotFound(_) => TrustedContextError::NotFound,
                other => TrustedContextError::Workload(other),
            })?;
        let record = self.context_record(key).await?;
        Ok(TrustedContextView::of(key, &record))
    }

    /// The frozen revision `revision` of the Context: found only while the
    /// Context is frozen at exactly that revision.
    pub async fn locate_trusted_context(
        &self,
        key: &TrustedKey,
        revision: &str,
    ) -> Result<RevisionRecord, TrustedContextError> {
        let revision = check_revision(revision)?;
        let name = key.workload_name()?;
        self.locate(&key.owner_key(), &name, &revision)
            .await
            .map_err(|e| match e {
                WorkloadError::Internal(_) | WorkloadError::StoreUnavailable(_) => {
                    TrustedContextError::Workload(e)
                }
                _ => TrustedContextError::NotFound,
            })
    }

    /// Opens a located revision's bundle (see [`Self::locate_trusted_context`]).
    pub async fn open_trusted_bundle(
        &self,
        key: &TrustedKey,
        revision: &RevisionRecord,
    ) -> Result<CachedBundle, TrustedContextError> {
        self.open_bundle(&key.name, revision)
            .await
            .map_err(|e| match e {
                WorkloadError::NotFound(_) => TrustedContextError::NotFound,
                other => TrustedContextError::Workload(other),
            })
    }

    /// Deletes the Context. `force` is accepted for upstream's sake: nothing
    /// attaches to a Context here, so a delete never waits for consumers.
    pub async fn delete_trusted_context(
        &self,
        key: &TrustedKey,
        _force: bool,
    ) -> Result<(), TrustedContextError> {
        let name = key.workload_name()?;
        self.delete(&key.owner_key(), &name)
            .await
            .map_err(|e| match e {
                WorkloadError::NotFound(_) => TrustedContextError::NotFound,
                other => TrustedContextError::Workload(other),
            })
    }

    /// The Context's record, unless absent, another subject's, or being
    /// deleted.
    async fn context_record(
        &self,
        key: &TrustedKey,
    ) -> Result<WorkloadRecord, TrustedContextError> {
        let name = key.workload_name()?;
        self.inner
            .visible(&key.owner_key(), &name)
            .await
            .map_err(|e| match e {
                WorkloadError::NotFound(_) => TrustedContextError::NotFound,
                other => TrustedContextError::Workload(other),
            })
    }

    /// Removes capability `id` for good; a failure only leaves it to expire.
    async fn consume_capability(&self, id: &str) {
        if let Err(e) = self.inner.store.remove_grant(id).await {
            tracing::warn!(error = %e, "consuming an upload capability failed");
        }
    }
}

/// Upstream's revision check (before any lookup).
fn check_revision(revision: &str) -> Result<Revision, TrustedContextError> {
    Revision::try_from(revision).map_err(|_| {
        TrustedContextError::Invalid("revision must be a lowercase SHA-256 digest".to_owned())
    })
}

/// The message of a refused bundle: the engine's reason code, then its text.
fn rejection(b: &BundleError) -> String {
    match b.entry() {
        Some(entry) => format!("context bundle rejected: {}: {entry} ({b})", b.code()),
        None => format!("context bundle rejected: {}: {b}", b.code()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(ns: &str, name: &str, subject: Owner) -> TrustedKey {
        TrustedKey {
            namespace: ns.into(),
            name: name.into(),
            subject,
        }
    }

    #[test]
    fn keys_separate_subjects_namespaces_and_the_public_api() {
        let alice = Owner::User("alice".into());
        let k = key("team1", "research", alice.clone());
        assert_eq!(k.owner_key(), "ctx:team1/user:alice");
        assert_ne!(
            k.owner_key(),
            key("team2", "research", alice.clone()).owner_key()
        );
        assert_ne!(
            k.owner_key(),
            key("team1", "research", Owner::Agent("alice".into())).owner_key()
        );
        // A public-API owner key never starts with `ctx:`.
        assert!(!alice.key().starts_with(OWNER_PREFIX));
        assert!(!Owner::Subject("ctx:team1/user:alice".into())
            .key()
            .starts_with(OWNER_PREFIX));
    }

    #[test]
    fn capability_ids_never_look_like_grant_ids() {
        let id = base64::engine::general_purpose::URL_SAFE_NO_PAD.encode([0xffu8; 18]);
        assert!(is_capability_id(&id), "{id}");
        assert!(!is_capability_id(&"a".repeat(32)));
        assert!(!is_capability_id(&"a".repeat(23)));
        assert!(!is_capability_id("aaaaaaaaaaaaaaaaaaaaaaa="));
    }

    #[test]
    fn create_requests_are_checked_like_upstream() {
        let ok = CreateTrustedContext {
            name: "research".into(),
            namespace: "team1".into(),
            kind: "state".into(),
            backend: "pvc".into(),
            size: "1Gi".into(),
            access_mode: "ReadWriteOnce".into(),
            storage_class: String::new(),
        };
        assert!(ok.validate().is_ok());
        type Case = (fn(&mut CreateTrustedContext), &'static str);
        let cases: [Case; 6] = [
            (|r| r.name = "Bad".into(), "name must be"),
            (|r| r.namespace = "a.b".into(), "namespace must be"),
            (|r| r.kind = "notes".into(), "type must be workspace, state"),
            (|r| r.backend = "s3".into(), "storage.backend must be pvc"),
            (|r| r.size = "0".into(), "storage.size must be"),
            (
                |r| r.access_mode = "RWO".into(),
                "storage.accessMode must be",
            ),
        ];
        for (change, message) in cases {
            let mut bad = ok.clone();
            change(&mut bad);
            let err = bad.validate().unwrap_err().to_string();
            assert!(err.starts_with(message), "{err}");
        }
    }

    #[test]
    fn go_times_drop_trailing_zeros() {
        assert_eq!(go_time(0), "1970-01-01T00:00:00Z");
        assert_eq!(go_time(1_500), "1970-01-01T00:00:01.5Z");
        assert_eq!(go_time(1_234), "1970-01-01T00:00:01.234Z");
        assert_eq!(size_text(256 << 20), "256 MiB");
        assert_eq!(size_text(1000), "1000 bytes");
    }
}
