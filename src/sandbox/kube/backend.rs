//! [`KubeBackend`]: the [`SandboxBackend`] over a Kubernetes API with the
//! agent-sandbox controller.
//!
//! Writes go straight to the API (create, server-side apply, delete); pool
//! reads come from the watch caches in [`super::watch`]. Creation lives in
//! `create` (and the reaping of creates abandoned half-way in `abandoned`),
//! named contexts in `volumes`; this module holds the type, its API
//! helpers, reads, waits and deletes.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::PersistentVolumeClaim;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::jiff::Timestamp;
use kube::api::{DeleteParams, ListParams, PostParams};
use kube::{Api, Client, Resource, ResourceExt};
use serde::de::DeserializeOwned;

use crate::pool::model::{ContextVolumeSpec, ContextVolumeStatus, Member, PoolSpec, PoolStatus};
use crate::pool::{BackendError, LabelSelector, SandboxBackend};

use super::crd::{Sandbox, SandboxClaim};
use super::objects;
use super::settings::KubeSettings;
use super::status;
use super::watch::{self, CacheError, Caches, Kind, SelectorWatches, Watchers};

/// Past the end of another replica's create, so the status read then no
/// longer counts it as running.
const CLOCK_STEP: Duration = Duration::from_millis(5);

/// Deletes of one kind of a pool's objects in flight at once: a pool of 50
/// is removed in a few round trips, and the API server is not flooded.
pub(super) const DELETES_IN_FLIGHT: usize = 16;

/// Requests to the Kubernetes API in flight at once through a client built
/// by [`KubeBackend::try_default`]: many concurrent pool creates then queue
/// in the service rather than overrun the API server (whose in-flight
/// limits and priority-and-fairness answer `429` beyond them). A watch or
/// exec stream counts only until its response starts.
pub const API_REQUESTS_IN_FLIGHT: usize = 64;

/// `builder` with at most [`API_REQUESTS_IN_FLIGHT`] requests in flight.
pub fn with_api_bound<S>(
    builder: kube::client::ClientBuilder<S>,
) -> kube::client::ClientBuilder<tower::limit::ConcurrencyLimit<S>> {
    builder.with_layer(&tower::limit::ConcurrencyLimitLayer::new(
        API_REQUESTS_IN_FLIGHT,
    ))
}

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
///     expires_at: None, // or Some(time): deleted then, by the controller and the reaper
/// };
/// backend.create_pool(&spec).await?;
/// let status = backend.wait_pool("review", Duration::from_secs(120)).await?;
/// backend.delete_pool("review").await?;
/// # let _ = status;
/// # Ok(())
/// # }
/// ```
pub struct KubeBackend {
    pub(super) client: Client,
    pub(super) settings: Arc<KubeSettings>,
    /// Pools this process is creating right now.
    pub(super) creating: InFlight,
    /// The watch caches, once started.
    pub(super) caches: OnceLock<(Caches, Watchers)>,
    /// Caches of Sandboxes by label selector, for shared delivery targets.
    pub(super) selected: SelectorWatches,
    /// Storage classes' binding modes, as looked up.
    pub(super) binding_modes: BindingModes,
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
            selected: SelectorWatches::default(),
            binding_modes: BindingModes::default(),
        })
    }

    /// A backend with the in-cluster configuration or the kubeconfig
    /// (`KUBECONFIG`, `~/.kube/config`), as `kube::Client::try_default` finds it.
    /// At most [`API_REQUESTS_IN_FLIGHT`] requests are in flight at once.
    pub async fn try_default(settings: KubeSettings) -> Result<Self, KubeBackendError> {
        let config = kube::Config::infer()
            .await
            .map_err(|e| KubeBackendError::Client(kube::Error::InferConfig(e)))?;
        let builder =
            kube::client::ClientBuilder::try_from(config).map_err(KubeBackendError::Client)?;
        Self::new(with_api_bound(builder).build(), settings)
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

    pub(super) fn caches(&self) -> Result<&Caches, BackendError> {
        self.caches
            .get()
            .map(|(caches, _)| caches)
            .ok_or_else(|| BackendError::internal("read pools", CacheError::NotStarted))
    }

    /// Caches that have completed their first list.
    pub(super) async fn synced_caches(&self) -> Result<&Caches, BackendError> {
        let caches = self.caches()?;
        caches
            .synced(self.settings.initial_sync_timeout)
            .await
            .map_err(|e| BackendError::internal("read pools", e))?;
        Ok(caches)
    }

    pub(super) fn api<K>(&self) -> Api<K>
    where
        K: Resource<Scope = k8s_openapi::NamespaceResourceScope, DynamicType = ()>,
    {
        Api::namespaced(self.client.clone(), &self.settings.namespace)
    }

    pub(super) fn post_params(&self) -> PostParams {
        PostParams {
            dry_run: false,
            field_manager: Some(self.settings.field_manager.clone()),
        }
    }

    /// Lists `K` in the namespace by label; a missing resource type (CRD not
    /// installed) counts as no objects, as upstream.
    pub(super) async fn list_or_empty<K>(
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

    /// The managed claims, Sandboxes and PVCs of pool `name` (at most
    /// `limit` of each), listed from the API in one round trip.
    pub(super) async fn list_pool_objects(
        &self,
        name: &str,
        limit: Option<u32>,
    ) -> Result<(Vec<SandboxClaim>, Vec<Sandbox>, Vec<PersistentVolumeClaim>), BackendError> {
        let selector = objects::managed_pool_selector(name);
        tokio::try_join!(
            async {
                self.list_or_empty::<SandboxClaim>(&selector, limit)
                    .await
                    .map_err(|e| BackendError::internal("list sandbox claims", e))
            },
            async {
                self.list_or_empty::<Sandbox>(&selector, limit)
                    .await
                    .map_err(|e| BackendError::internal("list sandboxes", e))
            },
            async {
                self.list_or_empty::<PersistentVolumeClaim>(&selector, limit)
                    .await
                    .map_err(|e| BackendError::internal("list workspace PVCs", e))
            },
        )
    }

    /// Deletes the managed objects of pool `name` whose metadata `select`
    /// picks, listed from the API (not the caches: a pool created a moment
    /// ago must not survive its delete); `last` (kind and name) after all
    /// others. Answers how many of each kind there were.
    pub(super) async fn delete_objects(
        &self,
        name: &str,
        select: impl Fn(&ObjectMeta) -> bool,
        last: Option<(Kind, &str)>,
    ) -> Result<Deleted, BackendError> {
        // The three lists at once: a delete is a few round trips, not six.
        let (claims, sandboxes, pvcs) = self.list_pool_objects(name, None).await?;
        let (claims, sandboxes, pvcs) = (
            picked(&claims, &select),
            picked(&sandboxes, &select),
            picked(&pvcs, &select),
        );
        let deleted = Deleted {
            claims: claims.len(),
            sandboxes: sandboxes.len(),
            pvcs: pvcs.len(),
        };
        // Kind by kind, the objects of a kind at once, `last` after all.
        // Claims in the foreground, as upstream: the claim stays visible
        // until its Sandbox and Pod are gone, so the pool does not look
        // released while its sandboxes still run. Only PVCs with our pool and
        // managed-by labels: never the caller's existing claim, which
        // carries neither.
        let mut deferred = None;
        for (kind, names) in [
            (Kind::Claim, claims),
            (Kind::Sandbox, sandboxes),
            (Kind::Pvc, pvcs),
        ] {
            let (later, now): (Vec<String>, Vec<String>) = names
                .into_iter()
                .partition(|object| last == Some((kind, object.as_str())));
            deferred = deferred.or(later.into_iter().next().map(|object| (kind, object)));
            self.delete_all(kind, now).await?;
        }
        if let Some((kind, object)) = deferred {
            self.delete_one(kind, &object).await?;
        }
        Ok(deleted)
    }

    /// Deletes the objects `names` of one kind, [`DELETES_IN_FLIGHT`] at a
    /// time; the first failure is the answer.
    pub(super) async fn delete_all(
        &self,
        kind: Kind,
        names: Vec<String>,
    ) -> Result<(), BackendError> {
        futures::stream::iter(names)
            .map(|object| async move { self.delete_one(kind, &object).await })
            .buffer_unordered(DELETES_IN_FLIGHT)
            .try_collect()
            .await
    }

    /// Deletes one object of a pool (claims in the foreground); a missing
    /// one is fine.
    async fn delete_one(&self, kind: Kind, name: &str) -> Result<(), BackendError> {
        match kind {
            Kind::Claim => delete_ignoring_missing(
                &self.api::<SandboxClaim>(),
                name,
                &DeleteParams::foreground(),
            )
            .await
            .map_err(|e| BackendError::internal(format!("delete sandbox claim {name}"), e)),
            Kind::Sandbox => delete_ignoring_missing(&self.api::<Sandbox>(), name, &background())
                .await
                .map_err(|e| BackendError::internal(format!("delete sandbox {name}"), e)),
            Kind::Pvc => {
                delete_ignoring_missing(&self.api::<PersistentVolumeClaim>(), name, &background())
                    .await
                    .map_err(|e| BackendError::internal(format!("delete workspace PVC {name}"), e))
            }
        }
    }
}

/// The names of the `objects` whose metadata `select` picks.
fn picked<K: Resource>(objects: &[K], select: &impl Fn(&ObjectMeta) -> bool) -> Vec<String> {
    objects
        .iter()
        .map(Resource::meta)
        .filter(|meta| select(meta))
        .filter_map(|meta| meta.name.clone())
        .collect()
}

/// How many objects of each kind a delete found.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(super) struct Deleted {
    pub(super) claims: usize,
    pub(super) sandboxes: usize,
    pub(super) pvcs: usize,
}

impl Deleted {
    /// Nothing was there.
    pub(super) fn is_empty(&self) -> bool {
        self.claims == 0 && self.sandboxes == 0 && self.pvcs == 0
    }
}

#[async_trait::async_trait]
impl SandboxBackend for KubeBackend {
    async fn check_ready(&self) -> Result<(), BackendError> {
        self.check_api().await?;
        // A cache whose watch cannot run would answer stale pool status.
        self.caches()?
            .check_watches()
            .await
            .map_err(|e| BackendError::internal("watch the sandbox objects", e))
    }

    async fn create_pool(&self, spec: &PoolSpec) -> Result<PoolStatus, BackendError> {
        self.create(spec).await
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
        let deleted = self.delete_pool_members(name).await?;
        if deleted.is_empty() {
            return Ok(false);
        }
        tracing::info!(
            pool = %name,
            claims = deleted.claims,
            sandboxes = deleted.sandboxes,
            pvcs = deleted.pvcs,
            "sandbox pool deleted"
        );
        Ok(true)
    }

    async fn reap_abandoned(&self, now: Timestamp) -> Result<Option<Timestamp>, BackendError> {
        self.reap_abandoned_creates(now).await
    }

    async fn set_suspended(
        &self,
        name: &str,
        suspended: bool,
    ) -> Result<Option<PoolStatus>, BackendError> {
        self.set_operating_mode(name, suspended).await
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
            let objects = caches.pool_objects(name);
            let current = status::pool_status(name, &objects, self.creating.contains(name));
            match &current {
                None => return Ok(None),
                Some(status) if status.phase.is_settled() => return Ok(current),
                Some(_) => {}
            }
            // The end of a create recorded by another replica comes with no
            // watch event: look again then.
            let wake = status::pending_until(&objects, Timestamp::now())
                .and_then(|until| Duration::try_from(until.duration_since(Timestamp::now())).ok())
                .map(|left| (tokio::time::Instant::now() + left + CLOCK_STEP).min(deadline))
                .unwrap_or(deadline);
            match tokio::time::timeout_at(wake, changes.changed()).await {
                Err(_elapsed) if wake < deadline => {}
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

    async fn create_volume(
        &self,
        spec: &ContextVolumeSpec,
    ) -> Result<ContextVolumeStatus, BackendError> {
        self.create_context_pvc(spec).await
    }

    async fn get_volume(
        &self,
        namespace: &str,
        name: &str,
    ) -> Result<Option<ContextVolumeStatus>, BackendError> {
        self.context_pvc(namespace, name).await
    }

    async fn list_volumes(
        &self,
        namespace: &str,
    ) -> Result<Vec<ContextVolumeStatus>, BackendError> {
        self.list_context_pvcs(Some(namespace)).await
    }

    async fn list_all_volumes(&self) -> Result<Vec<ContextVolumeStatus>, BackendError> {
        self.list_context_pvcs(None).await
    }

    async fn delete_volume(&self, namespace: &str, name: &str) -> Result<bool, BackendError> {
        self.delete_context_pvc(namespace, name).await
    }

    /// From a cache of the Sandboxes `selector` matches, started (and
    /// waited for) on the first call with that selector.
    async fn list_sandboxes(&self, selector: &LabelSelector) -> Result<Vec<Member>, BackendError> {
        let store = self.selected.sandboxes(
            &self.client,
            &self.settings.namespace,
            &selector.to_string(),
        );
        match tokio::time::timeout(self.settings.initial_sync_timeout, store.wait_until_ready())
            .await
        {
            Ok(Ok(())) => {}
            Ok(Err(_)) => {
                return Err(BackendError::internal(
                    "list shared sandboxes",
                    CacheError::Stopped("selected sandboxes"),
                ))
            }
            Err(_) => {
                return Err(BackendError::internal(
                    "list shared sandboxes",
                    CacheError::NotSynced,
                ))
            }
        }
        let mut members: Vec<Member> = store
            .state()
            .iter()
            // The API filtered already; checked again so the cache can never
            // widen what the operator selected.
            .filter(|sandbox| selector.matches(sandbox.labels()))
            .map(|sandbox| status::sandbox_member(sandbox))
            .collect();
        members.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(members)
    }
}

/// Background propagation: the garbage collector removes dependents.
pub(super) fn background() -> DeleteParams {
    DeleteParams::background()
}

/// Deletes `name`; a missing object is fine (deletes are idempotent).
pub(super) async fn delete_ignoring_missing<K>(
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
pub(super) fn create_error(error: kube::Error, context: impl Into<String>) -> BackendError {
    match &error {
        kube::Error::Api(status) if status.is_already_exists() || status.code == 409 => {
            BackendError::AlreadyExists
        }
        _ => BackendError::internal(context, error),
    }
}

/// A 404: the object (or its resource type) does not exist.
pub(super) fn is_not_found(error: &kube::Error) -> bool {
    matches!(error, kube::Error::Api(status) if status.is_not_found() || status.code == 404)
}

// The binding modes are state of the backend; `binding` reads and fills
// them (and so sits above this module).
/// When a storage class binds its claims.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum BindingMode {
    /// As soon as the claim exists: wait for `Bound` before the pod.
    Immediate,
    /// Once a pod using the claim is scheduled: never wait.
    WaitForFirstConsumer,
    /// Not known (no class, class missing, not allowed to read it): don't wait.
    Unknown,
}

/// The binding mode of each storage class this process has looked up. A
/// class's `volumeBindingMode` is immutable, so an answer holds for the
/// life of the process; only transient failures are asked again.
#[derive(Debug, Default)]
pub(super) struct BindingModes(Mutex<HashMap<String, BindingMode>>);

impl BindingModes {
    pub(super) fn get(&self, class: &str) -> Option<BindingMode> {
        self.lock().get(class).copied()
    }

    pub(super) fn insert(&self, class: &str, mode: BindingMode) {
        self.lock().insert(class.to_owned(), mode);
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, BindingMode>> {
        // A map of immutable facts stays valid even if a holder panicked.
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// Names of pools being created right now in this process.
#[derive(Debug, Default, Clone)]
pub(super) struct InFlight(Arc<Mutex<HashSet<String>>>);

/// Removes its name from the in-flight set when dropped.
pub(super) struct InFlightGuard {
    set: InFlight,
    name: String,
}

impl InFlight {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashSet<String>> {
        // The set stays consistent even if a holder panicked.
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Marks `name` in flight; `None` if it already is.
    pub(super) fn begin(&self, name: &str) -> Option<InFlightGuard> {
        self.lock().insert(name.to_string()).then(|| InFlightGuard {
            set: self.clone(),
            name: name.to_string(),
        })
    }

    pub(super) fn contains(&self, name: &str) -> bool {
        self.lock().contains(name)
    }
}

impl Drop for InFlightGuard {
    fn drop(&mut self) {
        self.set.lock().remove(&self.name);
    }
}
