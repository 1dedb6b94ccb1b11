//! Deleting a whole pool. A finished warm pool that the watch caches hold
//! whole goes by its claims' names; any other pool by one
//! `deletecollection` per kind of object its strategy makes, by the pool's
//! managed labels, the kinds at once. The API server then selects the
//! objects itself, so a delete is one round trip (no list first) and still
//! catches members the watch caches have not seen yet (made a moment ago,
//! or by another replica).

use k8s_openapi::api::core::v1::PersistentVolumeClaim;
use kube::api::{DeleteParams, ListParams};
use kube::Resource;
use serde::de::DeserializeOwned;

use crate::pool::model::Strategy;
use crate::pool::BackendError;

use super::backend::{background, is_not_found, Deleted, KubeBackend};
use super::crd::{Sandbox, SandboxClaim};
use super::objects;
use super::status;
use super::watch::Kind;

/// The kinds of object a create of `strategy` makes: claims for warm
/// pools, Sandboxes for an existing claim, Sandboxes and PVCs for managed
/// workspaces.
fn kinds_of(strategy: &Strategy) -> &'static [Kind] {
    match strategy {
        Strategy::Warm { .. } => &[Kind::Claim],
        Strategy::Existing { .. } => &[Kind::Sandbox],
        Strategy::Shared { .. } | Strategy::Dedicated { .. } => &[Kind::Sandbox, Kind::Pvc],
    }
}

/// Every kind: for a pool the caches do not know (yet).
const ALL_KINDS: &[Kind] = &[Kind::Claim, Kind::Sandbox, Kind::Pvc];

impl KubeBackend {
    /// Deletes the managed objects of pool `name`. A finished warm pool the
    /// caches hold whole goes by its claims' names, one `DELETE` each, at
    /// once: under load the API server takes several times as long for a
    /// `deletecollection` (a consistent list, then the same deletes) as for
    /// a `DELETE` by name. Any other pool goes by selector, the kinds its
    /// strategy makes as the caches know it (all three for a pool they do
    /// not know, or cannot answer for), so members the caches have not
    /// seen yet are caught too.
    pub(super) async fn delete_pool_members(&self, name: &str) -> Result<Deleted, BackendError> {
        let Ok(caches) = self.synced_caches().await else {
            return self.delete_pool_objects(name, ALL_KINDS).await;
        };
        let objects = caches.pool_objects(name);
        let Some(pool) = status::pool_status(name, &objects, self.creating.contains(name)) else {
            return self.delete_pool_objects(name, ALL_KINDS).await;
        };
        if let Strategy::Warm { .. } = pool.strategy {
            // A create still running here has not marked itself done.
            if let Some(claims) = status::finished_claims(name, &objects, pool.replicas) {
                let deleted = Deleted {
                    claims: claims.len(),
                    ..Deleted::default()
                };
                self.delete_all(Kind::Claim, claims).await?;
                return Ok(deleted);
            }
        }
        self.delete_pool_objects(name, kinds_of(&pool.strategy))
            .await
    }

    /// Deletes the managed objects of pool `name` of the `kinds` given, the
    /// kinds at once; answers how many of each there were. The selector has
    /// our pool and managed-by labels: never the caller's existing claim,
    /// which carries neither, nor a foreign object with only the pool label.
    pub(super) async fn delete_pool_objects(
        &self,
        name: &str,
        kinds: &[Kind],
    ) -> Result<Deleted, BackendError> {
        let selector = objects::managed_pool_selector(name);
        let counts = futures::future::try_join_all(
            kinds
                .iter()
                .map(|kind| self.delete_kind(*kind, name, &selector)),
        )
        .await?;
        let mut deleted = Deleted::default();
        for (kind, count) in kinds.iter().zip(counts) {
            match kind {
                Kind::Claim => deleted.claims = count,
                Kind::Sandbox => deleted.sandboxes = count,
                Kind::Pvc => deleted.pvcs = count,
            }
        }
        Ok(deleted)
    }

    /// Deletes the objects of `kind` that `selector` matches in pool
    /// `name`. Claims go in the foreground, as upstream: a claim stays
    /// visible until its Sandbox and Pod are gone, so the pool does not
    /// look released while its sandboxes still run. Sandboxes and PVCs go
    /// in the background at once: a PVC in use stays (its protection
    /// finalizer) until its pod is gone.
    async fn delete_kind(
        &self,
        kind: Kind,
        name: &str,
        selector: &str,
    ) -> Result<usize, BackendError> {
        let (result, what) = match kind {
            Kind::Claim => (
                self.delete_selected::<SandboxClaim>(selector, &DeleteParams::foreground())
                    .await,
                "sandbox claims",
            ),
            Kind::Sandbox => (
                self.delete_selected::<Sandbox>(selector, &background())
                    .await,
                "sandboxes",
            ),
            Kind::Pvc => (
                self.delete_selected::<PersistentVolumeClaim>(selector, &background())
                    .await,
                "workspace PVCs",
            ),
        };
        result.map_err(|e| BackendError::internal(format!("delete {what} of {name}"), e))
    }

    /// Deletes every `K` in the namespace that `selector` matches; answers
    /// how many there were. A missing resource type (CRD not installed)
    /// holds none.
    async fn delete_selected<K>(
        &self,
        selector: &str,
        params: &DeleteParams,
    ) -> Result<usize, kube::Error>
    where
        K: Resource<Scope = k8s_openapi::NamespaceResourceScope, DynamicType = ()>
            + Clone
            + DeserializeOwned
            + std::fmt::Debug,
    {
        let selected = ListParams::default().labels(selector);
        match self.api::<K>().delete_collection(params, &selected).await {
            // The API server answers the list of what it deleted; a bare
            // `Status` names no object.
            Ok(deleted) => Ok(deleted.either(|list| list.items.len(), |_status| 0)),
            Err(error) if is_not_found(&error) => Ok(0),
            Err(error) => Err(error),
        }
    }
}
