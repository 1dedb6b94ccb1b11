//! Who may upload: the owner, or the holder of a one-time upload grant.
//! A grant's secret is stored only as its sha256 and compared in constant
//! time.

use base64::Engine as _;
use subtle::ConstantTimeEq;

use super::service::not_ready;
use super::state::{now_ms, random_bytes, sha256_hex, Inner};
use super::{
    rfc3339, UploadGrantView, UploadTicket, WorkloadError, WorkloadName, WorkloadService,
    BUNDLE_MEDIA_TYPE,
};
use crate::store::{GrantRecord, WorkloadRecord, WorkloadStatus};

impl WorkloadService {
    /// A fresh upload grant for the owner's workload `name`.
    pub async fn grant(
        &self,
        owner: &str,
        name: &WorkloadName,
    ) -> Result<UploadGrantView, WorkloadError> {
        let record = self.inner.visible(owner, name).await?;
        Inner::check_uploadable(&record)?;
        let (grant, view) = self.inner.new_grant(&record);
        // Grants die with expiry anyway; purge old ones while here.
        self.inner.store.purge_expired_grants(now_ms()).await?;
        self.inner.store.insert_grant(&grant).await?;
        Ok(view)
    }

    /// Authorises an upload by the owner (before reading the body).
    pub async fn owner_upload(
        &self,
        owner: &str,
        name: &WorkloadName,
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
        let grant = self
            .inner
            .store
            .grant(id)
            .await?
            .ok_or(WorkloadError::GrantInvalid)?;
        let presented = sha256_hex(token.as_bytes());
        if !bool::from(presented.as_bytes().ct_eq(grant.token_sha256.as_bytes())) {
            return Err(WorkloadError::GrantInvalid);
        }
        if grant.expires_at_ms < now_ms() {
            return Err(WorkloadError::GrantExpired);
        }
        let name = WorkloadName::try_from(grant.name).map_err(|_| WorkloadError::GrantInvalid)?;
        let record = self
            .inner
            .visible(&grant.owner, &name)
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
}

impl Inner {
    /// `Ok` while the workload accepts uploads.
    pub(super) fn check_uploadable(record: &WorkloadRecord) -> Result<(), WorkloadError> {
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

    /// A fresh grant for `record`: the stored record (secret hashed) and
    /// the view that shows the secret once.
    pub(super) fn new_grant(&self, record: &WorkloadRecord) -> (GrantRecord, UploadGrantView) {
        self.new_grant_with_id(record, hex::encode(random_bytes::<16>()))
    }

    /// [`Inner::new_grant`] with the public id `id`.
    pub(super) fn new_grant_with_id(
        &self,
        record: &WorkloadRecord,
        id: String,
    ) -> (GrantRecord, UploadGrantView) {
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
}
