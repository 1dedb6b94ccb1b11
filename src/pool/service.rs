//! The pool service: validation, owner scoping, and backend calls that a
//! client disconnect cannot cancel. Failures are [`PoolError`]s; the API
//! decides how they are answered.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::jiff::{SignedDuration, Timestamp};
use tokio::sync::Notify;

use super::error::{PoolError, PoolResult, Subject};
use super::model::{ContextVolumeStatus, PoolStatus, Strategy};
use super::port::{BackendError, SandboxBackend};
use super::quota::QuotaGate;
use super::validate::{self, CreateContextVolumeRequest, CreatePoolRequest, TtlBounds};

/// Longest a `GET ?wait=ready` may hold a request.
pub const MAX_WAIT: Duration = Duration::from_secs(600);

/// Per-owner quotas of pools and named contexts; `0` means no quota.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PoolQuotas {
    /// Most sandbox replicas an owner's pools hold together.
    pub replicas: u32,
    /// Most named contexts an owner holds, across namespaces.
    pub contexts: u32,
}

impl Default for PoolQuotas {
    fn default() -> Self {
        Self {
            replicas: 100,
            contexts: 20,
        }
    }
}

/// Owner-scoped access to pools and named contexts.
///
/// Another owner's pool or context is answered exactly like a missing one,
/// on `DELETE` too: [`PoolError::NotFound`] (`404`), as upstream and
/// Kubernetes answer, so a second delete tells the caller it was gone.
#[derive(Clone)]
pub struct PoolService {
    backend: Arc<dyn SandboxBackend>,
    quotas: PoolQuotas,
    pool_gate: Arc<QuotaGate>,
    context_gate: Arc<QuotaGate>,
    ttl_bounds: TtlBounds,
    /// Woken when a pool with an expiry is created, so the reaper
    /// re-plans its next wake-up (a new pool may expire first).
    expiries: Arc<Notify>,
}

/// Message of `409 pool_not_suspendable` for warm-pool pools.
pub const WARM_NOT_SUSPENDABLE: &str = "a warm-pool pool cannot be suspended: its sandboxes are adopted from the warm pool's template, which need not keep any volume, so suspending would discard their state; delete the pool instead";

impl std::fmt::Debug for PoolService {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("PoolService(..)")
    }
}

impl PoolService {
    /// A service over `backend` with the default quotas.
    pub fn new(backend: Arc<dyn SandboxBackend>) -> Self {
        Self::with_quotas(backend, PoolQuotas::default())
    }

    /// A service over `backend` enforcing `quotas`.
    pub fn with_quotas(backend: Arc<dyn SandboxBackend>, quotas: PoolQuotas) -> Self {
        Self {
            backend,
            quotas,
            pool_gate: Arc::new(QuotaGate::new()),
            context_gate: Arc::new(QuotaGate::new()),
            ttl_bounds: TtlBounds::default(),
            expiries: Arc::new(Notify::new()),
        }
    }

    /// The same service accepting a pool `ttl` within `bounds`.
    pub fn with_ttl_bounds(mut self, bounds: TtlBounds) -> Self {
        self.ttl_bounds = bounds;
        self
    }

    /// Notified whenever a pool with an expiry was created (for the reaper).
    pub fn expiries(&self) -> &Arc<Notify> {
        &self.expiries
    }

    /// The backend (for other services, e.g. delivery into sandboxes).
    pub fn backend(&self) -> &Arc<dyn SandboxBackend> {
        &self.backend
    }

    /// `Ok` when the backend can serve requests; else
    /// [`PoolError::NotReady`] (the cause goes to the log, not to the
    /// prober).
    pub async fn check_ready(&self) -> PoolResult<()> {
        self.backend.check_ready().await.map_err(|e| {
            tracing::warn!(error = %e, "sandbox backend not ready");
            PoolError::NotReady(e)
        })
    }

    /// Validates `req` and creates the pool for `owner_scope`.
    ///
    /// The backend runs in its own task: if the client disconnects, this
    /// future is dropped but creation (and any rollback) runs to completion.
    pub async fn create(
        &self,
        req: &CreatePoolRequest,
        owner_scope: &str,
    ) -> PoolResult<PoolStatus> {
        let mut spec =
            validate::pool(req, owner_scope).map_err(|e| PoolError::Invalid(e.0.into()))?;
        // After upstream's rules, so their messages keep their order.
        let ttl = validate::ttl(&req.ttl, self.ttl_bounds).map_err(|e| PoolError::Invalid(e.0))?;
        spec.expires_at = ttl.map(expiry_after);
        let reservation = match self.quotas.replicas {
            0 => None,
            quota => {
                let listed = async {
                    let pools = self.list(owner_scope).await?;
                    Ok(pools
                        .into_iter()
                        .map(|p| (p.name, u64::from(p.replicas)))
                        .collect())
                };
                let reserved = self
                    .pool_gate
                    .reserve(
                        owner_scope,
                        &spec.name,
                        spec.replicas.into(),
                        quota.into(),
                        listed,
                    )
                    .await?;
                Some(reserved.map_err(|held| PoolError::PoolQuotaExceeded {
                    quota,
                    held,
                    asked: spec.replicas,
                })?)
            }
        };
        let backend = self.backend.clone();
        let kind = spec.strategy.kind();
        let name = spec.name.clone();
        let doing = format!("create sandbox pool {name} ({kind})");
        // The reservation is released by the detached task, when the
        // backend is done, even if the client left.
        let status = detached(Subject::Pool, doing, async move {
            let created = backend.create_pool(&spec).await;
            if let Some(r) = reservation {
                r.release().await;
            }
            created
        })
        .await?;
        if status.expires_at.is_some() {
            self.expiries.notify_one();
        }
        tracing::info!(pool = %name, strategy = kind, replicas = status.replicas, expires_at = ?status.expires_at, "sandbox pool created");
        Ok(status)
    }

    /// Suspends (`true`) or resumes (`false`) the caller's pool `name`:
    /// idempotent, answers the pool afterwards. Warm-pool pools answer
    /// [`PoolError::NotSuspendable`].
    pub async fn set_suspended(
        &self,
        name: &str,
        owner_scope: &str,
        suspended: bool,
    ) -> PoolResult<PoolStatus> {
        let current = self.get(name, owner_scope).await?;
        if matches!(current.strategy, Strategy::Warm { .. }) {
            return Err(PoolError::NotSuspendable(WARM_NOT_SUSPENDABLE.to_owned()));
        }
        let backend = self.backend.clone();
        let owned_name = name.to_owned();
        let (doing, done) = if suspended {
            ("suspend", "sandbox pool suspended")
        } else {
            ("resume", "sandbox pool resumed")
        };
        // Like a delete, a started suspend or resume reaches every sandbox
        // even if the client leaves.
        let status = detached(
            Subject::Pool,
            format!("{doing} sandbox pool {name}"),
            async move { backend.set_suspended(&owned_name, suspended).await },
        )
        .await?
        .ok_or(PoolError::NotFound(Subject::Pool))?;
        tracing::info!(pool = %name, phase = status.phase.as_str(), "{done}");
        Ok(status)
    }

    /// Deletes every pool (of any owner) that expired at `now`, and what
    /// creates abandoned half-way left once their window passed
    /// ([`SandboxBackend::reap_abandoned`]); answers the next such instant
    /// still ahead. One failed delete is logged and retried at the next
    /// pass, never stops the others.
    pub async fn reap(&self, now: Timestamp) -> Result<Option<Timestamp>, BackendError> {
        let pools = self.backend.list_pools().await?;
        let mut next: Option<Timestamp> = None;
        for pool in pools {
            let Some(at) = pool.expires_at else { continue };
            if at > now {
                next = Some(next.map_or(at, |n| n.min(at)));
                continue;
            }
            match self.backend.delete_pool(&pool.name).await {
                Ok(_) => {
                    tracing::info!(pool = %pool.name, expired_at = %at, "expired sandbox pool deleted");
                }
                Err(e) => {
                    tracing::warn!(pool = %pool.name, error = %e, "deleting an expired sandbox pool failed; retrying later");
                }
            }
        }
        let window = self.backend.reap_abandoned(now).await?;
        Ok(match (next, window) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        })
    }

    /// The caller's pool `name`.
    pub async fn get(&self, name: &str, owner_scope: &str) -> PoolResult<PoolStatus> {
        self.owned(name, owner_scope)
            .await?
            .ok_or(PoolError::NotFound(Subject::Pool))
    }

    /// The caller's pool `name` once it is `ready` or `failed`, or after
    /// `timeout` (capped at [`MAX_WAIT`]) with its current status.
    pub async fn wait(
        &self,
        name: &str,
        owner_scope: &str,
        timeout: Duration,
    ) -> PoolResult<PoolStatus> {
        // Check ownership first, so another owner's pool answers at once,
        // exactly like a missing one.
        let current = self.get(name, owner_scope).await?;
        if current.phase.is_settled() {
            return Ok(current);
        }
        let status = self
            .backend
            .wait_pool(name, timeout.min(MAX_WAIT))
            .await
            .map_err(|e| {
                PoolError::from_backend(e, Subject::Pool, format!("wait for sandbox pool {name}"))
            })?;
        match status {
            Some(s) if s.owner_scope == owner_scope => Ok(s),
            _ => Err(PoolError::NotFound(Subject::Pool)),
        }
    }

    /// The caller's pools, sorted by name.
    pub async fn list(&self, owner_scope: &str) -> PoolResult<Vec<PoolStatus>> {
        let mut pools = self.backend.list_pools().await.map_err(|e| {
            PoolError::from_backend(e, Subject::Pool, "list sandbox pools".to_owned())
        })?;
        pools.retain(|p| p.owner_scope == owner_scope);
        pools.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(pools)
    }

    /// Every owner's pools, unsorted: for the metrics sampler, never for a
    /// caller.
    pub async fn list_all(&self) -> Result<Vec<PoolStatus>, BackendError> {
        self.backend.list_pools().await
    }

    /// Deletes the caller's pool `name`; [`PoolError::NotFound`] when the
    /// caller has none (also when a concurrent delete removed it first).
    pub async fn delete(&self, name: &str, owner_scope: &str) -> PoolResult<()> {
        if self.owned(name, owner_scope).await?.is_none() {
            return Err(PoolError::NotFound(Subject::Pool));
        }
        let backend = self.backend.clone();
        let owned_name = name.to_owned();
        // Like creation, a started deletion finishes even if the client leaves.
        let deleted = detached(
            Subject::Pool,
            format!("delete sandbox pool {name}"),
            async move { backend.delete_pool(&owned_name).await },
        )
        .await?;
        if !deleted {
            return Err(PoolError::NotFound(Subject::Pool));
        }
        tracing::info!(pool = %name, "sandbox pool deleted");
        Ok(())
    }

    /// Validates `req` and creates the named context for `owner_scope`.
    pub async fn create_volume(
        &self,
        req: &CreateContextVolumeRequest,
        owner_scope: &str,
    ) -> PoolResult<ContextVolumeStatus> {
        let spec =
            validate::context(req, owner_scope).map_err(|e| PoolError::Invalid(e.0.into()))?;
        let reservation = match self.quotas.contexts {
            0 => None,
            quota => {
                let listed = async {
                    let all = self.backend.list_all_volumes().await.map_err(|e| {
                        PoolError::from_backend(e, Subject::Context, "list contexts".to_owned())
                    })?;
                    Ok(all
                        .into_iter()
                        .filter(|c| c.owner_scope == owner_scope)
                        .map(|c| (format!("{}/{}", c.namespace, c.name), 1))
                        .collect())
                };
                let key = format!("{}/{}", spec.namespace, spec.name);
                let reserved = self
                    .context_gate
                    .reserve(owner_scope, &key, 1, quota.into(), listed)
                    .await?;
                Some(reserved.map_err(|_| PoolError::ContextQuotaExceeded(quota))?)
            }
        };
        let backend = self.backend.clone();
        let doing = format!("create context {}/{}", spec.namespace, spec.name);
        detached(Subject::Context, doing, async move {
            let created = backend.create_volume(&spec).await;
            if let Some(r) = reservation {
                r.release().await;
            }
            created
        })
        .await
    }

    /// The caller's named context.
    pub async fn get_volume(
        &self,
        namespace: &str,
        name: &str,
        owner_scope: &str,
    ) -> PoolResult<ContextVolumeStatus> {
        self.owned_context(namespace, name, owner_scope)
            .await?
            .ok_or(PoolError::NotFound(Subject::Context))
    }

    /// The caller's named contexts in `namespace`, sorted by name.
    pub async fn list_volumes(
        &self,
        namespace: &str,
        owner_scope: &str,
    ) -> PoolResult<Vec<ContextVolumeStatus>> {
        // A namespace that cannot exist holds nothing; never pass it on.
        if !validate::is_dns1123_label(namespace) {
            return Ok(Vec::new());
        }
        let mut items = self.backend.list_volumes(namespace).await.map_err(|e| {
            PoolError::from_backend(e, Subject::Context, format!("list contexts in {namespace}"))
        })?;
        items.retain(|c| c.owner_scope == owner_scope);
        items.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(items)
    }

    /// Deletes the caller's named context; [`PoolError::NotFound`] when the
    /// caller has none.
    pub async fn delete_volume(
        &self,
        namespace: &str,
        name: &str,
        owner_scope: &str,
    ) -> PoolResult<()> {
        if self
            .owned_context(namespace, name, owner_scope)
            .await?
            .is_none()
        {
            return Err(PoolError::NotFound(Subject::Context));
        }
        let backend = self.backend.clone();
        let (ns, n) = (namespace.to_owned(), name.to_owned());
        let doing = format!("delete context {namespace}/{name}");
        let deleted = detached(Subject::Context, doing, async move {
            backend.delete_volume(&ns, &n).await
        })
        .await?;
        if !deleted {
            return Err(PoolError::NotFound(Subject::Context));
        }
        Ok(())
    }

    async fn owned(&self, name: &str, owner_scope: &str) -> PoolResult<Option<PoolStatus>> {
        // A name that fails validation cannot exist; never pass it on to a
        // label selector or a path.
        if !validate::is_pool_name(name) {
            return Ok(None);
        }
        let status = self.backend.get_pool(name).await.map_err(|e| {
            PoolError::from_backend(e, Subject::Pool, format!("get sandbox pool {name}"))
        })?;
        Ok(status.filter(|s| s.owner_scope == owner_scope))
    }

    async fn owned_context(
        &self,
        namespace: &str,
        name: &str,
        owner_scope: &str,
    ) -> PoolResult<Option<ContextVolumeStatus>> {
        if !validate::is_pool_name(name) || !validate::is_dns1123_label(namespace) {
            return Ok(None);
        }
        let status = self
            .backend
            .get_volume(namespace, name)
            .await
            .map_err(|e| {
                PoolError::from_backend(
                    e,
                    Subject::Context,
                    format!("get context {namespace}/{name}"),
                )
            })?;
        Ok(status.filter(|s| s.owner_scope == owner_scope))
    }
}

/// Now plus `ttl`, rounded up to whole seconds (what a `metav1.Time`
/// stores), so a pool never expires before its `ttl` passed.
fn expiry_after(ttl: Duration) -> Timestamp {
    let ttl = SignedDuration::try_from(ttl).unwrap_or(SignedDuration::MAX);
    let at = Timestamp::now().checked_add(ttl).unwrap_or(Timestamp::MAX);
    let second = at.as_second() + i64::from(at.subsec_nanosecond() > 0);
    Timestamp::from_second(second).unwrap_or(at)
}

/// Runs a mutation of `subject` in its own task and maps its failure.
///
/// A client disconnect drops the caller's future; the task still runs the
/// backend call (and any rollback it does) to completion, so no request can
/// leave half a pool behind.
async fn detached<T, F>(subject: Subject, doing: String, work: F) -> PoolResult<T>
where
    T: Send + 'static,
    F: Future<Output = Result<T, BackendError>> + Send + 'static,
{
    // In the caller's span, so its log lines name the request.
    match tokio::spawn(tracing::Instrument::in_current_span(work)).await {
        Ok(result) => result.map_err(|e| PoolError::from_backend(e, subject, doing)),
        Err(e) => Err(PoolError::Internal {
            doing,
            source: BackendError::internal("task failed", e),
        }),
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicBool, Ordering};

    use super::*;
    use crate::pool::error::{CONTEXT_EXISTS, POOL_NOT_FOUND};
    use crate::pool::model::{ContextVolumeSpec, PoolSpec};
    use crate::pool::validate::WorkspaceRequest;

    /// Fails creation half-way after a delay, then "rolls back".
    #[derive(Default)]
    struct SlowFailing {
        rolled_back: AtomicBool,
        /// What `reap_abandoned` answers.
        window: Option<Timestamp>,
    }

    #[async_trait::async_trait]
    impl SandboxBackend for SlowFailing {
        async fn create_pool(&self, _: &PoolSpec) -> Result<PoolStatus, BackendError> {
            tokio::time::sleep(Duration::from_millis(200)).await;
            self.rolled_back.store(true, Ordering::SeqCst);
            Err(BackendError::internal(
                "create sandbox 3",
                std::io::Error::other("secret kube detail"),
            ))
        }
        async fn get_pool(&self, _: &str) -> Result<Option<PoolStatus>, BackendError> {
            Ok(None)
        }
        async fn list_pools(&self) -> Result<Vec<PoolStatus>, BackendError> {
            Ok(Vec::new())
        }
        async fn delete_pool(&self, _: &str) -> Result<bool, BackendError> {
            Ok(false)
        }
        async fn wait_pool(
            &self,
            _: &str,
            _: Duration,
        ) -> Result<Option<PoolStatus>, BackendError> {
            Ok(None)
        }
        async fn create_volume(
            &self,
            _: &ContextVolumeSpec,
        ) -> Result<ContextVolumeStatus, BackendError> {
            Err(BackendError::AlreadyExists)
        }
        async fn get_volume(
            &self,
            _: &str,
            _: &str,
        ) -> Result<Option<ContextVolumeStatus>, BackendError> {
            Ok(None)
        }
        async fn list_volumes(&self, _: &str) -> Result<Vec<ContextVolumeStatus>, BackendError> {
            Ok(Vec::new())
        }
        async fn list_all_volumes(&self) -> Result<Vec<ContextVolumeStatus>, BackendError> {
            Ok(Vec::new())
        }
        async fn delete_volume(&self, _: &str, _: &str) -> Result<bool, BackendError> {
            Ok(false)
        }
        async fn reap_abandoned(&self, _: Timestamp) -> Result<Option<Timestamp>, BackendError> {
            Ok(self.window)
        }
        async fn check_ready(&self) -> Result<(), BackendError> {
            Err(BackendError::internal(
                "reach the Kubernetes API",
                std::io::Error::other("connection refused"),
            ))
        }
    }

    #[tokio::test]
    async fn the_reaper_also_wakes_at_the_end_of_an_unfinished_create() {
        let at = Timestamp::now()
            .checked_add(SignedDuration::from_secs(30))
            .unwrap();
        let backend = SlowFailing {
            window: Some(at),
            ..SlowFailing::default()
        };
        let service = PoolService::new(Arc::new(backend));
        assert_eq!(service.reap(Timestamp::now()).await.unwrap(), Some(at));
        // Nothing expiring, nothing unfinished: no wake-up but the rescan.
        let service = PoolService::new(Arc::new(SlowFailing::default()));
        assert_eq!(service.reap(Timestamp::now()).await.unwrap(), None);
    }

    #[tokio::test]
    async fn an_unreachable_backend_is_not_ready_without_leaking_why() {
        let service = PoolService::new(Arc::new(SlowFailing::default()));
        let err = service.check_ready().await.unwrap_err();
        // `From<PoolError> for ApiError` answers this `503 not_ready`.
        assert!(matches!(err, PoolError::NotReady(_)), "{err:?}");
        assert!(!err.to_string().contains("connection refused"));
    }

    fn request() -> CreatePoolRequest {
        CreatePoolRequest {
            name: "p".into(),
            replicas: 5,
            warm_pool_ref: String::new(),
            workspace: WorkspaceRequest {
                size: "1Gi".into(),
                access_mode: "ReadWriteOnce".into(),
                ..Default::default()
            },
            ttl: String::new(),
        }
    }

    #[tokio::test]
    async fn a_dropped_caller_does_not_cancel_creation_or_rollback() {
        let backend = Arc::new(SlowFailing::default());
        let service = PoolService::new(backend.clone());
        let req = request();
        // The client goes away long before the backend finishes.
        let dropped =
            tokio::time::timeout(Duration::from_millis(20), service.create(&req, "o")).await;
        assert!(dropped.is_err());
        tokio::time::sleep(Duration::from_millis(400)).await;
        assert!(backend.rolled_back.load(Ordering::SeqCst));
    }

    #[tokio::test]
    async fn backend_errors_map_to_domain_errors() {
        let service = PoolService::new(Arc::new(SlowFailing::default()));
        let err = service.create(&request(), "o").await.unwrap_err();
        // Answered as a generic `500 internal_error`; the cause is logged.
        assert!(
            matches!(&err, PoolError::Internal { doing, .. } if doing == "create sandbox pool p (dedicated)"),
            "{err:?}"
        );
        let ctx = CreateContextVolumeRequest {
            name: "c".into(),
            namespace: "ns".into(),
            context_type: "memory".into(),
            storage: validate::StorageRequest {
                backend: "pvc".into(),
                size: "1Gi".into(),
                access_mode: "ReadWriteOnce".into(),
                storage_class: String::new(),
            },
        };
        let err = service.create_volume(&ctx, "o").await.unwrap_err();
        assert!(matches!(err, PoolError::AlreadyExists(Subject::Context)));
        assert_eq!(err.to_string(), CONTEXT_EXISTS);
        // Missing and invalid names are simply absent, for delete too.
        let err = service.get("Not_A_Name", "o").await.unwrap_err();
        assert!(matches!(err, PoolError::NotFound(Subject::Pool)));
        assert_eq!(err.to_string(), POOL_NOT_FOUND);
        let err = service.delete("p", "o").await.unwrap_err();
        assert!(matches!(err, PoolError::NotFound(Subject::Pool)));
        let err = service.delete_volume("ns", "c", "o").await.unwrap_err();
        assert!(matches!(err, PoolError::NotFound(Subject::Context)));
    }
}
