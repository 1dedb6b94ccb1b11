//! Resource names and label keys shared with the upstream Go prototype.
//!
//! Every backend names and labels what it creates with these, so that pools
//! created by either implementation look the same to the harness and to
//! `kubectl`.

/// Label carried by every object of a pool (and its pods): `<pool name>`.
pub const POOL_LABEL: &str = "context.rossoctl.io/pool";
/// Label marking objects this service manages.
pub const MANAGED_BY_LABEL: &str = "app.kubernetes.io/managed-by";
/// Value of [`MANAGED_BY_LABEL`].
pub const MANAGED_BY_VALUE: &str = "context-service";
/// Label carrying the HMAC'd owner scope of a pool or context.
pub const OWNER_LABEL: &str = "context.rossoctl.io/owner";
/// Label on managed pool PVCs, annotation on Sandboxes: the requested replicas.
pub const REPLICAS_KEY: &str = "context.rossoctl.io/replicas";
/// Annotation on Sandboxes: `"true"` or `"false"`.
pub const WORKSPACE_READ_ONLY_ANNOTATION: &str = "context.rossoctl.io/workspace-read-only";
/// Annotation on Sandboxes of the existing-PVC strategy: the claim name.
pub const WORKSPACE_CLAIM_ANNOTATION: &str = "context.rossoctl.io/workspace-claim";
/// Annotation on every managed object of a pool with a `ttl`: when the pool
/// expires (RFC 3339, UTC). The reaper deletes the pool then, also after a
/// restart of the service.
pub const EXPIRES_AT_ANNOTATION: &str = "context.rossoctl.io/expires-at";

/// Annotation on every object a create makes: until when (RFC 3339, UTC)
/// the create may still be adding members. Every replica of the service
/// reads it, so a pool another replica is creating is `provisioning`
/// everywhere, not `failed` with members missing; after it, missing
/// members are a failure (e.g. the creating replica died half-way).
pub const CREATING_UNTIL_ANNOTATION: &str = "context.rossoctl.io/creating-until";

/// Annotation on the *first* object a create makes (its anchor): whether
/// that create finished. [`CREATED_PENDING`] from the start; the creator
/// sets the time it finished (RFC 3339, UTC) with one patch once every
/// object exists (any value but pending or abandoned reads as done;
/// earlier versions wrote [`CREATED_DONE`]), and a
/// reaper that finds it still pending after [`CREATING_UNTIL_ANNOTATION`]
/// claims it with [`CREATED_ABANDONED`] before deleting what the create made.
/// Both changes are compare-and-swap on `pending`, so exactly one wins.
/// Objects of older versions carry none and are never reaped.
pub const CREATED_ANNOTATION: &str = "context.rossoctl.io/created";
/// [`CREATED_ANNOTATION`] while the create runs.
pub const CREATED_PENDING: &str = "false";
/// [`CREATED_ANNOTATION`] once the create made every object, as earlier
/// versions wrote it (no time).
pub const CREATED_DONE: &str = "true";
/// [`CREATED_ANNOTATION`] of a create whose replica died half-way, being
/// deleted.
pub const CREATED_ABANDONED: &str = "abandoned";

/// The annotations every object of a pool expiring at `expires_at` carries
/// ([`EXPIRES_AT_ANNOTATION`]); empty for a pool that never expires.
pub fn expiry_annotations(
    expires_at: Option<k8s_openapi::jiff::Timestamp>,
) -> std::collections::BTreeMap<String, String> {
    expires_at
        .map(|at| (EXPIRES_AT_ANNOTATION.to_owned(), at.to_string()))
        .into_iter()
        .collect()
}
/// Label on named-context PVCs: the context name.
pub const CONTEXT_NAME_LABEL: &str = "context.rossoctl.io/name";
/// Label on named-context PVCs: the context type.
pub const CONTEXT_TYPE_LABEL: &str = "context.rossoctl.io/type";

/// `context.rossoctl.io/pool=<name>`: the selector a harness routes on.
pub fn selector(pool: &str) -> String {
    format!("{POOL_LABEL}={pool}")
}

/// Sandbox `index` of a direct pool: `sandbox-<name>-<index>`.
pub fn sandbox(pool: &str, index: u32) -> String {
    format!("sandbox-{pool}-{index}")
}

/// The dedicated (RWO) workspace PVC of sandbox `index`: `<name>-workspace-<index>`.
pub fn dedicated_workspace(pool: &str, index: u32) -> String {
    format!("{pool}-workspace-{index}")
}

/// The shared (RWX) workspace PVC of a pool: `<name>-workspace`.
pub fn shared_workspace(pool: &str) -> String {
    format!("{pool}-workspace")
}

/// SandboxClaim `index` of a warm-pool pool: `claim-<name>-<index>`.
pub fn claim(pool: &str, index: u32) -> String {
    format!("claim-{pool}-{index}")
}

/// The PVC of a named context: `context-<name>`.
pub fn context_claim(context: &str) -> String {
    format!("context-{context}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_match_upstream() {
        assert_eq!(selector("a"), "context.rossoctl.io/pool=a");
        assert_eq!(sandbox("bugstone-1", 2), "sandbox-bugstone-1-2");
        assert_eq!(dedicated_workspace("review", 0), "review-workspace-0");
        assert_eq!(shared_workspace("bugstone-1"), "bugstone-1-workspace");
        assert_eq!(claim("fast-run", 2), "claim-fast-run-2");
        assert_eq!(context_claim("research"), "context-research");
    }
}
