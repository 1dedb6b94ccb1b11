//! Sandbox backends: where pools and named contexts really live.
//!
//! Two implementations of the pool domain's port,
//! [`crate::pool::SandboxBackend`] (and of the delivery exec port,
//! [`crate::delivery::SandboxExec`]): `local` (the embedded default:
//! directories under the data dir) and `kube` (agent-sandbox CRDs and PVCs
//! in a Kubernetes namespace). Backends know nothing about owners beyond
//! recording and reporting [`crate::pool::PoolSpec::owner_scope`]; the pool
//! service filters and hides other owners' objects.

pub mod kube;
pub mod local;

use std::sync::Arc;

use crate::delivery::SandboxExec;
use crate::pool::SandboxBackend;

/// Which backend to open, with its settings (built by the application from
/// its configuration).
#[derive(Debug, Clone)]
pub enum SandboxSettings {
    /// Directories under the data dir.
    Local(local::LocalSettings),
    /// A Kubernetes cluster with the agent-sandbox controller (boxed: many
    /// times the size of the local settings).
    Kube(Box<kube::KubeSettings>),
}

/// An opened backend: the pool domain's port, and the delivery exec port
/// where the backend implements it.
pub struct OpenedBackend {
    /// Pools and named contexts.
    pub pools: Arc<dyn SandboxBackend>,
    /// Runs commands in sandboxes (`None`: deliveries are not available).
    pub exec: Option<Arc<dyn SandboxExec>>,
}

/// Opens the backend `settings` select; a `kube` backend starts its watch
/// caches here and talks through `kube_client` when given, else through
/// the client the environment configures (in-cluster or `KUBECONFIG`).
pub async fn open(
    settings: SandboxSettings,
    kube_client: Option<::kube::Client>,
) -> anyhow::Result<OpenedBackend> {
    match settings {
        SandboxSettings::Local(settings) => {
            let backend = Arc::new(local::LocalBackend::open(settings)?);
            Ok(OpenedBackend {
                pools: backend.clone(),
                exec: Some(backend),
            })
        }
        SandboxSettings::Kube(settings) => {
            let backend = match kube_client {
                Some(client) => kube::KubeBackend::new(client, *settings)?,
                None => kube::KubeBackend::try_default(*settings).await?,
            };
            backend.start_watchers();
            let exec = kube::exec::KubeExec::new(
                backend.client().clone(),
                &backend.settings().namespace,
                backend.settings().delivery_container.clone(),
            );
            Ok(OpenedBackend {
                pools: Arc::new(backend),
                exec: Some(Arc::new(exec)),
            })
        }
    }
}
