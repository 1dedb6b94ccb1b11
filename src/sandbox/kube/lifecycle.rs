//! Suspending and resuming a direct pool: a merge patch of every managed
//! Sandbox's `spec.operatingMode` (`Suspended` makes the agent-sandbox
//! controller delete the pod and keep the Sandbox, its PVCs and its name;
//! `Running` starts a fresh pod). The answer comes from the watch caches
//! once they saw the new mode, so an immediate `get` agrees with it.

use std::sync::Arc;

use kube::api::{Patch, PatchParams};
use kube::ResourceExt;

use crate::pool::model::PoolStatus;
use crate::pool::BackendError;

use super::backend::{is_not_found, KubeBackend};
use super::crd::Sandbox;
use super::objects;
use super::status::{self, PoolObjects};

impl KubeBackend {
    /// Sets `operatingMode` on every managed Sandbox of pool `name`; `None`
    /// when the pool has no Sandbox (no pool, or a warm-pool pool, whose
    /// Sandboxes are the controller's).
    pub(super) async fn set_operating_mode(
        &self,
        name: &str,
        suspended: bool,
    ) -> Result<Option<PoolStatus>, BackendError> {
        // From the API, not the caches: a pool created a moment ago must
        // not be missed.
        let selector = objects::managed_pool_selector(name);
        let sandboxes = self
            .list_or_empty::<Sandbox>(&selector, None)
            .await
            .map_err(|e| BackendError::internal("list sandboxes", e))?;
        if sandboxes.is_empty() {
            return Ok(None);
        }
        let api = self.api::<Sandbox>();
        let params = PatchParams {
            field_manager: Some(self.settings.field_manager.clone()),
            ..PatchParams::default()
        };
        let patch = objects::operating_mode_patch(suspended);
        let mut patched = Vec::with_capacity(sandboxes.len());
        for sandbox in &sandboxes {
            let sandbox_name = sandbox.name_any();
            // Already in that mode: nothing to write (idempotent, and no
            // needless generation bump).
            if status::is_suspended(sandbox) == suspended {
                patched.push(Arc::new(sandbox.clone()));
                continue;
            }
            match api
                .patch(&sandbox_name, &params, &Patch::Merge(&patch))
                .await
            {
                Ok(updated) => patched.push(Arc::new(updated)),
                // Deleted meanwhile (expiry, a concurrent delete).
                Err(e) if is_not_found(&e) => {}
                Err(e) => {
                    let doing = if suspended { "suspend" } else { "resume" };
                    return Err(BackendError::internal(
                        format!("{doing} sandbox {sandbox_name}"),
                        e,
                    ));
                }
            }
        }
        let objects = self.observed(name, suspended, patched).await;
        Ok(status::pool_status(name, &objects, false))
    }

    /// The pool's objects once the caches show every Sandbox in the asked
    /// mode (at most `cache_sync_timeout`); else the patched Sandboxes
    /// over what the caches hold.
    async fn observed(
        &self,
        name: &str,
        suspended: bool,
        patched: Vec<Arc<Sandbox>>,
    ) -> PoolObjects {
        let Some((caches, _)) = self.caches.get() else {
            return PoolObjects {
                sandboxes: patched,
                ..PoolObjects::default()
            };
        };
        let deadline = tokio::time::Instant::now() + self.settings.cache_sync_timeout;
        let seen = caches
            .first(deadline, |caches| {
                let objects = caches.pool_objects(name);
                let all_asked = objects
                    .sandboxes
                    .iter()
                    .all(|s| status::is_suspended(s) == suspended);
                all_asked.then_some(objects)
            })
            .await;
        match seen {
            Some(objects) => objects,
            None => {
                tracing::warn!(pool = %name, "watch caches lag behind a suspend or resume");
                PoolObjects {
                    sandboxes: patched,
                    ..caches.pool_objects(name)
                }
            }
        }
    }
}
