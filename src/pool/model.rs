//! Validated, backend-neutral types of sandbox pools and named contexts.
//!
//! The service validates a request into a [`PoolSpec`] / [`ContextVolumeSpec`];
//! backends create objects from them and describe what exists as a
//! [`PoolStatus`] / [`ContextVolumeStatus`]. The API layer maps these to the
//! upstream JSON.

use k8s_openapi::jiff::Timestamp;
use serde::{Deserialize, Serialize};

/// Kubernetes access mode of a workspace volume.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum AccessMode {
    /// One node (upstream: one sandbox per volume).
    ReadWriteOnce,
    /// Many nodes: shareable by every sandbox of a pool.
    ReadWriteMany,
}

impl AccessMode {
    /// The Kubernetes spelling, e.g. `ReadWriteMany`.
    pub fn as_str(self) -> &'static str {
        match self {
            AccessMode::ReadWriteOnce => "ReadWriteOnce",
            AccessMode::ReadWriteMany => "ReadWriteMany",
        }
    }

    /// Parses the exact (case-sensitive) Kubernetes spelling.
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "ReadWriteOnce" => Some(AccessMode::ReadWriteOnce),
            "ReadWriteMany" => Some(AccessMode::ReadWriteMany),
            _ => None,
        }
    }
}

impl std::fmt::Display for AccessMode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// How a pool gets its sandboxes and workspace. Exactly one per pool.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "camelCase")]
pub enum Strategy {
    /// One RWO workspace PVC per sandbox (`<name>-workspace-<i>`).
    Dedicated {
        /// Kubernetes quantity, e.g. `1Gi`, as requested.
        size: String,
        /// StorageClass; `None` = the cluster default.
        storage_class: Option<String>,
    },
    /// One RWX workspace PVC for the whole pool (`<name>-workspace`).
    Shared {
        /// Kubernetes quantity, e.g. `5Gi`, as requested.
        size: String,
        /// StorageClass; `None` = the cluster default.
        storage_class: Option<String>,
    },
    /// An existing PVC in the service namespace, mounted by every sandbox;
    /// never created nor deleted by the service.
    Existing {
        /// The PVC's name.
        claim_name: String,
        /// Whether sandboxes mount it read-only.
        read_only: bool,
    },
    /// One SandboxClaim per replica against a SandboxWarmPool.
    Warm {
        /// The SandboxWarmPool's name (`warmPoolRef`).
        pool: String,
    },
}

impl Strategy {
    /// A short stable name: `dedicated`, `shared`, `existing` or `warm`
    /// (for logs and metrics).
    pub fn kind(&self) -> &'static str {
        match self {
            Strategy::Dedicated { .. } => "dedicated",
            Strategy::Shared { .. } => "shared",
            Strategy::Existing { .. } => "existing",
            Strategy::Warm { .. } => "warm",
        }
    }

    /// The warm pool's name, for the warm strategy.
    pub fn warm_pool_ref(&self) -> Option<&str> {
        match self {
            Strategy::Warm { pool } => Some(pool),
            _ => None,
        }
    }
}

/// A validated request for a pool.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PoolSpec {
    /// Pool name: a DNS-1123 label of at most 50 characters.
    pub name: String,
    /// Number of sandboxes, 1..=100.
    pub replicas: u32,
    /// How sandboxes and the workspace are provided.
    pub strategy: Strategy,
    /// The owner's scope ([`crate::auth::OwnerScope`]); recorded on every
    /// object (label [`super::names::OWNER_LABEL`]).
    pub owner_scope: String,
    /// When the pool expires (creation time plus the requested `ttl`), in
    /// whole seconds; `None` = never. Backends record it durably (annotation
    /// [`super::names::EXPIRES_AT_ANNOTATION`]) so expiry survives restarts.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expires_at: Option<Timestamp>,
}

/// Where a pool stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum PoolPhase {
    /// Not every sandbox is ready yet.
    Provisioning,
    /// Every sandbox is ready.
    Ready,
    /// A sandbox or claim reports a terminal failure; see `reason`/`message`.
    Failed,
    /// The sandboxes are suspended: no pods run, volumes and names are kept
    /// (`POST .../resume` brings them back).
    Suspended,
}

impl PoolPhase {
    /// Every phase (for gauges that report each one, zeros included).
    pub const ALL: [PoolPhase; 4] = [
        PoolPhase::Provisioning,
        PoolPhase::Ready,
        PoolPhase::Failed,
        PoolPhase::Suspended,
    ];

    /// `provisioning`, `ready` or `failed`.
    pub fn as_str(self) -> &'static str {
        match self {
            PoolPhase::Provisioning => "provisioning",
            PoolPhase::Ready => "ready",
            PoolPhase::Failed => "failed",
            PoolPhase::Suspended => "suspended",
        }
    }

    /// Whether a waiter can stop waiting (`ready`, `failed` or
    /// `suspended`: a suspended pool does not become ready by itself).
    pub fn is_settled(self) -> bool {
        matches!(
            self,
            PoolPhase::Ready | PoolPhase::Failed | PoolPhase::Suspended
        )
    }
}

/// One sandbox of a pool, addressable without Kubernetes access.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Member {
    /// The sandbox's name (for warm pools: the adopted sandbox, or the claim
    /// name while none is bound yet).
    pub name: String,
    /// The pod running it, once known (`None` on the local backend, which
    /// has no pods).
    pub pod: Option<String>,
    /// Whether the sandbox is ready.
    pub ready: bool,
}

/// The workspace as upstream reports it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct WorkspaceView {
    /// Storage request of the (first) workspace volume; `""` for warm pools.
    pub size: String,
    /// First access mode of the workspace volume; `""` for warm pools.
    pub access_mode: String,
    /// StorageClass of the volume, when set.
    pub storage_class: Option<String>,
    /// The existing claim, for the existing-PVC strategy.
    pub claim_name: Option<String>,
    /// Read-only flag, for the existing-PVC strategy.
    pub read_only: Option<bool>,
}

/// What a backend reports about a pool.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PoolStatus {
    /// Pool name.
    pub name: String,
    /// Requested number of sandboxes.
    pub replicas: u32,
    /// The strategy, as requested (for `Existing`: as requested; the volume's
    /// actual properties are in `workspace`).
    pub strategy: Strategy,
    /// The workspace as upstream reports it (e.g. the existing PVC's size).
    pub workspace: WorkspaceView,
    /// `provisioning`, `ready` or `failed`.
    pub phase: PoolPhase,
    /// Number of ready sandboxes.
    pub ready_replicas: u32,
    /// Machine-readable reason, from the Ready condition that decided the
    /// phase (usually set only when `failed` or stuck).
    pub reason: Option<String>,
    /// Human-readable detail for `reason`.
    pub message: Option<String>,
    /// The sandboxes, in index order.
    pub members: Vec<Member>,
    /// The owner scope recorded on the pool's objects (`""` if none).
    pub owner_scope: String,
    /// When the pool expires, as recorded on its objects; `None` = never.
    pub expires_at: Option<Timestamp>,
}

/// Classification of a named context (metadata only).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ContextVolumeType {
    /// Mutable working state.
    Workspace,
    /// Agent memory.
    Memory,
    /// Reference knowledge.
    Knowledge,
    /// Outputs to retain.
    Artifacts,
}

impl ContextVolumeType {
    /// The lowercase spelling used in JSON and labels.
    pub fn as_str(self) -> &'static str {
        match self {
            ContextVolumeType::Workspace => "workspace",
            ContextVolumeType::Memory => "memory",
            ContextVolumeType::Knowledge => "knowledge",
            ContextVolumeType::Artifacts => "artifacts",
        }
    }

    /// Parses the exact lowercase spelling.
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "workspace" => Some(ContextVolumeType::Workspace),
            "memory" => Some(ContextVolumeType::Memory),
            "knowledge" => Some(ContextVolumeType::Knowledge),
            "artifacts" => Some(ContextVolumeType::Artifacts),
            _ => None,
        }
    }
}

/// A validated request for a named context (a PVC `context-<name>`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ContextVolumeSpec {
    /// Context name: a DNS-1123 label of at most 50 characters.
    pub name: String,
    /// Namespace (a DNS-1123 label).
    pub namespace: String,
    /// Classification.
    pub context_type: ContextVolumeType,
    /// Kubernetes quantity, as requested.
    pub size: String,
    /// Access mode of the volume.
    pub access_mode: AccessMode,
    /// StorageClass; `None` = the cluster default.
    pub storage_class: Option<String>,
    /// The owner's scope, recorded on the volume.
    pub owner_scope: String,
}

/// Where a named context stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ContextVolumePhase {
    /// The volume is not bound yet.
    Provisioning,
    /// The volume is bound.
    Ready,
}

impl ContextVolumePhase {
    /// `provisioning` or `ready`.
    pub fn as_str(self) -> &'static str {
        match self {
            ContextVolumePhase::Provisioning => "provisioning",
            ContextVolumePhase::Ready => "ready",
        }
    }
}

/// What a backend reports about a named context.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ContextVolumeStatus {
    /// Context name.
    pub name: String,
    /// Namespace.
    pub namespace: String,
    /// Classification.
    pub context_type: ContextVolumeType,
    /// `provisioning` or `ready`.
    pub phase: ContextVolumePhase,
    /// Storage request of the volume.
    pub size: String,
    /// First access mode of the volume.
    pub access_mode: String,
    /// StorageClass of the volume, when set.
    pub storage_class: Option<String>,
    /// The volume's name (`context-<name>`).
    pub claim_name: String,
    /// The owner scope recorded on the volume (`""` if none).
    pub owner_scope: String,
}
