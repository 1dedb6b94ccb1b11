//! Volumes bound before their sandboxes: on a storage class that binds
//! `Immediate`ly, a sandbox pod that reaches the scheduler before its PVC is
//! bound fails scheduling ("pod has unbound immediate
//! PersistentVolumeClaims") and is retried with backoff (1 s, 2 s, … 10 s):
//! the multi-second tails of concurrent creates. So a create waits until a
//! workspace PVC is `Bound` before it makes the Sandboxes that mount it.
//!
//! Only on such classes: a `WaitForFirstConsumer` class binds after the
//! scheduler picked a node for the first pod, so waiting there would never
//! end; the scheduler handles those pods without a failed attempt. A class
//! whose mode cannot be read (no RBAC for StorageClasses, no class at all)
//! is not waited for, as before.

use k8s_openapi::api::core::v1::PersistentVolumeClaim;
use k8s_openapi::api::storage::v1::StorageClass;
use kube::runtime::reflector::ObjectRef;
use kube::Api;
use tokio::time::Instant;

use super::backend::{is_not_found, BindingMode, KubeBackend};

impl BindingMode {
    /// The mode a StorageClass declares; Kubernetes' default is `Immediate`.
    fn of(class: &StorageClass) -> Self {
        match class.volume_binding_mode.as_deref() {
            None | Some("Immediate") => BindingMode::Immediate,
            Some("WaitForFirstConsumer") => BindingMode::WaitForFirstConsumer,
            Some(_) => BindingMode::Unknown,
        }
    }
}

impl KubeBackend {
    /// Until when a create that made its PVCs now waits for them to bind:
    /// one deadline for all of them, so a create outlasts the settings'
    /// `volume_bind_timeout` at most once, however many PVCs it has.
    pub(super) fn bind_deadline(&self) -> Instant {
        Instant::now() + self.settings.volume_bind_timeout
    }

    /// Waits until the workspace PVC `made` (as the API answered its
    /// create, with the default class filled in) is `Bound`, if its class
    /// binds immediately; at most until `deadline`, after which the
    /// Sandboxes are made anyway (a pod then waits for the volume as it
    /// would have without the wait).
    pub(super) async fn await_bound(&self, made: &PersistentVolumeClaim, deadline: Instant) {
        let Some(name) = made.metadata.name.as_deref() else {
            return;
        };
        if self.settings.volume_bind_timeout.is_zero() || is_bound(made) {
            return;
        }
        // Bindings are seen through the watch caches (none: nothing to see).
        let Some((caches, _)) = self.caches.get() else {
            return;
        };
        let class = made
            .spec
            .as_ref()
            .and_then(|spec| spec.storage_class_name.as_deref());
        if self.binding_mode(class).await != BindingMode::Immediate {
            return;
        }
        let key = ObjectRef::new(name).within(&self.settings.namespace);
        let bound = caches
            .first(deadline, |caches| {
                caches.pvc(&key).filter(|pvc| is_bound(pvc)).map(|_| ())
            })
            .await;
        if bound.is_none() {
            tracing::warn!(
                pvc = %name,
                timeout = ?self.settings.volume_bind_timeout,
                "workspace PVC not seen bound in time; creating its sandboxes anyway"
            );
        }
    }

    /// The binding mode of storage class `class` (`None`: the claim has
    /// none, not even a default).
    async fn binding_mode(&self, class: Option<&str>) -> BindingMode {
        let Some(class) = class.filter(|class| !class.is_empty()) else {
            return BindingMode::Unknown;
        };
        if let Some(mode) = self.binding_modes.get(class) {
            return mode;
        }
        let mode = match Api::<StorageClass>::all(self.client.clone())
            .get(class)
            .await
        {
            Ok(found) => BindingMode::of(&found),
            Err(error) if is_not_found(&error) => BindingMode::Unknown,
            Err(kube::Error::Api(status)) if status.code == 401 || status.code == 403 => {
                tracing::warn!(
                    storage_class = %class,
                    "may not read the storage class (RBAC: get storageclasses); \
                     sandboxes will not wait for their volumes to bind"
                );
                BindingMode::Unknown
            }
            Err(error) => {
                // Transient: don't wait this time, ask again next time.
                tracing::warn!(storage_class = %class, %error, "reading the storage class failed");
                return BindingMode::Unknown;
            }
        };
        self.binding_modes.insert(class, mode);
        mode
    }
}

/// Whether `pvc` is bound to a volume.
fn is_bound(pvc: &PersistentVolumeClaim) -> bool {
    pvc.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Bound")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn class(mode: Option<&str>) -> StorageClass {
        StorageClass {
            provisioner: "example.com/p".to_owned(),
            volume_binding_mode: mode.map(str::to_owned),
            ..StorageClass::default()
        }
    }

    #[test]
    fn a_class_without_a_mode_binds_immediately() {
        assert_eq!(BindingMode::of(&class(None)), BindingMode::Immediate);
        assert_eq!(
            BindingMode::of(&class(Some("Immediate"))),
            BindingMode::Immediate
        );
        assert_eq!(
            BindingMode::of(&class(Some("WaitForFirstConsumer"))),
            BindingMode::WaitForFirstConsumer
        );
        assert_eq!(
            BindingMode::of(&class(Some("Someday"))),
            BindingMode::Unknown
        );
    }
}
