//! The manifests as upstream writes them: names, labels, pod template,
//! volumes, owner references, claim lifecycle and context PVCs.

use super::*;
use serde_json::json;

const OWNER: &str = "0123456789abcdef0123456789abcdef";

fn settings() -> KubeSettings {
    KubeSettings::new("ns", "registry.example/sandbox:1")
}

fn meta(name: &str, replicas: u32, strategy: StrategyKind) -> PoolMeta<'_> {
    PoolMeta {
        name,
        replicas,
        owner_scope: OWNER,
        strategy,
        expires_at: None,
        creating_until: None,
    }
}

fn record(size: &str, mode: &str, class: Option<&str>) -> WorkspaceRecord {
    WorkspaceRecord {
        size: size.to_string(),
        access_mode: mode.to_string(),
        storage_class: class.map(str::to_string),
    }
}

#[test]
fn names_and_selectors_match_upstream() {
    assert_eq!(names::sandbox("bugstone-1", 2), "sandbox-bugstone-1-2");
    assert_eq!(
        names::dedicated_workspace("review", 0),
        "review-workspace-0"
    );
    assert_eq!(
        names::shared_workspace("bugstone-1"),
        "bugstone-1-workspace"
    );
    assert_eq!(names::claim("fast-run", 2), "claim-fast-run-2");
    assert_eq!(names::context_claim("research"), "context-research");
    assert_eq!(
        managed_pool_selector("a"),
        "context.rossoctl.io/pool=a,app.kubernetes.io/managed-by=context-service"
    );
}

#[test]
fn dedicated_sandbox_has_upstream_pod_template_labels_and_volume() {
    let mut settings = settings();
    settings.sandbox_service_account = Some("sandboxes".to_string());
    let pool = meta("review", 3, StrategyKind::Dedicated);
    let pvc = names::dedicated_workspace("review", 2);
    let volume = WorkspaceVolume {
        claim_name: &pvc,
        read_only: false,
    };
    let object = sandbox(
        &settings,
        &pool,
        2,
        volume,
        &record("1Gi", "ReadWriteOnce", None),
    );
    let value = serde_json::to_value(&object).expect("serialises");
    assert_eq!(value["apiVersion"], "agents.x-k8s.io/v1beta1");
    assert_eq!(value["kind"], "Sandbox");
    assert_eq!(value["metadata"]["name"], "sandbox-review-2");
    assert_eq!(value["metadata"]["namespace"], "ns");
    let labels = json!({
        "context.rossoctl.io/pool": "review",
        "app.kubernetes.io/managed-by": "context-service",
        "context.rossoctl.io/owner": OWNER,
    });
    assert_eq!(value["metadata"]["labels"], labels);
    let annotations = &value["metadata"]["annotations"];
    assert_eq!(annotations["context.rossoctl.io/replicas"], "3");
    assert_eq!(
        annotations["context.rossoctl.io/workspace-read-only"],
        "false"
    );
    assert_eq!(annotations["context.rossoctl.io/strategy"], "dedicated");
    assert_eq!(annotations["context.rossoctl.io/workspace-size"], "1Gi");
    assert!(annotations["context.rossoctl.io/workspace-claim"].is_null());
    assert!(annotations["context.rossoctl.io/workspace-storage-class"].is_null());

    let template = &value["spec"]["podTemplate"];
    assert_eq!(template["metadata"]["labels"], labels);
    let pod = &template["spec"];
    assert_eq!(pod["serviceAccountName"], "sandboxes");
    assert_eq!(
        pod["topologySpreadConstraints"],
        json!([{
            "maxSkew": 1,
            "topologyKey": "kubernetes.io/hostname",
            "whenUnsatisfiable": "ScheduleAnyway",
            "labelSelector": {"matchLabels": {"context.rossoctl.io/pool": "review"}},
        }])
    );
    let container = &pod["containers"][0];
    assert_eq!(pod["containers"].as_array().map(Vec::len), Some(1));
    assert_eq!(container["name"], "sandbox");
    assert_eq!(container["image"], "registry.example/sandbox:1");
    assert_eq!(
        container["command"],
        json!([
            "/bin/sh",
            "-c",
            "mkdir -p /workspace && exec sleep infinity"
        ])
    );
    assert_eq!(container["workingDir"], "/workspace");
    assert_eq!(
        container["volumeMounts"],
        json!([{"name": "workspace", "mountPath": "/workspace", "readOnly": false}])
    );
    assert_eq!(
        container["resources"],
        json!({"requests": {"memory": "64Mi", "cpu": "50m"}, "limits": {"memory": "256Mi"}})
    );
    assert_eq!(
        pod["volumes"],
        json!([{
            "name": "workspace",
            "persistentVolumeClaim": {"claimName": "review-workspace-2", "readOnly": false},
        }])
    );
    // Nothing upstream does not set either: no expiry on direct sandboxes.
    assert!(value["spec"]["shutdownTime"].is_null());
}

#[test]
fn existing_read_only_claim_is_mounted_read_only_and_recorded() {
    let pool = meta("readers", 2, StrategyKind::Existing);
    let volume = WorkspaceVolume {
        claim_name: "prepared",
        read_only: true,
    };
    let object = sandbox(
        &settings(),
        &pool,
        0,
        volume,
        &record("2Gi", "ReadWriteMany", Some("nfs")),
    );
    let value = serde_json::to_value(&object).expect("serialises");
    let pod = &value["spec"]["podTemplate"]["spec"];
    assert_eq!(
        pod["volumes"][0]["persistentVolumeClaim"],
        json!({"claimName": "prepared", "readOnly": true})
    );
    assert_eq!(pod["containers"][0]["volumeMounts"][0]["readOnly"], true);
    let annotations = &value["metadata"]["annotations"];
    assert_eq!(
        annotations["context.rossoctl.io/workspace-claim"],
        "prepared"
    );
    assert_eq!(
        annotations["context.rossoctl.io/workspace-read-only"],
        "true"
    );
    assert_eq!(
        annotations["context.rossoctl.io/workspace-storage-class"],
        "nfs"
    );
    assert_eq!(annotations["context.rossoctl.io/strategy"], "existing");
}

#[test]
fn workspace_pvc_has_labels_mode_size_and_class_only_when_given() {
    let pool = meta("team", 3, StrategyKind::Shared);
    let pvc = workspace_pvc(
        &settings(),
        &pool,
        "team-workspace",
        "5Gi",
        "ReadWriteMany",
        Some("fast"),
    );
    let value = serde_json::to_value(&pvc).expect("serialises");
    assert_eq!(value["metadata"]["name"], "team-workspace");
    assert_eq!(value["metadata"]["namespace"], "ns");
    assert_eq!(
        value["metadata"]["labels"],
        json!({
            "context.rossoctl.io/pool": "team",
            "app.kubernetes.io/managed-by": "context-service",
            "context.rossoctl.io/owner": OWNER,
            "context.rossoctl.io/replicas": "3",
        })
    );
    assert_eq!(
        value["spec"],
        json!({
            "accessModes": ["ReadWriteMany"],
            "resources": {"requests": {"storage": "5Gi"}},
            "storageClassName": "fast",
        })
    );
    for class in [None, Some("")] {
        let pvc = workspace_pvc(&settings(), &pool, "x", "1Gi", "ReadWriteOnce", class);
        let spec = pvc.spec.expect("spec");
        assert_eq!(spec.storage_class_name, None);
    }
}

#[test]
fn claim_has_warm_pool_lifecycle_and_only_the_pool_pod_label() {
    let mut settings = settings();
    settings.claim_ttl = Duration::from_secs(3600);
    let pool = meta("fast-run", 3, StrategyKind::Warm);
    let now: Timestamp = "2026-11-29T16:00:00.750Z".parse().expect("time");
    let claim = sandbox_claim(&settings, &pool, 2, "research-agents", now);
    let value = serde_json::to_value(&claim).expect("serialises");
    assert_eq!(value["apiVersion"], "extensions.agents.x-k8s.io/v1beta1");
    assert_eq!(value["kind"], "SandboxClaim");
    assert_eq!(value["metadata"]["name"], "claim-fast-run-2");
    assert_eq!(value["metadata"]["namespace"], "ns");
    assert_eq!(
        value["metadata"]["labels"]["context.rossoctl.io/owner"],
        OWNER
    );
    assert_eq!(
        value["metadata"]["labels"]["app.kubernetes.io/managed-by"],
        "context-service"
    );
    assert_eq!(
        value["metadata"]["annotations"]["context.rossoctl.io/replicas"],
        "3"
    );
    assert_eq!(
        value["spec"],
        json!({
            "warmPoolRef": {"name": "research-agents"},
            "lifecycle": {"shutdownTime": "2026-11-29T17:00:00Z", "shutdownPolicy": "Delete"},
            "additionalPodMetadata": {"labels": {"context.rossoctl.io/pool": "fast-run"}},
        })
    );
}

#[test]
fn claim_pod_label_can_be_turned_off_for_a_stock_controller() {
    let mut settings = settings();
    settings.claim_pod_label = false;
    let pool = meta("fast", 1, StrategyKind::Warm);
    let claim = sandbox_claim(&settings, &pool, 0, "agents", Timestamp::now());
    assert_eq!(claim.spec.additional_pod_metadata, None);
    assert_eq!(
        kube::ResourceExt::labels(&claim)
            .get(names::POOL_LABEL)
            .map(String::as_str),
        Some("fast")
    );
}

#[test]
fn owner_reference_points_at_the_sandbox_without_blocking() {
    let pool = meta("review", 1, StrategyKind::Dedicated);
    let volume = WorkspaceVolume {
        claim_name: "review-workspace-0",
        read_only: false,
    };
    let mut object = sandbox(&settings(), &pool, 0, volume, &WorkspaceRecord::default());
    assert_eq!(sandbox_owner_reference(&object), None, "no uid yet");
    object.metadata.uid = Some("u-1".to_string());
    let owner = sandbox_owner_reference(&object).expect("owner");
    assert_eq!(owner.api_version, "agents.x-k8s.io/v1beta1");
    assert_eq!(owner.kind, "Sandbox");
    assert_eq!(owner.name, "sandbox-review-0");
    assert_eq!(owner.uid, "u-1");
    assert_eq!(owner.controller, None);
    assert_eq!(owner.block_owner_deletion, None);
    let patch = pvc_owner_patch("ns", "review-workspace-0", owner);
    assert_eq!(
        patch,
        json!({
            "apiVersion": "v1",
            "kind": "PersistentVolumeClaim",
            "metadata": {
                "name": "review-workspace-0",
                "namespace": "ns",
                "ownerReferences": [{
                    "apiVersion": "agents.x-k8s.io/v1beta1",
                    "kind": "Sandbox",
                    "name": "sandbox-review-0",
                    "uid": "u-1",
                }],
            },
        })
    );
}

#[test]
fn context_pvc_has_context_labels_and_no_pool_label() {
    let pvc = context_pvc(
        "team1",
        "research",
        "memory",
        OWNER,
        "5Gi",
        "ReadWriteOnce",
        None,
    );
    let value = serde_json::to_value(&pvc).expect("serialises");
    assert_eq!(value["metadata"]["name"], "context-research");
    assert_eq!(value["metadata"]["namespace"], "team1");
    assert_eq!(
        value["metadata"]["labels"],
        json!({
            "app.kubernetes.io/managed-by": "context-service",
            "context.rossoctl.io/name": "research",
            "context.rossoctl.io/type": "memory",
            "context.rossoctl.io/owner": OWNER,
        })
    );
    assert_eq!(value["spec"]["accessModes"], json!(["ReadWriteOnce"]));
    assert!(value["spec"]["storageClassName"].is_null());
}

#[test]
fn a_ttl_puts_the_expiry_on_every_object_and_shutdown_time_on_members() {
    let settings = settings();
    let at: Timestamp = "2026-12-01T18:00:00Z".parse().expect("time");
    let mut pool = meta("brief", 2, StrategyKind::Shared);
    pool.expires_at = Some(at);
    let pvc_name = names::shared_workspace("brief");
    let volume = WorkspaceVolume {
        claim_name: &pvc_name,
        read_only: false,
    };
    let object = sandbox(
        &settings,
        &pool,
        0,
        volume,
        &record("1Gi", "ReadWriteMany", None),
    );
    let value = serde_json::to_value(&object).expect("serialises");
    assert_eq!(value["spec"]["shutdownTime"], "2026-12-01T18:00:00Z");
    assert_eq!(value["spec"]["shutdownPolicy"], "Delete");
    assert_eq!(
        value["metadata"]["annotations"]["context.rossoctl.io/expires-at"],
        "2026-12-01T18:00:00Z"
    );
    let pvc = workspace_pvc(&settings, &pool, &pvc_name, "1Gi", "ReadWriteMany", None);
    assert_eq!(
        pvc.metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get("context.rossoctl.io/expires-at").cloned()),
        Some("2026-12-01T18:00:00Z".to_string())
    );
    // Claims expire with the pool, not after the claim TTL.
    let mut warm = meta("hot", 1, StrategyKind::Warm);
    warm.expires_at = Some(at);
    let claim = sandbox_claim(&settings, &warm, 0, "wp", Timestamp::now());
    let value = serde_json::to_value(&claim).expect("serialises");
    assert_eq!(
        value["spec"]["lifecycle"],
        json!({"shutdownTime": "2026-12-01T18:00:00Z", "shutdownPolicy": "Delete"})
    );
    assert_eq!(
        value["metadata"]["annotations"]["context.rossoctl.io/expires-at"],
        "2026-12-01T18:00:00Z"
    );

    // Without a ttl: no expiry anywhere on a direct pool.
    let plain = meta("plain", 1, StrategyKind::Shared);
    let value = serde_json::to_value(sandbox(
        &settings,
        &plain,
        0,
        volume,
        &record("1Gi", "ReadWriteMany", None),
    ))
    .expect("serialises");
    assert!(value["spec"].get("shutdownTime").is_none(), "{value}");
    assert!(value["spec"].get("shutdownPolicy").is_none(), "{value}");
    let pvc = workspace_pvc(&settings, &plain, &pvc_name, "1Gi", "ReadWriteMany", None);
    assert!(pvc.metadata.annotations.is_none());
}

#[test]
fn operating_mode_patches_name_the_controller_values() {
    assert_eq!(
        operating_mode_patch(true),
        json!({"spec": {"operatingMode": "Suspended"}})
    );
    assert_eq!(
        operating_mode_patch(false),
        json!({"spec": {"operatingMode": "Running"}})
    );
}
