//! [`KubeBackend`]: the [`SandboxBackend`] over a Kubernetes API with the
//! agent-sandbox controller.
//!
//! Writes go straight to the API (create, server-side apply, delete); pool
//! reads come from the watch caches in [`super::watch`].

use std::collections::HashSet;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use k8s_openapi::api::core::v1::PersistentVolumeClaim;
use k8s_openapi::jiff::Timestamp;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::{Api, Client, Resource, ResourceExt};
use serde::de::DeserializeOwned;

use crate::pool::model::{
    ContextPhase, ContextSpec, ContextStatus, ContextType, PoolSpec, PoolStatus, Strategy,
};
use crate::pool::{names, BackendError, SandboxBackend};

use super::crd::{Sandbox, SandboxClaim, SandboxWarmPool};
use super::objects::{self, PoolMeta, WorkspaceRecord, WorkspaceVolume};
use super::settings::KubeSettings;
use super::status::{self, PoolObjects};
use super::watch::{self, CacheError, Caches, Created, Kind, Watchers};

/// Why a [`KubeBackend`] cannot be built.
#[derive(Debug, thiserror::Error)]
pub enum KubeBackendError {
    /// A required setting is empty.
    #[error("kube backend setting {0} must not be empty")]
    EmptySetting(&'static str),
    /// No kubeconfig or in-cluster configuration could be loaded.
    #[error("loading the Kubernetes client configuration")]
    Client(#[source] kube::Error),
}

/// Pools and named contexts as agent-sandbox objects in one namespace.
///
/// Build it with [`KubeBackend::new`] (or [`KubeBackend::try_default`]),
/// then call [`KubeBackend::start_watchers`] once inside a Tokio runtime:
/// pool reads (`get_pool`, `list_pools`, `wait_pool`) are answered from the
/// watch caches and fail until they are started.
///
/// ```no_run
/// # async fn demo() -> anyhow::Result<()> {
/// use std::time::Duration;
/// use context_service::sandbox::kube::{KubeBackend, KubeSettings};
/// use context_service::pool::SandboxBackend;
/// use context_service::pool::{PoolSpec, Strategy};
///
/// let client = kube::Client::try_default().await?; // KUBECONFIG or in-cluster
/// let settings = KubeSettings::new("e2e-pools", "busybox:1.36");
/// let backend = KubeBackend::new(client, settings)?;
/// backend.start_watchers();
/// backend.wait_synced(Duration::from_secs(30)).await?;
/// let spec = PoolSpec {
///     name: "review".into(),
///     replicas: 2,
///     strategy: Strategy::Shared { size: "1Gi".into(), storage_class: None },
///     owner_scope: "0123456789abcdef0123456789abcdef".into(),
/// };
/// backend.create_pool(&spec).await?;
/// let status = backend.wait_pool("review", Duration::from_secs(120)).await?;
/// backend.delete_pool("review").await?;
/// # let _ = status;
/// # Ok(())
/// # }
/// ```
pub struct KubeBackend {
    client: Client,
    settings: Arc<KubeSettings>,
    creating: InFlight,
    caches: OnceLock<(Caches, Watchers)>,
}

impl std::fmt::Debug for KubeBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KubeBackend")
            .field("settings", &self.settings)
            .field("watching", &self.caches.get().is_some())
            .finish_non_exhaustive()
    }
}

impl KubeBackend {
    /// A backend talking through `client` with `settings`. Starts nothing.
    pub fn new(client: Client, settings: KubeSettings) -> Result<Self, KubeBackendError> {
        for (name, value) in [
            ("namespace", &settings.namespace),
            ("field manager", &settings.field_manager),
            ("sandbox image", &settings.sandbox_image),
        ] {
            if value.trim().is_empty() {
                return Err(KubeBackendError::EmptySetting(name));
            }
        }
        Ok(Self {
            client,
            settings: Arc::new(settings),
            creating: InFlight::default(),
            caches: OnceLock::new(),
        })
    }

    /// A backend with the in-cluster configuration or the kubeconfig
    /// (`KUBECONFIG`, `~/.kube/config`), as `kube::Client::try_default` finds it.
    pub async fn try_default(settings: KubeSettings) -> Result<Self, KubeBackendError> {
        let client = Client::try_default()
            .await
            .map_err(KubeBackendError::Client)?;
        Self::new(client, settings)
    }

    /// Starts the watch caches (once; later calls do nothing). Must run
    /// inside a Tokio runtime; the watchers stop when the backend is dropped.
    pub fn start_watchers(&self) {
        self.caches
            .get_or_init(|| watch::start(&self.client, &self.settings.namespace));
    }

    /// Waits until the watch caches completed their first list, at most
    /// `timeout` (for start-up and readiness checks).
    pub async fn wait_synced(&self, timeout: Duration) -> Result<(), BackendError> {
        self.caches()?
            .synced(timeout)
            .await
            .map_err(|e| BackendError::internal("sync watch caches", e))
    }

    /// Checks that the API server answers (for `/readyz`).
    pub async fn check_api(&self) -> Result<(), BackendError> {
        self.client
            .apiserver_version()
            .await
            .map(|_| ())
            .map_err(|e| BackendError::internal("reach the Kubernetes API", e))
    }

    /// The settings in use.
    pub fn settings(&self) -> &KubeSettings {
        &self.settings
    }

    /// The Kubernetes client (e.g. for exec into sandbox pods).
    pub fn client(&self) -> &Client {
        &self.client
    }

    fn caches(&self) -> Result<&Caches, BackendError> {
        self.caches
            .get()
            .map(|(caches, _)| caches)
            .ok_or_else(|| BackendError::internal("read pools", CacheError::NotStarted))
    }

    /// Caches that have completed their first list.
    async fn synced_caches(&self) -> Result<&Caches, BackendError> {
        let caches = self.caches()?;
        caches
            .synced(self.settings.initial_sync_timeout)
            .await
            .map_err(|e| BackendError::internal("read pools", e))?;
        Ok(caches)
    }

    fn api<K>(&self) -> Api<K>
    where
        K: Resource<Scope = k8s_openapi::NamespaceResourceScope, DynamicType = ()>,
    {
        Api::namespaced(self.client.clone(), &self.settings.namespace)
    }

    fn post_params(&self) -> PostParams {
        PostParams {
            dry_run: false,
            field_manager: Some(self.settings.field_manager.clone()),
        }
    }

    /// `AlreadyExists` when any managed claim, Sandbox or PVC carries the
    /// pool label, whatever its strategy or owner: names are global in the
    /// namespace.
    async fn ensure_absent(&self, name: &str) -> Result<(), BackendError> {
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

    /// Lists `K` in the namespace by label; a missing resource type (CRD not
    /// installed) counts as no objects, as upstream.
    async fn list_or_empty<K>(
        &self,
        selector: &str,
        limit: Option<u32>,
    ) -> Result<Vec<K>, kube::Error>
    where
        K: Resource<Scope = k8s_openapi::NamespaceResourceScope, DynamicType = ()>
            + Clone
            + DeserializeOwned
            + std::fmt::Debug,
    {
        let mut params = ListParams::default().labels(selector);
        if let Some(limit) = limit {
            params = params.limit(limit);
        }
        match self.api::<K>().list(&params).await {
            Ok(list) => Ok(list.items),
            Err(error) if is_not_found(&error) => Ok(Vec::new()),
            Err(error) => Err(error),
        }
    }

    /// Creates every object of `spec`, recording each in `created`; returns
    /// them as the API answered.
    async fn create_objects(
        &self,
        spec: &PoolSpec,
        created: &mut Created,
    ) -> Result<PoolObjects, BackendError> {
        let meta = PoolMeta::from(spec);
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

    /// The caller's existing PVC, checked as upstream: it must exist (a
    /// managed volume of another owner counts as missing) and support RWX
    /// for several replicas. Returns what status reports about it.
    async fn existing_claim(
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

    async fn create_pvc(
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
    async fn create_sandboxes<'v>(
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
    async fn set_pvc_owner(
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
    async fn create_claims(
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
    async fn rollback(&self, pool: &str, created: &Created) {
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
    async fn created_status(
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

    fn context_status(&self, pvc: &PersistentVolumeClaim) -> Option<ContextStatus> {
        let labels = pvc.labels();
        if labels.get(names::MANAGED_BY_LABEL).map(String::as_str) != Some(names::MANAGED_BY_VALUE)
        {
            return None;
        }
        let name = labels
            .get(names::CONTEXT_NAME_LABEL)
            .filter(|n| !n.is_empty())?;
        let context_type = ContextType::parse(labels.get(names::CONTEXT_TYPE_LABEL)?)?;
        let spec = pvc.spec.as_ref();
        let bound = pvc.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Bound");
        Some(ContextStatus {
            name: name.clone(),
            namespace: pvc.namespace().unwrap_or_default(),
            context_type,
            phase: if bound {
                ContextPhase::Ready
            } else {
                ContextPhase::Provisioning
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

    /// The managed context PVC `context-<name>` in `namespace`, if it is one.
    async fn context_pvc(
        &self,
        namespace: &str,
        name: &str,
    ) -> Result<Option<ContextStatus>, BackendError> {
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
}

#[async_trait::async_trait]
impl SandboxBackend for KubeBackend {
    async fn check_ready(&self) -> Result<(), BackendError> {
        self.check_api().await
    }

    async fn create_pool(&self, spec: &PoolSpec) -> Result<PoolStatus, BackendError> {
        // A concurrent create of the same name in this process is a conflict;
        // across processes the pre-check and the API's 409 catch it.
        let Some(_creating) = self.creating.begin(&spec.name) else {
            return Err(BackendError::AlreadyExists);
        };
        let mut created = Created::default();
        match self.create_objects(spec, &mut created).await {
            Ok(made) => self.created_status(spec, &created, made).await,
            Err(error) => {
                if !created.objects.is_empty() {
                    self.rollback(&spec.name, &created).await;
                }
                Err(error)
            }
        }
    }

    async fn get_pool(&self, name: &str) -> Result<Option<PoolStatus>, BackendError> {
        let caches = self.synced_caches().await?;
        Ok(status::pool_status(
            name,
            &caches.pool_objects(name),
            self.creating.contains(name),
        ))
    }

    async fn list_pools(&self) -> Result<Vec<PoolStatus>, BackendError> {
        let caches = self.synced_caches().await?;
        Ok(caches
            .pool_names()
            .into_iter()
            .filter_map(|name| {
                status::pool_status(
                    &name,
                    &caches.pool_objects(&name),
                    self.creating.contains(&name),
                )
            })
            .collect())
    }

    async fn delete_pool(&self, name: &str) -> Result<bool, BackendError> {
        // Listed from the API, not the caches: a pool created a moment ago
        // must not survive its delete.
        let selector = objects::managed_pool_selector(name);
        let claims = self
            .list_or_empty::<SandboxClaim>(&selector, None)
            .await
            .map_err(|e| BackendError::internal("list sandbox claims", e))?;
        let sandboxes = self
            .list_or_empty::<Sandbox>(&selector, None)
            .await
            .map_err(|e| BackendError::internal("list sandboxes", e))?;
        let pvcs = self
            .list_or_empty::<PersistentVolumeClaim>(&selector, None)
            .await
            .map_err(|e| BackendError::internal("list workspace PVCs", e))?;
        if claims.is_empty() && sandboxes.is_empty() && pvcs.is_empty() {
            return Ok(false);
        }
        // Claims in the foreground, as upstream: the claim stays visible
        // until its Sandbox and Pod are gone, so the pool does not look
        // released while its sandboxes still run.
        let claim_api = self.api::<SandboxClaim>();
        for claim in &claims {
            let claim_name = claim.name_any();
            delete_ignoring_missing(&claim_api, &claim_name, &DeleteParams::foreground())
                .await
                .map_err(|e| {
                    BackendError::internal(format!("delete sandbox claim {claim_name}"), e)
                })?;
        }
        let sandbox_api = self.api::<Sandbox>();
        for sandbox in &sandboxes {
            let sandbox_name = sandbox.name_any();
            delete_ignoring_missing(&sandbox_api, &sandbox_name, &background())
                .await
                .map_err(|e| BackendError::internal(format!("delete sandbox {sandbox_name}"), e))?;
        }
        // Only PVCs with our pool and managed-by labels: never the caller's
        // existing claim, which carries neither.
        let pvc_api = self.api::<PersistentVolumeClaim>();
        for pvc in &pvcs {
            let pvc_name = pvc.name_any();
            delete_ignoring_missing(&pvc_api, &pvc_name, &background())
                .await
                .map_err(|e| {
                    BackendError::internal(format!("delete workspace PVC {pvc_name}"), e)
                })?;
        }
        tracing::info!(
            pool = %name,
            claims = claims.len(),
            sandboxes = sandboxes.len(),
            pvcs = pvcs.len(),
            "sandbox pool deleted"
        );
        Ok(true)
    }

    async fn wait_pool(
        &self,
        name: &str,
        timeout: Duration,
    ) -> Result<Option<PoolStatus>, BackendError> {
        let caches = self.synced_caches().await?;
        let mut changes = caches.subscribe();
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            // Mark the current generation seen before reading, so a change
            // between the read and the wait is not missed.
            changes.borrow_and_update();
            let current = status::pool_status(
                name,
                &caches.pool_objects(name),
                self.creating.contains(name),
            );
            match &current {
                None => return Ok(None),
                Some(status) if status.phase.is_settled() => return Ok(current),
                Some(_) => {}
            }
            match tokio::time::timeout_at(deadline, changes.changed()).await {
                Err(_elapsed) => return Ok(current),
                Ok(Ok(())) => {}
                Ok(Err(_closed)) => {
                    return Err(BackendError::internal(
                        format!("wait for sandbox pool {name}"),
                        "the watchers stopped",
                    ))
                }
            }
        }
    }

    async fn create_context(&self, spec: &ContextSpec) -> Result<ContextStatus, BackendError> {
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

    async fn get_context(
        &self,
        namespace: &str,
        name: &str,
    ) -> Result<Option<ContextStatus>, BackendError> {
        self.context_pvc(namespace, name).await
    }

    async fn list_contexts(&self, namespace: &str) -> Result<Vec<ContextStatus>, BackendError> {
        let api: Api<PersistentVolumeClaim> = Api::namespaced(self.client.clone(), namespace);
        let list = api
            .list(&ListParams::default().labels(&objects::managed_selector()))
            .await
            .map_err(|e| BackendError::internal("list context PVCs", e))?;
        let mut contexts: Vec<ContextStatus> = list
            .items
            .iter()
            .filter(|pvc| pvc.name_any() == names::context_claim(&context_label(pvc)))
            .filter_map(|pvc| self.context_status(pvc))
            .collect();
        contexts.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(contexts)
    }

    async fn delete_context(&self, namespace: &str, name: &str) -> Result<bool, BackendError> {
        if self.context_pvc(namespace, name).await?.is_none() {
            return Ok(false);
        }
        let api: Api<PersistentVolumeClaim> = Api::namespaced(self.client.clone(), namespace);
        delete_ignoring_missing(&api, &names::context_claim(name), &background())
            .await
            .map_err(|e| BackendError::internal("delete context PVC", e))?;
        Ok(true)
    }
}

/// The context-name label of a PVC, or empty.
fn context_label(pvc: &PersistentVolumeClaim) -> String {
    pvc.labels()
        .get(names::CONTEXT_NAME_LABEL)
        .cloned()
        .unwrap_or_default()
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

/// Background propagation: the garbage collector removes dependents.
fn background() -> DeleteParams {
    DeleteParams::background()
}

/// Deletes `name`; a missing object is fine (deletes are idempotent).
async fn delete_ignoring_missing<K>(
    api: &Api<K>,
    name: &str,
    params: &DeleteParams,
) -> Result<(), kube::Error>
where
    K: Resource + Clone + DeserializeOwned + std::fmt::Debug,
{
    match api.delete(name, params).await {
        Ok(_) => Ok(()),
        Err(error) if is_not_found(&error) => Ok(()),
        Err(error) => Err(error),
    }
}

/// A create's error: a 409 means the name is taken.
fn create_error(error: kube::Error, context: impl Into<String>) -> BackendError {
    match &error {
        kube::Error::Api(status) if status.is_already_exists() || status.code == 409 => {
            BackendError::AlreadyExists
        }
        _ => BackendError::internal(context, error),
    }
}

fn is_not_found(error: &kube::Error) -> bool {
    matches!(error, kube::Error::Api(status) if status.is_not_found() || status.code == 404)
}

/// Names of pools being created right now in this process.
#[derive(Debug, Default, Clone)]
struct InFlight(Arc<Mutex<HashSet<String>>>);

/// Removes its name from the in-flight set when dropped.
struct InFlightGuard {
    set: InFlight,
    name: String,
}

impl InFlight {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashSet<String>> {
        // The set stays consistent even if a holder panicked.
        self.0
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Marks `name` in flight; `None` if it already is.
    fn begin(&self, name: &str) -> Option<InFlightGuard> {
        self.lock().insert(name.to_string()).then(|| InFlightGuard {
            set: self.clone(),
            name: name.to_string(),
        })
    }

    fn contains(&self, name: &str) -> bool {
        self.lock().contains(name)
    }
}

impl Drop for InFlightGuard {
    fn drop(&mut self) {
        self.set.lock().remove(&self.name);
    }
}
