//! Settings of the `kube` backend: where objects go and what the sandbox pod
//! looks like.

use std::time::Duration;

/// The default field manager recorded on every object this service writes.
pub const DEFAULT_FIELD_MANAGER: &str = "context-service";

/// Default of [`KubeSettings::create_window`]: far above the ≈10 s of a
/// 100-sandbox pool.
pub const DEFAULT_CREATE_WINDOW: Duration = Duration::from_secs(120);

/// Default of [`KubeSettings::volume_bind_timeout`]: the scheduler's
/// longest backoff; past it, waiting gains nothing over a pod that waits.
pub const DEFAULT_VOLUME_BIND_TIMEOUT: Duration = Duration::from_secs(10);

/// Settings of the `kube` backend.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KubeSettings {
    /// The single namespace holding Sandboxes, SandboxClaims, pool PVCs and
    /// the warm pools that claims reference (upstream `CS_NAMESPACE`).
    pub namespace: String,
    /// Field manager for creates and server-side apply.
    pub field_manager: String,
    /// Image of the sandbox container (upstream `CS_SANDBOX_IMAGE`).
    pub sandbox_image: String,
    /// Command of the sandbox container; upstream keeps the pod alive with
    /// `sleep infinity` so work can be exec'd into it.
    pub sandbox_command: Vec<String>,
    /// `serviceAccountName` of sandbox pods, when set (upstream
    /// `CS_SANDBOX_SERVICE_ACCOUNT`).
    pub sandbox_service_account: Option<String>,
    /// CPU request of the sandbox container.
    pub sandbox_cpu_request: String,
    /// Memory request of the sandbox container.
    pub sandbox_memory_request: String,
    /// Memory limit of the sandbox container.
    pub sandbox_memory_limit: String,
    /// Lifetime of a SandboxClaim: its `lifecycle.shutdownTime` is creation
    /// time plus this, with policy `Delete`, so a crashed caller cannot leak
    /// warm sandboxes forever.
    pub claim_ttl: Duration,
    /// Put the pool label on claimed pods through the claim's
    /// `additionalPodMetadata` (upstream behaviour; the pool's selector then
    /// matches warm pods too). The agent-sandbox controller (v0.5+) accepts
    /// it only if `context.rossoctl.io` is in its allowed label domains, and
    /// otherwise fails the claims with `InvalidMetadata`; turn it off for a
    /// stock controller, at the price of a selector that matches no warm pod.
    pub claim_pod_label: bool,
    /// Container that deliveries exec into (`CS_DELIVERY_CONTAINER`);
    /// `None` = each sandbox pod's first container.
    pub delivery_container: Option<String>,
    /// How long a create waits for the watch caches to observe the objects it
    /// made, so that an immediate `get` does not answer "not found".
    pub cache_sync_timeout: Duration,
    /// How long a read waits for the watch caches' first list (at start-up)
    /// before answering an internal error.
    pub initial_sync_timeout: Duration,
    /// How long a pool create may take, recorded on its objects
    /// (`context.rossoctl.io/creating-until`): until then other replicas
    /// see it as running; after it, a create that has not marked its
    /// completion is abandoned (its replica died) and any replica's reaper
    /// deletes what it made. Short only in tests.
    pub create_window: Duration,
    /// How long a create waits at most for a workspace PVC of an
    /// `Immediate` storage class to bind before it makes the Sandboxes that
    /// mount it (see `binding`); zero: never wait.
    pub volume_bind_timeout: Duration,
}

impl KubeSettings {
    /// Settings with upstream's pod template for `namespace` and `sandbox_image`.
    pub fn new(namespace: impl Into<String>, sandbox_image: impl Into<String>) -> Self {
        Self {
            namespace: namespace.into(),
            field_manager: DEFAULT_FIELD_MANAGER.to_string(),
            sandbox_image: sandbox_image.into(),
            sandbox_command: vec![
                "/bin/sh".to_string(),
                "-c".to_string(),
                "mkdir -p /workspace && exec sleep infinity".to_string(),
            ],
            sandbox_service_account: None,
            sandbox_cpu_request: "50m".to_string(),
            sandbox_memory_request: "64Mi".to_string(),
            sandbox_memory_limit: "256Mi".to_string(),
            claim_ttl: Duration::from_secs(24 * 60 * 60),
            claim_pod_label: true,
            delivery_container: None,
            cache_sync_timeout: Duration::from_secs(5),
            initial_sync_timeout: Duration::from_secs(30),
            create_window: DEFAULT_CREATE_WINDOW,
            volume_bind_timeout: DEFAULT_VOLUME_BIND_TIMEOUT,
        }
    }
}
