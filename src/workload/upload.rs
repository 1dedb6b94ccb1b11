//! The upload path: the body streams through the bundle engine into a temp
//! blob, which is made durable and then named by a new candidate revision.

use std::io;
use std::pin::Pin;

use bytes::Bytes;
use futures::Stream;
use tokio_util::io::SyncIoBridge;

use super::state::{blocking, now_ms, Inner};
use super::{RevisionView, UploadTicket, WorkloadError, WorkloadService};
use crate::bundle::{self, BundleError, CanonicalOptions};
use crate::store::{RevisionRecord, StoreError, WorkloadStatus};

/// A request body: chunks of bytes or an I/O error.
pub type BodyStream = Pin<Box<dyn Stream<Item = io::Result<Bytes>> + Send>>;

impl WorkloadService {
    /// Streams `body` through the bundle engine into a new candidate
    /// revision, once admitted (see `admission`). Nothing of a refused
    /// upload stays on disk, and a refused upload leaves its grant usable.
    pub async fn upload(
        &self,
        ticket: UploadTicket,
        body: BodyStream,
    ) -> Result<RevisionView, WorkloadError> {
        // Before a byte of the body is read.
        let permit = self.inner.uploads.admit(&ticket).inspect_err(|e| {
            if let WorkloadError::TooManyUploads(_) = e {
                self.inner.metrics.rejected("too_many_uploads");
            }
        })?;
        let limits = self.inner.settings.limits.clone();
        // The engine counts the compressed bytes as they arrive (chunked
        // bodies have no Content-Length) and stops one byte past the limit.
        let reader = SyncIoBridge::new(tokio_util::io::StreamReader::new(body));
        let temp = self.inner.blobs.temp()?;
        let out = temp.writer()?;
        let opts = CanonicalOptions {
            temp_dir: Some(self.inner.spool_dir.clone()),
            temp_budget: Some(self.inner.temp_budget.clone()),
            deflate_threads: self.inner.settings.deflate_threads,
            ..CanonicalOptions::default()
        };
        // The permit moves into the blocking task: if the client goes away,
        // the upload's place stays taken until its thread is really done.
        let span = tracing::Span::current();
        let task = tokio::task::spawn_blocking(move || {
            let _request = span.enter();
            let result = bundle::canonicalize(reader, &limits, &opts, out);
            (result, permit)
        });
        let (result, permit) = task
            .await
            .map_err(|e| WorkloadError::Internal(format!("upload task failed: {e}")))?;
        let report = match result {
            Ok(r) => r,
            Err(BundleError::CompressedTooLarge { limit }) => {
                self.inner.metrics.rejected("upload_too_large");
                return Err(WorkloadError::TooLarge(format!(
                    "the upload exceeds the limit of {limit} bytes"
                )));
            }
            Err(e) => {
                if e.is_rejection() {
                    self.inner.metrics.rejected(e.code());
                }
                return Err(classify_bundle_error(e));
            }
        };
        let bundle::Report {
            inspection,
            bundle_digest,
            bundle_bytes,
            bundle_encoding,
        } = report;
        let revision = RevisionRecord {
            revision: inspection.revision,
            bundle_digest,
            files: inspection.files,
            entries: inspection.entries,
            bytes: bundle_bytes,
            bundle_encoding,
            inflated_bytes: inspection.inflated_bytes,
            uploaded_at_ms: now_ms(),
            tree: None,
        };
        let name = ticket.name.clone();
        // With object storage the bundle is stored there (verified) before
        // anything names it; a failure leaves no trace (the temp blob is
        // dropped) and the grant usable.
        self.inner
            .blobs
            .share(&temp, &revision.bundle_digest, revision.bytes)
            .await?;
        self.inner
            .commit_upload(&ticket, temp, revision.clone())
            .await?;
        // Now that the metadata names it, an object another replica swept
        // meanwhile is put back. The upload is committed either way: a
        // failure here is logged.
        let digest = &revision.bundle_digest;
        if let Err(e) = self.inner.blobs.reshare(digest, revision.bytes).await {
            tracing::warn!(digest = %digest, error = %e, "could not re-check the stored bundle after its upload");
        }
        // One upload per grant until the commit is done.
        drop(permit);
        self.inner.metrics.uploaded();
        Ok(RevisionView::of(&name, &revision))
    }
}

/// Maps an engine error to the API's classes. (The compressed size, the
/// one `TooLarge`, is answered by the caller.) The other size limits keep
/// their own reason (`inflated_too_large`, ...) as a bundle rejection.
fn classify_bundle_error(e: BundleError) -> WorkloadError {
    if e.is_rejection() {
        return WorkloadError::Bundle(e);
    }
    if let BundleError::TempSpaceExhausted { .. } = e {
        return WorkloadError::TempSpaceExhausted(e.to_string());
    }
    match e {
        BundleError::Io { .. } => WorkloadError::UploadBroken(e.to_string()),
        other => WorkloadError::Internal(format!("bundle engine: {other}")),
    }
}

impl Inner {
    /// Makes the blob durable, then names it in the record (consuming the
    /// grant) in one transaction.
    async fn commit_upload(
        &self,
        ticket: &UploadTicket,
        temp: crate::store::TempBlob,
        revision: RevisionRecord,
    ) -> Result<(), WorkloadError> {
        let _gc = self.blobs.lock_gc().await;
        let (blobs, digest) = (self.blobs.clone(), revision.bundle_digest.clone());
        blocking(move || Ok(blobs.persist(temp, &digest).map(drop)?)).await?;
        let outcome = loop {
            let record = match self.store.workload(&ticket.owner, &ticket.name).await? {
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
                .await
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
        self.collect(&maybe_unused).await?;
        self.trim_copies().await?;
        outcome.map(|_| ())
    }
}
