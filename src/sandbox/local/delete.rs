//! Pool deletion, and the start-up rollback of pools a crash left
//! half-created: the same removal, of objects that carry the pool label.

use crate::pool::model::PoolSpec;
use crate::pool::BackendError;

use super::layout::{internal, remove_dir, remove_file};
use super::plan::Plan;
use super::records::RecordState;
use super::Inner;

impl Inner {
    /// Rolls back every pool a crash left `creating`. Runs at open, before
    /// any request.
    pub(super) fn recover(&self) -> Result<(), BackendError> {
        for pool in self.record_names()? {
            if let Some(record) = self.read_record(&pool)? {
                if record.state == RecordState::Creating {
                    tracing::warn!(pool = %pool, "rolling back a pool left half-created by a crash");
                    self.remove_pool_objects(&record.spec)?;
                    remove_file(&self.record_path(&pool))
                        .map_err(internal(format!("remove pool record {pool}")))?;
                }
            }
        }
        Ok(())
    }

    /// Deletes the pool's own objects, then its record; `false` when there
    /// was no pool.
    pub(super) fn delete_pool(&self, name: &str) -> Result<bool, BackendError> {
        // Waits for a creation of the same name in flight to finish.
        let _reserved = self.reserve_pool(name);
        let Some(record) = self.read_record(name)? else {
            return Ok(false);
        };
        let result = self.remove_pool_objects(&record.spec);
        // The record goes last, so a failed delete can be retried.
        if result.is_ok() {
            remove_file(&self.record_path(name))
                .map_err(internal(format!("delete pool record {name}")))?;
        }
        self.notify();
        result.map(|()| true)
    }

    /// Removes every object the spec plans that carries its pool label:
    /// never an existing claim, a warm pool or another pool's object.
    pub(super) fn remove_pool_objects(&self, spec: &PoolSpec) -> Result<(), BackendError> {
        let plan = Plan::of(spec);
        for claim in &plan.claims {
            self.remove_claim(claim, &spec.name)?;
        }
        for sandbox in &plan.sandboxes {
            if let Some(meta) = self.read_sandbox(sandbox)? {
                if meta.meta.belongs_to(&spec.name) {
                    remove_dir(&self.sandbox_dir(sandbox))
                        .map_err(internal(format!("delete sandbox {sandbox}")))?;
                }
            } else {
                // A directory without metadata is a half-made sandbox.
                remove_dir(&self.sandbox_dir(sandbox))
                    .map_err(internal(format!("delete sandbox {sandbox}")))?;
            }
        }
        for volume in &plan.volumes {
            let dir = self.volume_dir(&self.namespace, volume);
            match self.read_volume(&self.namespace, volume)? {
                Some(meta) if !meta.meta.belongs_to(&spec.name) => {}
                _ => {
                    remove_dir(&dir).map_err(internal(format!("delete workspace PVC {volume}")))?;
                }
            }
        }
        Ok(())
    }

    /// Removes claim `claim` of `pool` and the sandbox it adopted.
    pub(super) fn remove_claim(&self, claim: &str, pool: &str) -> Result<(), BackendError> {
        if let Some(meta) = self.read_claim(claim)? {
            if !meta.meta.belongs_to(pool) {
                return Ok(());
            }
            // A sandbox without metadata is one this claim was making.
            let ours = self
                .read_sandbox(&meta.sandbox)?
                .is_none_or(|sandbox| sandbox.meta.belongs_to(pool));
            if ours {
                remove_dir(&self.sandbox_dir(&meta.sandbox))
                    .map_err(internal(format!("delete sandbox {}", meta.sandbox)))?;
            }
            remove_file(&self.claim_path(claim))
                .map_err(internal(format!("delete sandbox claim {claim}")))?;
        }
        Ok(())
    }
}
