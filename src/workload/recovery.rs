//! Blob collection and start-up recovery: blobs no record names are
//! removed under the `gc` lock, interrupted deletes are finished, and
//! workloads whose bundle went missing are marked `failed`.

use std::collections::HashSet;
use std::sync::{Arc, Weak};
use std::time::{Duration, SystemTime};

use super::service::{blocking, now_ms, Inner};
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
    pub(super) fn named_digests(&self) -> Result<HashSet<String>, WorkloadError> {
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

    /// Drops the least recently used disk copies of object storage beyond
    /// their budget (a no-op without object storage). Caller holds `gc`
    /// (or is the start-up recovery, before anything is served). A
    /// failure only leaves the disk fuller: logged, never the request's.
    pub(super) fn trim_copies(&self) {
        match self.blobs.trim() {
            Ok(dropped) if !dropped.is_empty() => {
                let (budget, bytes) = self.blobs.usage().unwrap_or_default();
                tracing::debug!(
                    dropped = dropped.len(),
                    bytes,
                    budget,
                    "dropped local copies of stored bundles beyond the budget"
                );
            }
            Ok(_) => {}
            Err(e) => tracing::warn!(error = %e, "dropping local copies of stored bundles failed"),
        }
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
            // With object storage a bundle not on local disk is fetched when
            // used: the local blobs are only a copy.
            if self.objects.is_some() {
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
        // A budget of disk copies lowered since the last run applies at once.
        self.trim_copies();
        report.grants_purged = self.store.purge_expired_grants(now_ms())?;
        Ok(report)
    }
}

/// How often the object sweep runs: a quarter of the grace period, between
/// 1 s and 5 min.
fn sweep_every(grace: Duration) -> Duration {
    (grace / 4).clamp(Duration::from_secs(1), Duration::from_secs(300))
}

/// Starts the periodic sweep of object storage ([`Inner::sweep_objects`]);
/// it ends when the service is dropped.
pub(super) fn spawn_object_sweeper(inner: &Arc<Inner>) {
    let weak: Weak<Inner> = Arc::downgrade(inner);
    let every = sweep_every(inner.settings.blob_gc_grace);
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
/// older than the grace period (see [`crate::store::ObjectBlobs`]), with
/// their local copies; returns how many.
///
/// Younger unnamed objects are kept: another replica may have written one
/// and not yet named it. Each candidate is checked again under `gc` just
/// before its delete, and an upload that found an object already there
/// re-checks it after naming it (and puts it back if a sweep took it).
pub(super) async fn sweep_objects(inner: &Arc<Inner>) -> Result<usize, WorkloadError> {
    let Some(objects) = inner.objects.clone() else {
        return Ok(0);
    };
    let reader = inner.clone();
    let named = blocking(move || reader.named_digests()).await?;
    let grace = inner.settings.blob_gc_grace;
    let candidates = objects.deletable(&named, grace, SystemTime::now()).await?;
    let mut removed = 0;
    for object in candidates {
        let checker = inner.clone();
        let digest = object.digest.clone();
        let unnamed = blocking(move || {
            let _gc = checker.lock_gc();
            if checker.named_digests()?.contains(&digest) {
                return Ok(false);
            }
            checker.cache.evict(&digest);
            checker.blobs.remove(&digest)?;
            Ok(true)
        })
        .await?;
        if unnamed {
            objects.delete(&object.digest).await?;
            removed += 1;
        }
    }
    Ok(removed)
}
