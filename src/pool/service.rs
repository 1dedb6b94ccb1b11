//! The pool service: validation, owner scoping, uncancellable creation and
//! the mapping of backend errors to API errors.

use std::sync::Arc;
use std::time::Duration;

use crate::api::{ApiError, ApiResult};
use crate::backend::{BackendError, SandboxBackend};

use super::model::{ContextStatus, PoolStatus};
use super::validate::{self, CreateContextRequest, CreatePoolRequest};

/// Message of `404` for pools (also for another owner's pool).
pub const POOL_NOT_FOUND: &str = "sandbox pool not found";
/// Message of `409` for pools.
pub const POOL_EXISTS: &str = "sandbox pool already exists";
/// Message of `404` for named contexts (also for another owner's).
pub const CONTEXT_NOT_FOUND: &str = "context resource not found";
/// Message of `409` for named contexts.
pub const CONTEXT_EXISTS: &str = "context resource already exists";

/// Longest a `GET ?wait=ready` may hold a request.
pub const MAX_WAIT: Duration = Duration::from_secs(600);

/// Owner-scoped access to pools and named contexts.
///
/// Another owner's pool or context is answered exactly like a missing one.
/// `DELETE` is idempotent: when the pool (or context) is gone, or belongs to
/// someone else, the caller's goal "no such pool of mine" is met and the
/// answer is `204` either way.
#[derive(Clone)]
pub struct PoolService {
    backend: Arc<dyn SandboxBackend>,
}

impl std::fmt::Debug for PoolService {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("PoolService(..)")
    }
}

impl PoolService {
    /// A service over `backend`.
    pub fn new(backend: Arc<dyn SandboxBackend>) -> Self {
        Self { backend }
    }

    /// The backend (for other services, e.g. delivery into sandboxes).
    pub fn backend(&self) -> &Arc<dyn SandboxBackend> {
        &self.backend
    }

    /// `Ok` when the backend can serve requests; else `503 not_ready` (the
    /// cause goes to the log, not to the prober).
    pub async fn check_ready(&self) -> ApiResult<()> {
        self.backend.check_ready().await.map_err(|e| {
            tracing::warn!(error = %e, "sandbox backend not ready");
            ApiError::new(
                axum::http::StatusCode::SERVICE_UNAVAILABLE,
                "not_ready",
                "the sandbox backend is not reachable; see the service log",
            )
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
    ) -> ApiResult<PoolStatus> {
        let spec = validate::pool(req, owner_scope).map_err(|e| ApiError::invalid_request(e.0))?;
        let backend = self.backend.clone();
        let kind = spec.strategy.kind();
        let name = spec.name.clone();
        let task = tokio::spawn(async move { backend.create_pool(&spec).await });
        let status = task
            .await
            .map_err(|e| {
                ApiError::internal(format!("create sandbox pool {name}: task failed: {e}"))
            })?
            .map_err(|e| pool_error(e, &format!("create sandbox pool {name} ({kind})")))?;
        tracing::info!(pool = %name, strategy = kind, replicas = status.replicas, "sandbox pool created");
        Ok(status)
    }

    /// The caller's pool `name`.
    pub async fn get(&self, name: &str, owner_scope: &str) -> ApiResult<PoolStatus> {
        self.owned(name, owner_scope)
            .await?
            .ok_or_else(|| ApiError::not_found(POOL_NOT_FOUND))
    }

    /// The caller's pool `name` once it is `ready` or `failed`, or after
    /// `timeout` (capped at [`MAX_WAIT`]) with its current status.
    pub async fn wait(
        &self,
        name: &str,
        owner_scope: &str,
        timeout: Duration,
    ) -> ApiResult<PoolStatus> {
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
            .map_err(|e| pool_error(e, &format!("wait for sandbox pool {name}")))?;
        match status {
            Some(s) if s.owner_scope == owner_scope => Ok(s),
            _ => Err(ApiError::not_found(POOL_NOT_FOUND)),
        }
    }

    /// The caller's pools, sorted by name.
    pub async fn list(&self, owner_scope: &str) -> ApiResult<Vec<PoolStatus>> {
        let mut pools = self
            .backend
            .list_pools()
            .await
            .map_err(|e| pool_error(e, "list sandbox pools"))?;
        pools.retain(|p| p.owner_scope == owner_scope);
        pools.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(pools)
    }

    /// Deletes the caller's pool `name`; `Ok` also when there is none.
    pub async fn delete(&self, name: &str, owner_scope: &str) -> ApiResult<()> {
        if self.owned(name, owner_scope).await?.is_none() {
            return Ok(());
        }
        let backend = self.backend.clone();
        let owned_name = name.to_owned();
        // Like creation, a started deletion finishes even if the client leaves.
        let task = tokio::spawn(async move { backend.delete_pool(&owned_name).await });
        task.await
            .map_err(|e| {
                ApiError::internal(format!("delete sandbox pool {name}: task failed: {e}"))
            })?
            .map_err(|e| pool_error(e, &format!("delete sandbox pool {name}")))?;
        tracing::info!(pool = %name, "sandbox pool deleted");
        Ok(())
    }

    /// Validates `req` and creates the named context for `owner_scope`.
    pub async fn create_context(
        &self,
        req: &CreateContextRequest,
        owner_scope: &str,
    ) -> ApiResult<ContextStatus> {
        let spec =
            validate::context(req, owner_scope).map_err(|e| ApiError::invalid_request(e.0))?;
        let backend = self.backend.clone();
        let label = format!("create context {}/{}", spec.namespace, spec.name);
        let task = tokio::spawn(async move { backend.create_context(&spec).await });
        task.await
            .map_err(|e| ApiError::internal(format!("{label}: task failed: {e}")))?
            .map_err(|e| context_error(e, &label))
    }

    /// The caller's named context.
    pub async fn get_context(
        &self,
        namespace: &str,
        name: &str,
        owner_scope: &str,
    ) -> ApiResult<ContextStatus> {
        self.owned_context(namespace, name, owner_scope)
            .await?
            .ok_or_else(|| ApiError::not_found(CONTEXT_NOT_FOUND))
    }

    /// The caller's named contexts in `namespace`, sorted by name.
    pub async fn list_contexts(
        &self,
        namespace: &str,
        owner_scope: &str,
    ) -> ApiResult<Vec<ContextStatus>> {
        // A namespace that cannot exist holds nothing; never pass it on.
        if !validate::is_dns1123_label(namespace) {
            return Ok(Vec::new());
        }
        let mut items = self
            .backend
            .list_contexts(namespace)
            .await
            .map_err(|e| context_error(e, &format!("list contexts in {namespace}")))?;
        items.retain(|c| c.owner_scope == owner_scope);
        items.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(items)
    }

    /// Deletes the caller's named context; `Ok` also when there is none.
    pub async fn delete_context(
        &self,
        namespace: &str,
        name: &str,
        owner_scope: &str,
    ) -> ApiResult<()> {
        if self
            .owned_context(namespace, name, owner_scope)
            .await?
            .is_none()
        {
            return Ok(());
        }
        let backend = self.backend.clone();
        let (ns, n) = (namespace.to_owned(), name.to_owned());
        let label = format!("delete context {namespace}/{name}");
        let task = tokio::spawn(async move { backend.delete_context(&ns, &n).await });
        task.await
            .map_err(|e| ApiError::internal(format!("{label}: task failed: {e}")))?
            .map_err(|e| context_error(e, &label))?;
        Ok(())
    }

    async fn owned(&self, name: &str, owner_scope: &str) -> ApiResult<Option<PoolStatus>> {
        // A name that fails validation cannot exist; never pass it on to a
        // label selector or a path.
        if !validate::is_pool_name(name) {
            return Ok(None);
        }
        let status = self
            .backend
            .get_pool(name)
            .await
            .map_err(|e| pool_error(e, &format!("get sandbox pool {name}")))?;
        Ok(status.filter(|s| s.owner_scope == owner_scope))
    }

    async fn owned_context(
        &self,
        namespace: &str,
        name: &str,
        owner_scope: &str,
    ) -> ApiResult<Option<ContextStatus>> {
        if !validate::is_pool_name(name) || !validate::is_dns1123_label(namespace) {
            return Ok(None);
        }
        let status = self
            .backend
            .get_context(namespace, name)
            .await
            .map_err(|e| context_error(e, &format!("get context {namespace}/{name}")))?;
        Ok(status.filter(|s| s.owner_scope == owner_scope))
    }
}

fn pool_error(err: BackendError, doing: &str) -> ApiError {
    match err {
        BackendError::AlreadyExists => ApiError::already_exists(POOL_EXISTS),
        BackendError::Invalid(_) => ApiError::invalid_request(err.to_string()),
        BackendError::Internal { .. } => ApiError::internal(format!("{doing}: {err:#}")),
    }
}

fn context_error(err: BackendError, doing: &str) -> ApiError {
    match err {
        BackendError::AlreadyExists => ApiError::already_exists(CONTEXT_EXISTS),
        // Contexts have no "invalid" path upstream; keep the text anyway.
        BackendError::Invalid(_) => ApiError::invalid_request(err.to_string()),
        BackendError::Internal { .. } => ApiError::internal(format!("{doing}: {err:#}")),
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicBool, Ordering};

    use super::*;
    use crate::pool::model::{ContextSpec, PoolSpec};
    use crate::pool::validate::WorkspaceRequest;

    /// Fails creation half-way after a delay, then "rolls back".
    #[derive(Default)]
    struct SlowFailing {
        rolled_back: AtomicBool,
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
        async fn create_context(&self, _: &ContextSpec) -> Result<ContextStatus, BackendError> {
            Err(BackendError::AlreadyExists)
        }
        async fn get_context(
            &self,
            _: &str,
            _: &str,
        ) -> Result<Option<ContextStatus>, BackendError> {
            Ok(None)
        }
        async fn list_contexts(&self, _: &str) -> Result<Vec<ContextStatus>, BackendError> {
            Ok(Vec::new())
        }
        async fn delete_context(&self, _: &str, _: &str) -> Result<bool, BackendError> {
            Ok(false)
        }
        async fn check_ready(&self) -> Result<(), BackendError> {
            Err(BackendError::internal(
                "reach the Kubernetes API",
                std::io::Error::other("connection refused"),
            ))
        }
    }

    #[tokio::test]
    async fn an_unreachable_backend_is_not_ready_without_leaking_why() {
        let service = PoolService::new(Arc::new(SlowFailing::default()));
        let err = service.check_ready().await.unwrap_err();
        assert_eq!(err.status(), 503);
        assert_eq!(err.code(), "not_ready");
        assert!(!err.message().contains("connection refused"));
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
    async fn backend_errors_map_to_generic_api_errors() {
        let service = PoolService::new(Arc::new(SlowFailing::default()));
        let err = service.create(&request(), "o").await.unwrap_err();
        assert_eq!(err.code(), "internal_error");
        assert!(!err.message().contains("secret"), "{}", err.message());
        let ctx = CreateContextRequest {
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
        let err = service.create_context(&ctx, "o").await.unwrap_err();
        assert_eq!(
            (err.code(), err.message()),
            ("already_exists", CONTEXT_EXISTS)
        );
        // Missing and invalid names are simply absent; delete is idempotent.
        let err = service.get("Not_A_Name", "o").await.unwrap_err();
        assert_eq!((err.code(), err.message()), ("not_found", POOL_NOT_FOUND));
        service.delete("p", "o").await.unwrap();
    }
}
