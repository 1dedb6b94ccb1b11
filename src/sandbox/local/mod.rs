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
//!
//! One concern per module: `layout` (paths and file-system primitives),
//! `records` (the JSON records), `plan` (what a spec creates),
//! `reservation` (conflicts and names in flight), `create` (creation and
//! rollback), `delete` (deletion and crash recovery), `status` and
//! `volumes`, and `exec` (the delivery exec port). This module holds the backend type and the trait
//! implementation, which runs each operation on the blocking pool.

mod create;
mod delete;
mod exec;
mod layout;
mod plan;
mod records;
mod reservation;
mod status;
mod volumes;

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::watch;

use crate::delivery::ExecError;
use crate::fsutil;
use crate::pool::model::{ContextVolumeSpec, ContextVolumeStatus, Member, PoolSpec, PoolStatus};
use crate::pool::{BackendError, LabelSelector, SandboxBackend};

use layout::SANDBOX_FILE;
use reservation::Reservations;

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

/// What every operation works on: the tree, the settings, the reservations.
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

    /// The directory exec and delivery run in for sandbox `name`, from one
    /// read of its record: `NotFound` when there is no such sandbox,
    /// `Suspended` when it keeps its files but runs nothing (no pod).
    pub fn exec_dir(&self, name: &str) -> Result<PathBuf, ExecError> {
        if !crate::pool::validate::is_dns1123_subdomain(name) {
            return Err(ExecError::NotFound(name.to_owned()));
        }
        match self.inner.read_sandbox(name) {
            Ok(None) => Err(ExecError::NotFound(name.to_owned())),
            Ok(Some(meta)) if meta.suspended => Err(ExecError::Suspended(name.to_owned())),
            Ok(Some(_)) => Ok(self.inner.sandbox_dir(name)),
            // An unreadable record still names an existing sandbox.
            Err(_) => {
                let dir = self.inner.sandbox_dir(name);
                dir.join(SANDBOX_FILE)
                    .is_file()
                    .then_some(dir)
                    .ok_or_else(|| ExecError::NotFound(name.to_owned()))
            }
        }
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
        let span = tracing::Span::current();
        tokio::task::spawn_blocking(move || span.in_scope(|| f(&inner)))
            .await
            .map_err(|e| BackendError::internal("local backend task", e))?
    }
}

impl Inner {
    fn notify(&self) {
        self.changes.send_modify(|v| *v = v.wrapping_add(1));
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
        self.blocking(Inner::list_pools).await
    }

    async fn delete_pool(&self, name: &str) -> Result<bool, BackendError> {
        let name = name.to_owned();
        self.blocking(move |inner| inner.delete_pool(&name)).await
    }

    async fn set_suspended(
        &self,
        name: &str,
        suspended: bool,
    ) -> Result<Option<PoolStatus>, BackendError> {
        let name = name.to_owned();
        self.blocking(move |inner| inner.set_suspended(&name, suspended))
            .await
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

    async fn create_volume(
        &self,
        spec: &ContextVolumeSpec,
    ) -> Result<ContextVolumeStatus, BackendError> {
        let spec = spec.clone();
        self.blocking(move |inner| inner.create_volume(&spec)).await
    }

    async fn get_volume(
        &self,
        namespace: &str,
        name: &str,
    ) -> Result<Option<ContextVolumeStatus>, BackendError> {
        let (ns, name) = (namespace.to_owned(), name.to_owned());
        self.blocking(move |inner| inner.get_volume(&ns, &name))
            .await
    }

    async fn list_volumes(
        &self,
        namespace: &str,
    ) -> Result<Vec<ContextVolumeStatus>, BackendError> {
        let ns = namespace.to_owned();
        self.blocking(move |inner| inner.list_volumes(&ns)).await
    }

    async fn list_all_volumes(&self) -> Result<Vec<ContextVolumeStatus>, BackendError> {
        self.blocking(Inner::list_all_volumes).await
    }

    async fn delete_volume(&self, namespace: &str, name: &str) -> Result<bool, BackendError> {
        let (ns, name) = (namespace.to_owned(), name.to_owned());
        self.blocking(move |inner| inner.delete_volume(&ns, &name))
            .await
    }

    async fn list_sandboxes(&self, selector: &LabelSelector) -> Result<Vec<Member>, BackendError> {
        let selector = selector.clone();
        self.blocking(move |inner| inner.list_sandboxes(&selector))
            .await
    }
}

#[cfg(test)]
mod tests;
