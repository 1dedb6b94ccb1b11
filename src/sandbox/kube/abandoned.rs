//! Creates abandoned half-way: the process running one died (kill -9, node
//! loss) after making some of its objects and before rolling them back.
//!
//! Every create records its window on its objects
//! ([`names::CREATING_UNTIL_ANNOTATION`]) and a completion mark on its
//! first object, the anchor ([`names::CREATED_ANNOTATION`]: pending, then
//! done with one patch once every object exists). A mark still pending
//! after the window is a create nobody will finish: the reaper of any
//! replica (and of the next start) claims it, moving the mark from pending
//! to abandoned, and deletes every object of that create, the anchor last,
//! so a reaper that dies half-way leaves a claimed mark for the next one.
//! The creator's mark and the reaper's claim are both a JSON-patch
//! compare-and-swap on "pending", so exactly one of them wins: a create
//! that ran past its window fails and rolls back instead of finishing a
//! pool that is being deleted. A completed pool is never touched, also when
//! members were deleted since (no mark is pending), nor is a pool of an
//! older version (no mark at all).

use k8s_openapi::api::core::v1::PersistentVolumeClaim;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::api::{Patch, PatchParams};
use kube::Resource;
use serde::de::DeserializeOwned;

use crate::pool::{names, BackendError};

use super::backend::{Deleted, KubeBackend};
use super::crd::{Sandbox, SandboxClaim};
use super::objects;
use super::status::{self, CreateMark, MarkState};
use super::watch::Kind;

/// After a claim lost to a change of the anchor, look again this soon
/// rather than at the next rescan.
const LOOK_AGAIN: SignedDuration = SignedDuration::from_secs(1);

impl KubeBackend {
    /// Deletes every create abandoned at `now` (of any owner; not those this
    /// process is running); answers the earliest window still open, when
    /// the next may be. One failure is logged and retried at the next pass,
    /// never stops the others.
    pub(super) async fn reap_abandoned_creates(
        &self,
        now: Timestamp,
    ) -> Result<Option<Timestamp>, BackendError> {
        let caches = self.synced_caches().await?;
        let mut next: Option<Timestamp> = None;
        let mut wake = |at: Timestamp| next = Some(next.map_or(at, |n: Timestamp| n.min(at)));
        for pool in caches.pool_names() {
            if self.creating.contains(&pool) {
                continue;
            }
            let objects = caches.pool_objects(&pool);
            let Some(mark) = status::create_mark(&objects) else {
                continue;
            };
            match (mark.state, mark.until) {
                (MarkState::Done, _) | (MarkState::Pending, None) => continue,
                (MarkState::Pending, Some(until)) if until > now => {
                    wake(until);
                    continue;
                }
                _ => {}
            }
            match self.delete_abandoned(&pool, &mark).await {
                Ok(Some(deleted)) => tracing::info!(
                    %pool,
                    window_ended = ?mark.until,
                    claims = deleted.claims,
                    sandboxes = deleted.sandboxes,
                    pvcs = deleted.pvcs,
                    "deleted a sandbox pool whose create was abandoned half-way"
                ),
                Ok(None) => {
                    tracing::info!(%pool, anchor = %mark.name, "an abandoned-looking create changed meanwhile; looking again");
                    if let Ok(soon) = now.checked_add(LOOK_AGAIN) {
                        wake(soon);
                    }
                }
                Err(error) => {
                    tracing::warn!(%pool, %error, "deleting an abandoned sandbox pool create failed; retrying later");
                }
            }
        }
        Ok(next)
    }

    /// Claims the abandoned create of `pool` (unless already claimed) and
    /// deletes what it made: the objects carrying its window, the anchor
    /// last. `None` when the claim lost (the creator finished after all, or
    /// the anchor changed or went away).
    async fn delete_abandoned(
        &self,
        pool: &str,
        mark: &CreateMark,
    ) -> Result<Option<Deleted>, BackendError> {
        if mark.state == MarkState::Pending
            && !self
                .swap_mark(mark.kind, &mark.name, names::CREATED_ABANDONED)
                .await
                .map_err(|e| BackendError::internal(format!("claim {}", mark.name), e))?
        {
            return Ok(None);
        }
        let until = mark.until;
        // Only that create's objects: a new create of the same name would
        // carry a window of its own.
        let of_that_create = |meta: &ObjectMeta| {
            meta.annotations
                .as_ref()
                .and_then(status::window_end)
                .is_some_and(|end| Some(end) == until)
        };
        let deleted = self
            .delete_objects(pool, of_that_create, Some((mark.kind, &mark.name)))
            .await?;
        Ok(Some(deleted))
    }

    /// Moves the completion mark on the anchor `name` from pending to `to`.
    /// `false` when it was not pending (any more) or the anchor is gone.
    pub(super) async fn swap_mark(
        &self,
        kind: Kind,
        name: &str,
        to: &str,
    ) -> Result<bool, kube::Error> {
        let patch = objects::created_mark_patch(to);
        let result = match kind {
            Kind::Pvc => self.json_patch::<PersistentVolumeClaim>(name, patch).await,
            Kind::Sandbox => self.json_patch::<Sandbox>(name, patch).await,
            Kind::Claim => self.json_patch::<SandboxClaim>(name, patch).await,
        };
        match result {
            Ok(()) => Ok(true),
            // 422: the test failed (not pending); 409 for older servers.
            Err(kube::Error::Api(status)) if matches!(status.code, 404 | 409 | 422) => Ok(false),
            Err(error) => Err(error),
        }
    }

    async fn json_patch<K>(&self, name: &str, patch: serde_json::Value) -> Result<(), kube::Error>
    where
        K: Resource<Scope = k8s_openapi::NamespaceResourceScope, DynamicType = ()>
            + Clone
            + DeserializeOwned
            + std::fmt::Debug,
    {
        let patch = serde_json::from_value(patch).map_err(kube::Error::SerdeError)?;
        let params = PatchParams {
            field_manager: Some(self.settings.field_manager.clone()),
            ..PatchParams::default()
        };
        self.api::<K>()
            .patch(name, &params, &Patch::<()>::Json(patch))
            .await
            .map(|_| ())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_mark_patch_tests_for_pending_then_replaces() {
        let patch = objects::created_mark_patch(names::CREATED_DONE);
        assert_eq!(
            patch,
            serde_json::json!([
                {"op": "test", "path": "/metadata/annotations/context.rossoctl.io~1created", "value": "false"},
                {"op": "replace", "path": "/metadata/annotations/context.rossoctl.io~1created", "value": "true"},
            ])
        );
        // It is a valid JSON patch for kube-rs.
        let _: kube::api::Patch<()> =
            Patch::Json(serde_json::from_value(patch).expect("JSON patch"));
    }
}
