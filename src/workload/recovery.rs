//! Blob collection and start-up recovery: blobs no record names are
//! removed under the `gc` lock, interrupted deletes are finished, and
//! workloads whose bundle went missing are marked `failed`.

use std::collections::HashSet;
use std::sync::{Arc, Weak};
use std::time::Duration;

use super::state::{blocking, now_ms, Inner};
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
    /// Digests of the blobs some record names.
    pub(super) async fn named_digests(&self) -> Result<HashSet<String>, WorkloadError> {
        let records = self.store.all_workloads().await?;
        Ok(records
            .iter()
            .flat_map(WorkloadRecord::blob_digests)
            .map(str::to_owned)
            .collect())
    }

    /// Removes those of `digests` that no record names. Caller holds the
    /// collection lock.
    pub(super) async fn collect(&self, digests: &[String]) -> Result<usize, WorkloadError> {
        let named = self.named_digests().await?;
        let unnamed: Vec<String> = digests
            .iter()
            .filter(|d| !named.contains(*d))
            .cloned()
            .collect();
        let (blobs, cache) = (self.blobs.clone(), self.cache.clone());
        blocking(move || {
            for d in &unnamed {
                cache.evict(d);
                blobs.remove(d)?;
            }
            Ok(unnamed.len())
        })
        .await
    }

    /// Drops the least recently used disk copies of object storage beyond
    /// their budget (see [`crate::store::Blobs::trim_copies`]). Caller
    /// holds the collection lock (or is the start-up recovery).
    pub(super) async fn trim_copies(&self) -> Result<(), WorkloadError> {
        let blobs = self.blobs.clone();
        blocking(move || {
            blobs.trim_copies();
            Ok(())
        })
        .await
    }

    /// Removes a `deleting` record and its unnamed blobs; `false` when the
    /// record changed meanwhile.
    pub(super) async fn finish_delete(
        &self,
        record: &WorkloadRecord,
    ) -> Result<bool, WorkloadError> {
        let digests: Vec<String> = record.blob_digests().map(str::to_owned).collect();
        for d in &digests {
            self.cache.evict(d);
        }
        let _gc = self.blobs.lock_gc().await;
        match self
            .store
            .remove_workload(&record.owner, &record.name, record.version)
            .await
        {
            Ok(()) | Err(StoreError::NotFound) => {}
            Err(StoreError::Conflict) => return Ok(false),
            Err(e) => return Err(e.into()),
        }
        self.collect(&digests).await?;
        Ok(true)
    }

    /// Start-up recovery; runs before the first request.
    pub(super) async fn recover(&self) -> Result<RecoveryReport, WorkloadError> {
        let mut report = RecoveryReport::default();
        let (blobs, spool_dir) = (self.blobs.clone(), self.spool_dir.clone());
        report.temp_files_removed = blocking(move || {
            let mut removed = 0;
            for path in blobs.local().remove_temp_files()? {
                tracing::warn!(path = %path.display(), "removed a temp file left by a crash");
                removed += 1;
            }
            // Spool files of the bundle engine are unnamed, but clear the
            // dir in case a crash left anything.
            if let Ok(entries) = std::fs::read_dir(&spool_dir) {
                for entry in entries.flatten() {
                    if entry.file_type().map(|t| t.is_file()).unwrap_or(false) {
                        let _ = std::fs::remove_file(entry.path());
                        removed += 1;
                    }
                }
            }
            Ok(removed)
        })
        .await?;
        for record in self.store.all_workloads().await? {
            if record.status == WorkloadStatus::Deleting {
                self.finish_delete(&record).await?;
                report.deletes_finished += 1;
                continue;
            }
            // With object storage a bundle not on local disk is fetched when
            // used: the local blobs are only a copy, and nothing is lost.
            let missing: Vec<&RevisionRecord> = record
                .candidate
                .iter()
                .chain(record.active.iter())
                .filter(|r| self.blobs.lost(&r.bundle_digest))
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
                .is_some_and(|c| self.blobs.lost(&c.bundle_digest))
            {
                next.candidate = None;
            }
            next.failure = Some(reason);
            next.updated_at_ms = now_ms();
            self.store.replace_workload(&next, None).await?;
            report.failed.push(record.name.clone());
        }
        let named = self.named_digests().await?;
        let blobs = self.blobs.clone();
        report.orphan_blobs_removed = blocking(move || {
            let mut removed = 0;
            for digest in blobs.local().digests()? {
                if !named.contains(&digest) {
                    tracing::warn!(digest = %digest, "removing a bundle no workload names");
                    blobs.remove(&digest)?;
                    removed += 1;
                }
            }
            // A budget of disk copies lowered since the last run applies at
            // once.
            blobs.trim_copies();
            Ok(removed)
        })
        .await?;
        report.grants_purged = self.store.purge_expired_grants(now_ms()).await?;
        Ok(report)
    }
}

/// Starts the periodic sweep of object storage ([`sweep_objects`]) every
/// `every`; it ends when the service is dropped.
pub(super) fn spawn_object_sweeper(inner: &Arc<Inner>, every: Duration) {
    let weak: Weak<Inner> = Arc::downgrade(inner);
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            let Some(inner) = weak.upgrade() else { return };
            match sweep_objects(&inner).await {
                Ok(0) => {}
                Ok(n) => tracing::info!(
                    removed = n,
                    "removed bundles no workload names from object storage"
                ),
                Err(e) => {
                    tracing::warn!(error = %e, "sweeping object storage failed; retrying later");
                }
            }
        }
    });
}

/// Deletes from object storage the objects no workload names that are
/// older than the grace period (see [`crate::store::Blobs::sweepable`]),
/// with their local copies; returns how many.
///
/// Younger unnamed objects are kept: another replica may have written one
/// and not yet named it. Each candidate is checked again under the
/// collection lock just before its delete, and an upload that found an
/// object already there re-checks it after naming it (and puts it back if
/// a sweep took it).
pub(super) async fn sweep_objects(inner: &Arc<Inner>) -> Result<usize, WorkloadError> {
    let named = inner.named_digests().await?;
    let candidates = inner.blobs.sweepable(&named).await?;
    let mut removed = 0;
    for digest in candidates {
        let unnamed = {
            let _gc = inner.blobs.lock_gc().await;
            if inner.named_digests().await?.contains(&digest) {
                false
            } else {
                inner.cache.evict(&digest);
                let (blobs, d) = (inner.blobs.clone(), digest.clone());
                blocking(move || Ok(blobs.remove(&d)?)).await?;
                true
            }
        };
        if unnamed {
            inner.blobs.delete_shared(&digest).await?;
            removed += 1;
        }
    }
    Ok(removed)
}
