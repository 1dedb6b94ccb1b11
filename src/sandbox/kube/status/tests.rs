//! Pool status from hand-written objects: phases, reasons, members, and
//! what older (Go prototype) objects still give.

use std::sync::Arc;

use super::super::crd::PodMetadata;
use super::*;
use crate::pool::model::PoolPhase;
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

/// `status` is provisioning with `ready` members ready, for `reason`.
fn assert_provisioning(status: &PoolStatus, ready: u32, reason: &str, message: &str) {
    assert_eq!(status.phase, PoolPhase::Provisioning);
    assert_eq!(status.ready_replicas, ready);
    assert_eq!(status.reason.as_deref(), Some(reason));
    assert_eq!(status.message.as_deref(), Some(message));
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
    assert_provisioning(
        &status,
        1,
        "DependenciesNotReady",
        "sandbox-p-1: Pod exists with phase: Pending",
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

/// A Sandbox with `uid` whose Ready condition, if any, is `ready`.
fn sandbox_with_uid(name: &str, uid: &str, ready: Option<Value>) -> Arc<Sandbox> {
    let mut sandbox = (*sandbox(name, direct(1, "shared"), ready.into_iter().collect())).clone();
    sandbox.metadata.uid = Some(uid.to_string());
    Arc::new(sandbox)
}

/// A pod controlled by the object with `owner_uid`: `Running` and `Ready`
/// with one IP, then changed by `edit`.
fn running_pod(name: &str, owner_uid: &str, edit: impl FnOnce(&mut Value)) -> Arc<Pod> {
    let mut value = json!({
        "metadata": {
            "name": name,
            "ownerReferences": [{
                "apiVersion": "agents.x-k8s.io/v1beta1", "kind": "Sandbox",
                "name": name, "uid": owner_uid, "controller": true,
            }],
        },
        "status": {
            "phase": "Running",
            "conditions": [{"type": "Ready", "status": "True"}],
            "podIPs": [{"ip": "10.0.0.7"}],
        },
    });
    edit(&mut value);
    Arc::new(serde_json::from_value(value).expect("pod"))
}

/// A change to a pod's JSON.
type Edit = fn(&mut Value);

/// Whether the one-member shared pool of `sandbox` and `pod` reads ready.
fn one_member_ready(sandbox: Arc<Sandbox>, pod: Arc<Pod>) -> bool {
    let objects = PoolObjects {
        sandboxes: vec![sandbox],
        pods: vec![pod],
        ..PoolObjects::default()
    };
    let status = pool_status("p", &objects, false).expect("pool");
    assert_eq!(status.members.len(), 1);
    assert_eq!(status.ready_replicas == 1, status.phase == PoolPhase::Ready);
    status.members[0].ready
}

#[test]
fn a_member_is_ready_once_its_own_pod_is_ready_before_the_controller_says_so() {
    let pending = || {
        Some(condition(
            "Ready",
            "False",
            "DependenciesNotReady",
            "Pod exists with phase: Pending",
        ))
    };
    let ready_pod = || running_pod("sandbox-p-0", "u-1", |_| ());
    // The controller's rule, read off the pod: with no Ready condition
    // written yet, or while it still says the pod is pending.
    let fresh = sandbox_with_uid("sandbox-p-0", "u-1", None);
    assert!(one_member_ready(fresh, ready_pod()));
    let stale = sandbox_with_uid("sandbox-p-0", "u-1", pending());
    assert!(one_member_ready(stale, ready_pod()));

    // Each part of the rule is needed.
    let not_yet: [(&str, Edit); 6] = [
        ("another owner", |pod| {
            pod["metadata"]["ownerReferences"][0]["uid"] = json!("u-2");
        }),
        ("an owner that is not the controller", |pod| {
            pod["metadata"]["ownerReferences"][0]["controller"] = json!(false);
        }),
        ("not Ready", |pod| {
            pod["status"]["conditions"][0]["status"] = json!("False");
        }),
        ("no IP yet", |pod| pod["status"]["podIPs"] = json!([])),
        ("not Running", |pod| {
            pod["status"]["phase"] = json!("Pending");
        }),
        ("being deleted", |pod| {
            pod["metadata"]["deletionTimestamp"] = json!("2026-01-01T00:00:00Z");
        }),
    ];
    for (what, edit) in not_yet {
        let sandbox = sandbox_with_uid("sandbox-p-0", "u-1", pending());
        let pod = running_pod("sandbox-p-0", "u-1", edit);
        assert!(!one_member_ready(sandbox, pod), "a pod with {what}");
    }

    // Any reason but "pending" is the controller's to lift.
    let several = condition("Ready", "False", "MultiplePods", "2 pods");
    let sandbox = sandbox_with_uid("sandbox-p-0", "u-1", Some(several));
    assert!(!one_member_ready(sandbox, ready_pod()));
    // A Sandbox asking for a Service also needs it, which is not watched.
    let mut with_service = (*sandbox_with_uid("sandbox-p-0", "u-1", pending())).clone();
    with_service.spec.service = Some(true);
    assert!(!one_member_ready(Arc::new(with_service), ready_pod()));
    // Suspended: the desired state decides, whatever the pod says.
    let mut paused = (*sandbox_with_uid("sandbox-p-0", "u-1", pending())).clone();
    paused.spec.operating_mode = Some("Suspended".to_string());
    assert!(!one_member_ready(Arc::new(paused), ready_pod()));
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

/// Annotations of a member of a create whose window ends in a minute,
/// with `mark` (the completion mark) when it is the anchor.
fn in_window(strategy: &str, mark: Option<&str>) -> Value {
    let mut annotations = direct(3, strategy);
    let until = Timestamp::now()
        .checked_add(SignedDuration::from_secs(60))
        .expect("time");
    annotations["context.rossoctl.io/creating-until"] = json!(until.to_string());
    if let Some(mark) = mark {
        annotations["context.rossoctl.io/created"] = json!(mark);
    }
    annotations
}

#[test]
fn members_missing_within_a_create_window_are_expected_only_while_they_may_arrive() {
    let phase = |sandboxes: Vec<Arc<Sandbox>>, pvcs: Vec<Arc<PersistentVolumeClaim>>| {
        let objects = PoolObjects {
            sandboxes,
            pvcs,
            ..PoolObjects::default()
        };
        pool_status("p", &objects, false).expect("pool").phase
    };
    let ago = |seconds: i64| {
        Timestamp::now()
            .checked_sub(SignedDuration::from_secs(seconds))
            .expect("time")
            .to_string()
    };
    // Members are made concurrently: while the mark is pending, a gap is a
    // member still on its way.
    let anchor = |mark: &str| sandbox("sandbox-p-0", in_window("existing", Some(mark)), vec![]);
    let third = || sandbox("sandbox-p-2", in_window("existing", None), vec![]);
    assert_eq!(
        phase(vec![anchor("false"), third()], vec![]),
        PoolPhase::Provisioning
    );
    // Finished a moment ago: these caches may not have every member yet.
    assert_eq!(
        phase(vec![anchor(&ago(1)), third()], vec![]),
        PoolPhase::Provisioning
    );
    // Finished longer ago, or by a version that wrote no time: a member
    // was deleted since.
    assert_eq!(
        phase(vec![anchor(&ago(10)), third()], vec![]),
        PoolPhase::Failed
    );
    assert_eq!(
        phase(vec![anchor("true"), third()], vec![]),
        PoolPhase::Failed
    );
    // Claimed by a reaper: failed.
    assert_eq!(
        phase(vec![anchor("abandoned"), third()], vec![]),
        PoolPhase::Failed
    );
    // The anchor of an existing-claim pool is its first Sandbox, made
    // before the others and watched with them: without it, it was deleted.
    assert_eq!(phase(vec![third()], vec![]), PoolPhase::Failed);
    // A dedicated pool's anchor is its first PVC, in another watch that may
    // lag the Sandboxes': no PVC cached yet is no verdict yet.
    let dedicated = || sandbox("sandbox-p-1", in_window("dedicated", None), vec![]);
    assert_eq!(phase(vec![dedicated()], vec![]), PoolPhase::Provisioning);
    // Some PVC but not the anchor, which was made first: deleted.
    let later_pvc = pvc("p-workspace-1", "1.5Gi", "Bound");
    assert_eq!(phase(vec![dedicated()], vec![later_pvc]), PoolPhase::Failed);
}

#[test]
fn terminating_members_are_not_ready() {
    let mut claim = (*claim(
        "claim-p-0",
        "uid-0",
        json!({"sandbox": {"name": "claim-p-0"}, "conditions": [ready()]}),
    ))
    .clone();
    claim.metadata.deletion_timestamp = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
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
    sandbox.metadata.deletion_timestamp = Some(
        k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(k8s_openapi::jiff::Timestamp::now()),
    );
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

/// A claim of pool `p` that asks for the pool label on its pod, as the
/// service's claims do, bound to Sandbox `sandbox` and `Ready`.
fn labelling_claim(name: &str, uid: &str, sandbox: &str) -> Arc<SandboxClaim> {
    let mut claim = claim(
        name,
        uid,
        json!({"sandbox": {"name": sandbox}, "conditions": [ready()]}),
    );
    Arc::make_mut(&mut claim).spec.additional_pod_metadata = Some(PodMetadata {
        labels: BTreeMap::from([(names::POOL_LABEL.to_string(), "p".to_string())]),
        annotations: BTreeMap::new(),
    });
    claim
}

#[test]
fn a_ready_warm_member_waits_for_the_pool_label_on_its_pod() {
    let mut objects = PoolObjects {
        claims: vec![
            labelling_claim("claim-p-0", "uid-0", "agents-a"),
            labelling_claim("claim-p-1", "uid-1", "agents-b"),
        ],
        bound_sandboxes: vec![adopted("agents-b", "uid-1", Some("agents-b-pod"))],
        // Only pods with the pool's label are in the pool's objects.
        pods: vec![pod("agents-a", "Running", "")],
        ..PoolObjects::default()
    };
    let status = pool_status("p", &objects, false).expect("pool");
    assert_provisioning(
        &status,
        1,
        "PodLabelPending",
        "claim-p-1: waiting for the pool label on pod agents-b-pod",
    );
    assert_eq!(
        status.members.iter().map(|m| m.ready).collect::<Vec<_>>(),
        [true, false]
    );

    objects.pods.push(pod("agents-b-pod", "Running", ""));
    let status = pool_status("p", &objects, false).expect("pool");
    assert_eq!(status.phase, PoolPhase::Ready);
    assert_eq!(status.ready_replicas, 2);
    assert_eq!(status.reason, None);
}

#[test]
fn a_claim_that_does_not_ask_for_the_label_does_not_wait_for_it() {
    // `--kube-claim-pod-label=false`: no label will come.
    let bound = json!({"sandbox": {"name": "agents-a"}, "conditions": [ready()]});
    // A claim asking for another pool's label: not this pool's selector.
    let other_pool = |name: &str, uid: &str, sandbox: &str| {
        let mut claim = labelling_claim(name, uid, sandbox);
        Arc::make_mut(&mut claim)
            .spec
            .additional_pod_metadata
            .as_mut()
            .expect("metadata")
            .labels
            .insert(names::POOL_LABEL.to_string(), "q".to_string());
        claim
    };
    for claims in [
        vec![
            claim("claim-p-0", "uid-0", bound.clone()),
            claim("claim-p-1", "uid-1", bound),
        ],
        vec![
            other_pool("claim-p-0", "uid-0", "agents-a"),
            other_pool("claim-p-1", "uid-1", "agents-b"),
        ],
    ] {
        let objects = PoolObjects {
            claims,
            ..PoolObjects::default()
        };
        let status = pool_status("p", &objects, false).expect("pool");
        assert_eq!(status.phase, PoolPhase::Ready);
    }
}

#[test]
fn suspended_sandboxes_make_a_suspended_pool_with_its_expiry() {
    let mut annotations = direct(2, "dedicated");
    annotations["context.rossoctl.io/expires-at"] = json!("2026-12-01T18:00:00Z");
    let suspended = |name: &str| {
        let mut sb = (*sandbox(
            name,
            annotations.clone(),
            vec![condition("Ready", "False", "SandboxSuspended", "")],
        ))
        .clone();
        sb.spec.operating_mode = Some("Suspended".to_string());
        Arc::new(sb)
    };
    let objects = PoolObjects {
        sandboxes: vec![suspended("sandbox-p-0"), suspended("sandbox-p-1")],
        pvcs: vec![pvc("p-workspace-0", "1Gi", "Bound")],
        ..PoolObjects::default()
    };
    let status = pool_status("p", &objects, false).expect("pool");
    assert_eq!(status.phase, PoolPhase::Suspended);
    assert_eq!((status.reason, status.message), (None, None));
    assert_eq!(status.ready_replicas, 0);
    assert_eq!(
        status.expires_at.map(|t| t.to_string()).as_deref(),
        Some("2026-12-01T18:00:00Z")
    );
    // Just asked to suspend, the controller has not reacted yet: not
    // usable any more all the same.
    let mut asked = (*sandbox("sandbox-p-0", direct(1, "dedicated"), vec![ready()])).clone();
    asked.spec.operating_mode = Some("Suspended".to_string());
    let objects = PoolObjects {
        sandboxes: vec![Arc::new(asked)],
        ..PoolObjects::default()
    };
    let status = pool_status("p", &objects, false).expect("pool");
    assert_eq!(status.phase, PoolPhase::Suspended);
    assert!(!status.members[0].ready);
    assert_eq!(status.expires_at, None);
    // Resumed (Running) but the pod not back yet: provisioning.
    let mut resumed = (*sandbox(
        "sandbox-p-0",
        direct(1, "dedicated"),
        vec![condition(
            "Ready",
            "False",
            "DependenciesNotReady",
            "Pod does not exist",
        )],
    ))
    .clone();
    resumed.spec.operating_mode = Some("Running".to_string());
    let objects = PoolObjects {
        sandboxes: vec![Arc::new(resumed)],
        ..PoolObjects::default()
    };
    let status = pool_status("p", &objects, false).expect("pool");
    assert_eq!(status.phase, PoolPhase::Provisioning);
}
