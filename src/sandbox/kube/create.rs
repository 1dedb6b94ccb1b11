//! Pool creation: a conflict check, then the strategy's PVCs, Sandboxes or
//! SandboxClaims, [`CREATES_IN_FLIGHT`] at once after the first object (the
//! anchor, which carries the completion mark); a failure half-way deletes
//! what this call made. The answer comes from the watch caches once they
//! saw the new objects.

use std::future::Future;
use std::ops::Range;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use futures::StreamExt;
use k8s_openapi::api::core::v1::PersistentVolumeClaim;
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::api::{Patch, PatchParams};
use kube::ResourceExt;

use crate::pool::model::{PoolSpec, PoolStatus, Strategy};
use crate::pool::{names, BackendError};

use super::backend::{
    background, create_error, delete_ignoring_missing, is_not_found, KubeBackend, DELETES_IN_FLIGHT,
};
use super::crd::{Sandbox, SandboxClaim, SandboxWarmPool};
use super::objects::{self, PoolMeta, StrategyKind, WorkspaceRecord, WorkspaceVolume};
use super::status::{self, PoolObjects};
use super::watch::{Created, Kind};

/// Objects of one pool created at once. A pool of 50 then takes a few round
/// trips instead of 50 to 150 in a row, and the API server sees a bounded
/// burst (the `kube` client itself has no client-side rate limit).
pub(super) const CREATES_IN_FLIGHT: usize = 16;

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
        let created = Created::default();
        let made = match self.create_objects(spec, &created).await {
            // The mark and the caches catching up in the same round trip.
            Ok(made) => {
                let (marked, seen) =
                    tokio::join!(self.mark_created(spec), self.caches_hold(spec, &created));
                marked.map(|()| (made, seen))
            }
            Err(error) => Err(error),
        };
        match made {
            Ok((made, seen)) => created_status(spec, made, seen),
            Err(error) => {
                let objects = created.objects();
                if !objects.is_empty() {
                    self.rollback(spec, &objects).await;
                }
                Err(error)
            }
        }
    }

    /// `AlreadyExists` when any managed claim, Sandbox or PVC carries the
    /// pool label, whatever its strategy or owner: names are global in the
    /// namespace.
    pub(super) async fn ensure_absent(&self, name: &str) -> Result<(), BackendError> {
        let (claims, sandboxes, pvcs) = self.list_pool_objects(name, Some(1)).await?;
        if claims.is_empty() && sandboxes.is_empty() && pvcs.is_empty() {
            Ok(())
        } else {
            Err(BackendError::AlreadyExists)
        }
    }

    /// Creates every object of `spec`, recording each in `created`; returns
    /// them as the API answered. The anchor (the first object, see
    /// [`objects::anchor`]) is made alone before any other, so that every
    /// object of a create that dies half-way is found through its mark.
    pub(super) async fn create_objects(
        &self,
        spec: &PoolSpec,
        created: &Created,
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
                // Both checks in one round trip; the claim's answer first.
                let (record, absent) = tokio::join!(
                    self.existing_claim(spec, claim_name),
                    self.ensure_absent(&spec.name)
                );
                let record = record?;
                absent?;
                let volume = WorkspaceVolume {
                    claim_name,
                    read_only: *read_only,
                };
                let make = |i| self.create_sandbox(&meta, i, volume, &record, created);
                let sandboxes = anchor_first(meta.replicas, make).await?;
                Ok(PoolObjects {
                    sandboxes,
                    ..PoolObjects::default()
                })
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
                let pvc = self.create_pvc(&meta, &pvc_name, &record, created).await?;
                self.await_bound(&pvc, self.bind_deadline()).await;
                let volume = WorkspaceVolume {
                    claim_name: &pvc_name,
                    read_only: false,
                };
                let make = |i| self.create_sandbox(&meta, i, volume, &record, created);
                let sandboxes = each_member(0..meta.replicas, make).await?;
                Ok(PoolObjects {
                    sandboxes,
                    pvcs: vec![pvc],
                    ..PoolObjects::default()
                })
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
                // Every PVC first (PVC 0, the anchor, alone), so the
                // provisioner works on all of them while the create waits;
                // then each replica's Sandbox once its PVC is bound (so no
                // sandbox pod meets an unbound volume), then the Sandbox as
                // the PVC's owner.
                let make_pvc = |i: u32| {
                    let (meta, record) = (&meta, &record);
                    async move {
                        let name = names::dedicated_workspace(meta.name, i);
                        self.create_pvc(meta, &name, record, created).await
                    }
                };
                let made_pvcs = anchor_first(meta.replicas, make_pvc).await?;
                let bind_by = self.bind_deadline();
                let replica = |i: u32| {
                    let (meta, record, made_pvcs) = (&meta, &record, &made_pvcs);
                    async move {
                        let name = names::dedicated_workspace(meta.name, i);
                        if let Some(pvc) = made_pvcs.get(i as usize) {
                            self.await_bound(pvc, bind_by).await;
                        }
                        let volume = WorkspaceVolume {
                            claim_name: &name,
                            read_only: false,
                        };
                        let sandbox = self
                            .create_sandbox(meta, i, volume, record, created)
                            .await?;
                        let pvc = self.set_pvc_owner(&name, &sandbox, i).await?;
                        Ok((sandbox, Arc::new(pvc)))
                    }
                };
                let (sandboxes, pvcs) = each_member(0..meta.replicas, replica)
                    .await?
                    .into_iter()
                    .unzip();
                Ok(PoolObjects {
                    sandboxes,
                    pvcs,
                    ..PoolObjects::default()
                })
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
        let done = Timestamp::now().to_string();
        match self.swap_mark(kind, &anchor, &done).await {
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
        created: &Created,
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

    /// Creates Sandbox `index` of the pool mounting `volume`.
    pub(super) async fn create_sandbox(
        &self,
        meta: &PoolMeta<'_>,
        index: u32,
        volume: WorkspaceVolume<'_>,
        record: &WorkspaceRecord,
        created: &Created,
    ) -> Result<Arc<Sandbox>, BackendError> {
        let sandbox = objects::sandbox(&self.settings, meta, index, volume, record);
        let made = self
            .api::<Sandbox>()
            .create(&self.post_params(), &sandbox)
            .await
            .map_err(|e| create_error(e, format!("create sandbox {index}")))?;
        created.push(Kind::Sandbox, made.name_any());
        Ok(Arc::new(made))
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
        created: &Created,
    ) -> Result<PoolObjects, BackendError> {
        // Both checks in one round trip; the warm pool's answer first.
        let warm_pools = self.api::<SandboxWarmPool>();
        let (found, absent) =
            tokio::join!(warm_pools.get_opt(warm_pool), self.ensure_absent(meta.name));
        let found = match found {
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
        absent?;
        let api = self.api::<SandboxClaim>();
        let now = Timestamp::now();
        let make = |i: u32| {
            let api = &api;
            async move {
                let claim = objects::sandbox_claim(&self.settings, meta, i, warm_pool, now);
                let made = api
                    .create(&self.post_params(), &claim)
                    .await
                    .map_err(|e| create_error(e, format!("create sandbox claim {i}")))?;
                created.push(Kind::Claim, made.name_any());
                Ok(Arc::new(made))
            }
        };
        Ok(PoolObjects {
            claims: anchor_first(meta.replicas, make).await?,
            ..PoolObjects::default()
        })
    }

    /// Deletes what a failed create made: claims, then Sandboxes, then
    /// PVCs, each kind [`DELETES_IN_FLIGHT`] at a time, the anchor last (a
    /// rollback cut short by the process dying leaves the pending mark, so a
    /// reaper finishes it). Best effort: a failure is logged and the rest
    /// still goes (the pool label lets a later delete finish the job).
    pub(super) async fn rollback(&self, spec: &PoolSpec, made: &[(Kind, String)]) {
        let pool = &spec.name;
        let anchor = objects::anchor(pool, StrategyKind::of(&spec.strategy));
        for kind in [Kind::Claim, Kind::Sandbox, Kind::Pvc] {
            let names = made
                .iter()
                .filter(|object| object.0 == kind && **object != anchor)
                .map(|(_, name)| name.as_str());
            futures::stream::iter(names)
                .for_each_concurrent(DELETES_IN_FLIGHT, |name| self.undo(pool, kind, name))
                .await;
        }
        if made.contains(&anchor) {
            self.undo(pool, anchor.0, &anchor.1).await;
        }
        tracing::info!(%pool, objects = made.len(), "rolled back a failed pool create");
    }

    /// Deletes one object a failed create made, logging a failure.
    async fn undo(&self, pool: &str, kind: Kind, name: &str) {
        let result = match kind {
            Kind::Claim => {
                delete_ignoring_missing(&self.api::<SandboxClaim>(), name, &background()).await
            }
            Kind::Sandbox => {
                delete_ignoring_missing(&self.api::<Sandbox>(), name, &background()).await
            }
            Kind::Pvc => {
                delete_ignoring_missing(&self.api::<PersistentVolumeClaim>(), name, &background())
                    .await
            }
        };
        if let Err(error) = result {
            tracing::warn!(%pool, ?kind, %name, %error, "rollback: delete failed");
        }
    }

    /// The objects of the pool from the caches once they hold every object
    /// of `created` (so an immediate `get` agrees with the answer); `None`
    /// when they do not within the cache sync timeout, or are not started.
    async fn caches_hold(&self, spec: &PoolSpec, created: &Created) -> Option<PoolObjects> {
        let (caches, _) = self.caches.get()?;
        let deadline = tokio::time::Instant::now() + self.settings.cache_sync_timeout;
        let seen = caches
            .first(deadline, |caches| caches.contains(created).then_some(()))
            .await;
        if seen.is_none() {
            tracing::warn!(pool = %spec.name, "watch caches lag behind a create");
            return None;
        }
        Some(caches.pool_objects(&spec.name))
    }
}

/// The status right after a create: from the caches' objects when they
/// caught up, else from the API's answers.
fn created_status(
    spec: &PoolSpec,
    made: PoolObjects,
    cached: Option<PoolObjects>,
) -> Result<PoolStatus, BackendError> {
    let objects = cached.unwrap_or(made);
    status::pool_status(&spec.name, &objects, true).ok_or_else(|| {
        BackendError::internal(
            format!("read sandbox pool {}", spec.name),
            "no objects after create",
        )
    })
}

/// Makes member 0 (the anchor) alone, then members `1..replicas` as
/// [`each_member`] does; answers all of them in index order.
async fn anchor_first<T, F, Fut>(replicas: u32, make: F) -> Result<Vec<T>, BackendError>
where
    F: Fn(u32) -> Fut,
    Fut: Future<Output = Result<T, BackendError>>,
{
    if replicas == 0 {
        return Ok(Vec::new());
    }
    let first = make(0).await?;
    let mut all = Vec::with_capacity(replicas as usize);
    all.push(first);
    all.extend(each_member(1..replicas, make).await?);
    Ok(all)
}

/// Runs `make(i)` for every member `i` of `members`, [`CREATES_IN_FLIGHT`]
/// at once, and answers the results in index order. After a failure no
/// further member starts, but those in flight run to their end: dropping a
/// request the API may already have carried out would leave an object the
/// rollback does not know of. The answer is then the failure of the lowest
/// index.
async fn each_member<T, F, Fut>(members: Range<u32>, make: F) -> Result<Vec<T>, BackendError>
where
    F: Fn(u32) -> Fut,
    Fut: Future<Output = Result<T, BackendError>>,
{
    let failed = AtomicBool::new(false);
    let (failed, make) = (&failed, &make);
    let mut done: Vec<(u32, Option<Result<T, BackendError>>)> = futures::stream::iter(members)
        .map(|i| async move {
            if failed.load(Ordering::Acquire) {
                return (i, None);
            }
            let result = make(i).await;
            if result.is_err() {
                failed.store(true, Ordering::Release);
            }
            (i, Some(result))
        })
        .buffer_unordered(CREATES_IN_FLIGHT)
        .collect()
        .await;
    done.sort_unstable_by_key(|(i, _)| *i);
    let mut made = Vec::with_capacity(done.len());
    let mut first_failure = None;
    for (_, result) in done {
        match result {
            Some(Ok(value)) => made.push(value),
            Some(Err(error)) => {
                first_failure.get_or_insert(error);
            }
            None => {}
        }
    }
    match first_failure {
        Some(error) => Err(error),
        None => Ok(made),
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
