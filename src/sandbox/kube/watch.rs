//! Watch caches: kube-runtime reflectors over the managed objects of the
//! namespace, started once, plus a change counter that waiters subscribe to.
//!
//! Pool status reads these stores instead of listing per request, and
//! `wait_pool` sleeps on the change counter instead of polling.

use std::collections::BTreeSet;
use std::fmt::Debug;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod};
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{watcher, WatchStreamExt};
use kube::{Api, Client, Resource, ResourceExt};
use serde::de::DeserializeOwned;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::pool::names;

use super::crd::{Sandbox, SandboxClaim};
// `Kind` lives with the object builders (which `status` reads too); it
// is named here for the creates that record what they made.
use super::objects::managed_selector;
pub use super::objects::Kind;
use super::status::PoolObjects;
use super::watch_health::{KindHealth, WatchHealth, WatchUnhealthy};

/// Label the claim controller puts on every Sandbox bound to a claim (cold
/// or adopted); adopted Sandboxes carry none of our labels.
const CLAIMED_SANDBOX_SELECTOR: &str = "agents.x-k8s.io/claim-uid";

/// Read side of the watch caches.
#[derive(Clone)]
pub struct Caches {
    namespace: String,
    claims: Store<SandboxClaim>,
    sandboxes: Store<Sandbox>,
    claimed_sandboxes: Store<Sandbox>,
    pvcs: Store<PersistentVolumeClaim>,
    pods: Store<Pod>,
    changes: watch::Receiver<u64>,
    health: WatchHealth,
    /// Set once every store completed its first list. One waiter at a time
    /// waits on the stores: kube-runtime's `wait_until_ready` wakes only
    /// the last of several concurrent waiters (one oneshot waker), so the
    /// others (the reaper's start scan, the metrics sampler, early
    /// requests) slept until their timeout.
    synced: Arc<tokio::sync::OnceCell<()>>,
}

/// The running watcher tasks; dropping this stops them.
pub struct Watchers {
    tasks: Vec<JoinHandle<()>>,
}

impl Drop for Watchers {
    fn drop(&mut self) {
        for task in &self.tasks {
            task.abort();
        }
    }
}

/// Starts one reflector per kind in `namespace`: claims, Sandboxes and PVCs
/// with `managed-by=context-service`, Sandboxes bound to claims, and Pods
/// with a pool label (what a pool's selector matches: a direct pool's pods
/// carry ours, an adopted warm pod gets the pool label, and only that, from
/// its claim).
pub fn start(client: &Client, namespace: &str) -> (Caches, Watchers) {
    let (changed, changes) = watch::channel(0u64);
    let changed = Arc::new(changed);
    let managed = watcher::Config::default().labels(&managed_selector());
    let claimed = watcher::Config::default().labels(CLAIMED_SANDBOX_SELECTOR);
    let mut tasks = Vec::with_capacity(5);
    let mut health = WatchHealth::default();
    let mut spawn = Spawner {
        client,
        namespace,
        changed: &changed,
        tasks: &mut tasks,
        health: Some(&mut health),
    };
    let claims = spawn.reflector::<SandboxClaim>(managed.clone());
    let sandboxes = spawn.reflector::<Sandbox>(managed.clone());
    let claimed_sandboxes = spawn.reflector::<Sandbox>(claimed);
    let pvcs = spawn.reflector::<PersistentVolumeClaim>(managed);
    let pods = spawn.reflector::<Pod>(watcher::Config::default().labels(names::POOL_LABEL));
    let caches = Caches {
        namespace: namespace.to_string(),
        claims,
        sandboxes,
        claimed_sandboxes,
        pvcs,
        pods,
        changes,
        health,
        synced: Arc::default(),
    };
    (caches, Watchers { tasks })
}

/// Sandbox reflectors started on demand, one per label selector (the
/// operator's shared-sandbox selector: Sandboxes this service did not make
/// and the managed caches do not hold). Dropping this stops them.
#[derive(Default)]
pub struct SelectorWatches {
    stores: std::sync::Mutex<SelectedStores>,
}

/// Selector → its store and the reflector task feeding it.
type SelectedStores = std::collections::HashMap<String, (Store<Sandbox>, JoinHandle<()>)>;

impl SelectorWatches {
    /// The cache of the Sandboxes in `namespace` matching `selector`,
    /// started by the first call for that selector.
    pub fn sandboxes(&self, client: &Client, namespace: &str, selector: &str) -> Store<Sandbox> {
        // The map stays consistent even if a holder panicked.
        let mut stores = self
            .stores
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some((store, _)) = stores.get(selector) {
            return store.clone();
        }
        // Nobody waits on these changes; the sender only feeds the counter.
        let changed = Arc::new(watch::channel(0u64).0);
        let mut tasks = Vec::with_capacity(1);
        let store = Spawner {
            client,
            namespace,
            changed: &changed,
            tasks: &mut tasks,
            health: None,
        }
        .reflector::<Sandbox>(watcher::Config::default().labels(selector));
        if let Some(task) = tasks.pop() {
            stores.insert(selector.to_string(), (store.clone(), task));
        }
        store
    }
}

impl Drop for SelectorWatches {
    fn drop(&mut self) {
        let stores = self
            .stores
            .get_mut()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        for (_, task) in stores.values() {
            task.abort();
        }
    }
}

/// What every reflector of one set of caches shares.
struct Spawner<'a> {
    client: &'a Client,
    namespace: &'a str,
    changed: &'a Arc<watch::Sender<u64>>,
    tasks: &'a mut Vec<JoinHandle<()>>,
    /// Where each reflector reports whether its watch runs (`None`: the
    /// on-demand selector caches, which readiness does not depend on).
    health: Option<&'a mut WatchHealth>,
}

impl Spawner<'_> {
    /// Spawns a reflector for `K` and returns its store. Every event (and
    /// every re-list) bumps the change counter; errors are logged, recorded
    /// in the health and retried with kube-runtime's default backoff.
    fn reflector<K>(&mut self, config: watcher::Config) -> Store<K>
    where
        K: Resource<DynamicType = (), Scope = k8s_openapi::NamespaceResourceScope>
            + Clone
            + DeserializeOwned
            + Debug
            + Send
            + Sync
            + 'static,
    {
        let api: Api<K> = Api::namespaced(self.client.clone(), self.namespace);
        let health = self.health.as_deref_mut().map(|all| {
            let kind = KindHealth::new(api.clone(), config.label_selector.clone());
            all.push(kind.clone());
            kind
        });
        let (reader, writer) = reflector::store();
        // Managed fields are large and never read: keep them out of memory.
        let stream = watcher(api, config)
            .default_backoff()
            .modify(|object: &mut K| object.managed_fields_mut().clear());
        let stream = reflector::reflector(writer, stream);
        let changed = self.changed.clone();
        let kind = K::plural(&()).to_string();
        self.tasks.push(tokio::spawn(async move {
            let mut stream = std::pin::pin!(stream);
            while let Some(event) = stream.next().await {
                match event {
                    Ok(event) => {
                        // Only a running watch applies and deletes; the
                        // list's events say nothing of the watch after it.
                        if let (
                            Some(health),
                            watcher::Event::Apply(_) | watcher::Event::Delete(_),
                        ) = (&health, &event)
                        {
                            health.watching();
                        }
                        changed.send_modify(|generation| *generation = generation.wrapping_add(1));
                    }
                    Err(error) => {
                        if let Some(health) = &health {
                            health.failed(&error);
                        }
                        tracing::warn!(%kind, %error, "watch failed; retrying");
                    }
                }
            }
        }));
        reader
    }
}

impl Caches {
    /// Waits until every store has completed its first list, at most `timeout`.
    pub async fn synced(&self, timeout: Duration) -> Result<(), CacheError> {
        let all = self.synced.get_or_try_init(|| async {
            self.claims
                .wait_until_ready()
                .await
                .map_err(|_| "sandboxclaims")?;
            self.sandboxes
                .wait_until_ready()
                .await
                .map_err(|_| "sandboxes")?;
            self.claimed_sandboxes
                .wait_until_ready()
                .await
                .map_err(|_| "claimed sandboxes")?;
            self.pvcs
                .wait_until_ready()
                .await
                .map_err(|_| "persistentvolumeclaims")?;
            self.pods.wait_until_ready().await.map_err(|_| "pods")?;
            Ok::<(), &'static str>(())
        });
        match tokio::time::timeout(timeout, all).await {
            Ok(Ok(&())) => Ok(()),
            Ok(Err(kind)) => Err(CacheError::Stopped(kind)),
            Err(_) => Err(CacheError::NotSynced),
        }
    }

    /// `Ok` when every cache's watch runs (probing those not known to).
    pub(super) async fn check_watches(&self) -> Result<(), WatchUnhealthy> {
        self.health.check().await
    }

    /// The first `Some` that `look` finds in the caches, looking again
    /// after every change, until `deadline`; `None` once it passed or the
    /// caches stopped.
    pub(super) async fn first<T>(
        &self,
        deadline: tokio::time::Instant,
        mut look: impl FnMut(&Caches) -> Option<T>,
    ) -> Option<T> {
        let mut changes = self.subscribe();
        tokio::time::timeout_at(deadline, async {
            loop {
                // Mark the generation seen before looking, so a change
                // between the look and the wait is not missed.
                changes.borrow_and_update();
                if let Some(found) = look(self) {
                    return Some(found);
                }
                changes.changed().await.ok()?;
            }
        })
        .await
        .ok()
        .flatten()
    }

    /// A receiver that changes whenever any cache changes.
    pub fn subscribe(&self) -> watch::Receiver<u64> {
        self.changes.clone()
    }

    /// The objects of pool `name` as the caches see them now.
    pub fn pool_objects(&self, name: &str) -> PoolObjects {
        let in_pool = |labels: &std::collections::BTreeMap<String, String>| {
            labels.get(names::POOL_LABEL).map(String::as_str) == Some(name)
        };
        let claims = self.claims.state_filter(|claim| in_pool(claim.labels()));
        let bound_sandboxes = claims
            .iter()
            .filter_map(|claim| claim.status.as_ref()?.sandbox.as_ref())
            .filter_map(|bound| {
                self.claimed_sandboxes
                    .get(&ObjectRef::new(&bound.name).within(&self.namespace))
            })
            .collect();
        PoolObjects {
            claims,
            sandboxes: self.sandboxes.state_filter(|s| in_pool(s.labels())),
            pvcs: self.pvcs.state_filter(|pvc| in_pool(pvc.labels())),
            pods: self.pods.state_filter(|pod| in_pool(pod.labels())),
            bound_sandboxes,
        }
    }

    /// Names of every pool with a cached claim, Sandbox or PVC.
    pub fn pool_names(&self) -> BTreeSet<String> {
        let mut names = BTreeSet::new();
        let mut add = |labels: &std::collections::BTreeMap<String, String>| {
            if let Some(pool) = labels
                .get(names::POOL_LABEL)
                .filter(|pool| !pool.is_empty())
            {
                names.insert(pool.clone());
            }
        };
        self.claims.state().iter().for_each(|o| add(o.labels()));
        self.sandboxes.state().iter().for_each(|o| add(o.labels()));
        self.pvcs.state().iter().for_each(|o| add(o.labels()));
        names
    }

    /// The cached PVC `key`.
    pub(super) fn pvc(
        &self,
        key: &ObjectRef<PersistentVolumeClaim>,
    ) -> Option<Arc<PersistentVolumeClaim>> {
        self.pvcs.get(key)
    }

    /// Whether the caches hold every object of `created`.
    pub fn contains(&self, created: &Created) -> bool {
        let ns = &self.namespace;
        created.objects().iter().all(|(kind, name)| match kind {
            Kind::Claim => self.claims.get(&ObjectRef::new(name).within(ns)).is_some(),
            Kind::Sandbox => self
                .sandboxes
                .get(&ObjectRef::new(name).within(ns))
                .is_some(),
            Kind::Pvc => self.pvcs.get(&ObjectRef::new(name).within(ns)).is_some(),
        })
    }
}

/// The objects one create made, in the order the API accepted them. Shared
/// by the create's concurrent requests, hence the lock.
#[derive(Debug, Default)]
pub struct Created {
    objects: std::sync::Mutex<Vec<(Kind, String)>>,
}

impl Created {
    /// Records a created object.
    pub fn push(&self, kind: Kind, name: impl Into<String>) {
        self.lock().push((kind, name.into()));
    }

    /// Kind and name of each object made so far.
    pub fn objects(&self) -> Vec<(Kind, String)> {
        self.lock().clone()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<(Kind, String)>> {
        // A plain list: consistent even if a holder panicked.
        self.objects
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// Why the caches cannot answer.
#[derive(Debug, thiserror::Error)]
pub enum CacheError {
    /// `start_watchers` was not called.
    #[error("the watch caches are not started")]
    NotStarted,
    /// A first list has not completed in time (API unreachable, RBAC or a
    /// CRD missing: the watcher logs say which).
    #[error("the watch caches have not synced")]
    NotSynced,
    /// A watcher task ended.
    #[error("the {0} watcher stopped")]
    Stopped(&'static str),
}
