//! Why members are not ready, from Sandbox, SandboxClaim and Pod
//! conditions, and the phase, reason and message these give the pool.

use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;

use crate::pool::model::{Member, PoolPhase, PoolStatus, Strategy, WorkspaceView};

use super::super::crd::Condition;

/// Reason of a member (or workspace) that is being deleted.
pub(super) const TERMINATING: &str = "Terminating";

/// Reason of a warm member whose pod the pool's selector does not match yet.
pub(super) const POD_UNLABELLED: &str = "PodLabelPending";

/// The Sandbox `Ready` reason while its pod is not (yet) ready.
pub(super) const DEPENDENCIES_NOT_READY: &str = "DependenciesNotReady";

/// Sandbox / claim `Ready` reasons after which the member will not become
/// ready without intervention (agent-sandbox §1.3, §1.6; the Python SDK's
/// terminal list plus the missing-reference and terminal-pod reasons).
pub(super) const TERMINAL_REASONS: &[&str] = &[
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

/// Why a member is not ready.
#[derive(Debug, Clone)]
pub(super) struct Problem {
    reason: String,
    message: String,
    terminal: bool,
}

impl Problem {
    /// From a `Ready` condition (or its absence).
    pub(super) fn from_condition(object: &str, ready: Option<&Condition>) -> Self {
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
    pub(super) fn terminating(object: &str) -> Self {
        Self {
            reason: TERMINATING.to_string(),
            message: format!("{object}: being deleted"),
            terminal: false,
        }
    }

    /// From a Sandbox's conditions: a failed scheduling explains a pending
    /// pod better than the generic `DependenciesNotReady`.
    pub(super) fn from_sandbox(
        object: &str,
        conditions: &[Condition],
        ready: Option<&Condition>,
    ) -> Self {
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

    /// The claim is ready but its pod does not carry the pool label yet,
    /// so the pool's selector does not find it.
    pub(super) fn pod_unlabelled(object: &str, pod: &str) -> Self {
        Self {
            reason: POD_UNLABELLED.to_string(),
            message: format!("{object}: waiting for the pool label on pod {pod}"),
            terminal: false,
        }
    }

    /// The workspace PVC lost its volume: the data is gone for good.
    pub(super) fn workspace_lost(pvc: &str) -> Self {
        Self {
            reason: "WorkspaceLost".to_string(),
            message: format!("workspace PVC {pvc} lost its volume"),
            terminal: true,
        }
    }

    /// From the pod itself, when it ended: the Sandbox controller may not
    /// have caught up yet, and a terminated pod is never recreated.
    pub(super) fn from_pod(object: &str, pod: &Pod) -> Option<Self> {
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
pub(super) fn prefixed(object: &str, message: &str) -> String {
    if message.is_empty() {
        object.to_string()
    } else {
        format!("{object}: {message}")
    }
}

/// Phase, reason and message from the members and their problems.
#[allow(clippy::too_many_arguments)]
pub(super) fn finish(
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
        expires_at: None,
    }
}

/// The condition of `type_`, if present.
pub(super) fn condition<'a>(conditions: &'a [Condition], type_: &str) -> Option<&'a Condition> {
    conditions.iter().find(|condition| condition.type_ == type_)
}

/// The condition is present and `True`.
pub(super) fn is_true(condition: Option<&Condition>) -> bool {
    condition.is_some_and(|condition| condition.status == "True")
}
