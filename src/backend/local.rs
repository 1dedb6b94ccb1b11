//! The embedded `local` backend: sandboxes and workspace volumes are
//! directories under `<data-dir>/local/`, readiness is immediate.
//!
//! Layout, one tree per namespace (pools live in the service namespace):
//! ```text
//! local/namespaces/<ns>/pools/<pool>.json           the pool record (spec + state)
//! local/namespaces/<ns>/volumes/<pvc>/volume.json   a workspace or context volume
//! local/namespaces/<ns>/volumes/<pvc>/data/         its contents
//! local/namespaces/<ns>/sandboxes/<name>/sandbox.json
//! local/namespaces/<ns>/sandboxes/<name>/workspace  the mounted volume (a symlink)
//! local/namespaces/<ns>/claims/<claim>.json         a warm-pool claim
//! ```
//! Names and labels are those of the Kubernetes backend, so the strategies
//! behave the same: existing claims are volumes (e.g. a named context created
//! in the service namespace), warm pools are declared in the settings.
//!
//! This backend is for development, tests and benchmarks. It is **not** a
//! security boundary: read-only mounts are advisory.
//!
//! Mutations run on the blocking pool. A short lock checks conflicts and
//! reserves every name a mutation will touch, so creations of different
//! pools run concurrently, and one pool's objects are made by several
//! threads. A pool record is written in state `creating` before any object
//! and `created` after the last (and after the directories are synced);
//! records left `creating` by a crash are rolled back on open.

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use tokio::sync::watch;

use super::{BackendError, SandboxBackend};
use crate::config::ServeConfig;
use crate::fsutil;
use crate::pool::model::{
    AccessMode, ContextPhase, ContextSpec, ContextStatus, ContextType, Member, PoolPhase, PoolSpec,
    PoolStatus, Strategy, WorkspaceView,
};
use crate::pool::names;

/// Settings of the local backend.
#[derive(Debug, Clone)]
pub struct LocalSettings {
    /// Root of the tree (`<data-dir>/local`).
    pub root: PathBuf,
    /// The service namespace: where pools, their sandboxes and claims live.
    pub namespace: String,
    /// Declared SandboxWarmPools that `warmPoolRef` may name.
    pub warm_pools: Vec<String>,
}

impl LocalSettings {
    /// The settings `config` describes.
    pub fn from_config(config: &ServeConfig) -> Self {
        Self {
            root: config.data_dir.join("local"),
            namespace: config.namespace.clone(),
            warm_pools: config.local_warm_pools.clone(),
        }
    }
}

/// The embedded backend. Cheap to clone.
#[derive(Clone)]
pub struct LocalBackend {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for LocalBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LocalBackend")
            .field("root", &self.inner.root)
            .field("namespace", &self.inner.namespace)
            .finish()
    }
}

struct Inner {
    root: PathBuf,
    namespace: String,
    warm_pools: BTreeSet<String>,
    /// Held briefly: conflict checks and reservations of names in flight.
    lock: Mutex<Reservations>,
    /// Bumped after every mutation; waiters re-read the pool.
    changes: watch::Sender<u64>,
    /// Test hook: fail the creation of the object with this name.
    #[cfg(test)]
    fail_on: Mutex<Option<String>>,
}

/// Names claimed by mutations in flight, so that they run without a lock.
#[derive(Debug, Default)]
struct Reservations {
    /// Pools being created or deleted.
    pools: HashSet<String>,
    /// Objects being created ([`volume_key`], [`sandbox_key`], [`claim_key`]).
    objects: HashSet<String>,
}

/// Releases its reservations when dropped, on every path out.
struct Reserved<'a> {
    inner: &'a Inner,
    pool: Option<String>,
    objects: Vec<String>,
}

impl Drop for Reserved<'_> {
    fn drop(&mut self) {
        let mut reservations = self.inner.reservations();
        if let Some(pool) = &self.pool {
            reservations.pools.remove(pool);
        }
        for object in &self.objects {
            reservations.objects.remove(object);
        }
    }
}

fn volume_key(ns: &str, name: &str) -> String {
    format!("volume/{ns}/{name}")
}

fn sandbox_key(name: &str) -> String {
    format!("sandbox/{name}")
}

fn claim_key(name: &str) -> String {
    format!("claim/{name}")
}

/// Runs `work` over `items` on up to [`WORKERS`] threads (the file system
/// overlaps their fsyncs); stops at the first error and returns it.
fn parallel<T: Sync>(
    items: &[T],
    work: impl Fn(usize, &T) -> Result<(), BackendError> + Sync,
) -> Result<(), BackendError> {
    if items.len() <= 1 {
        return items.iter().enumerate().try_for_each(|(i, t)| work(i, t));
    }
    let next = AtomicUsize::new(0);
    let stop = AtomicBool::new(false);
    let failure = Mutex::new(None);
    std::thread::scope(|scope| {
        for _ in 0..WORKERS.min(items.len()) {
            scope.spawn(|| {
                while !stop.load(Ordering::Relaxed) {
                    let index = next.fetch_add(1, Ordering::Relaxed);
                    let Some(item) = items.get(index) else { break };
                    if let Err(e) = work(index, item) {
                        stop.store(true, Ordering::Relaxed);
                        failure
                            .lock()
                            .unwrap_or_else(PoisonError::into_inner)
                            .get_or_insert(e);
                        break;
                    }
                }
            });
        }
    });
    match failure.into_inner().unwrap_or_else(PoisonError::into_inner) {
        Some(e) => Err(e),
        None => Ok(()),
    }
}

/// Threads that create the objects of one pool.
const WORKERS: usize = 8;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
enum RecordState {
    Creating,
    Created,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
struct PoolRecord {
    spec: PoolSpec,
    state: RecordState,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
struct ObjectMeta {
    name: String,
    labels: BTreeMap<String, String>,
    #[serde(default)]
    annotations: BTreeMap<String, String>,
}

impl ObjectMeta {
    fn label(&self, key: &str) -> Option<&str> {
        self.labels.get(key).map(String::as_str)
    }

    fn belongs_to(&self, pool: &str) -> bool {
        self.label(names::POOL_LABEL) == Some(pool)
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
struct VolumeMeta {
    meta: ObjectMeta,
    size: String,
    access_mode: AccessMode,
    storage_class: Option<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
struct SandboxMeta {
    meta: ObjectMeta,
    /// The mounted volume, for direct strategies.
    volume: Option<String>,
    read_only: bool,
    /// The warm pool it came from, for claimed sandboxes.
    warm_pool: Option<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
struct ClaimMeta {
    meta: ObjectMeta,
    warm_pool: String,
    /// The sandbox adopted from the warm pool.
    sandbox: String,
}

/// The objects a spec creates, in creation order.
#[derive(Debug, Default)]
struct Plan {
    volumes: Vec<String>,
    sandboxes: Vec<String>,
    claims: Vec<String>,
    /// The sandboxes the claims adopt (chosen at creation only).
    warm_sandboxes: Vec<String>,
}

impl Plan {
    fn of(spec: &PoolSpec) -> Self {
        let n = spec.replicas;
        let name = spec.name.as_str();
        let sandboxes = || (0..n).map(|i| names::sandbox(name, i)).collect();
        match &spec.strategy {
            Strategy::Dedicated { .. } => Plan {
                volumes: (0..n)
                    .map(|i| names::dedicated_workspace(name, i))
                    .collect(),
                sandboxes: sandboxes(),
                ..Plan::default()
            },
            Strategy::Shared { .. } => Plan {
                volumes: vec![names::shared_workspace(name)],
                sandboxes: sandboxes(),
                ..Plan::default()
            },
            Strategy::Existing { .. } => Plan {
                sandboxes: sandboxes(),
                ..Plan::default()
            },
            Strategy::Warm { .. } => Plan {
                claims: (0..n).map(|i| names::claim(name, i)).collect(),
                ..Plan::default()
            },
        }
    }

    /// Reservation keys of every object the plan creates.
    fn keys(&self, ns: &str) -> Vec<String> {
        let volumes = self.volumes.iter().map(|v| volume_key(ns, v));
        let sandboxes = self
            .sandboxes
            .iter()
            .chain(&self.warm_sandboxes)
            .map(|s| sandbox_key(s));
        let claims = self.claims.iter().map(|c| claim_key(c));
        volumes.chain(sandboxes).chain(claims).collect()
    }

    /// The volume sandbox `index` mounts.
    fn volume_for(&self, spec: &PoolSpec, index: usize) -> Option<String> {
        match &spec.strategy {
            Strategy::Dedicated { .. } => self.volumes.get(index).cloned(),
            Strategy::Shared { .. } => self.volumes.first().cloned(),
            Strategy::Existing { claim_name, .. } => Some(claim_name.clone()),
            Strategy::Warm { .. } => None,
        }
    }
}

/// What one create call made so far, to undo it on failure.
#[derive(Debug, Default)]
struct Created {
    volumes: Vec<String>,
    sandboxes: Vec<String>,
    claims: Vec<String>,
}

fn internal(context: impl Into<String>) -> impl FnOnce(io::Error) -> BackendError {
    let context = context.into();
    move |e| BackendError::internal(context, e)
}

impl LocalBackend {
    /// Opens (or creates) the tree at `settings.root` and rolls back pools a
    /// crash left half-created.
    pub fn open(settings: LocalSettings) -> anyhow::Result<Self> {
        use anyhow::Context as _;
        for pool in &settings.warm_pools {
            anyhow::ensure!(
                crate::pool::validate::is_dns1123_subdomain(pool),
                "local warm pool {pool:?} is not a lowercase Kubernetes name"
            );
        }
        anyhow::ensure!(
            crate::pool::validate::is_dns1123_label(&settings.namespace),
            "namespace {:?} is not a lowercase Kubernetes name",
            settings.namespace
        );
        fsutil::ensure_dir(&settings.root, 0o700)
            .with_context(|| format!("creating {}", settings.root.display()))?;
        let (changes, _) = watch::channel(0);
        let backend = Self {
            inner: Arc::new(Inner {
                root: settings.root,
                namespace: settings.namespace,
                warm_pools: settings.warm_pools.into_iter().collect(),
                lock: Mutex::new(Reservations::default()),
                changes,
                #[cfg(test)]
                fail_on: Mutex::new(None),
            }),
        };
        backend
            .inner
            .recover()
            .context("recovering half-created pools")?;
        Ok(backend)
    }

    /// The directory of sandbox `name` in the service namespace, if it exists
    /// (for exec and delivery).
    pub fn sandbox_dir(&self, name: &str) -> Option<PathBuf> {
        if !crate::pool::validate::is_dns1123_subdomain(name) {
            return None;
        }
        let dir = self.inner.sandbox_dir(name);
        dir.join(SANDBOX_FILE).is_file().then_some(dir)
    }

    #[cfg(test)]
    fn fail_on(&self, object: Option<&str>) {
        if let Ok(mut f) = self.inner.fail_on.lock() {
            *f = object.map(str::to_owned);
        }
    }

    async fn blocking<T, F>(&self, f: F) -> Result<T, BackendError>
    where
        T: Send + 'static,
        F: FnOnce(&Inner) -> Result<T, BackendError> + Send + 'static,
    {
        let inner = self.inner.clone();
        tokio::task::spawn_blocking(move || f(&inner))
            .await
            .map_err(|e| BackendError::internal("local backend task", e))?
    }
}

const POOL_FILE_EXT: &str = "json";
const VOLUME_FILE: &str = "volume.json";
const SANDBOX_FILE: &str = "sandbox.json";

impl Inner {
    fn ns_dir(&self, ns: &str) -> PathBuf {
        self.root.join("namespaces").join(ns)
    }

    fn pools_dir(&self) -> PathBuf {
        self.ns_dir(&self.namespace).join("pools")
    }

    fn record_path(&self, pool: &str) -> PathBuf {
        self.pools_dir().join(format!("{pool}.{POOL_FILE_EXT}"))
    }

    fn volume_dir(&self, ns: &str, name: &str) -> PathBuf {
        self.ns_dir(ns).join("volumes").join(name)
    }

    fn sandbox_dir(&self, name: &str) -> PathBuf {
        self.ns_dir(&self.namespace).join("sandboxes").join(name)
    }

    fn claim_path(&self, name: &str) -> PathBuf {
        self.ns_dir(&self.namespace)
            .join("claims")
            .join(format!("{name}.json"))
    }

    fn notify(&self) {
        self.changes.send_modify(|v| *v = v.wrapping_add(1));
    }

    fn reservations(&self) -> std::sync::MutexGuard<'_, Reservations> {
        // The reservations stay consistent even if a holder panicked: every
        // change is a single insert or remove.
        self.lock.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn read_record(&self, pool: &str) -> Result<Option<PoolRecord>, BackendError> {
        read_json(&self.record_path(pool)).map_err(internal(format!("read pool record {pool}")))
    }

    fn write_record(&self, record: &PoolRecord) -> Result<(), BackendError> {
        let bytes = serde_json::to_vec_pretty(record)
            .map_err(|e| BackendError::internal("encode pool record", e))?;
        fsutil::write_atomic(&self.record_path(&record.spec.name), &bytes, 0o600)
            .map_err(internal(format!("write pool record {}", record.spec.name)))
    }

    fn read_volume(&self, ns: &str, name: &str) -> Result<Option<VolumeMeta>, BackendError> {
        read_json(&self.volume_dir(ns, name).join(VOLUME_FILE))
            .map_err(internal(format!("read volume {ns}/{name}")))
    }

    fn read_sandbox(&self, name: &str) -> Result<Option<SandboxMeta>, BackendError> {
        read_json(&self.sandbox_dir(name).join(SANDBOX_FILE))
            .map_err(internal(format!("read sandbox {name}")))
    }

    fn read_claim(&self, name: &str) -> Result<Option<ClaimMeta>, BackendError> {
        read_json(&self.claim_path(name)).map_err(internal(format!("read sandbox claim {name}")))
    }

    /// Runs at open, before any request.
    fn recover(&self) -> Result<(), BackendError> {
        for pool in self.record_names()? {
            if let Some(record) = self.read_record(&pool)? {
                if record.state == RecordState::Creating {
                    tracing::warn!(pool = %pool, "rolling back a pool left half-created by a crash");
                    self.remove_pool_objects(&record.spec)?;
                    remove_file(&self.record_path(&pool))
                        .map_err(internal(format!("remove pool record {pool}")))?;
                }
            }
        }
        Ok(())
    }

    fn record_names(&self) -> Result<Vec<String>, BackendError> {
        let mut out = Vec::new();
        let entries = match fs::read_dir(self.pools_dir()) {
            Ok(e) => e,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(out),
            Err(e) => return Err(BackendError::internal("list pool records", e)),
        };
        for entry in entries {
            let entry = entry.map_err(internal("list pool records"))?;
            let file = entry.file_name();
            let Some(file) = file.to_str() else { continue };
            // Skips temp files of interrupted atomic writes.
            if file.starts_with(fsutil::TEMP_PREFIX) {
                continue;
            }
            if let Some(name) = file.strip_suffix(".json") {
                out.push(name.to_owned());
            }
        }
        out.sort();
        Ok(out)
    }

    fn labels(&self, spec: &PoolSpec) -> BTreeMap<String, String> {
        BTreeMap::from([
            (names::POOL_LABEL.to_owned(), spec.name.clone()),
            (
                names::MANAGED_BY_LABEL.to_owned(),
                names::MANAGED_BY_VALUE.to_owned(),
            ),
            (names::OWNER_LABEL.to_owned(), spec.owner_scope.clone()),
        ])
    }

    fn create_pool(&self, spec: &PoolSpec) -> Result<PoolStatus, BackendError> {
        let (plan, _reserved) = self.reserve_for_create(spec)?;
        self.write_record(&PoolRecord {
            spec: spec.clone(),
            state: RecordState::Creating,
        })?;
        self.notify();
        let created = Mutex::new(Created::default());
        let result = self
            .create_objects(spec, &plan, &created)
            .and_then(|()| self.sync_object_dirs())
            .and_then(|()| {
                self.write_record(&PoolRecord {
                    spec: spec.clone(),
                    state: RecordState::Created,
                })
            });
        if let Err(err) = result {
            let created = created.into_inner().unwrap_or_else(PoisonError::into_inner);
            self.rollback(spec, &created);
            self.notify();
            return Err(err);
        }
        self.notify();
        self.status(&PoolRecord {
            spec: spec.clone(),
            state: RecordState::Created,
        })
    }

    /// Under the short lock: checks the strategy's references and conflicts,
    /// then reserves the pool name and every object name of the plan, so
    /// creation itself runs without the lock.
    fn reserve_for_create(&self, spec: &PoolSpec) -> Result<(Plan, Reserved<'_>), BackendError> {
        let mut reservations = self.reservations();
        // Upstream checks the claim or warm pool before creating anything.
        match &spec.strategy {
            Strategy::Existing { claim_name, .. } => {
                let volume = self
                    .read_volume(&self.namespace, claim_name)?
                    .filter(|v| visible_to(&v.meta, &spec.owner_scope))
                    .ok_or_else(|| {
                        BackendError::Invalid(format!("workspace claim {claim_name:?} not found"))
                    })?;
                if spec.replicas > 1 && volume.access_mode != AccessMode::ReadWriteMany {
                    return Err(BackendError::Invalid(format!(
                        "workspace claim {claim_name:?} must support ReadWriteMany for multiple sandboxes"
                    )));
                }
            }
            Strategy::Warm { pool } => {
                if !self.warm_pools.contains(pool) {
                    return Err(BackendError::Invalid(format!(
                        "warm pool {pool:?} not found"
                    )));
                }
            }
            Strategy::Dedicated { .. } | Strategy::Shared { .. } => {}
        }
        let mut plan = Plan::of(spec);
        if reservations.pools.contains(&spec.name) || self.conflicts(spec, &plan, &reservations) {
            return Err(BackendError::AlreadyExists);
        }
        if let Strategy::Warm { pool } = &spec.strategy {
            for _ in 0..spec.replicas {
                let name = self.fresh_warm_sandbox_name(pool, &reservations, &plan);
                plan.warm_sandboxes.push(name);
            }
        }
        let keys = plan.keys(&self.namespace);
        reservations.pools.insert(spec.name.clone());
        reservations.objects.extend(keys.iter().cloned());
        Ok((
            plan,
            Reserved {
                inner: self,
                pool: Some(spec.name.clone()),
                objects: keys,
            },
        ))
    }

    /// Reserves pool `name` for a deletion, waiting while it is being
    /// created or deleted.
    fn reserve_pool(&self, name: &str) -> Reserved<'_> {
        loop {
            if self.reservations().pools.insert(name.to_owned()) {
                return Reserved {
                    inner: self,
                    pool: Some(name.to_owned()),
                    objects: Vec::new(),
                };
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// Whether the pool name, or any object the plan would create, is taken
    /// (on disk or by a creation in flight).
    fn conflicts(&self, spec: &PoolSpec, plan: &Plan, reservations: &Reservations) -> bool {
        if self.record_path(&spec.name).exists() {
            return true;
        }
        if plan
            .keys(&self.namespace)
            .iter()
            .any(|k| reservations.objects.contains(k))
        {
            return true;
        }
        // Index 0 of every strategy catches a pool of another strategy
        // under the same name; the full plan catches any other collision.
        let name = spec.name.as_str();
        let volumes = [
            names::shared_workspace(name),
            names::dedicated_workspace(name, 0),
        ];
        plan.volumes
            .iter()
            .chain(&volumes)
            .any(|v| self.volume_dir(&self.namespace, v).exists())
            || plan
                .sandboxes
                .iter()
                .chain([&names::sandbox(name, 0)])
                .any(|s| self.sandbox_dir(s).exists())
            || plan
                .claims
                .iter()
                .chain([&names::claim(name, 0)])
                .any(|c| self.claim_path(c).exists())
    }

    /// Test hook: fails the creation of the object named in `fail_on`.
    fn fault(&self, object: &str, what: &str) -> Result<(), BackendError> {
        #[cfg(test)]
        if let Ok(f) = self.fail_on.lock() {
            if f.as_deref() == Some(object) {
                return Err(BackendError::internal(
                    what.to_owned(),
                    io::Error::other("injected failure"),
                ));
            }
        }
        let _ = (object, what);
        Ok(())
    }

    /// Makes the new entries of the object directories durable before the
    /// record says `created`.
    fn sync_object_dirs(&self) -> Result<(), BackendError> {
        let ns = self.ns_dir(&self.namespace);
        for dir in ["volumes", "sandboxes", "claims"] {
            match fsutil::sync_dir(&ns.join(dir)) {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                Err(e) => return Err(BackendError::internal(format!("sync {dir}"), e)),
            }
        }
        Ok(())
    }

    fn create_objects(
        &self,
        spec: &PoolSpec,
        plan: &Plan,
        created: &Mutex<Created>,
    ) -> Result<(), BackendError> {
        let labels = self.labels(spec);
        let record = |f: &dyn Fn(&mut Created)| {
            f(&mut created.lock().unwrap_or_else(PoisonError::into_inner));
        };
        parallel(&plan.volumes, |_, volume| {
            let what = format!("create workspace PVC {volume}");
            self.fault(volume, &what)?;
            let (size, access_mode, storage_class) = match &spec.strategy {
                Strategy::Dedicated {
                    size,
                    storage_class,
                } => (size, AccessMode::ReadWriteOnce, storage_class),
                Strategy::Shared {
                    size,
                    storage_class,
                } => (size, AccessMode::ReadWriteMany, storage_class),
                _ => return Ok(()),
            };
            let mut volume_labels = labels.clone();
            volume_labels.insert(names::REPLICAS_KEY.to_owned(), spec.replicas.to_string());
            let meta = VolumeMeta {
                meta: ObjectMeta {
                    name: volume.clone(),
                    labels: volume_labels,
                    annotations: BTreeMap::new(),
                },
                size: size.clone(),
                access_mode,
                storage_class: storage_class.clone(),
            };
            let dir = self.volume_dir(&self.namespace, volume);
            create_new_dir(&dir).map_err(internal(what.clone()))?;
            record(&|c| c.volumes.push(volume.clone()));
            fsutil::ensure_dir(&dir.join("data"), 0o755).map_err(internal(what.clone()))?;
            write_json(&dir.join(VOLUME_FILE), &meta).map_err(internal(what))
        })?;
        let read_only = matches!(
            spec.strategy,
            Strategy::Existing {
                read_only: true,
                ..
            }
        );
        parallel(&plan.sandboxes, |index, sandbox| {
            let what = format!("create sandbox {index}");
            self.fault(sandbox, &what)?;
            let volume = plan.volume_for(spec, index);
            let mut annotations = BTreeMap::from([
                (
                    names::WORKSPACE_READ_ONLY_ANNOTATION.to_owned(),
                    read_only.to_string(),
                ),
                (names::REPLICAS_KEY.to_owned(), spec.replicas.to_string()),
            ]);
            if let Strategy::Existing { claim_name, .. } = &spec.strategy {
                annotations.insert(
                    names::WORKSPACE_CLAIM_ANNOTATION.to_owned(),
                    claim_name.clone(),
                );
            }
            let meta = SandboxMeta {
                meta: ObjectMeta {
                    name: sandbox.clone(),
                    labels: labels.clone(),
                    annotations,
                },
                volume,
                read_only,
                warm_pool: None,
            };
            // Recorded first: a failure half-way leaves a directory to remove.
            record(&|c| c.sandboxes.push(sandbox.clone()));
            self.make_sandbox(&meta).map_err(internal(what))
        })?;
        if let Strategy::Warm { pool } = &spec.strategy {
            parallel(&plan.claims, |index, claim| {
                let what = format!("create sandbox claim {index}");
                self.fault(claim, &what)?;
                let sandbox = plan.warm_sandboxes.get(index).cloned().ok_or_else(|| {
                    BackendError::internal(what.clone(), io::Error::other("no sandbox planned"))
                })?;
                let meta = SandboxMeta {
                    meta: ObjectMeta {
                        name: sandbox.clone(),
                        labels: BTreeMap::from([
                            (names::POOL_LABEL.to_owned(), spec.name.clone()),
                            (names::OWNER_LABEL.to_owned(), spec.owner_scope.clone()),
                        ]),
                        annotations: BTreeMap::new(),
                    },
                    volume: None,
                    read_only: false,
                    warm_pool: Some(pool.clone()),
                };
                let claim_meta = ClaimMeta {
                    meta: ObjectMeta {
                        name: claim.clone(),
                        labels: labels.clone(),
                        annotations: BTreeMap::new(),
                    },
                    warm_pool: pool.clone(),
                    sandbox: sandbox.clone(),
                };
                // The claim first, so a rollback always finds the sandbox.
                write_json(&self.claim_path(claim), &claim_meta).map_err(internal(what.clone()))?;
                record(&|c| c.claims.push(claim.clone()));
                self.make_sandbox(&meta).map_err(internal(what))
            })?;
        }
        Ok(())
    }

    /// A name for a sandbox adopted from warm pool `pool`, which upstream
    /// names `<pool>-<random>`; unused on disk and by creations in flight.
    fn fresh_warm_sandbox_name(
        &self,
        pool: &str,
        reservations: &Reservations,
        plan: &Plan,
    ) -> String {
        use rand::Rng as _;
        const ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
        let mut rng = rand::rng();
        loop {
            let suffix: String = (0..5)
                .map(|_| char::from(ALPHABET[rng.random_range(0..ALPHABET.len())]))
                .collect();
            let name = format!("{pool}-{suffix}");
            if !self.sandbox_dir(&name).exists()
                && !reservations.objects.contains(&sandbox_key(&name))
                && !plan.warm_sandboxes.contains(&name)
            {
                return name;
            }
        }
    }

    fn make_sandbox(&self, meta: &SandboxMeta) -> io::Result<()> {
        let dir = self.sandbox_dir(&meta.meta.name);
        create_new_dir(&dir)?;
        let workspace = dir.join("workspace");
        match &meta.volume {
            // Relative, so the tree can be moved as a whole.
            Some(volume) => std::os::unix::fs::symlink(
                Path::new("../../volumes").join(volume).join("data"),
                &workspace,
            )?,
            None => fsutil::ensure_dir(&workspace, 0o755)?,
        }
        write_json(&dir.join(SANDBOX_FILE), meta)
    }

    /// Best effort: removes what this create call made, newest first. Errors
    /// are logged; the record stays `creating` if anything is left, so the
    /// next start finishes the job.
    fn rollback(&self, spec: &PoolSpec, created: &Created) {
        let mut clean = true;
        for claim in created.claims.iter().rev() {
            clean &= self.remove_claim(claim, &spec.name).is_ok();
        }
        for sandbox in created.sandboxes.iter().rev() {
            clean &= remove_dir(&self.sandbox_dir(sandbox)).is_ok();
        }
        for volume in created.volumes.iter().rev() {
            clean &= remove_dir(&self.volume_dir(&self.namespace, volume)).is_ok();
        }
        if clean {
            if let Err(e) = remove_file(&self.record_path(&spec.name)) {
                tracing::error!(pool = %spec.name, error = %e, "rollback: cannot remove the pool record");
            }
        } else {
            tracing::error!(pool = %spec.name, "rollback incomplete; it finishes at the next start or delete");
        }
    }

    fn remove_claim(&self, claim: &str, pool: &str) -> Result<(), BackendError> {
        if let Some(meta) = self.read_claim(claim)? {
            if !meta.meta.belongs_to(pool) {
                return Ok(());
            }
            // A sandbox without metadata is one this claim was making.
            let ours = self
                .read_sandbox(&meta.sandbox)?
                .is_none_or(|sandbox| sandbox.meta.belongs_to(pool));
            if ours {
                remove_dir(&self.sandbox_dir(&meta.sandbox))
                    .map_err(internal(format!("delete sandbox {}", meta.sandbox)))?;
            }
            remove_file(&self.claim_path(claim))
                .map_err(internal(format!("delete sandbox claim {claim}")))?;
        }
        Ok(())
    }

    /// Removes every object the spec plans that carries its pool label:
    /// never an existing claim, a warm pool or another pool's object.
    fn remove_pool_objects(&self, spec: &PoolSpec) -> Result<(), BackendError> {
        let plan = Plan::of(spec);
        for claim in &plan.claims {
            self.remove_claim(claim, &spec.name)?;
        }
        for sandbox in &plan.sandboxes {
            if let Some(meta) = self.read_sandbox(sandbox)? {
                if meta.meta.belongs_to(&spec.name) {
                    remove_dir(&self.sandbox_dir(sandbox))
                        .map_err(internal(format!("delete sandbox {sandbox}")))?;
                }
            } else {
                // A directory without metadata is a half-made sandbox.
                remove_dir(&self.sandbox_dir(sandbox))
                    .map_err(internal(format!("delete sandbox {sandbox}")))?;
            }
        }
        for volume in &plan.volumes {
            let dir = self.volume_dir(&self.namespace, volume);
            match self.read_volume(&self.namespace, volume)? {
                Some(meta) if !meta.meta.belongs_to(&spec.name) => {}
                _ => {
                    remove_dir(&dir).map_err(internal(format!("delete workspace PVC {volume}")))?
                }
            }
        }
        Ok(())
    }

    fn delete_pool(&self, name: &str) -> Result<bool, BackendError> {
        // Waits for a creation of the same name in flight to finish.
        let _reserved = self.reserve_pool(name);
        let Some(record) = self.read_record(name)? else {
            return Ok(false);
        };
        let result = self.remove_pool_objects(&record.spec);
        // The record goes last, so a failed delete can be retried.
        if result.is_ok() {
            remove_file(&self.record_path(name))
                .map_err(internal(format!("delete pool record {name}")))?;
        }
        self.notify();
        result.map(|()| true)
    }

    fn get_pool(&self, name: &str) -> Result<Option<PoolStatus>, BackendError> {
        match self.read_record(name)? {
            Some(record) => self.status(&record).map(Some),
            None => Ok(None),
        }
    }

    fn list_pools(&self) -> Result<Vec<PoolStatus>, BackendError> {
        let mut out = Vec::new();
        for name in self.record_names()? {
            // A pool deleted between listing and reading is simply gone.
            if let Some(status) = self.get_pool(&name)? {
                out.push(status);
            }
        }
        Ok(out)
    }

    fn status(&self, record: &PoolRecord) -> Result<PoolStatus, BackendError> {
        let spec = &record.spec;
        let plan = Plan::of(spec);
        let mut members = Vec::with_capacity(spec.replicas as usize);
        // The first problem found explains a failed pool.
        let mut problem: Option<(&'static str, String)> = None;
        let mut volume_ok = BTreeMap::<String, bool>::new();
        let mut volume_exists = |name: &str| -> Result<bool, BackendError> {
            if let Some(ok) = volume_ok.get(name) {
                return Ok(*ok);
            }
            let ok = self.read_volume(&self.namespace, name)?.is_some();
            volume_ok.insert(name.to_owned(), ok);
            Ok(ok)
        };
        for (index, sandbox) in plan.sandboxes.iter().enumerate() {
            let exists = self.sandbox_dir(sandbox).join(SANDBOX_FILE).is_file();
            let volume = plan.volume_for(spec, index);
            let mounted = match &volume {
                Some(v) => volume_exists(v)?,
                None => true,
            };
            if problem.is_none() {
                if !exists {
                    problem = Some((
                        "SandboxMissing",
                        format!("sandbox {sandbox} does not exist"),
                    ));
                } else if let (false, Some(v)) = (mounted, &volume) {
                    problem = Some((
                        "WorkspaceMissing",
                        format!("workspace volume {v} does not exist"),
                    ));
                }
            }
            members.push(Member {
                name: sandbox.clone(),
                pod: None,
                ready: exists && mounted,
            });
        }
        for claim in &plan.claims {
            match self.read_claim(claim)? {
                Some(meta) => {
                    let exists = self.sandbox_dir(&meta.sandbox).join(SANDBOX_FILE).is_file();
                    if !exists && problem.is_none() {
                        problem = Some((
                            "SandboxMissing",
                            format!("sandbox {} of claim {claim} does not exist", meta.sandbox),
                        ));
                    }
                    members.push(Member {
                        name: meta.sandbox,
                        pod: None,
                        ready: exists,
                    });
                }
                None => {
                    if problem.is_none() {
                        problem = Some((
                            "ClaimMissing",
                            format!("sandbox claim {claim} does not exist"),
                        ));
                    }
                    members.push(Member {
                        name: claim.clone(),
                        pod: None,
                        ready: false,
                    });
                }
            }
        }
        let ready_replicas = members.iter().filter(|m| m.ready).count() as u32;
        let workspace = self.workspace_view(spec)?;
        let (phase, reason, message) = match (record.state, problem) {
            (RecordState::Creating, _) => (PoolPhase::Provisioning, None, None),
            (RecordState::Created, None) => (PoolPhase::Ready, None, None),
            (RecordState::Created, Some((reason, message))) => {
                (PoolPhase::Failed, Some(reason.to_owned()), Some(message))
            }
        };
        Ok(PoolStatus {
            name: spec.name.clone(),
            replicas: spec.replicas,
            strategy: spec.strategy.clone(),
            workspace,
            phase,
            ready_replicas,
            reason,
            message,
            members,
            owner_scope: spec.owner_scope.clone(),
        })
    }

    fn workspace_view(&self, spec: &PoolSpec) -> Result<WorkspaceView, BackendError> {
        Ok(match &spec.strategy {
            Strategy::Dedicated {
                size,
                storage_class,
            } => WorkspaceView {
                size: size.clone(),
                access_mode: AccessMode::ReadWriteOnce.as_str().to_owned(),
                storage_class: storage_class.clone(),
                ..WorkspaceView::default()
            },
            Strategy::Shared {
                size,
                storage_class,
            } => WorkspaceView {
                size: size.clone(),
                access_mode: AccessMode::ReadWriteMany.as_str().to_owned(),
                storage_class: storage_class.clone(),
                ..WorkspaceView::default()
            },
            Strategy::Existing {
                claim_name,
                read_only,
            } => {
                // Upstream reports the existing volume's own properties.
                let volume = self.read_volume(&self.namespace, claim_name)?;
                WorkspaceView {
                    size: volume.as_ref().map(|v| v.size.clone()).unwrap_or_default(),
                    access_mode: volume
                        .as_ref()
                        .map(|v| v.access_mode.as_str().to_owned())
                        .unwrap_or_default(),
                    storage_class: volume.and_then(|v| v.storage_class),
                    claim_name: Some(claim_name.clone()),
                    read_only: Some(*read_only),
                }
            }
            Strategy::Warm { .. } => WorkspaceView::default(),
        })
    }

    fn create_context(&self, spec: &ContextSpec) -> Result<ContextStatus, BackendError> {
        let claim = names::context_claim(&spec.name);
        let dir = self.volume_dir(&spec.namespace, &claim);
        let key = volume_key(&spec.namespace, &claim);
        let _reserved = {
            let mut reservations = self.reservations();
            if reservations.objects.contains(&key)
                || self.read_volume(&spec.namespace, &claim)?.is_some()
            {
                return Err(BackendError::AlreadyExists);
            }
            reservations.objects.insert(key.clone());
            Reserved {
                inner: self,
                pool: None,
                objects: vec![key],
            }
        };
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

    fn get_context(&self, ns: &str, name: &str) -> Result<Option<ContextStatus>, BackendError> {
        let claim = names::context_claim(name);
        Ok(self
            .read_volume(ns, &claim)?
            .and_then(|v| context_status(ns, &v))
            .filter(|c| c.name == name))
    }

    fn list_contexts(&self, ns: &str) -> Result<Vec<ContextStatus>, BackendError> {
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

    fn delete_context(&self, ns: &str, name: &str) -> Result<bool, BackendError> {
        let key = volume_key(ns, &names::context_claim(name));
        let _reserved = loop {
            let mut reservations = self.reservations();
            if reservations.objects.insert(key.clone()) {
                break Reserved {
                    inner: self,
                    pool: None,
                    objects: vec![key],
                };
            }
            drop(reservations);
            std::thread::sleep(Duration::from_millis(5));
        };
        if self.get_context(ns, name)?.is_none() {
            return Ok(false);
        }
        let claim = names::context_claim(name);
        remove_dir(&self.volume_dir(ns, &claim))
            .map_err(internal(format!("delete context PVC {ns}/{claim}")))?;
        self.notify();
        Ok(true)
    }
}

/// A volume that is another owner's managed volume is invisible.
fn visible_to(meta: &ObjectMeta, owner_scope: &str) -> bool {
    match meta.label(names::OWNER_LABEL) {
        Some(owner) => owner == owner_scope,
        None => true,
    }
}

/// The context a volume holds, if it is a managed context volume.
fn context_status(ns: &str, volume: &VolumeMeta) -> Option<ContextStatus> {
    let meta = &volume.meta;
    if meta.label(names::MANAGED_BY_LABEL) != Some(names::MANAGED_BY_VALUE) {
        return None;
    }
    let name = meta
        .label(names::CONTEXT_NAME_LABEL)
        .filter(|n| !n.is_empty())?;
    let context_type = ContextType::parse(meta.label(names::CONTEXT_TYPE_LABEL)?)?;
    Some(ContextStatus {
        name: name.to_owned(),
        namespace: ns.to_owned(),
        context_type,
        // A local volume is usable the moment it exists ("bound").
        phase: ContextPhase::Ready,
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

fn read_json<T: DeserializeOwned>(path: &Path) -> io::Result<Option<T>> {
    match fs::read(path) {
        Ok(bytes) => serde_json::from_slice(&bytes).map(Some).map_err(|e| {
            io::Error::new(
                io::ErrorKind::InvalidData,
                format!("{}: {e}", path.display()),
            )
        }),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e),
    }
}

fn write_json<T: Serialize>(path: &Path, value: &T) -> io::Result<()> {
    let bytes = serde_json::to_vec_pretty(value).map_err(io::Error::other)?;
    fsutil::write_atomic(path, &bytes, 0o600)
}

fn create_new_dir(dir: &Path) -> io::Result<()> {
    if let Some(parent) = dir.parent() {
        fsutil::ensure_dir(parent, 0o755)?;
    }
    // `create_dir` (not `create_dir_all`) fails on an existing directory.
    fs::create_dir(dir)
}

fn remove_dir(dir: &Path) -> io::Result<()> {
    match fs::remove_dir_all(dir) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(e),
    }
}

fn remove_file(path: &Path) -> io::Result<()> {
    match fs::remove_file(path) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(e),
    }
}

#[async_trait::async_trait]
impl SandboxBackend for LocalBackend {
    async fn create_pool(&self, spec: &PoolSpec) -> Result<PoolStatus, BackendError> {
        let spec = spec.clone();
        self.blocking(move |inner| inner.create_pool(&spec)).await
    }

    async fn get_pool(&self, name: &str) -> Result<Option<PoolStatus>, BackendError> {
        let name = name.to_owned();
        self.blocking(move |inner| inner.get_pool(&name)).await
    }

    async fn list_pools(&self) -> Result<Vec<PoolStatus>, BackendError> {
        self.blocking(|inner| inner.list_pools()).await
    }

    async fn delete_pool(&self, name: &str) -> Result<bool, BackendError> {
        let name = name.to_owned();
        self.blocking(move |inner| inner.delete_pool(&name)).await
    }

    async fn wait_pool(
        &self,
        name: &str,
        timeout: Duration,
    ) -> Result<Option<PoolStatus>, BackendError> {
        let deadline = tokio::time::Instant::now() + timeout;
        // Subscribe before reading, so no change between the two is missed.
        let mut changes = self.inner.changes.subscribe();
        loop {
            let status = self.get_pool(name).await?;
            match &status {
                None => return Ok(None),
                Some(s) if s.phase.is_settled() => return Ok(status),
                Some(_) => {}
            }
            // Changes made by this process wake us at once; the tick catches
            // directories removed behind our back.
            tokio::select! {
                _ = tokio::time::sleep_until(deadline) => return Ok(status),
                _ = changes.changed() => {}
                _ = tokio::time::sleep(Duration::from_secs(1)) => {}
            }
        }
    }

    async fn create_context(&self, spec: &ContextSpec) -> Result<ContextStatus, BackendError> {
        let spec = spec.clone();
        self.blocking(move |inner| inner.create_context(&spec))
            .await
    }

    async fn get_context(
        &self,
        namespace: &str,
        name: &str,
    ) -> Result<Option<ContextStatus>, BackendError> {
        let (ns, name) = (namespace.to_owned(), name.to_owned());
        self.blocking(move |inner| inner.get_context(&ns, &name))
            .await
    }

    async fn list_contexts(&self, namespace: &str) -> Result<Vec<ContextStatus>, BackendError> {
        let ns = namespace.to_owned();
        self.blocking(move |inner| inner.list_contexts(&ns)).await
    }

    async fn delete_context(&self, namespace: &str, name: &str) -> Result<bool, BackendError> {
        let (ns, name) = (namespace.to_owned(), name.to_owned());
        self.blocking(move |inner| inner.delete_context(&ns, &name))
            .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn open(dir: &Path) -> LocalBackend {
        LocalBackend::open(LocalSettings {
            root: dir.join("local"),
            namespace: "default".into(),
            warm_pools: vec!["agents".into()],
        })
        .unwrap()
    }

    fn spec(name: &str, replicas: u32, strategy: Strategy) -> PoolSpec {
        PoolSpec {
            name: name.into(),
            replicas,
            strategy,
            owner_scope: "owner-a".into(),
        }
    }

    fn dedicated() -> Strategy {
        Strategy::Dedicated {
            size: "1Gi".into(),
            storage_class: None,
        }
    }

    /// Every file and directory under the namespace tree, relative.
    fn tree(dir: &Path) -> Vec<String> {
        fn walk(base: &Path, dir: &Path, out: &mut Vec<String>) {
            let Ok(entries) = fs::read_dir(dir) else {
                return;
            };
            for e in entries.flatten() {
                let p = e.path();
                out.push(p.strip_prefix(base).unwrap().display().to_string());
                if p.is_dir() && !p.is_symlink() {
                    walk(base, &p, out);
                }
            }
        }
        let base = dir.join("local/namespaces/default");
        let mut out = Vec::new();
        walk(&base, &base, &mut out);
        out.retain(|p| p.contains('/'));
        out.sort();
        out
    }

    #[tokio::test]
    async fn failure_half_way_rolls_back_everything() {
        let dir = tempfile::tempdir().unwrap();
        let backend = open(dir.path());
        backend.fail_on(Some("sandbox-p-1"));
        let err = backend
            .create_pool(&spec("p", 3, dedicated()))
            .await
            .unwrap_err();
        assert!(err.to_string().contains("create sandbox 1"), "{err}");
        assert!(tree(dir.path()).is_empty(), "{:?}", tree(dir.path()));
        assert!(backend.get_pool("p").await.unwrap().is_none());
        // The name is free again.
        backend.fail_on(None);
        let status = backend
            .create_pool(&spec("p", 3, dedicated()))
            .await
            .unwrap();
        assert_eq!(status.phase, PoolPhase::Ready);
        assert_eq!(status.ready_replicas, 3);
    }

    #[tokio::test]
    async fn warm_claim_failure_rolls_back_adopted_sandboxes() {
        let dir = tempfile::tempdir().unwrap();
        let backend = open(dir.path());
        backend.fail_on(Some("claim-w-2"));
        let warm = Strategy::Warm {
            pool: "agents".into(),
        };
        backend.create_pool(&spec("w", 3, warm)).await.unwrap_err();
        assert!(tree(dir.path()).is_empty(), "{:?}", tree(dir.path()));
    }

    #[tokio::test]
    async fn a_crash_mid_create_is_rolled_back_on_open() {
        let dir = tempfile::tempdir().unwrap();
        let backend = open(dir.path());
        let s = spec("p", 2, dedicated());
        backend.create_pool(&s).await.unwrap();
        // Simulate a crash: the record says "creating" and objects exist.
        backend
            .inner
            .write_record(&PoolRecord {
                spec: s.clone(),
                state: RecordState::Creating,
            })
            .unwrap();
        assert_eq!(
            backend.get_pool("p").await.unwrap().unwrap().phase,
            PoolPhase::Provisioning
        );
        drop(backend);
        let backend = open(dir.path());
        assert!(backend.get_pool("p").await.unwrap().is_none());
        assert!(tree(dir.path()).is_empty(), "{:?}", tree(dir.path()));
    }

    #[tokio::test]
    async fn conflicts_are_detected_across_strategies() {
        let dir = tempfile::tempdir().unwrap();
        let backend = open(dir.path());
        backend
            .create_pool(&spec("p", 1, dedicated()))
            .await
            .unwrap();
        let warm = Strategy::Warm {
            pool: "agents".into(),
        };
        for strategy in [
            warm,
            Strategy::Shared {
                size: "1Gi".into(),
                storage_class: None,
            },
            dedicated(),
        ] {
            let err = backend
                .create_pool(&spec("p", 2, strategy))
                .await
                .unwrap_err();
            assert!(matches!(err, BackendError::AlreadyExists), "{err}");
        }
        // A record lost (e.g. deleted by hand) still conflicts on objects.
        fs::remove_file(backend.inner.record_path("p")).unwrap();
        let err = backend
            .create_pool(&spec(
                "p",
                1,
                Strategy::Warm {
                    pool: "agents".into(),
                },
            ))
            .await
            .unwrap_err();
        assert!(matches!(err, BackendError::AlreadyExists), "{err}");
    }

    #[tokio::test]
    async fn delete_keeps_existing_volumes_and_is_idempotent() {
        let dir = tempfile::tempdir().unwrap();
        let backend = open(dir.path());
        let ctx = ContextSpec {
            name: "shared".into(),
            namespace: "default".into(),
            context_type: ContextType::Workspace,
            size: "2Gi".into(),
            access_mode: AccessMode::ReadWriteMany,
            storage_class: None,
            owner_scope: "owner-a".into(),
        };
        backend.create_context(&ctx).await.unwrap();
        let existing = Strategy::Existing {
            claim_name: "context-shared".into(),
            read_only: true,
        };
        let status = backend.create_pool(&spec("e", 2, existing)).await.unwrap();
        assert_eq!(status.workspace.size, "2Gi");
        assert_eq!(status.workspace.access_mode, "ReadWriteMany");
        assert!(backend.delete_pool("e").await.unwrap());
        assert!(!backend.delete_pool("e").await.unwrap());
        assert!(backend
            .get_context("default", "shared")
            .await
            .unwrap()
            .is_some());
        assert_eq!(
            tree(dir.path()),
            vec![
                "volumes/context-shared",
                "volumes/context-shared/data",
                "volumes/context-shared/volume.json"
            ]
        );
    }

    #[tokio::test]
    async fn another_owners_volume_is_not_found_and_rwo_needs_one_replica() {
        let dir = tempfile::tempdir().unwrap();
        let backend = open(dir.path());
        let ctx = ContextSpec {
            name: "mine".into(),
            namespace: "default".into(),
            context_type: ContextType::Memory,
            size: "1Gi".into(),
            access_mode: AccessMode::ReadWriteOnce,
            storage_class: Some("fast".into()),
            owner_scope: "owner-b".into(),
        };
        backend.create_context(&ctx).await.unwrap();
        let existing = |read_only| Strategy::Existing {
            claim_name: "context-mine".into(),
            read_only,
        };
        let err = backend
            .create_pool(&spec("e", 1, existing(false)))
            .await
            .unwrap_err();
        assert_eq!(
            err.to_string(),
            "invalid sandbox pool: workspace claim \"context-mine\" not found"
        );
        let mut theirs = spec("e", 2, existing(false));
        theirs.owner_scope = "owner-b".into();
        let err = backend.create_pool(&theirs).await.unwrap_err();
        assert_eq!(
            err.to_string(),
            "invalid sandbox pool: workspace claim \"context-mine\" must support ReadWriteMany for multiple sandboxes"
        );
        theirs.replicas = 1;
        let status = backend.create_pool(&theirs).await.unwrap();
        assert_eq!(status.workspace.storage_class.as_deref(), Some("fast"));
    }

    #[tokio::test]
    async fn a_sandbox_removed_behind_our_back_fails_the_pool() {
        let dir = tempfile::tempdir().unwrap();
        let backend = open(dir.path());
        backend
            .create_pool(&spec("p", 2, dedicated()))
            .await
            .unwrap();
        fs::remove_dir_all(backend.inner.sandbox_dir("sandbox-p-1")).unwrap();
        let status = backend.get_pool("p").await.unwrap().unwrap();
        assert_eq!(status.phase, PoolPhase::Failed);
        assert_eq!(status.ready_replicas, 1);
        assert_eq!(status.reason.as_deref(), Some("SandboxMissing"));
        assert!(status.message.unwrap().contains("sandbox-p-1"));
        assert!(!status.members[1].ready && status.members[0].ready);
        // Delete still cleans up what is left.
        assert!(backend.delete_pool("p").await.unwrap());
        assert!(tree(dir.path()).is_empty(), "{:?}", tree(dir.path()));
    }

    #[tokio::test]
    async fn wait_returns_at_once_when_settled_and_none_when_missing() {
        let dir = tempfile::tempdir().unwrap();
        let backend = open(dir.path());
        assert!(backend
            .wait_pool("nope", Duration::from_secs(5))
            .await
            .unwrap()
            .is_none());
        backend
            .create_pool(&spec("p", 1, dedicated()))
            .await
            .unwrap();
        let status = backend
            .wait_pool("p", Duration::from_secs(30))
            .await
            .unwrap()
            .unwrap();
        assert_eq!(status.phase, PoolPhase::Ready);
    }

    #[tokio::test]
    async fn a_half_made_context_volume_does_not_block_creation() {
        let dir = tempfile::tempdir().unwrap();
        let backend = open(dir.path());
        fs::create_dir_all(backend.inner.volume_dir("team", "context-notes")).unwrap();
        let ctx = ContextSpec {
            name: "notes".into(),
            namespace: "team".into(),
            context_type: ContextType::Memory,
            size: "1Gi".into(),
            access_mode: AccessMode::ReadWriteOnce,
            storage_class: None,
            owner_scope: "owner-a".into(),
        };
        assert!(backend
            .get_context("team", "notes")
            .await
            .unwrap()
            .is_none());
        let status = backend.create_context(&ctx).await.unwrap();
        assert_eq!(status.claim_name, "context-notes");
        let err = backend.create_context(&ctx).await.unwrap_err();
        assert!(matches!(err, BackendError::AlreadyExists), "{err}");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn concurrent_creates_and_deletes_of_many_pools() {
        let dir = tempfile::tempdir().unwrap();
        let backend = open(dir.path());
        let mut tasks = Vec::new();
        for i in 0..12 {
            let backend = backend.clone();
            let strategy = match i % 3 {
                0 => dedicated(),
                1 => Strategy::Shared {
                    size: "1Gi".into(),
                    storage_class: None,
                },
                _ => Strategy::Warm {
                    pool: "agents".into(),
                },
            };
            tasks.push(tokio::spawn(async move {
                backend
                    .create_pool(&spec(&format!("p{i}"), 5, strategy))
                    .await
            }));
        }
        for t in tasks {
            let status = t.await.unwrap().unwrap();
            assert_eq!((status.phase, status.ready_replicas), (PoolPhase::Ready, 5));
        }
        assert_eq!(backend.list_pools().await.unwrap().len(), 12);
        let mut tasks = Vec::new();
        for i in 0..12 {
            let backend = backend.clone();
            tasks.push(tokio::spawn(async move {
                backend.delete_pool(&format!("p{i}")).await
            }));
        }
        for t in tasks {
            assert!(t.await.unwrap().unwrap());
        }
        assert!(tree(dir.path()).is_empty(), "{:?}", tree(dir.path()));
    }
}
