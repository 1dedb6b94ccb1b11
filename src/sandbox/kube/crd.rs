//! Typed `v1beta1` structs for the agent-sandbox custom resources the `kube`
//! backend reads and writes: `Sandbox` (`agents.x-k8s.io`), `SandboxClaim`
//! and `SandboxWarmPool` (`extensions.agents.x-k8s.io`).
//!
//! Only the fields this service uses are modelled. Everything is
//! `#[serde(default)]` where the controller may leave it out, and serde
//! ignores unknown fields, so new status fields written by a newer controller
//! never break decoding (a decode error would stall the watchers).

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::PodSpec;
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// A `metav1.Condition` as the agent-sandbox controllers write it.
///
/// Written by hand instead of using the k8s-openapi type so that a condition
/// without `lastTransitionTime` (or with an unexpected time format) still
/// decodes: status computation only needs type, status, reason and message.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Condition {
    /// Condition type, e.g. `Ready`.
    #[serde(rename = "type", default)]
    pub type_: String,
    /// `True`, `False` or `Unknown`.
    #[serde(default)]
    pub status: String,
    /// Machine-readable reason, e.g. `DependenciesNotReady`.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub reason: String,
    /// Human-readable message.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub message: String,
    /// RFC 3339 time of the last status change, kept as text.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_transition_time: Option<String>,
    /// Generation the condition was computed for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
}

/// Labels and annotations of a pod template (the only metadata the
/// controller honours there).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PodMetadata {
    /// Labels merged onto the Pod.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,
    /// Annotations merged onto the Pod.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub annotations: BTreeMap<String, String>,
}

/// The pod a Sandbox runs: `{metadata: {labels, annotations}, spec: PodSpec}`.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PodTemplate {
    /// Pod labels and annotations.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata: Option<PodMetadata>,
    /// The full core/v1 pod spec.
    pub spec: PodSpec,
}

/// `Sandbox.spec`: one pod with a stable identity.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[kube(
    group = "agents.x-k8s.io",
    version = "v1beta1",
    kind = "Sandbox",
    plural = "sandboxes",
    namespaced,
    status = "SandboxStatus"
)]
#[serde(rename_all = "camelCase")]
pub struct SandboxSpec {
    /// The pod to run.
    pub pod_template: PodTemplate,
    /// `Running` (default) or `Suspended`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub operating_mode: Option<String>,
    /// Absolute expiry (RFC 3339); unset means never.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shutdown_time: Option<String>,
    /// `Delete` or `Retain` (default) on expiry.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shutdown_policy: Option<String>,
    /// Whether the controller keeps a headless Service for the Sandbox;
    /// unset means none (this service never asks for one).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub service: Option<bool>,
}

/// `Sandbox.status`.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SandboxStatus {
    /// `Ready`, `Suspended`, `PodScheduled`, `Finished`.
    #[serde(default)]
    pub conditions: Vec<Condition>,
    /// IPs of the backing pod; empty while there is none.
    #[serde(default, rename = "podIPs")]
    pub pod_ips: Vec<String>,
    /// Label selector of the backing pod (`agents.x-k8s.io/sandbox-name-hash=…`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub selector: Option<String>,
}

/// `SandboxClaim.spec.warmPoolRef`.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
pub struct WarmPoolRef {
    /// Name of a `SandboxWarmPool` in the claim's namespace.
    #[serde(default)]
    pub name: String,
}

/// `SandboxClaim.spec.lifecycle`: when and how the claim expires.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ClaimLifecycle {
    /// Absolute expiry (RFC 3339).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shutdown_time: Option<String>,
    /// `Delete`, `DeleteForeground` or `Retain` (the controller's default).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shutdown_policy: Option<String>,
    /// Expire this many seconds after the pod finished.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ttl_seconds_after_finished: Option<i32>,
}

/// `SandboxClaim.spec`: check a sandbox out of a warm pool.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[kube(
    group = "extensions.agents.x-k8s.io",
    version = "v1beta1",
    kind = "SandboxClaim",
    plural = "sandboxclaims",
    namespaced,
    status = "SandboxClaimStatus"
)]
#[serde(rename_all = "camelCase")]
pub struct SandboxClaimSpec {
    /// The pool to check out from.
    #[serde(default)]
    pub warm_pool_ref: WarmPoolRef,
    /// Expiry, so a crashed caller cannot leak the sandbox forever.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lifecycle: Option<ClaimLifecycle>,
    /// Labels and annotations merged onto the claimed pod.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub additional_pod_metadata: Option<PodMetadata>,
}

/// `SandboxClaim.status.sandbox`: the bound Sandbox.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ClaimedSandbox {
    /// Name of the bound Sandbox; differs from the claim name after a warm
    /// adoption.
    #[serde(default)]
    pub name: String,
    /// IPs copied from the Sandbox.
    #[serde(default, rename = "podIPs")]
    pub pod_ips: Vec<String>,
}

/// `SandboxClaim.status`.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SandboxClaimStatus {
    /// `Ready` (forwarded from the Sandbox, or a claim-level reason) and `Finished`.
    #[serde(default)]
    pub conditions: Vec<Condition>,
    /// The bound Sandbox, once there is one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sandbox: Option<ClaimedSandbox>,
}

/// `SandboxWarmPool.spec.sandboxTemplateRef`.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
pub struct SandboxTemplateRef {
    /// Name of a `SandboxTemplate` in the pool's namespace.
    #[serde(default)]
    pub name: String,
}

/// `SandboxWarmPool.spec`. This service only reads pools (to validate a
/// `warmPoolRef`); it never creates or deletes them.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[kube(
    group = "extensions.agents.x-k8s.io",
    version = "v1beta1",
    kind = "SandboxWarmPool",
    plural = "sandboxwarmpools",
    namespaced,
    status = "SandboxWarmPoolStatus"
)]
#[serde(rename_all = "camelCase")]
pub struct SandboxWarmPoolSpec {
    /// Desired number of unclaimed sandboxes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replicas: Option<i32>,
    /// Template used for the pool's sandboxes and for cold starts.
    #[serde(default)]
    pub sandbox_template_ref: SandboxTemplateRef,
}

/// `SandboxWarmPool.status`.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SandboxWarmPoolStatus {
    /// Active members, ready or not.
    #[serde(default)]
    pub replicas: i32,
    /// Members whose Sandbox is Ready.
    #[serde(default)]
    pub ready_replicas: i32,
}

#[cfg(test)]
mod tests {
    use super::*;
    use kube::Resource;

    #[test]
    fn api_coordinates_match_the_controller() {
        assert_eq!(Sandbox::api_version(&()), "agents.x-k8s.io/v1beta1");
        assert_eq!(Sandbox::plural(&()), "sandboxes");
        assert_eq!(
            SandboxClaim::api_version(&()),
            "extensions.agents.x-k8s.io/v1beta1"
        );
        assert_eq!(SandboxClaim::plural(&()), "sandboxclaims");
        assert_eq!(SandboxWarmPool::kind(&()), "SandboxWarmPool");
        assert_eq!(SandboxWarmPool::plural(&()), "sandboxwarmpools");
    }

    #[test]
    fn decodes_controller_objects_with_unknown_fields() {
        let claim: SandboxClaim = serde_json::from_value(serde_json::json!({
            "apiVersion": "extensions.agents.x-k8s.io/v1beta1",
            "kind": "SandboxClaim",
            "metadata": {"name": "claim-a-0", "namespace": "ns"},
            "spec": {"warmPoolRef": {"name": "pool"}, "futureField": 1},
            "status": {
                "conditions": [{"type": "Ready", "status": "False", "reason": "WarmPoolNotFound"}],
                "sandbox": {"name": "pool-abcde", "podIPs": ["10.0.0.1"]},
                "somethingNew": {"x": true}
            }
        }))
        .expect("claim decodes");
        let status = claim.status.expect("status");
        assert_eq!(status.sandbox.expect("sandbox").name, "pool-abcde");
        assert_eq!(status.conditions[0].reason, "WarmPoolNotFound");
        assert_eq!(status.conditions[0].last_transition_time, None);

        let sandbox: Sandbox = serde_json::from_value(serde_json::json!({
            "apiVersion": "agents.x-k8s.io/v1beta1",
            "kind": "Sandbox",
            "metadata": {"name": "s"},
            "spec": {"podTemplate": {"spec": {"containers": [{"name": "c"}]}}, "service": true},
            "status": {"podIPs": ["10.0.0.2"], "serviceFQDN": "x", "nodeName": "n"}
        }))
        .expect("sandbox decodes");
        assert_eq!(sandbox.status.expect("status").pod_ips, vec!["10.0.0.2"]);
    }
}
