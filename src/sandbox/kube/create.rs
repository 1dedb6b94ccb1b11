//! Pool creation: a conflict check, then the strategy's PVCs, Sandboxes or
//! SandboxClaims; a failure half-way deletes what this call made. The
//! answer comes from the watch caches once they saw the new objects.

use std::sync::Arc;

use k8s_openapi::api::core::v1::PersistentVolumeClaim;
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::api::{Patch, PatchParams};
use kube::ResourceExt;

use crate::pool::model::{PoolSpec, PoolStatus, Strategy};
use crate::pool::{names, BackendError};

use super::backend::{
    background, create_error, delete_ignoring_missing, is_not_found, KubeBackend,
};
use super::crd::{Sandbox, SandboxClaim, SandboxWarmPool};
use super::objects::{self, PoolMeta, StrategyKind, WorkspaceRecord, WorkspaceVolume};
use super::status::{self, PoolObjects};
use super::watch::{Created, Kind};

impl KubeBackend {
    /// Creates every object of `spec`, then marks the create complete on
    /// its first object (one patch); on a failure half-way, deletes what
    /// this call made. A create whose process dies before the mark is
    /// deleted by the reaper of any replica once its window has passed
    /// (`abandoned`).
    pub(super) async fn create(&self, spec: &PoolSpec) -> Result<PoolStatus, BackendError> {
        // A concurrent create of the same name in this process is a conflict;
        // across processes the pre-check and the API's 409 catch it.
        let Some(_creating) = self.creating.begin(&spec.name) else {
            return Err(BackendError::AlreadyExists);
        };
        let mut created = Created::default();
        let made = match self.create_objects(spec, &mut created).await {
            Ok(made) => self.mark_created(spec).await.map(|()| made),
            Err(error) => Err(error),
        };
        match made {
            Ok(made) => self.created_status(spec, &created, made).await,
            Err(error) => {
                if !created.objects.is_empty() {
                    self.rollback(&spec.name, &created).await;
                }
                Err(error)
            }
        }
    }

    /// `AlreadyExists` when any managed claim, Sandbox or PVC carries the
    /// pool label, whatever its strategy or owner: names are global in the
    /// namespace.
    pub(super) async fn ensure_absent(&self, name: &str) -> Result<(), BackendError> {
        let selector = objects::managed_pool_selector(name);
        let claims = self
            .list_or_empty::<SandboxClaim>(&selector, Some(1))
            .await
            .map_err(|e| BackendError::internal("list sandbox claims", e))?;
        let sandboxes = self
            .list_or_empty::<Sandbox>(&selector, Some(1))
            .await
            .map_err(|e| BackendError::internal("list sandboxes", e))?;
        let pvcs = self
            .list_or_empty::<PersistentVolumeClaim>(&selector, Some(1))
            .await
            .map_err(|e| BackendError::internal("list workspace PVCs", e))?;
        if claims.is_empty() && sandboxes.is_empty() && pvcs.is_empty() {
            Ok(())
        } else {
            Err(BackendError::AlreadyExists)
        }
    }

    /// Creates every object of `spec`, recording each in `created`; returns
    /// them as the API answered.
    pub(super) async fn create_objects(
        &self,
        spec: &PoolSpec,
        created: &mut Created,
    ) -> Result<PoolObjects, BackendError> {
        let window =
            SignedDuration::try_from(self.settings.create_window).unwrap_or(SignedDuration::MAX);
        let meta = PoolMeta {
            creating_until: Timestamp::now().checked_add(window).ok(),
            ..PoolMeta::from(spec)
        };
        match &spec.strategy {
            Strategy::Warm { pool } => self.create_claims(&meta, pool, created).await,
            Strategy::Existing {
                claim_name,
                read_only,
            } => {
                let record = self.existing_claim(spec, claim_name).await?;
                self.ensure_absent(&spec.name).await?;
                let volume = WorkspaceVolume {
                    claim_name,
                    read_only: *read_only,
                };
                self.create_sandboxes(&meta, |_| volume, &record, None, created)
                    .await
            }
            Strategy::Shared {
                size,
                storage_class,
            } => {
                self.ensure_absent(&spec.name).await?;
                let record = WorkspaceRecord {
                    size: size.clone(),
                    access_mode: "ReadWriteMany".to_string(),
                    storage_class: storage_class.clone(),
                };
                let pvc_name = names::shared_workspace(&spec.name);
                let pvcs = vec![self.create_pvc(&meta, &pvc_name, &record, created).await?];
                let volume = WorkspaceVolume {
                    claim_name: &pvc_name,
                    read_only: false,
                };
                let mut made = self
                    .create_sandboxes(&meta, |_| volume, &record, None, created)
                    .await?;
                made.pvcs = pvcs;
                Ok(made)
            }
            Strategy::Dedicated {
                size,
                storage_class,
            } => {
                self.ensure_absent(&spec.name).await?;
                let record = WorkspaceRecord {
                    size: size.clone(),
                    access_mode: "ReadWriteOnce".to_string(),
                    storage_class: storage_class.clone(),
                };
                let names: Vec<String> = (0..spec.replicas)
                    .map(|i| names::dedicated_workspace(&spec.name, i))
                    .collect();
                // PVCs first, so no sandbox pod ever waits on a missing
                // volume; each gets its Sandbox as owner right after that
                // Sandbox exists.
                let mut pvcs = Vec::with_capacity(names.len());
                for pvc_name in &names {
                    pvcs.push(self.create_pvc(&meta, pvc_name, &record, created).await?);
                }
                let volume = |i: u32| WorkspaceVolume {
                    claim_name: names[i as usize].as_str(),
                    read_only: false,
                };
                let mut made = self
                    .create_sandboxes(&meta, volume, &record, Some(&mut pvcs), created)
                    .await?;
                made.pvcs = pvcs;
                Ok(made)
            }
        }
    }

    /// Marks the create of `spec` complete: its anchor's mark goes from
    /// pending to done. Fails if a reaper took the create for abandoned
    /// first (it ran past its window), so the create then rolls back
    /// rather than leaving a pool the reaper is deleting.
    async fn mark_created(&self, spec: &PoolSpec) -> Result<(), BackendError> {
        let (kind, anchor) = objects::anchor(&spec.name, StrategyKind::of(&spec.strategy));
        let context = format!("mark the create of sandbox pool {} complete", spec.name);
        match self.swap_mark(kind, &anchor, names::CREATED_DONE).await {
            Ok(true) => Ok(()),
            Ok(false) => Err(BackendError::internal(
                context,
                format!("{anchor} is no longer pending: the create ran past its window and was taken for abandoned"),
            )),
            Err(error) => Err(BackendError::internal(context, error)),
        }
    }

    /// The caller's existing PVC, checked as upstream: it must exist (a
    /// managed volume of another owner counts as missing) and support RWX
    /// for several replicas. Returns what status reports about it.
    pub(super) async fn existing_claim(
        &self,
        spec: &PoolSpec,
        claim_name: &str,
    ) -> Result<WorkspaceRecord, BackendError> {
        let pvc = self
            .api::<PersistentVolumeClaim>()
            .get_opt(claim_name)
            .await
            .map_err(|e| BackendError::internal("get workspace claim", e))?
            .filter(|pvc| visible_to(pvc.labels(), &spec.owner_scope))
            .ok_or_else(|| {
                BackendError::Invalid(format!("workspace claim {claim_name:?} not found"))
            })?;
        let pvc_spec = pvc.spec.unwrap_or_default();
        let modes = pvc_spec.access_modes.unwrap_or_default();
        if spec.replicas > 1 && !modes.iter().any(|mode| mode == "ReadWriteMany") {
            return Err(BackendError::Invalid(format!(
                "workspace claim {claim_name:?} must support ReadWriteMany for multiple sandboxes"
            )));
        }
        Ok(WorkspaceRecord {
            size: pvc_spec
                .resources
                .and_then(|resources| resources.requests)
                .and_then(|requests| requests.get("storage").map(|q| q.0.clone()))
                .unwrap_or_default(),
            access_mode: modes.first().cloned().unwrap_or_default(),
            storage_class: pvc_spec.storage_class_name,
        })
    }

    pub(super) async fn create_pvc(
        &self,
        meta: &PoolMeta<'_>,
        name: &str,
        record: &WorkspaceRecord,
        created: &mut Created,
    ) -> Result<Arc<PersistentVolumeClaim>, BackendError> {
        let pvc = objects::workspace_pvc(
            &self.settings,
            meta,
            name,
            &record.size,
            &record.access_mode,
            record.storage_class.as_deref(),
        );
        let made = self
            .api::<PersistentVolumeClaim>()
            .create(&self.post_params(), &pvc)
            .await
            .map_err(|e| create_error(e, format!("create workspace PVC {name}")))?;
        created.push(Kind::Pvc, name);
        Ok(Arc::new(made))
    }

    /// Creates Sandboxes `0..replicas` mounting `volume(i)`. With
    /// `owned_pvcs` (dedicated), PVC `i` gets Sandbox `i` as owner.
    pub(super) async fn create_sandboxes<'v>(
        &self,
        meta: &PoolMeta<'_>,
        volume: impl Fn(u32) -> WorkspaceVolume<'v>,
        record: &WorkspaceRecord,
        mut owned_pvcs: Option<&mut Vec<Arc<PersistentVolumeClaim>>>,
        created: &mut Created,
    ) -> Result<PoolObjects, BackendError> {
        let api = self.api::<Sandbox>();
        let mut sandboxes = Vec::with_capacity(meta.replicas as usize);
        for i in 0..meta.replicas {
            let sandbox = objects::sandbox(&self.settings, meta, i, volume(i), record);
            let made = api
                .create(&self.post_params(), &sandbox)
                .await
                .map_err(|e| create_error(e, format!("create sandbox {i}")))?;
            created.push(Kind::Sandbox, made.name_any());
            if let Some(pvcs) = owned_pvcs.as_deref_mut() {
                let slot = pvcs.get_mut(i as usize).ok_or_else(|| {
                    BackendError::internal(
                        format!("own workspace PVC {i}"),
                        "no PVC for this sandbox",
                    )
                })?;
                *slot = Arc::new(self.set_pvc_owner(&slot.name_any(), &made, i).await?);
            }
            sandboxes.push(Arc::new(made));
        }
        Ok(PoolObjects {
            sandboxes,
            ..PoolObjects::default()
        })
    }

    /// Adds `owner` to the PVC `name` by server-side apply, so the garbage
    /// collector removes the PVC with its Sandbox.
    pub(super) async fn set_pvc_owner(
        &self,
        name: &str,
        owner: &Sandbox,
        index: u32,
    ) -> Result<PersistentVolumeClaim, BackendError> {
        let context = format!("set owner of workspace PVC {name}");
        let reference = objects::sandbox_owner_reference(owner).ok_or_else(|| {
            BackendError::internal(context.clone(), format!("sandbox {index} has no uid"))
        })?;
        let patch = objects::pvc_owner_patch(&self.settings.namespace, name, reference);
        self.api::<PersistentVolumeClaim>()
            .patch(
                name,
                &PatchParams::apply(&self.settings.field_manager),
                &Patch::Apply(&patch),
            )
            .await
            .map_err(|e| BackendError::internal(context, e))
    }

    /// Warm strategy: the warm pool must exist; then one claim per replica.
    pub(super) async fn create_claims(
        &self,
        meta: &PoolMeta<'_>,
        warm_pool: &str,
        created: &mut Created,
    ) -> Result<PoolObjects, BackendError> {
        let found = match self.api::<SandboxWarmPool>().get_opt(warm_pool).await {
            Ok(found) => found,
            // A missing CRD is a missing pool too, as upstream.
            Err(error) if is_not_found(&error) => None,
            Err(error) => return Err(BackendError::internal("get warm pool", error)),
        };
        if found.is_none() {
            return Err(BackendError::Invalid(format!(
                "warm pool {warm_pool:?} not found"
            )));
        }
        self.ensure_absent(meta.name).await?;
        let api = self.api::<SandboxClaim>();
        let now = Timestamp::now();
        let mut claims = Vec::with_capacity(meta.replicas as usize);
        for i in 0..meta.replicas {
            let claim = objects::sandbox_claim(&self.settings, meta, i, warm_pool, now);
            let made = api
                .create(&self.post_params(), &claim)
                .await
                .map_err(|e| create_error(e, format!("create sandbox claim {i}")))?;
            created.push(Kind::Claim, made.name_any());
            claims.push(Arc::new(made));
        }
        Ok(PoolObjects {
            claims,
            ..PoolObjects::default()
        })
    }

    /// Deletes what a failed create made, newest first. Best effort: a
    /// failure is logged and the rest still goes (the pool label lets a
    /// later delete finish the job).
    pub(super) async fn rollback(&self, pool: &str, created: &Created) {
        for (kind, name) in created.objects.iter().rev() {
            let result = match kind {
                Kind::Claim => {
                    delete_ignoring_missing(&self.api::<SandboxClaim>(), name, &background()).await
                }
                Kind::Sandbox => {
                    delete_ignoring_missing(&self.api::<Sandbox>(), name, &background()).await
                }
                Kind::Pvc => {
                    delete_ignoring_missing(
                        &self.api::<PersistentVolumeClaim>(),
                        name,
                        &background(),
                    )
                    .await
                }
            };
            if let Err(error) = result {
                tracing::warn!(%pool, ?kind, %name, %error, "rollback: delete failed");
            }
        }
        tracing::info!(%pool, objects = created.objects.len(), "rolled back a failed pool create");
    }

    /// The status right after a create: from the caches once they saw every
    /// new object (so an immediate `get` agrees), else from the API answers.
    pub(super) async fn created_status(
        &self,
        spec: &PoolSpec,
        created: &Created,
        made: PoolObjects,
    ) -> Result<PoolStatus, BackendError> {
        let objects = match self.caches.get() {
            Some((caches, _)) => {
                let mut changes = caches.subscribe();
                let seen = tokio::time::timeout(self.settings.cache_sync_timeout, async {
                    loop {
                        changes.borrow_and_update();
                        if caches.contains(created) {
                            return true;
                        }
                        if changes.changed().await.is_err() {
                            return false;
                        }
                    }
                })
                .await
                .unwrap_or(false);
                if seen {
                    caches.pool_objects(&spec.name)
                } else {
                    tracing::warn!(pool = %spec.name, "watch caches lag behind a create");
                    made
                }
            }
            None => made,
        };
        status::pool_status(&spec.name, &objects, true).ok_or_else(|| {
            BackendError::internal(
                format!("read sandbox pool {}", spec.name),
                "no objects after create",
            )
        })
    }
}

/// Whether a PVC with `labels` may be mounted by `owner`: anything not
/// managed by this service, and managed volumes of that owner (or made by
/// the Go prototype, which recorded no owner).
fn visible_to(labels: &std::collections::BTreeMap<String, String>, owner: &str) -> bool {
    let managed =
        labels.get(names::MANAGED_BY_LABEL).map(String::as_str) == Some(names::MANAGED_BY_VALUE);
    match labels.get(names::OWNER_LABEL) {
        Some(recorded) if managed => recorded == owner,
        _ => true,
    }
}
