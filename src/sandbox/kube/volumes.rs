//! Named contexts (context volumes, [`crate::pool::model::ContextVolumeSpec`];
//! not the trusted Contexts of `workload::trusted`): one managed PVC `context-<name>`, in any namespace.

use k8s_openapi::api::core::v1::PersistentVolumeClaim;
use kube::api::ListParams;
use kube::{Api, ResourceExt};

use crate::pool::model::{
    ContextVolumePhase, ContextVolumeSpec, ContextVolumeStatus, ContextVolumeType,
};
use crate::pool::{names, BackendError};

use super::backend::{background, create_error, delete_ignoring_missing, KubeBackend};
use super::objects;

impl KubeBackend {
    /// Creates the PVC `context-<name>`.
    pub(super) async fn create_context_pvc(
        &self,
        spec: &ContextVolumeSpec,
    ) -> Result<ContextVolumeStatus, BackendError> {
        let pvc = objects::context_pvc(
            &spec.namespace,
            &spec.name,
            spec.context_type.as_str(),
            &spec.owner_scope,
            &spec.size,
            spec.access_mode.as_str(),
            spec.storage_class.as_deref(),
        );
        let api: Api<PersistentVolumeClaim> = Api::namespaced(self.client.clone(), &spec.namespace);
        let made = api
            .create(&self.post_params(), &pvc)
            .await
            .map_err(|e| create_error(e, "create context PVC"))?;
        self.context_status(&made).ok_or_else(|| {
            BackendError::internal("create context PVC", "the created PVC lacks its labels")
        })
    }

    /// The managed context PVC `context-<name>` in `namespace`, if it is one.
    pub(super) async fn context_pvc(
        &self,
        namespace: &str,
        name: &str,
    ) -> Result<Option<ContextVolumeStatus>, BackendError> {
        let api: Api<PersistentVolumeClaim> = Api::namespaced(self.client.clone(), namespace);
        let pvc = api
            .get_opt(&names::context_claim(name))
            .await
            .map_err(|e| BackendError::internal("get context PVC", e))?;
        Ok(pvc
            .as_ref()
            .and_then(|pvc| self.context_status(pvc))
            .filter(|status| status.name == name))
    }

    /// The named contexts in `namespace` (or in every namespace: the
    /// ClusterRole grants `list` on PVCs), sorted by name.
    pub(super) async fn list_context_pvcs(
        &self,
        namespace: Option<&str>,
    ) -> Result<Vec<ContextVolumeStatus>, BackendError> {
        let api: Api<PersistentVolumeClaim> = match namespace {
            Some(ns) => Api::namespaced(self.client.clone(), ns),
            None => Api::all(self.client.clone()),
        };
        let list = api
            .list(&ListParams::default().labels(&objects::managed_selector()))
            .await
            .map_err(|e| BackendError::internal("list context PVCs", e))?;
        let mut contexts: Vec<ContextVolumeStatus> = list
            .items
            .iter()
            .filter(|pvc| pvc.name_any() == names::context_claim(&context_label(pvc)))
            .filter_map(|pvc| self.context_status(pvc))
            .collect();
        contexts.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(contexts)
    }

    /// Deletes the context's PVC; `false` when it is not there.
    pub(super) async fn delete_context_pvc(
        &self,
        namespace: &str,
        name: &str,
    ) -> Result<bool, BackendError> {
        if self.context_pvc(namespace, name).await?.is_none() {
            return Ok(false);
        }
        let api: Api<PersistentVolumeClaim> = Api::namespaced(self.client.clone(), namespace);
        delete_ignoring_missing(&api, &names::context_claim(name), &background())
            .await
            .map_err(|e| BackendError::internal("delete context PVC", e))?;
        Ok(true)
    }

    /// The named context a PVC holds, if it is a managed context PVC.
    fn context_status(&self, pvc: &PersistentVolumeClaim) -> Option<ContextVolumeStatus> {
        let labels = pvc.labels();
        if labels.get(names::MANAGED_BY_LABEL).map(String::as_str) != Some(names::MANAGED_BY_VALUE)
        {
            return None;
        }
        let name = labels
            .get(names::CONTEXT_NAME_LABEL)
            .filter(|n| !n.is_empty())?;
        let context_type = ContextVolumeType::parse(labels.get(names::CONTEXT_TYPE_LABEL)?)?;
        let spec = pvc.spec.as_ref();
        let bound = pvc.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Bound");
        Some(ContextVolumeStatus {
            name: name.clone(),
            namespace: pvc.namespace().unwrap_or_default(),
            context_type,
            phase: if bound {
                ContextVolumePhase::Ready
            } else {
                ContextVolumePhase::Provisioning
            },
            size: spec
                .and_then(|s| s.resources.as_ref())
                .and_then(|r| r.requests.as_ref())
                .and_then(|r| r.get("storage"))
                .map(|q| q.0.clone())
                .unwrap_or_default(),
            access_mode: spec
                .and_then(|s| s.access_modes.as_ref())
                .and_then(|m| m.first())
                .cloned()
                .unwrap_or_default(),
            storage_class: spec
                .and_then(|s| s.storage_class_name.clone())
                .filter(|c| !c.is_empty()),
            claim_name: pvc.name_any(),
            owner_scope: labels.get(names::OWNER_LABEL).cloned().unwrap_or_default(),
        })
    }
}

/// The context-name label of a PVC, or empty.
fn context_label(pvc: &PersistentVolumeClaim) -> String {
    pvc.labels()
        .get(names::CONTEXT_NAME_LABEL)
        .cloned()
        .unwrap_or_default()
}
