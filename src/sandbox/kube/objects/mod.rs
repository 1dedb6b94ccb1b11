//! Builders of the Kubernetes objects a pool or named context consists of:
//! the upstream names, labels, annotations and manifests (upstream
//! context-service §2.2–2.7), plus the owner label.
//!
//! Everything here is pure: no I/O, the clock is a parameter.

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::core::v1::{
    Container, PersistentVolumeClaim, PersistentVolumeClaimSpec, PersistentVolumeClaimVolumeSource,
    PodSpec, ResourceRequirements, TopologySpreadConstraint, Volume, VolumeMount,
    VolumeResourceRequirements,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta, OwnerReference};
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::Resource;

use crate::pool::model::{PoolSpec, Strategy};
use crate::pool::names;

use super::crd::{
    ClaimLifecycle, PodMetadata, PodTemplate, Sandbox, SandboxClaim, SandboxClaimSpec, SandboxSpec,
    WarmPoolRef,
};
use super::settings::KubeSettings;

/// The kinds of object a create makes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// A SandboxClaim.
    Claim,
    /// A Sandbox.
    Sandbox,
    /// A PersistentVolumeClaim.
    Pvc,
}

/// Annotation on Sandboxes and claims: the pool's strategy. Not upstream; it
/// lets status tell dedicated from shared when the PVCs are gone.
pub const ANN_STRATEGY: &str = "context.rossoctl.io/strategy";
/// Sandbox annotation: the workspace size as requested or as the existing PVC
/// had it at creation, so status needs no extra read per request.
pub const ANN_WORKSPACE_SIZE: &str = "context.rossoctl.io/workspace-size";
/// Sandbox annotation: the workspace access mode (see [`ANN_WORKSPACE_SIZE`]).
pub const ANN_WORKSPACE_ACCESS_MODE: &str = "context.rossoctl.io/workspace-access-mode";
/// Sandbox annotation: the workspace storage class, when there is one.
pub const ANN_WORKSPACE_STORAGE_CLASS: &str = "context.rossoctl.io/workspace-storage-class";
/// Sandbox annotation written by the agent-sandbox controller: the pod name.
pub const ANN_POD_NAME: &str = "agents.x-k8s.io/pod-name";

/// Name, volume and container of the workspace in every sandbox pod.
const WORKSPACE: &str = "workspace";
/// Mount path (and working directory) of the workspace.
const WORKSPACE_PATH: &str = "/workspace";

/// `app.kubernetes.io/managed-by=context-service`: selects every object this
/// service manages (the watch caches use it).
pub fn managed_selector() -> String {
    format!("{}={}", names::MANAGED_BY_LABEL, names::MANAGED_BY_VALUE)
}

/// Objects of one pool that this service manages. Requiring `managed-by` as
/// well as the pool label means a foreign object that merely carries the pool
/// label is never counted or deleted (upstream gap 5).
pub fn managed_pool_selector(pool: &str) -> String {
    format!("{},{}", names::selector(pool), managed_selector())
}

/// The pool's workspace topology, as the builders need it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StrategyKind {
    /// One RWO PVC per sandbox.
    Dedicated,
    /// One RWX PVC for the pool.
    Shared,
    /// The caller's PVC; nothing is created for the workspace.
    Existing,
    /// Claims against a SandboxWarmPool.
    Warm,
}

impl StrategyKind {
    /// The value of [`ANN_STRATEGY`].
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Dedicated => "dedicated",
            Self::Shared => "shared",
            Self::Existing => "existing",
            Self::Warm => "warm",
        }
    }

    /// Parses [`Self::as_str`].
    pub fn parse(value: &str) -> Option<Self> {
        match value {
            "dedicated" => Some(Self::Dedicated),
            "shared" => Some(Self::Shared),
            "existing" => Some(Self::Existing),
            "warm" => Some(Self::Warm),
            _ => None,
        }
    }
}

/// What every object of one pool shares.
#[derive(Debug, Clone, Copy)]
pub struct PoolMeta<'a> {
    /// Pool name.
    pub name: &'a str,
    /// Requested number of sandboxes.
    pub replicas: u32,
    /// Owner scope of the caller (32 hex).
    pub owner_scope: &'a str,
    /// Workspace topology.
    pub strategy: StrategyKind,
    /// When the pool expires (its `ttl`); `None` = never.
    pub expires_at: Option<Timestamp>,
    /// Until when the create making these objects may still add members
    /// ([`names::CREATING_UNTIL_ANNOTATION`]); `None`: not recorded.
    pub creating_until: Option<Timestamp>,
}

impl StrategyKind {
    /// The kind of a requested strategy.
    pub fn of(strategy: &Strategy) -> Self {
        match strategy {
            Strategy::Dedicated { .. } => Self::Dedicated,
            Strategy::Shared { .. } => Self::Shared,
            Strategy::Existing { .. } => Self::Existing,
            Strategy::Warm { .. } => Self::Warm,
        }
    }
}

impl<'a> From<&'a PoolSpec> for PoolMeta<'a> {
    fn from(spec: &'a PoolSpec) -> Self {
        Self {
            name: &spec.name,
            replicas: spec.replicas,
            owner_scope: &spec.owner_scope,
            strategy: StrategyKind::of(&spec.strategy),
            expires_at: spec.expires_at,
            creating_until: None,
        }
    }
}

/// The first object a create of `pool` makes, its anchor, which carries the
/// create's completion mark ([`names::CREATED_ANNOTATION`]): the workspace
/// PVC for dedicated (the first) and shared, Sandbox 0 for an existing
/// claim, claim 0 for a warm pool. Being first, it exists whenever anything
/// of the create does; a completed pool whose anchor was deleted since has
/// no mark left and is never taken for an abandoned create.
pub fn anchor(pool: &str, strategy: StrategyKind) -> (Kind, String) {
    match strategy {
        StrategyKind::Dedicated => (Kind::Pvc, names::dedicated_workspace(pool, 0)),
        StrategyKind::Shared => (Kind::Pvc, names::shared_workspace(pool)),
        StrategyKind::Existing => (Kind::Sandbox, names::sandbox(pool, 0)),
        StrategyKind::Warm => (Kind::Claim, names::claim(pool, 0)),
    }
}

/// The annotations every object of `pool` carries: its expiry and the end
/// of the create making it; the anchor (`kind`, `object`) of a create with
/// a window also the pending completion mark.
fn pool_annotations(pool: &PoolMeta<'_>, kind: Kind, object: &str) -> BTreeMap<String, String> {
    let mut annotations = names::expiry_annotations(pool.expires_at);
    if let Some(until) = pool.creating_until {
        annotations.insert(
            names::CREATING_UNTIL_ANNOTATION.to_owned(),
            until.to_string(),
        );
        let (anchor_kind, anchor_name) = anchor(pool.name, pool.strategy);
        if anchor_kind == kind && anchor_name == object {
            annotations.insert(
                names::CREATED_ANNOTATION.to_owned(),
                names::CREATED_PENDING.to_owned(),
            );
        }
    }
    annotations
}

/// The JSON patch that moves a create's mark ([`names::CREATED_ANNOTATION`])
/// from pending to `to`, and fails (`422`) unless it is pending: the
/// compare-and-swap between a creator finishing and a reaper claiming.
pub fn created_mark_patch(to: &str) -> serde_json::Value {
    let path = format!(
        "/metadata/annotations/{}",
        names::CREATED_ANNOTATION
            .replace('~', "~0")
            .replace('/', "~1")
    );
    serde_json::json!([
        {"op": "test", "path": path, "value": names::CREATED_PENDING},
        {"op": "replace", "path": path, "value": to},
    ])
}

/// The workspace as recorded on the Sandboxes for status: for managed
/// workspaces what was requested, for an existing claim what the PVC had.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct WorkspaceRecord {
    /// Size (a Kubernetes quantity), possibly empty.
    pub size: String,
    /// Access mode, possibly empty.
    pub access_mode: String,
    /// Storage class, when there is one.
    pub storage_class: Option<String>,
}

/// The PVC a sandbox mounts at `/workspace`.
#[derive(Debug, Clone, Copy)]
pub struct WorkspaceVolume<'a> {
    /// PVC name.
    pub claim_name: &'a str,
    /// Mount (and volume) read-only; only the existing strategy sets it.
    pub read_only: bool,
}

/// `{pool, managed-by, owner}`: the labels of every pool object.
pub fn pool_labels(pool: &PoolMeta<'_>) -> BTreeMap<String, String> {
    BTreeMap::from([
        (names::POOL_LABEL.to_string(), pool.name.to_string()),
        (
            names::MANAGED_BY_LABEL.to_string(),
            names::MANAGED_BY_VALUE.to_string(),
        ),
        (names::OWNER_LABEL.to_string(), pool.owner_scope.to_string()),
    ])
}

/// `spec.operatingMode` of a suspended Sandbox.
pub const OPERATING_MODE_SUSPENDED: &str = "Suspended";
/// `spec.operatingMode` of a running Sandbox (the controller's default).
pub const OPERATING_MODE_RUNNING: &str = "Running";

/// The merge patch that suspends or resumes a Sandbox.
pub fn operating_mode_patch(suspended: bool) -> serde_json::Value {
    let mode = if suspended {
        OPERATING_MODE_SUSPENDED
    } else {
        OPERATING_MODE_RUNNING
    };
    serde_json::json!({ "spec": { "operatingMode": mode } })
}

/// A managed workspace PVC (§2.5): labels plus the replicas label, one access
/// mode, the storage request, the class only when given.
pub fn workspace_pvc(
    settings: &KubeSettings,
    pool: &PoolMeta<'_>,
    name: &str,
    size: &str,
    access_mode: &str,
    storage_class: Option<&str>,
) -> PersistentVolumeClaim {
    let mut labels = pool_labels(pool);
    labels.insert(names::REPLICAS_KEY.to_string(), pool.replicas.to_string());
    let annotations = pool_annotations(pool, Kind::Pvc, name);
    PersistentVolumeClaim {
        metadata: ObjectMeta {
            name: Some(name.to_string()),
            namespace: Some(settings.namespace.clone()),
            labels: Some(labels),
            annotations: (!annotations.is_empty()).then_some(annotations),
            ..ObjectMeta::default()
        },
        spec: Some(pvc_spec(size, access_mode, storage_class)),
        status: None,
    }
}

/// The spec of a PVC with one access mode and a storage request.
fn pvc_spec(
    size: &str,
    access_mode: &str,
    storage_class: Option<&str>,
) -> PersistentVolumeClaimSpec {
    PersistentVolumeClaimSpec {
        access_modes: Some(vec![access_mode.to_string()]),
        resources: Some(VolumeResourceRequirements {
            requests: Some(BTreeMap::from([(
                "storage".to_string(),
                Quantity(size.to_string()),
            )])),
            limits: None,
        }),
        // An empty class would disable dynamic provisioning; leave it unset
        // so the cluster default applies.
        storage_class_name: storage_class
            .filter(|class| !class.is_empty())
            .map(str::to_string),
        ..PersistentVolumeClaimSpec::default()
    }
}

/// Sandbox `index` of a direct pool (§2.4): upstream's pod template with the
/// configured image, mounting `volume` at `/workspace`.
pub fn sandbox(
    settings: &KubeSettings,
    pool: &PoolMeta<'_>,
    index: u32,
    volume: WorkspaceVolume<'_>,
    workspace: &WorkspaceRecord,
) -> Sandbox {
    let labels = pool_labels(pool);
    let name = names::sandbox(pool.name, index);
    let mut annotations = pool_annotations(pool, Kind::Sandbox, &name);
    annotations.extend([
        (
            names::WORKSPACE_READ_ONLY_ANNOTATION.to_string(),
            volume.read_only.to_string(),
        ),
        (names::REPLICAS_KEY.to_string(), pool.replicas.to_string()),
        (ANN_STRATEGY.to_string(), pool.strategy.as_str().to_string()),
        (ANN_WORKSPACE_SIZE.to_string(), workspace.size.clone()),
        (
            ANN_WORKSPACE_ACCESS_MODE.to_string(),
            workspace.access_mode.clone(),
        ),
    ]);
    if let Some(class) = workspace.storage_class.as_ref().filter(|c| !c.is_empty()) {
        annotations.insert(ANN_WORKSPACE_STORAGE_CLASS.to_string(), class.clone());
    }
    if pool.strategy == StrategyKind::Existing {
        annotations.insert(
            names::WORKSPACE_CLAIM_ANNOTATION.to_string(),
            volume.claim_name.to_string(),
        );
    }
    let resources = ResourceRequirements {
        requests: Some(BTreeMap::from([
            (
                "memory".to_string(),
                Quantity(settings.sandbox_memory_request.clone()),
            ),
            (
                "cpu".to_string(),
                Quantity(settings.sandbox_cpu_request.clone()),
            ),
        ])),
        limits: Some(BTreeMap::from([(
            "memory".to_string(),
            Quantity(settings.sandbox_memory_limit.clone()),
        )])),
        ..ResourceRequirements::default()
    };
    let container = Container {
        name: "sandbox".to_string(),
        image: Some(settings.sandbox_image.clone()),
        command: Some(settings.sandbox_command.clone()),
        working_dir: Some(WORKSPACE_PATH.to_string()),
        volume_mounts: Some(vec![VolumeMount {
            name: WORKSPACE.to_string(),
            mount_path: WORKSPACE_PATH.to_string(),
            read_only: Some(volume.read_only),
            ..VolumeMount::default()
        }]),
        resources: Some(resources),
        ..Container::default()
    };
    let spread = TopologySpreadConstraint {
        max_skew: 1,
        topology_key: "kubernetes.io/hostname".to_string(),
        when_unsatisfiable: "ScheduleAnyway".to_string(),
        label_selector: Some(LabelSelector {
            match_labels: Some(BTreeMap::from([(
                names::POOL_LABEL.to_string(),
                pool.name.to_string(),
            )])),
            match_expressions: None,
        }),
        ..TopologySpreadConstraint::default()
    };
    let pod_spec = PodSpec {
        topology_spread_constraints: Some(vec![spread]),
        containers: vec![container],
        volumes: Some(vec![Volume {
            name: WORKSPACE.to_string(),
            persistent_volume_claim: Some(PersistentVolumeClaimVolumeSource {
                claim_name: volume.claim_name.to_string(),
                read_only: Some(volume.read_only),
            }),
            ..Volume::default()
        }]),
        service_account_name: settings.sandbox_service_account.clone(),
        ..PodSpec::default()
    };
    let mut object = Sandbox::new(
        &name,
        SandboxSpec {
            pod_template: PodTemplate {
                metadata: Some(PodMetadata {
                    labels: labels.clone(),
                    annotations: BTreeMap::new(),
                }),
                spec: pod_spec,
            },
            // The controller deletes the Sandbox (and with it the pod and
            // its owned PVCs) at the pool's expiry, even if this service is
            // down then.
            shutdown_time: pool.expires_at.map(|at| at.to_string()),
            shutdown_policy: pool.expires_at.map(|_| "Delete".to_string()),
            ..SandboxSpec::default()
        },
    );
    object.metadata.namespace = Some(settings.namespace.clone());
    object.metadata.labels = Some(labels);
    object.metadata.annotations = Some(annotations);
    object
}

/// SandboxClaim `index` of a warm pool (§2.6) with a lifecycle: it expires at
/// the pool's expiry, or without one at `now + claim_ttl`, and is then
/// deleted with its sandbox.
pub fn sandbox_claim(
    settings: &KubeSettings,
    pool: &PoolMeta<'_>,
    index: u32,
    warm_pool: &str,
    now: Timestamp,
) -> SandboxClaim {
    let name = names::claim(pool.name, index);
    let mut object = SandboxClaim::new(
        &name,
        SandboxClaimSpec {
            warm_pool_ref: WarmPoolRef {
                name: warm_pool.to_string(),
            },
            lifecycle: Some(ClaimLifecycle {
                shutdown_time: Some(match pool.expires_at {
                    Some(at) => at.to_string(),
                    None => shutdown_time(now, settings.claim_ttl),
                }),
                shutdown_policy: Some("Delete".to_string()),
                ttl_seconds_after_finished: None,
            }),
            // Only the pool label, as upstream: it is what the harness's
            // selector matches on the claimed pod.
            additional_pod_metadata: settings.claim_pod_label.then(|| PodMetadata {
                labels: BTreeMap::from([(names::POOL_LABEL.to_string(), pool.name.to_string())]),
                annotations: BTreeMap::new(),
            }),
        },
    );
    object.metadata.namespace = Some(settings.namespace.clone());
    object.metadata.labels = Some(pool_labels(pool));
    let mut annotations = pool_annotations(pool, Kind::Claim, &name);
    annotations.extend([
        (names::REPLICAS_KEY.to_string(), pool.replicas.to_string()),
        (
            ANN_STRATEGY.to_string(),
            StrategyKind::Warm.as_str().to_string(),
        ),
    ]);
    object.metadata.annotations = Some(annotations);
    object
}

/// `now + ttl` as RFC 3339 in UTC with whole seconds (what the API server
/// stores for a `metav1.Time`).
fn shutdown_time(now: Timestamp, ttl: Duration) -> String {
    let ttl = SignedDuration::try_from(ttl).unwrap_or(SignedDuration::MAX);
    let at = now.checked_add(ttl).unwrap_or(Timestamp::MAX);
    let whole = Timestamp::from_second(at.as_second()).unwrap_or(at);
    whole.to_string()
}

/// A reference making `sandbox` the owner of a dedicated PVC, so the garbage
/// collector deletes the PVC with its Sandbox. Not a controller reference and
/// without `blockOwnerDeletion`: the Sandbox controller must not treat the
/// PVC as one of its own templates, and blocking needs `update` on
/// `sandboxes/finalizers`, which this service does not hold.
pub fn sandbox_owner_reference(sandbox: &Sandbox) -> Option<OwnerReference> {
    sandbox.owner_ref(&())
}

/// The server-side apply body that adds `owner` to the PVC `name`: only the
/// fields this service owns through apply.
pub fn pvc_owner_patch(namespace: &str, name: &str, owner: OwnerReference) -> serde_json::Value {
    serde_json::json!({
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "ownerReferences": [owner],
        },
    })
}

/// The PVC of a named context (§2.7) in `namespace`.
pub fn context_pvc(
    namespace: &str,
    name: &str,
    context_type: &str,
    owner_scope: &str,
    size: &str,
    access_mode: &str,
    storage_class: Option<&str>,
) -> PersistentVolumeClaim {
    let labels = BTreeMap::from([
        (
            names::MANAGED_BY_LABEL.to_string(),
            names::MANAGED_BY_VALUE.to_string(),
        ),
        (names::CONTEXT_NAME_LABEL.to_string(), name.to_string()),
        (
            names::CONTEXT_TYPE_LABEL.to_string(),
            context_type.to_string(),
        ),
        (names::OWNER_LABEL.to_string(), owner_scope.to_string()),
    ]);
    PersistentVolumeClaim {
        metadata: ObjectMeta {
            name: Some(names::context_claim(name)),
            namespace: Some(namespace.to_string()),
            labels: Some(labels),
            ..ObjectMeta::default()
        },
        spec: Some(pvc_spec(size, access_mode, storage_class)),
        status: None,
    }
}

#[cfg(test)]
mod tests;
