//! Named contexts (context volumes, [`crate::pool::model::ContextVolumeSpec`];
//! not the trusted Contexts of `workload::trusted`): one managed volume `context-<name>`, in any namespace.

use std::collections::BTreeMap;
use std::fs;
use std::io;

use crate::fsutil;
use crate::pool::model::{
    ContextVolumePhase, ContextVolumeSpec, ContextVolumeStatus, ContextVolumeType,
};
use crate::pool::{names, BackendError};

use super::layout::{create_new_dir, internal, remove_dir, write_json, VOLUME_FILE};
use super::records::{ObjectMeta, VolumeMeta};
use super::Inner;

impl Inner {
    /// Creates volume `context-<name>`; `AlreadyExists` if it is there.
    pub(super) fn create_volume(
        &self,
        spec: &ContextVolumeSpec,
    ) -> Result<ContextVolumeStatus, BackendError> {
        let claim = names::context_claim(&spec.name);
        let dir = self.volume_dir(&spec.namespace, &claim);
        let _reserved = self.reserve_new_volume(&spec.namespace, &claim)?;
        // A directory without metadata is a volume a crash left half-made.
        remove_dir(&dir).map_err(internal(format!("clean up half-made volume {claim}")))?;
        let meta = VolumeMeta {
            meta: ObjectMeta {
                name: claim.clone(),
                labels: BTreeMap::from([
                    (
                        names::MANAGED_BY_LABEL.to_owned(),
                        names::MANAGED_BY_VALUE.to_owned(),
                    ),
                    (names::CONTEXT_NAME_LABEL.to_owned(), spec.name.clone()),
                    (
                        names::CONTEXT_TYPE_LABEL.to_owned(),
                        spec.context_type.as_str().to_owned(),
                    ),
                    (names::OWNER_LABEL.to_owned(), spec.owner_scope.clone()),
                ]),
                annotations: BTreeMap::new(),
            },
            size: spec.size.clone(),
            access_mode: spec.access_mode,
            storage_class: spec.storage_class.clone(),
        };
        let what = format!("create context PVC {}/{claim}", spec.namespace);
        let made = create_new_dir(&dir)
            .and_then(|()| fsutil::ensure_dir(&dir.join("data"), 0o755))
            .and_then(|()| write_json(&dir.join(VOLUME_FILE), &meta));
        if let Err(e) = made {
            let _ = remove_dir(&dir);
            return Err(BackendError::internal(what, e));
        }
        context_status(&spec.namespace, &meta)
            .ok_or_else(|| BackendError::internal(what, io::Error::other("unreadable labels")))
    }

    /// The named context, if its volume is a managed context volume.
    pub(super) fn get_volume(
        &self,
        ns: &str,
        name: &str,
    ) -> Result<Option<ContextVolumeStatus>, BackendError> {
        let claim = names::context_claim(name);
        Ok(self
            .read_volume(ns, &claim)?
            .and_then(|v| context_status(ns, &v))
            .filter(|c| c.name == name))
    }

    /// Every named context in `ns`, sorted by name.
    /// The named contexts of every namespace.
    pub(super) fn list_all_volumes(&self) -> Result<Vec<ContextVolumeStatus>, BackendError> {
        let entries = match fs::read_dir(self.namespaces_dir()) {
            Ok(e) => e,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(BackendError::internal("list namespaces", e)),
        };
        let mut out = Vec::new();
        for entry in entries {
            let entry = entry.map_err(internal("list namespaces".to_owned()))?;
            if let Some(ns) = entry.file_name().to_str() {
                out.extend(self.list_volumes(ns)?);
            }
        }
        Ok(out)
    }

    pub(super) fn list_volumes(&self, ns: &str) -> Result<Vec<ContextVolumeStatus>, BackendError> {
        let dir = self.ns_dir(ns).join("volumes");
        let entries = match fs::read_dir(&dir) {
            Ok(e) => e,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(BackendError::internal(format!("list volumes in {ns}"), e)),
        };
        let mut out = Vec::new();
        for entry in entries {
            let entry = entry.map_err(internal(format!("list volumes in {ns}")))?;
            let Some(name) = entry.file_name().to_str().map(str::to_owned) else {
                continue;
            };
            if let Some(status) = self
                .read_volume(ns, &name)?
                .and_then(|v| context_status(ns, &v))
            {
                out.push(status);
            }
        }
        out.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(out)
    }

    /// Deletes the context's volume; `false` when there was none.
    pub(super) fn delete_volume(&self, ns: &str, name: &str) -> Result<bool, BackendError> {
        // Waits for a creation or deletion of the same volume in flight.
        let _reserved = self.reserve_volume(ns, &names::context_claim(name));
        if self.get_volume(ns, name)?.is_none() {
            return Ok(false);
        }
        let claim = names::context_claim(name);
        remove_dir(&self.volume_dir(ns, &claim))
            .map_err(internal(format!("delete context PVC {ns}/{claim}")))?;
        self.notify();
        Ok(true)
    }
}

/// The context a volume holds, if it is a managed context volume.
pub(super) fn context_status(ns: &str, volume: &VolumeMeta) -> Option<ContextVolumeStatus> {
    let meta = &volume.meta;
    if meta.label(names::MANAGED_BY_LABEL) != Some(names::MANAGED_BY_VALUE) {
        return None;
    }
    let name = meta
        .label(names::CONTEXT_NAME_LABEL)
        .filter(|n| !n.is_empty())?;
    let context_type = ContextVolumeType::parse(meta.label(names::CONTEXT_TYPE_LABEL)?)?;
    Some(ContextVolumeStatus {
        name: name.to_owned(),
        namespace: ns.to_owned(),
        context_type,
        // A local volume is usable the moment it exists ("bound").
        phase: ContextVolumePhase::Ready,
        size: volume.size.clone(),
        access_mode: volume.access_mode.as_str().to_owned(),
        storage_class: volume.storage_class.clone(),
        claim_name: meta.name.clone(),
        owner_scope: meta
            .label(names::OWNER_LABEL)
            .unwrap_or_default()
            .to_owned(),
    })
}
