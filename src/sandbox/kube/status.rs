//! Pool status from plain objects: phase (`provisioning | ready | failed`)
//! with reason and message from the Sandbox / SandboxClaim / Pod conditions,
//! ready count, members, and the workspace description.
//!
//! Pure functions over objects already selected for one pool, so they are
//! unit-testable without a cluster; the watch caches feed them.

use std::collections::BTreeMap;
use std::sync::Arc;

use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod};
use kube::ResourceExt;

use crate::pool::model::{Member, PoolPhase, PoolStatus, Strategy, WorkspaceView};
use crate::pool::names;

use super::crd::{Condition, Sandbox, SandboxClaim};
use super::objects::{
    StrategyKind, ANN_POD_NAME, ANN_STRATEGY, ANN_WORKSPACE_ACCESS_MODE, ANN_WORKSPACE_SIZE,
    ANN_WORKSPACE_STORAGE_CLASS,
};

/// Label the claim controller puts on the Sandbox it binds to a claim.
const LABEL_CLAIM_UID: &str = "agents.x-k8s.io/claim-uid";

/// Reason of a member (or workspace) that is being deleted.
const TERMINATING: &str = "Terminating";

/// Sandbox / claim `Ready` reasons after which the member will not become
/// ready without intervention (agent-sandbox §1.3, §1.6; the Python SDK's
/// terminal list plus the missing-reference and terminal-pod reasons).
const TERMINAL_REASONS: &[&str] = &[
    "WarmPoolNotFound",
    "TemplateNotFound",
    "InvalidMetadata",
    "EnvVarsInjectionRejected",
    "VolumeClaimTemplatesError",
    "ClaimExpired",
    "SandboxExpired",
    "PodFailed",
    "PodSucceeded",
];

/// The objects of one pool, as selected by its pool label, plus the
/// Sandboxes its claims are bound to (they carry the controller's labels,
/// not ours, after a warm adoption).
#[derive(Debug, Clone, Default)]
pub struct PoolObjects {
    /// SandboxClaims with the pool label.
    pub claims: Vec<Arc<SandboxClaim>>,
    /// Sandboxes with the pool label (direct strategies).
    pub sandboxes: Vec<Arc<Sandbox>>,
    /// Managed PVCs with the pool label.
    pub pvcs: Vec<Arc<PersistentVolumeClaim>>,
    /// Pods of the pool's sandboxes.
    pub pods: Vec<Arc<Pod>>,
    /// Sandboxes bound to the pool's claims, found by `status.sandbox.name`.
    pub bound_sandboxes: Vec<Arc<Sandbox>>,
}

impl PoolObjects {
    /// No claim, Sandbox or PVC carries the pool label: there is no pool.
    pub fn is_empty(&self) -> bool {
        self.claims.is_empty() && self.sandboxes.is_empty() && self.pvcs.is_empty()
    }
}

/// The status of pool `name`, or `None` when no object of it exists.
/// `creating` says a create of this pool is still running, so missing
/// members are expected rather than a failure.
pub fn pool_status(name: &str, objects: &PoolObjects, creating: bool) -> Option<PoolStatus> {
    if objects.is_empty() {
        return None;
    }
    Some(if objects.claims.is_empty() {
        direct_status(name, objects, creating)
    } else {
        warm_status(name, objects, creating)
    })
}

/// Status of a warm pool: claim → bound Sandbox → pod (agent-sandbox §3.1).
fn warm_status(name: &str, objects: &PoolObjects, creating: bool) -> PoolStatus {
    let mut claims: Vec<&SandboxClaim> = objects.claims.iter().map(Arc::as_ref).collect();
    claims.sort_by_key(|claim| index_key(&claim.name_any()));
    let first = claims[0];
    let replicas = replicas_from(first.annotations()).unwrap_or(claims.len() as u32);
    let mut members = Vec::with_capacity(claims.len());
    let mut problems = Vec::new();
    for claim in &claims {
        let ready_condition = claim
            .status
            .as_ref()
            .and_then(|status| condition(&status.conditions, "Ready"));
        let terminating = claim.metadata.deletion_timestamp.is_some();
        let ready = is_true(ready_condition) && !terminating;
        let bound = claim
            .status
            .as_ref()
            .and_then(|status| status.sandbox.as_ref())
            .map(|sandbox| sandbox.name.as_str())
            .filter(|name| !name.is_empty());
        let member = match bound {
            Some(sandbox_name) => {
                let sandbox = bound_sandbox(claim, sandbox_name, &objects.bound_sandboxes);
                // Pod name = the controller's annotation, falling back to the
                // Sandbox name (the SDKs' rule); unknown until the Sandbox is
                // seen or the claim reports ready.
                let pod = match sandbox {
                    Some(sandbox) => Some(pod_name(sandbox)),
                    None if ready => Some(sandbox_name.to_string()),
                    None => None,
                };
                Member {
                    name: sandbox_name.to_string(),
                    pod,
                    ready,
                }
            }
            None => Member {
                name: claim.name_any(),
                pod: None,
                ready,
            },
        };
        if terminating {
            problems.push(Problem::terminating(&claim.name_any()));
        } else if !ready {
            problems.push(Problem::from_condition(&claim.name_any(), ready_condition));
        }
        members.push(member);
    }
    let strategy = Strategy::Warm {
        pool: first.spec.warm_pool_ref.name.clone(),
    };
    finish(
        name,
        replicas,
        strategy,
        WorkspaceView::default(),
        members,
        problems,
        creating,
        owner_of(first.labels()),
    )
}

/// The Sandbox a claim is bound to, only if it really belongs to that claim
/// (its claim-UID label or an owner reference names the claim), so a
/// same-named foreign Sandbox is never reported as a member.
fn bound_sandbox<'a>(
    claim: &SandboxClaim,
    sandbox_name: &str,
    candidates: &'a [Arc<Sandbox>],
) -> Option<&'a Sandbox> {
    let uid = claim.uid()?;
    candidates
        .iter()
        .map(Arc::as_ref)
        .filter(|sandbox| sandbox.name_any() == sandbox_name)
        .find(|sandbox| {
            sandbox.labels().get(LABEL_CLAIM_UID) == Some(&uid)
                || sandbox
                    .owner_references()
                    .iter()
                    .any(|owner| owner.uid == uid)
        })
}

/// Status of a direct pool (dedicated, shared, existing).
fn direct_status(name: &str, objects: &PoolObjects, creating: bool) -> PoolStatus {
    let mut sandboxes: Vec<&Sandbox> = objects.sandboxes.iter().map(Arc::as_ref).collect();
    sandboxes.sort_by_key(|sandbox| index_key(&sandbox.name_any()));
    let mut pvcs: Vec<&PersistentVolumeClaim> = objects.pvcs.iter().map(Arc::as_ref).collect();
    pvcs.sort_by_key(|pvc| index_key(&pvc.name_any()));
    let first_sandbox = sandboxes.first().copied();
    let first_pvc = pvcs.first().copied();

    let annotations = first_sandbox
        .map(|s| s.annotations().clone())
        .unwrap_or_default();
    let replicas = replicas_from(&annotations)
        .or_else(|| first_pvc.and_then(|pvc| replicas_from(pvc.labels())))
        .unwrap_or(sandboxes.len() as u32);
    let claim_name = annotations
        .get(names::WORKSPACE_CLAIM_ANNOTATION)
        .filter(|claim| !claim.is_empty())
        .cloned();
    let kind = annotations
        .get(ANN_STRATEGY)
        .and_then(|value| StrategyKind::parse(value))
        .filter(|kind| *kind != StrategyKind::Warm)
        .unwrap_or_else(|| infer_strategy(claim_name.is_some(), &pvcs));
    let workspace = direct_workspace(&annotations, claim_name, first_pvc);
    let strategy = requested_strategy(kind, &annotations, &workspace);

    let pods: BTreeMap<String, &Pod> = objects
        .pods
        .iter()
        .map(|pod| (pod.name_any(), pod.as_ref()))
        .collect();
    let mut members = Vec::with_capacity(sandboxes.len());
    let mut problems = Vec::new();
    for sandbox in &sandboxes {
        let conditions = sandbox
            .status
            .as_ref()
            .map(|status| status.conditions.as_slice())
            .unwrap_or_default();
        let ready_condition = condition(conditions, "Ready");
        let terminating = sandbox.metadata.deletion_timestamp.is_some();
        let ready = is_true(ready_condition) && !terminating;
        let expected_pod = pod_name(sandbox);
        let pod = pods.get(&expected_pod).copied();
        let known_pod = sandbox.annotations().contains_key(ANN_POD_NAME) || pod.is_some();
        if terminating {
            problems.push(Problem::terminating(&sandbox.name_any()));
        } else if !ready {
            let problem = pod
                .and_then(|pod| Problem::from_pod(&sandbox.name_any(), pod))
                .unwrap_or_else(|| {
                    Problem::from_sandbox(&sandbox.name_any(), conditions, ready_condition)
                });
            problems.push(problem);
        }
        members.push(Member {
            name: sandbox.name_any(),
            pod: known_pod.then_some(expected_pod),
            ready,
        });
    }
    for pvc in &pvcs {
        if pvc.metadata.deletion_timestamp.is_some() {
            problems.push(Problem::terminating(&pvc.name_any()));
        }
        let lost = pvc
            .status
            .as_ref()
            .and_then(|status| status.phase.as_deref())
            == Some("Lost");
        if lost {
            problems.push(Problem {
                reason: "WorkspaceLost".to_string(),
                message: format!("workspace PVC {} lost its volume", pvc.name_any()),
                terminal: true,
            });
        }
    }
    let owner = first_sandbox
        .map(|s| owner_of(s.labels()))
        .or_else(|| first_pvc.map(|p| owner_of(p.labels())))
        .unwrap_or_default();
    finish(
        name, replicas, strategy, workspace, members, problems, creating, owner,
    )
}

/// The strategy as requested: the size and class recorded on the Sandboxes
/// at creation (the PVC may report a canonicalised size or a defaulted
/// class), else what the workspace shows.
fn requested_strategy(
    kind: StrategyKind,
    annotations: &BTreeMap<String, String>,
    workspace: &WorkspaceView,
) -> Strategy {
    let size = annotations
        .get(ANN_WORKSPACE_SIZE)
        .filter(|size| !size.is_empty())
        .cloned()
        .unwrap_or_else(|| workspace.size.clone());
    let storage_class = if annotations.contains_key(ANN_WORKSPACE_SIZE) {
        annotations.get(ANN_WORKSPACE_STORAGE_CLASS).cloned()
    } else {
        workspace.storage_class.clone()
    };
    match kind {
        StrategyKind::Shared => Strategy::Shared {
            size,
            storage_class,
        },
        StrategyKind::Existing => Strategy::Existing {
            claim_name: workspace.claim_name.clone().unwrap_or_default(),
            read_only: workspace.read_only.unwrap_or(false),
        },
        // Warm pools never reach here (they have claims); treat an odd
        // annotation like the default topology.
        StrategyKind::Dedicated | StrategyKind::Warm => Strategy::Dedicated {
            size,
            storage_class,
        },
    }
}

/// Dedicated vs shared vs existing for objects without our strategy
/// annotation (made by the Go prototype).
fn infer_strategy(has_claim: bool, pvcs: &[&PersistentVolumeClaim]) -> StrategyKind {
    if has_claim {
        return StrategyKind::Existing;
    }
    let shared = pvcs
        .first()
        .map(|pvc| first_access_mode(pvc) == "ReadWriteMany")
        .unwrap_or(false);
    if shared {
        StrategyKind::Shared
    } else {
        StrategyKind::Dedicated
    }
}

/// The workspace of a direct pool: the managed PVC's values (canonical, as
/// upstream) when it is cached, else what the Sandboxes recorded.
fn direct_workspace(
    annotations: &BTreeMap<String, String>,
    claim_name: Option<String>,
    pvc: Option<&PersistentVolumeClaim>,
) -> WorkspaceView {
    let recorded = |key: &str| annotations.get(key).cloned().unwrap_or_default();
    let read_only = claim_name.as_ref().map(|_| {
        annotations
            .get(names::WORKSPACE_READ_ONLY_ANNOTATION)
            .map(|value| parse_go_bool(value))
            .unwrap_or(false)
    });
    match pvc.filter(|_| claim_name.is_none()) {
        Some(pvc) => {
            let spec = pvc.spec.as_ref();
            WorkspaceView {
                size: spec
                    .and_then(|spec| spec.resources.as_ref())
                    .and_then(|resources| resources.requests.as_ref())
                    .and_then(|requests| requests.get("storage"))
                    .map(|quantity| quantity.0.clone())
                    .unwrap_or_else(|| recorded(ANN_WORKSPACE_SIZE)),
                access_mode: first_access_mode(pvc),
                storage_class: spec
                    .and_then(|spec| spec.storage_class_name.clone())
                    .filter(|class| !class.is_empty()),
                claim_name: None,
                read_only: None,
            }
        }
        None => WorkspaceView {
            size: recorded(ANN_WORKSPACE_SIZE),
            access_mode: recorded(ANN_WORKSPACE_ACCESS_MODE),
            storage_class: annotations
                .get(ANN_WORKSPACE_STORAGE_CLASS)
                .filter(|class| !class.is_empty())
                .cloned(),
            claim_name,
            read_only,
        },
    }
}

/// Why a member is not ready.
#[derive(Debug, Clone)]
struct Problem {
    reason: String,
    message: String,
    terminal: bool,
}

impl Problem {
    /// From a `Ready` condition (or its absence).
    fn from_condition(object: &str, ready: Option<&Condition>) -> Self {
        match ready {
            Some(condition) if !condition.reason.is_empty() => Self {
                terminal: TERMINAL_REASONS.contains(&condition.reason.as_str()),
                reason: condition.reason.clone(),
                message: prefixed(object, &condition.message),
            },
            _ => Self {
                reason: "Pending".to_string(),
                message: format!("{object}: waiting for the controller"),
                terminal: false,
            },
        }
    }

    /// The object is being deleted (a released pool on its way out).
    fn terminating(object: &str) -> Self {
        Self {
            reason: TERMINATING.to_string(),
            message: format!("{object}: being deleted"),
            terminal: false,
        }
    }

    /// From a Sandbox's conditions: a failed scheduling explains a pending
    /// pod better than the generic `DependenciesNotReady`.
    fn from_sandbox(object: &str, conditions: &[Condition], ready: Option<&Condition>) -> Self {
        let from_ready = Self::from_condition(object, ready);
        if from_ready.terminal {
            return from_ready;
        }
        match condition(conditions, "PodScheduled") {
            Some(scheduled) if scheduled.status == "False" && !scheduled.reason.is_empty() => {
                Self {
                    reason: scheduled.reason.clone(),
                    message: prefixed(object, &scheduled.message),
                    terminal: false,
                }
            }
            _ => from_ready,
        }
    }

    /// From the pod itself, when it ended: the Sandbox controller may not
    /// have caught up yet, and a terminated pod is never recreated.
    fn from_pod(object: &str, pod: &Pod) -> Option<Self> {
        let status = pod.status.as_ref()?;
        let reason = match status.phase.as_deref()? {
            "Failed" => "PodFailed",
            "Succeeded" => "PodSucceeded",
            _ => return None,
        };
        let detail = status
            .message
            .clone()
            .or_else(|| status.reason.clone())
            .unwrap_or_else(|| format!("pod {} ended", pod.name_any()));
        Some(Self {
            reason: reason.to_string(),
            message: prefixed(object, &detail),
            terminal: true,
        })
    }
}

/// `object: message`, or just the object when there is no message.
fn prefixed(object: &str, message: &str) -> String {
    if message.is_empty() {
        object.to_string()
    } else {
        format!("{object}: {message}")
    }
}

/// Phase, reason and message from the members and their problems.
#[allow(clippy::too_many_arguments)]
fn finish(
    name: &str,
    replicas: u32,
    strategy: Strategy,
    workspace: WorkspaceView,
    members: Vec<Member>,
    problems: Vec<Problem>,
    creating: bool,
    owner_scope: String,
) -> PoolStatus {
    let ready_replicas = members.iter().filter(|member| member.ready).count() as u32;
    let present = members.len() as u32;
    let deleting = problems.iter().any(|p| p.reason == TERMINATING);
    let (phase, reason, message) = if let Some(problem) = problems.iter().find(|p| p.terminal) {
        (
            PoolPhase::Failed,
            Some(problem.reason.clone()),
            Some(problem.message.clone()),
        )
    } else if present < replicas && !creating && !deleting {
        // A member was deleted behind our back (or its claim expired): it
        // will not come back by itself. While a create or a delete runs,
        // missing members are expected.
        (
            PoolPhase::Failed,
            Some("SandboxMissing".to_string()),
            Some(format!("{present} of {replicas} sandboxes exist")),
        )
    } else if ready_replicas >= replicas && present >= replicas {
        (PoolPhase::Ready, None, None)
    } else {
        match problems.first() {
            Some(problem) => (
                PoolPhase::Provisioning,
                Some(problem.reason.clone()),
                Some(problem.message.clone()),
            ),
            None => (PoolPhase::Provisioning, None, None),
        }
    };
    PoolStatus {
        name: name.to_string(),
        replicas,
        strategy,
        workspace,
        phase,
        ready_replicas,
        reason,
        message,
        members,
        owner_scope,
    }
}

/// The condition of `type_`, if present.
fn condition<'a>(conditions: &'a [Condition], type_: &str) -> Option<&'a Condition> {
    conditions.iter().find(|condition| condition.type_ == type_)
}

/// The condition is present and `True`.
fn is_true(condition: Option<&Condition>) -> bool {
    condition.is_some_and(|condition| condition.status == "True")
}

/// Pod of a Sandbox: the controller's pod-name annotation, else the Sandbox name.
fn pod_name(sandbox: &Sandbox) -> String {
    sandbox
        .annotations()
        .get(ANN_POD_NAME)
        .filter(|name| !name.is_empty())
        .cloned()
        .unwrap_or_else(|| sandbox.name_any())
}

/// The replica count annotation or label.
fn replicas_from(map: &BTreeMap<String, String>) -> Option<u32> {
    map.get(names::REPLICAS_KEY)?.parse().ok()
}

/// The owner label, or empty.
fn owner_of(labels: &BTreeMap<String, String>) -> String {
    labels.get(names::OWNER_LABEL).cloned().unwrap_or_default()
}

/// First access mode of a PVC's spec, or empty.
fn first_access_mode(pvc: &PersistentVolumeClaim) -> String {
    pvc.spec
        .as_ref()
        .and_then(|spec| spec.access_modes.as_ref())
        .and_then(|modes| modes.first())
        .cloned()
        .unwrap_or_default()
}

/// Go's `strconv.ParseBool` truth values (what upstream wrote and read).
fn parse_go_bool(value: &str) -> bool {
    matches!(value, "1" | "t" | "T" | "TRUE" | "true" | "True")
}

/// Sort key putting `x-2` before `x-10`: the trailing index, then the name.
fn index_key(name: &str) -> (u64, String) {
    let index = name
        .rsplit('-')
        .next()
        .and_then(|tail| tail.parse().ok())
        .unwrap_or(u64::MAX);
    (index, name.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{json, Value};

    const OWNER: &str = "0123456789abcdef0123456789abcdef";

    fn condition(type_: &str, status: &str, reason: &str, message: &str) -> Value {
        json!({"type": type_, "status": status, "reason": reason, "message": message})
    }

    fn ready() -> Value {
        condition("Ready", "True", "DependenciesReady", "")
    }

    fn sandbox(name: &str, annotations: Value, conditions: Vec<Value>) -> Arc<Sandbox> {
        let mut value = json!({
            "apiVersion": "agents.x-k8s.io/v1beta1",
            "kind": "Sandbox",
            "metadata": {
                "name": name,
                "labels": {"context.rossoctl.io/pool": "p", "context.rossoctl.io/owner": OWNER},
                "annotations": annotations,
            },
            "spec": {"podTemplate": {"spec": {"containers": [{"name": "sandbox"}]}}},
        });
        if !conditions.is_empty() {
            value["status"] = json!({"conditions": conditions});
        }
        Arc::new(serde_json::from_value(value).expect("sandbox"))
    }

    fn direct(replicas: u32, strategy: &str) -> Value {
        json!({
            "context.rossoctl.io/replicas": replicas.to_string(),
            "context.rossoctl.io/strategy": strategy,
            "context.rossoctl.io/workspace-read-only": "false",
            "context.rossoctl.io/workspace-size": "1.5Gi",
            "context.rossoctl.io/workspace-access-mode": "ReadWriteOnce",
        })
    }

    fn pvc(name: &str, size: &str, phase: &str) -> Arc<PersistentVolumeClaim> {
        Arc::new(
            serde_json::from_value(json!({
                "metadata": {"name": name, "labels": {"context.rossoctl.io/replicas": "2"}},
                "spec": {
                    "accessModes": ["ReadWriteOnce"],
                    "resources": {"requests": {"storage": size}},
                    "storageClassName": "standard",
                },
                "status": {"phase": phase},
            }))
            .expect("pvc"),
        )
    }

    fn pod(name: &str, phase: &str, message: &str) -> Arc<Pod> {
        Arc::new(
            serde_json::from_value(json!({
                "metadata": {"name": name},
                "status": {"phase": phase, "message": message},
            }))
            .expect("pod"),
        )
    }

    fn claim(name: &str, uid: &str, status: Value) -> Arc<SandboxClaim> {
        Arc::new(
            serde_json::from_value(json!({
                "apiVersion": "extensions.agents.x-k8s.io/v1beta1",
                "kind": "SandboxClaim",
                "metadata": {
                    "name": name,
                    "uid": uid,
                    "labels": {"context.rossoctl.io/owner": OWNER},
                    "annotations": {"context.rossoctl.io/replicas": "2"},
                },
                "spec": {"warmPoolRef": {"name": "agents"}},
                "status": status,
            }))
            .expect("claim"),
        )
    }

    fn adopted(name: &str, claim_uid: &str, pod_name: Option<&str>) -> Arc<Sandbox> {
        let annotations = match pod_name {
            Some(pod) => json!({"agents.x-k8s.io/pod-name": pod}),
            None => json!({}),
        };
        Arc::new(
            serde_json::from_value(json!({
                "metadata": {
                    "name": name,
                    "labels": {"agents.x-k8s.io/claim-uid": claim_uid},
                    "annotations": annotations,
                },
                "spec": {"podTemplate": {"spec": {"containers": [{"name": "c"}]}}},
            }))
            .expect("sandbox"),
        )
    }

    #[test]
    fn no_objects_is_no_pool() {
        assert_eq!(pool_status("p", &PoolObjects::default(), false), None);
    }

    #[test]
    fn all_sandboxes_ready_is_ready_with_members_in_index_order() {
        let mut sandboxes = Vec::new();
        for i in [10u32, 2, 0, 1, 3, 4, 5, 6, 7, 8, 9] {
            let name = format!("sandbox-p-{i}");
            let annotations = direct(11, "dedicated");
            sandboxes.push(sandbox(&name, annotations, vec![ready()]));
        }
        let objects = PoolObjects {
            sandboxes,
            ..PoolObjects::default()
        };
        let status = pool_status("p", &objects, false).expect("pool");
        assert_eq!(status.phase, PoolPhase::Ready);
        assert_eq!(status.ready_replicas, 11);
        assert_eq!(status.replicas, 11);
        assert_eq!(status.reason, None);
        assert_eq!(status.owner_scope, OWNER);
        let names: Vec<_> = status.members.iter().map(|m| m.name.clone()).collect();
        let expected: Vec<_> = (0..11).map(|i| format!("sandbox-p-{i}")).collect();
        assert_eq!(names, expected);
        // No pod-name annotation and no pod seen: the pod is not known yet.
        assert!(status.members.iter().all(|m| m.pod.is_none() && m.ready));
    }

    #[test]
    fn pending_sandbox_is_provisioning_with_its_reason() {
        let mut annotations = direct(2, "dedicated");
        annotations["agents.x-k8s.io/pod-name"] = json!("sandbox-p-0");
        let objects = PoolObjects {
            sandboxes: vec![
                sandbox("sandbox-p-0", annotations, vec![ready()]),
                sandbox(
                    "sandbox-p-1",
                    direct(2, "dedicated"),
                    vec![condition(
                        "Ready",
                        "False",
                        "DependenciesNotReady",
                        "Pod exists with phase: Pending",
                    )],
                ),
            ],
            pvcs: vec![
                pvc("p-workspace-1", "1536Mi", "Bound"),
                pvc("p-workspace-0", "1536Mi", "Bound"),
            ],
            pods: vec![pod("sandbox-p-1", "Pending", "")],
            ..PoolObjects::default()
        };
        let status = pool_status("p", &objects, false).expect("pool");
        assert_eq!(status.phase, PoolPhase::Provisioning);
        assert_eq!(status.ready_replicas, 1);
        assert_eq!(status.reason.as_deref(), Some("DependenciesNotReady"));
        assert_eq!(
            status.message.as_deref(),
            Some("sandbox-p-1: Pod exists with phase: Pending")
        );
        assert_eq!(
            status.members,
            vec![
                Member {
                    name: "sandbox-p-0".to_string(),
                    pod: Some("sandbox-p-0".to_string()),
                    ready: true,
                },
                Member {
                    name: "sandbox-p-1".to_string(),
                    pod: Some("sandbox-p-1".to_string()),
                    ready: false,
                },
            ]
        );
        // The workspace as the API server canonicalised it; the strategy as
        // requested.
        assert_eq!(status.workspace.size, "1536Mi");
        assert_eq!(status.workspace.storage_class.as_deref(), Some("standard"));
        assert_eq!(
            status.strategy,
            Strategy::Dedicated {
                size: "1.5Gi".to_string(),
                storage_class: None,
            }
        );
    }

    #[test]
    fn unschedulable_pod_explains_provisioning() {
        let objects = PoolObjects {
            sandboxes: vec![sandbox(
                "sandbox-p-0",
                direct(1, "shared"),
                vec![
                    condition(
                        "Ready",
                        "False",
                        "DependenciesNotReady",
                        "Pod exists with phase: Pending",
                    ),
                    condition(
                        "PodScheduled",
                        "False",
                        "Unschedulable",
                        "0/3 nodes are available",
                    ),
                ],
            )],
            ..PoolObjects::default()
        };
        let status = pool_status("p", &objects, false).expect("pool");
        assert_eq!(status.phase, PoolPhase::Provisioning);
        assert_eq!(status.reason.as_deref(), Some("Unschedulable"));
        assert_eq!(
            status.message.as_deref(),
            Some("sandbox-p-0: 0/3 nodes are available")
        );
        assert!(matches!(status.strategy, Strategy::Shared { .. }));
    }

    #[test]
    fn terminal_sandbox_reason_fails_the_pool() {
        let objects = PoolObjects {
            sandboxes: vec![
                sandbox("sandbox-p-0", direct(2, "dedicated"), vec![ready()]),
                sandbox(
                    "sandbox-p-1",
                    direct(2, "dedicated"),
                    vec![condition("Ready", "False", "PodFailed", "exit code 1")],
                ),
            ],
            ..PoolObjects::default()
        };
        let status = pool_status("p", &objects, false).expect("pool");
        assert_eq!(status.phase, PoolPhase::Failed);
        assert_eq!(status.reason.as_deref(), Some("PodFailed"));
        assert_eq!(status.message.as_deref(), Some("sandbox-p-1: exit code 1"));
        assert_eq!(status.ready_replicas, 1);
    }

    #[test]
    fn a_failed_pod_fails_the_pool_before_the_controller_notices() {
        let objects = PoolObjects {
            sandboxes: vec![sandbox(
                "sandbox-p-0",
                direct(1, "dedicated"),
                vec![condition(
                    "Ready",
                    "False",
                    "DependenciesNotReady",
                    "Pod is Running but not Ready",
                )],
            )],
            pods: vec![pod("sandbox-p-0", "Failed", "OOMKilled")],
            ..PoolObjects::default()
        };
        let status = pool_status("p", &objects, false).expect("pool");
        assert_eq!(status.phase, PoolPhase::Failed);
        assert_eq!(status.reason.as_deref(), Some("PodFailed"));
        assert_eq!(status.message.as_deref(), Some("sandbox-p-0: OOMKilled"));
        assert_eq!(status.members[0].pod.as_deref(), Some("sandbox-p-0"));
    }

    #[test]
    fn missing_sandboxes_fail_unless_the_create_is_running() {
        let objects = PoolObjects {
            sandboxes: vec![sandbox(
                "sandbox-p-0",
                direct(3, "dedicated"),
                vec![ready()],
            )],
            ..PoolObjects::default()
        };
        let status = pool_status("p", &objects, true).expect("pool");
        assert_eq!(status.phase, PoolPhase::Provisioning);
        let status = pool_status("p", &objects, false).expect("pool");
        assert_eq!(status.phase, PoolPhase::Failed);
        assert_eq!(status.reason.as_deref(), Some("SandboxMissing"));
        assert_eq!(status.message.as_deref(), Some("1 of 3 sandboxes exist"));
    }

    #[test]
    fn terminating_members_are_not_ready() {
        let mut claim = (*claim(
            "claim-p-0",
            "uid-0",
            json!({"sandbox": {"name": "claim-p-0"}, "conditions": [ready()]}),
        ))
        .clone();
        claim.metadata.deletion_timestamp =
            Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                k8s_openapi::jiff::Timestamp::now(),
            ));
        let objects = PoolObjects {
            claims: vec![Arc::new(claim)],
            ..PoolObjects::default()
        };
        let status = pool_status("p", &objects, false).expect("pool");
        assert_eq!(status.ready_replicas, 0);
        // One of two claims left, on its way out: a release, not a failure.
        assert_eq!(status.phase, PoolPhase::Provisioning);
        assert_eq!(status.reason.as_deref(), Some("Terminating"));
        assert!(!status.members[0].ready);

        let mut sandbox = (*sandbox("sandbox-p-0", direct(1, "shared"), vec![ready()])).clone();
        sandbox.metadata.deletion_timestamp =
            Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                k8s_openapi::jiff::Timestamp::now(),
            ));
        let objects = PoolObjects {
            sandboxes: vec![Arc::new(sandbox)],
            ..PoolObjects::default()
        };
        let status = pool_status("p", &objects, false).expect("pool");
        assert_eq!(status.phase, PoolPhase::Provisioning);
        assert_eq!(status.reason.as_deref(), Some("Terminating"));
    }

    #[test]
    fn lost_workspace_fails_the_pool() {
        let objects = PoolObjects {
            sandboxes: vec![sandbox(
                "sandbox-p-0",
                direct(1, "dedicated"),
                vec![ready()],
            )],
            pvcs: vec![pvc("p-workspace-0", "1Gi", "Lost")],
            ..PoolObjects::default()
        };
        let status = pool_status("p", &objects, false).expect("pool");
        assert_eq!(status.phase, PoolPhase::Failed);
        assert_eq!(status.reason.as_deref(), Some("WorkspaceLost"));
    }

    #[test]
    fn existing_claim_workspace_comes_from_the_recorded_annotations() {
        let annotations = json!({
            "context.rossoctl.io/replicas": "1",
            "context.rossoctl.io/strategy": "existing",
            "context.rossoctl.io/workspace-claim": "prepared",
            "context.rossoctl.io/workspace-read-only": "true",
            "context.rossoctl.io/workspace-size": "10Gi",
            "context.rossoctl.io/workspace-access-mode": "ReadWriteMany",
        });
        let objects = PoolObjects {
            sandboxes: vec![sandbox("sandbox-p-0", annotations, vec![])],
            ..PoolObjects::default()
        };
        let status = pool_status("p", &objects, false).expect("pool");
        assert_eq!(
            status.strategy,
            Strategy::Existing {
                claim_name: "prepared".to_string(),
                read_only: true,
            }
        );
        assert_eq!(
            status.workspace,
            WorkspaceView {
                size: "10Gi".to_string(),
                access_mode: "ReadWriteMany".to_string(),
                storage_class: None,
                claim_name: Some("prepared".to_string()),
                read_only: Some(true),
            }
        );
        // No conditions yet: provisioning, waiting for the controller.
        assert_eq!(status.phase, PoolPhase::Provisioning);
        assert_eq!(status.reason.as_deref(), Some("Pending"));
    }

    #[test]
    fn go_prototype_objects_without_our_annotations_still_read() {
        let annotations = json!({"context.rossoctl.io/workspace-read-only": "false"});
        let mut rwx = (*pvc("p-workspace", "5Gi", "Bound")).clone();
        if let Some(spec) = rwx.spec.as_mut() {
            spec.access_modes = Some(vec!["ReadWriteMany".to_string()]);
        }
        let objects = PoolObjects {
            sandboxes: vec![
                sandbox("sandbox-p-0", annotations.clone(), vec![ready()]),
                sandbox("sandbox-p-1", annotations, vec![ready()]),
            ],
            pvcs: vec![Arc::new(rwx)],
            ..PoolObjects::default()
        };
        let status = pool_status("p", &objects, false).expect("pool");
        // Replicas from the PVC label; shared from the RWX mode.
        assert_eq!(status.replicas, 2);
        assert_eq!(status.phase, PoolPhase::Ready);
        assert_eq!(
            status.strategy,
            Strategy::Shared {
                size: "5Gi".to_string(),
                storage_class: Some("standard".to_string()),
            }
        );
    }

    #[test]
    fn warm_members_resolve_claim_to_adopted_sandbox_to_pod() {
        let bound = |sandbox: &str, ready_condition: Value| json!({"sandbox": {"name": sandbox}, "conditions": [ready_condition]});
        let objects = PoolObjects {
            claims: vec![
                claim("claim-p-1", "uid-1", json!({})),
                claim("claim-p-0", "uid-0", bound("agents-x7k2p", ready())),
            ],
            bound_sandboxes: vec![adopted("agents-x7k2p", "uid-0", Some("agents-x7k2p-pod"))],
            ..PoolObjects::default()
        };
        let status = pool_status("p", &objects, false).expect("pool");
        assert_eq!(
            status.strategy,
            Strategy::Warm {
                pool: "agents".to_string()
            }
        );
        assert_eq!(status.workspace, WorkspaceView::default());
        assert_eq!(status.replicas, 2);
        assert_eq!(status.ready_replicas, 1);
        assert_eq!(status.phase, PoolPhase::Provisioning);
        assert_eq!(status.reason.as_deref(), Some("Pending"));
        assert_eq!(
            status.members,
            vec![
                Member {
                    name: "agents-x7k2p".to_string(),
                    pod: Some("agents-x7k2p-pod".to_string()),
                    ready: true,
                },
                Member {
                    name: "claim-p-1".to_string(),
                    pod: None,
                    ready: false,
                },
            ]
        );
    }

    #[test]
    fn a_same_named_sandbox_of_another_claim_is_not_a_member() {
        let objects = PoolObjects {
            claims: vec![claim(
                "claim-p-0",
                "uid-0",
                json!({"sandbox": {"name": "agents-abcde"}}),
            )],
            bound_sandboxes: vec![adopted("agents-abcde", "uid-someone-else", Some("evil"))],
            ..PoolObjects::default()
        };
        let status = pool_status("p", &objects, false).expect("pool");
        assert_eq!(status.members[0].name, "agents-abcde");
        assert_eq!(status.members[0].pod, None);
    }

    #[test]
    fn missing_warm_pool_fails_the_pool_with_the_claim_reason() {
        let not_found = condition(
            "Ready",
            "False",
            "WarmPoolNotFound",
            "warm pool agents not found",
        );
        let objects = PoolObjects {
            claims: vec![
                claim(
                    "claim-p-0",
                    "uid-0",
                    json!({"conditions": [not_found.clone()]}),
                ),
                claim("claim-p-1", "uid-1", json!({"conditions": [not_found]})),
            ],
            ..PoolObjects::default()
        };
        let status = pool_status("p", &objects, false).expect("pool");
        assert_eq!(status.phase, PoolPhase::Failed);
        assert_eq!(status.reason.as_deref(), Some("WarmPoolNotFound"));
        assert_eq!(
            status.message.as_deref(),
            Some("claim-p-0: warm pool agents not found")
        );
        assert_eq!(status.ready_replicas, 0);
    }

    #[test]
    fn all_claims_ready_is_ready_even_before_the_sandboxes_are_cached() {
        let bound = |sandbox: &str| json!({"sandbox": {"name": sandbox}, "conditions": [ready()]});
        let objects = PoolObjects {
            claims: vec![
                claim("claim-p-0", "uid-0", bound("claim-p-0")),
                claim("claim-p-1", "uid-1", bound("agents-q")),
            ],
            ..PoolObjects::default()
        };
        let status = pool_status("p", &objects, false).expect("pool");
        assert_eq!(status.phase, PoolPhase::Ready);
        assert_eq!(status.ready_replicas, 2);
        // Falls back to the Sandbox name, as the SDKs do.
        assert_eq!(status.members[1].pod.as_deref(), Some("agents-q"));
    }
}
