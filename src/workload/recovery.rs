//! Blob collection and start-up recovery: blobs no record names are
//! removed under the `gc` lock, interrupted deletes are finished, and
//! workloads whose bundle went missing are marked `failed`.

use std::collections::HashSet;

use super::service::{now_ms, Inner};
use super::WorkloadError;
use crate::store::{RevisionRecord, StoreError, WorkloadRecord, WorkloadStatus};

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

impl Inner {
    /// Takes the `gc` lock (a poisoned lock guards no data, so it is taken
    /// anyway).
    pub(super) fn lock_gc(&self) -> std::sync::MutexGuard<'_, ()> {
        self.gc
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Digests of the blobs some record names.
    fn named_digests(&self) -> Result<HashSet<String>, WorkloadError> {
        let records = self.store.all_workloads()?;
        Ok(records
            .iter()
            .flat_map(WorkloadRecord::blob_digests)
            .map(str::to_owned)
            .collect())
    }

    /// Removes those of `digests` that no record names. Caller holds `gc`.
    pub(super) fn collect(&self, digests: &[String]) -> Result<usize, WorkloadError> {
        let named = self.named_digests()?;
        let mut removed = 0;
        for d in digests.iter().filter(|d| !named.contains(*d)) {
            self.cache.evict(d);
            self.blobs.remove(d)?;
            removed += 1;
        }
        Ok(removed)
    }

    /// Removes a `deleting` record and its unnamed blobs; `false` when the
    /// record changed meanwhile.
    pub(super) fn finish_delete(&self, record: &WorkloadRecord) -> Result<bool, WorkloadError> {
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
    pub(super) fn recover(&self) -> Result<RecoveryReport, WorkloadError> {
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
        let named = self.named_digests()?;
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
