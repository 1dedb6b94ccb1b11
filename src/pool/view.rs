//! The JSON documents of the pool and context API, field for field as the
//! upstream Go service writes them (plus `reason`, `message` and
//! `sandboxes`), sizes in the canonical form the Kubernetes API server
//! stores ([`quantity::canonical`]). Used by the API to answer and by the
//! client to decode.

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use super::model::{ContextVolumeStatus, PoolStatus};
use super::names;
use super::quantity;

/// A sandbox pool (`GET /v1/sandbox-pools/{name}`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct Pool {
    /// Pool name.
    pub name: String,
    /// `provisioning`, `ready`, `failed` or `suspended`.
    pub status: String,
    /// Requested sandboxes.
    pub replicas: u32,
    /// Ready sandboxes.
    pub ready_replicas: u32,
    /// `context.rossoctl.io/pool=<name>`.
    pub sandbox_selector: String,
    /// The warm pool, for warm-pool pools.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub warm_pool_ref: Option<String>,
    /// The workspace.
    pub workspace: PoolWorkspace,
    /// Why the pool is `failed` (or stuck), from the Ready conditions.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// Detail of `reason`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// The pool's sandboxes.
    #[serde(default)]
    pub sandboxes: Vec<Sandbox>,
    /// When the pool expires and is deleted (RFC 3339, UTC), for pools
    /// created with a `ttl`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(example = "2026-12-01T18:00:00Z")]
    pub expires_at: Option<String>,
}

/// The `workspace` object of a pool.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct PoolWorkspace {
    /// Size (`""` for warm pools).
    #[serde(default)]
    pub size: String,
    /// Access mode (`""` for warm pools).
    #[serde(default)]
    pub access_mode: String,
    /// StorageClass, when set.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub storage_class: Option<String>,
    /// The existing claim, for the existing-PVC strategy.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub claim_name: Option<String>,
    /// Read-only flag, for the existing-PVC strategy (kept when `false`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub read_only: Option<bool>,
}

/// One member of a pool.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct Sandbox {
    /// Sandbox name.
    pub name: String,
    /// Pod name, once known (`null` on the local backend).
    pub pod: Option<String>,
    /// Whether it is ready.
    pub ready: bool,
}

/// `GET /v1/sandbox-pools`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct PoolList {
    /// The caller's pools, by name.
    pub items: Vec<Pool>,
}

impl From<&PoolStatus> for Pool {
    fn from(s: &PoolStatus) -> Self {
        Pool {
            name: s.name.clone(),
            status: s.phase.as_str().to_owned(),
            replicas: s.replicas,
            ready_replicas: s.ready_replicas,
            sandbox_selector: names::selector(&s.name),
            warm_pool_ref: s.strategy.warm_pool_ref().map(str::to_owned),
            workspace: PoolWorkspace {
                // As the Kubernetes API server stores it, on every backend.
                size: quantity::canonical_or_same(&s.workspace.size),
                access_mode: s.workspace.access_mode.clone(),
                storage_class: s.workspace.storage_class.clone().filter(|c| !c.is_empty()),
                claim_name: s.workspace.claim_name.clone().filter(|c| !c.is_empty()),
                read_only: s.workspace.read_only,
            },
            reason: s.reason.clone(),
            message: s.message.clone(),
            sandboxes: s
                .members
                .iter()
                .map(|m| Sandbox {
                    name: m.name.clone(),
                    pod: m.pod.clone(),
                    ready: m.ready,
                })
                .collect(),
            expires_at: s.expires_at.map(|at| at.to_string()),
        }
    }
}

/// A create-pool request body, as `contextctl` sends it (upstream key order).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct CreatePool {
    /// Pool name.
    pub name: String,
    /// Number of sandboxes.
    pub replicas: i64,
    /// Warm pool, for the warm strategy.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub warm_pool_ref: Option<String>,
    /// The workspace.
    pub workspace: CreateWorkspace,
    /// Lifetime, e.g. `2h` (humantime); the pool is deleted when it ends.
    /// Absent: the pool lives until deleted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(example = "2h")]
    pub ttl: Option<String>,
}

/// The `workspace` of a create-pool request.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct CreateWorkspace {
    /// Size of managed workspaces.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub size: Option<String>,
    /// `ReadWriteOnce` (dedicated) or `ReadWriteMany` (shared).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub access_mode: Option<String>,
    /// StorageClass of managed workspaces.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub storage_class: Option<String>,
    /// Existing claim.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub claim_name: Option<String>,
    /// Read-only mount of the existing claim.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub read_only: Option<bool>,
}

/// A named context resource.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
// The schema keeps the wire name of `/openapi.json`.
#[schema(as = Context)]
pub struct ContextVolume {
    /// Context name.
    pub name: String,
    /// Namespace.
    pub namespace: String,
    /// `workspace`, `memory`, `knowledge` or `artifacts`.
    #[serde(rename = "type")]
    pub context_type: String,
    /// `provisioning` or `ready`.
    pub status: String,
    /// The storage.
    pub storage: ContextVolumeStorage,
    /// How to attach it.
    pub attachment: Attachment,
}

/// The `storage` object of a context (also of a create-context request).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
// The schema keeps the wire name of `/openapi.json`.
#[schema(as = ContextStorage)]
pub struct ContextVolumeStorage {
    /// Always `pvc`.
    pub backend: String,
    /// Size.
    pub size: String,
    /// Access mode.
    pub access_mode: String,
    /// StorageClass, when set.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub storage_class: Option<String>,
}

/// The `attachment` object of a context: pass `claimName` as a pool's
/// `workspace.claimName` (in the service namespace).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct Attachment {
    /// Always `pvc`; a discriminator for future kinds.
    pub kind: String,
    /// The volume's name, `context-<name>`.
    pub claim_name: String,
}

/// `GET /v1/namespaces/{ns}/contexts`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
// The schema keeps the wire name of `/openapi.json`.
#[schema(as = ContextList)]
pub struct ContextVolumeList {
    /// The caller's contexts, by name.
    pub items: Vec<ContextVolume>,
}

/// A create-context request body.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
// The schema keeps the wire name of `/openapi.json`.
#[schema(as = CreateContext)]
pub struct CreateContextVolume {
    /// Context name.
    pub name: String,
    /// Namespace.
    pub namespace: String,
    /// Type.
    #[serde(rename = "type")]
    pub context_type: String,
    /// Storage.
    pub storage: ContextVolumeStorage,
}

impl From<&ContextVolumeStatus> for ContextVolume {
    fn from(s: &ContextVolumeStatus) -> Self {
        ContextVolume {
            name: s.name.clone(),
            namespace: s.namespace.clone(),
            context_type: s.context_type.as_str().to_owned(),
            status: s.phase.as_str().to_owned(),
            storage: ContextVolumeStorage {
                backend: "pvc".to_owned(),
                size: quantity::canonical_or_same(&s.size),
                access_mode: s.access_mode.clone(),
                storage_class: s.storage_class.clone().filter(|c| !c.is_empty()),
            },
            attachment: Attachment {
                kind: "pvc".to_owned(),
                claim_name: s.claim_name.clone(),
            },
        }
    }
}
