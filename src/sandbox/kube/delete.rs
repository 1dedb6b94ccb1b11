//! Deleting a whole pool: one `deletecollection` per kind of object its
//! strategy makes, by the pool's managed labels, the kinds at once. The API
//! server selects the objects itself, so a delete is one round trip (no
//! list first) and still catches members the watch caches have not seen
//! yet (made a moment ago, or by another replica).

use k8s_openapi::api::core::v1::PersistentVolumeClaim;
use kube::api::{DeleteParams, ListParams};
use kube::Resource;
use serde::de::DeserializeOwned;

use crate::pool::model::Strategy;
use crate::pool::BackendError;

use super::backend::{background, is_not_found, Deleted, KubeBackend};
use super::crd::{Sandbox, SandboxClaim};
use super::objects;

/// Which kinds of object a pool may have.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Kinds {
    claims: bool,
    sandboxes: bool,
    pvcs: bool,
}

impl Kinds {
    /// Every kind: for a pool the caches do not know (yet).
    pub(super) const ALL: Kinds = Kinds {
        claims: true,
        sandboxes: true,
        pvcs: true,
    };

    /// The kinds a create of `strategy` makes: claims for warm pools,
    /// Sandboxes for an existing claim, Sandboxes and PVCs for managed
    /// workspaces.
    pub(super) fn of(strategy: &Strategy) -> Kinds {
        match strategy {
            Strategy::Warm { .. } => Kinds {
                claims: true,
                sandboxes: false,
                pvcs: false,
            },
            Strategy::Existing { .. } => Kinds {
                claims: false,
                sandboxes: true,
                pvcs: false,
            },
            Strategy::Shared { .. } | Strategy::Dedicated { .. } => Kinds {
                claims: false,
                sandboxes: true,
                pvcs: true,
            },
        }
    }
}

impl KubeBackend {
    /// Deletes the managed objects of pool `name` of the `kinds` given;
    /// answers how many of each there were. Claims go in the foreground, as
    /// upstream: a claim stays visible until its Sandbox and Pod are gone,
    /// so the pool does not look released while its sandboxes still run.
    /// Sandboxes and PVCs go at once: a PVC in use stays (its protection
    /// finalizer) until its pod is gone. The selector has our pool and
    /// managed-by labels: never the caller's existing claim, which carries
    /// neither, nor a foreign object with only the pool label.
    pub(super) async fn delete_pool_objects(
        &self,
        name: &str,
        kinds: Kinds,
    ) -> Result<Deleted, BackendError> {
        let selector = objects::managed_pool_selector(name);
        let selector = selector.as_str();
        let (claims, sandboxes, pvcs) = tokio::try_join!(
            async {
                if !kinds.claims {
                    return Ok(0);
                }
                self.delete_selected::<SandboxClaim>(selector, &DeleteParams::foreground())
                    .await
                    .map_err(|e| {
                        BackendError::internal(format!("delete sandbox claims of {name}"), e)
                    })
            },
            async {
                if !kinds.sandboxes {
                    return Ok(0);
                }
                self.delete_selected::<Sandbox>(selector, &background())
                    .await
                    .map_err(|e| BackendError::internal(format!("delete sandboxes of {name}"), e))
            },
            async {
                if !kinds.pvcs {
                    return Ok(0);
                }
                self.delete_selected::<PersistentVolumeClaim>(selector, &background())
                    .await
                    .map_err(|e| {
                        BackendError::internal(format!("delete workspace PVCs of {name}"), e)
                    })
            },
        )?;
        Ok(Deleted {
            claims,
            sandboxes,
            pvcs,
        })
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
