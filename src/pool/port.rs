//! The port of the pool domain: what it needs from a sandbox backend.
//!
//! The sandbox backends (`crate::sandbox`: the embedded `local` directories,
//! or agent-sandbox objects in Kubernetes) implement [`SandboxBackend`]; the
//! pool service only ever talks to this trait, so the one arrow between the
//! two runs `sandbox → pool`.

use std::time::Duration;

use k8s_openapi::jiff::Timestamp;

use super::model::{ContextVolumeSpec, ContextVolumeStatus, Member, PoolSpec, PoolStatus};
use super::selector::LabelSelector;

/// Why a backend call failed.
#[derive(Debug, thiserror::Error)]
pub enum BackendError {
    /// The first object to create already exists (any strategy), or the
    /// context's volume exists: answered `409 already_exists`.
    #[error("already exists")]
    AlreadyExists,
    /// The request names something unusable (missing claim or warm pool,
    /// claim without RWX for several replicas). The text follows upstream,
    /// without the prefix: answered `400` as `invalid sandbox pool: <text>`,
    /// e.g. `workspace claim "x" not found`.
    #[error("invalid sandbox pool: {0}")]
    Invalid(String),
    /// Anything else. Logged with its source; answered as a generic `500`.
    #[error("{context}: {source}")]
    Internal {
        /// What the backend was doing, e.g. `create sandbox 3`.
        context: String,
        /// The cause.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync + 'static>,
    },
}

impl BackendError {
    /// An internal error: `context` says what was being done.
    pub fn internal(
        context: impl Into<String>,
        source: impl Into<Box<dyn std::error::Error + Send + Sync + 'static>>,
    ) -> Self {
        BackendError::Internal {
            context: context.into(),
            source: source.into(),
        }
    }
}

/// Where pools and named contexts live.
///
/// Conventions every implementation follows:
/// - names and labels from [`super::names`]; every object carries the
///   pool label, `managed-by` and the owner label;
/// - an existing claim that is a managed volume of *another* owner is
///   reported like a missing one (`Invalid("workspace claim \"x\" not found")`);
/// - `get`/`list` report a pool while any of its managed objects exists;
/// - errors never carry secrets; their text is logged, never answered.
#[async_trait::async_trait]
pub trait SandboxBackend: Send + Sync + 'static {
    /// Creates every object of `spec`. Conflicts across all strategies (any
    /// managed object under that pool name) give [`BackendError::AlreadyExists`]
    /// with nothing created. On a failure half-way it removes what it created
    /// in this call, then returns the error. The caller runs this in a task
    /// that a client disconnect cannot cancel.
    async fn create_pool(&self, spec: &PoolSpec) -> Result<PoolStatus, BackendError>;

    /// The pool's current status; `None` when no object of it exists.
    async fn get_pool(&self, name: &str) -> Result<Option<PoolStatus>, BackendError>;

    /// Every pool (of every owner; the service filters), sorted by name.
    async fn list_pools(&self) -> Result<Vec<PoolStatus>, BackendError>;

    /// Deletes the pool's claims, sandboxes and managed volumes; never an
    /// existing claim, a warm pool or a template. `false` when nothing
    /// existed. Idempotent: a retry after a partial failure finishes the job.
    async fn delete_pool(&self, name: &str) -> Result<bool, BackendError>;

    /// Deletes, of every owner, what creates left behind when the process
    /// running them died half-way (before finishing or rolling back), once
    /// their window has passed; answers the earliest window still open, so
    /// the reaper looks again then. Each deletion is logged. The default
    /// has nothing to do: the `local` backend rolls such a create back at
    /// its next start.
    async fn reap_abandoned(&self, now: Timestamp) -> Result<Option<Timestamp>, BackendError> {
        let _ = now;
        Ok(None)
    }

    /// Suspends (`true`) or resumes (`false`) every sandbox of the direct
    /// pool `name`: a suspended sandbox runs no pod (no exec, no delivery)
    /// but keeps its name and volumes; resuming starts new pods. Idempotent.
    /// Answers the pool's status afterwards; `None` = no such pool. The
    /// service never calls it for warm-pool pools.
    async fn set_suspended(
        &self,
        name: &str,
        suspended: bool,
    ) -> Result<Option<PoolStatus>, BackendError> {
        let _ = (name, suspended);
        Err(BackendError::internal(
            "suspend or resume a sandbox pool",
            "not supported by this backend",
        ))
    }

    /// Resolves when the pool is `ready`, `failed` or `suspended`, or when `timeout`
    /// passes (then with the current status). `None` = no such pool (also
    /// when it disappears while waiting).
    async fn wait_pool(
        &self,
        name: &str,
        timeout: Duration,
    ) -> Result<Option<PoolStatus>, BackendError>;

    /// Creates the volume `context-<name>` in `spec.namespace`;
    /// [`BackendError::AlreadyExists`] if that volume exists (whoever made it).
    async fn create_volume(
        &self,
        spec: &ContextVolumeSpec,
    ) -> Result<ContextVolumeStatus, BackendError>;

    /// The named context; `None` when its volume is missing or is not a
    /// managed context volume of that name.
    async fn get_volume(
        &self,
        namespace: &str,
        name: &str,
    ) -> Result<Option<ContextVolumeStatus>, BackendError>;

    /// Every named context in `namespace` (every owner), sorted by name.
    async fn list_volumes(&self, namespace: &str)
        -> Result<Vec<ContextVolumeStatus>, BackendError>;

    /// Every named context in every namespace (every owner), for the
    /// per-owner context quota.
    async fn list_all_volumes(&self) -> Result<Vec<ContextVolumeStatus>, BackendError>;

    /// Deletes the named context's volume; `false` when it did not exist.
    async fn delete_volume(&self, namespace: &str, name: &str) -> Result<bool, BackendError>;

    /// Every sandbox (of any owner, in the service namespace) whose labels
    /// match `selector`, sorted by name, with its pod and readiness. For
    /// deliveries into sandboxes an operator designated as shared
    /// (`--delivery-shared-selector`). The default finds none.
    async fn list_sandboxes(&self, selector: &LabelSelector) -> Result<Vec<Member>, BackendError> {
        let _ = selector;
        Ok(Vec::new())
    }

    /// Whether the backend can serve requests now, for `/readyz`. Local
    /// directories are always there; a cluster backend checks its API and
    /// that its watches run.
    async fn check_ready(&self) -> Result<(), BackendError> {
        Ok(())
    }
}
