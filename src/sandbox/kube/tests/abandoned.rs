//! Creates abandoned half-way: creating windows and completion marks on
//! the objects, and the reaper that deletes what nobody finishes.

use super::*;

#[tokio::test]
async fn every_object_of_a_create_records_when_it_may_still_add_members() {
    let fake = FakeApi::default();
    let backend = fake.backend();
    backend.start_watchers();
    let before = k8s_openapi::jiff::Timestamp::now();
    backend
        .create_pool(&spec("windowed", 2, dedicated()))
        .await
        .expect("created");
    let mut objects = vec![
        fake.object(SANDBOXES, "sandbox-windowed-0"),
        fake.object(SANDBOXES, "sandbox-windowed-1"),
    ];
    objects.extend(fake.names(PVCS).iter().map(|n| fake.object(PVCS, n)));
    assert_eq!(objects.len(), 4);
    for object in objects {
        let until: k8s_openapi::jiff::Timestamp = object["metadata"]["annotations"]
            ["context.rossoctl.io/creating-until"]
            .as_str()
            .unwrap_or_else(|| panic!("no creating-until on {object}"))
            .parse()
            .expect("RFC 3339");
        let ahead = until.duration_since(before).as_secs();
        assert!((119..=121).contains(&ahead), "{ahead} s ahead");
    }
}

#[tokio::test]
async fn a_create_marks_its_completion_on_its_first_object_with_one_patch() {
    let fake = FakeApi::default();
    fake.insert(NS, WARM_POOLS, warm_pool("agents"));
    let backend = fake.backend();
    let existing = Strategy::Existing {
        claim_name: "data".to_string(),
        read_only: false,
    };
    fake.insert(NS, PVCS, plain_pvc("data", "ReadWriteMany", json!({})));
    let warm = warm_agents();
    let shared = Strategy::Shared {
        size: "1Gi".to_string(),
        storage_class: None,
    };
    for (pool, strategy, plural, anchor) in [
        ("d", dedicated(), PVCS, "d-workspace-0"),
        ("s", shared, PVCS, "s-workspace"),
        ("e", existing, SANDBOXES, "sandbox-e-0"),
        ("w", warm, CLAIMS, "claim-w-0"),
    ] {
        let before = fake.requests().len();
        backend
            .create_pool(&spec(pool, 2, strategy))
            .await
            .expect("created");
        let requests = fake.requests()[before..].to_vec();
        // The anchor is the first object made, and the only one with a mark.
        let posts: Vec<&Recorded> = requests
            .iter()
            .filter(|r| r.method == Method::POST)
            .collect();
        assert_eq!(posts[0].name.as_deref(), Some(anchor), "{pool}");
        for post in &posts {
            let mark = &post.body["metadata"]["annotations"]["context.rossoctl.io/created"];
            if post.name.as_deref() == Some(anchor) {
                assert_eq!(mark, "false", "{pool}");
            } else {
                assert!(mark.is_null(), "{pool}: {post:?}");
            }
        }
        // One extra request, the last: a compare-and-swap from pending.
        let last = requests.last().expect("requests");
        assert_eq!(last.line(), format!("PATCH {plural}/{anchor}"), "{pool}");
        assert_eq!(
            last.content_type.as_deref(),
            Some("application/json-patch+json")
        );
        assert_eq!(last.body[0]["op"], "test");
        let stored = fake.object(plural, anchor);
        assert_done_mark(&stored["metadata"]["annotations"]["context.rossoctl.io/created"]);
    }
}

/// Inserts what a dedicated create of `name` with `replicas` left when
/// its process died after `made` sandboxes: every PVC, the first Sandboxes,
/// all with its window ending at `until` (the first PVC with the pending
/// completion mark).
fn half_made(fake: &FakeApi, name: &str, replicas: u32, made: u32, until: Timestamp) {
    use crate::sandbox::kube::objects::{
        self, PoolMeta, StrategyKind, WorkspaceRecord, WorkspaceVolume,
    };
    let meta = PoolMeta {
        name,
        replicas,
        owner_scope: OWNER,
        strategy: StrategyKind::Dedicated,
        expires_at: None,
        creating_until: Some(until),
    };
    let record = WorkspaceRecord {
        size: "1Gi".into(),
        access_mode: "ReadWriteOnce".into(),
        storage_class: None,
    };
    let pvcs: Vec<String> = (0..replicas)
        .map(|i| crate::pool::names::dedicated_workspace(name, i))
        .collect();
    for pvc in &pvcs {
        let object = objects::workspace_pvc(&settings(), &meta, pvc, "1Gi", "ReadWriteOnce", None);
        fake.insert(NS, PVCS, serde_json::to_value(&object).expect("JSON"));
    }
    for i in 0..made {
        let volume = WorkspaceVolume {
            claim_name: &pvcs[i as usize],
            read_only: false,
        };
        let object = objects::sandbox(&settings(), &meta, i, volume, &record);
        fake.insert(NS, SANDBOXES, serde_json::to_value(&object).expect("JSON"));
    }
}

/// Pool `name` once the caches show `members` members.
async fn with_members(
    backend: &KubeBackend,
    name: &str,
    members: usize,
) -> crate::pool::model::PoolStatus {
    loop {
        let status = backend.get_pool(name).await.expect("get").expect("present");
        if status.members.len() == members {
            return status;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

fn seconds_from_now(seconds: i64) -> Timestamp {
    Timestamp::now()
        .checked_add(k8s_openapi::jiff::SignedDuration::from_secs(seconds))
        .expect("time")
}

/// The annotation `key` of a stored object.
fn annotation(fake: &FakeApi, plural: &str, name: &str, key: &str) -> Value {
    fake.object(plural, name)["metadata"]["annotations"][key].clone()
}

#[tokio::test]
async fn an_abandoned_create_is_deleted_once_its_window_passed_and_nothing_else() {
    let mut short = settings();
    short.create_window = Duration::from_millis(300);
    let fake = FakeApi::default();
    // Died after PVCs 0-2 and sandbox 0; its window ended a second ago.
    half_made(&fake, "half", 3, 1, seconds_from_now(-1));
    // A reaper claimed this one and died before deleting all (window still
    // open: claimed is claimed).
    half_made(&fake, "claimed", 2, 2, seconds_from_now(60));
    fake.update(PVCS, "claimed-workspace-0", |pvc| {
        pvc["metadata"]["annotations"]["context.rossoctl.io/created"] = json!("abandoned");
    });
    // An older version's half pool: a window but no mark. Never touched.
    half_made(&fake, "old", 2, 1, seconds_from_now(-1));
    fake.update(PVCS, "old-workspace-0", |pvc| {
        let annotations = pvc["metadata"]["annotations"].as_object_mut().expect("map");
        annotations.remove("context.rossoctl.io/created");
    });
    let backend = KubeBackend::new(fake.client(), short).expect("backend");
    backend.start_watchers();
    // A completed pool whose last member someone deleted after its window.
    backend
        .create_pool(&spec("done", 2, dedicated()))
        .await
        .expect("created");
    tokio::time::sleep(Duration::from_millis(400)).await;
    fake.remove(SANDBOXES, "sandbox-done-1");

    let status = backend
        .get_pool("half")
        .await
        .expect("get")
        .expect("present");
    assert_eq!(status.phase, PoolPhase::Failed, "{status:?}");
    assert_eq!(status.reason.as_deref(), Some("CreateAbandoned"));
    assert_eq!(
        status.message.as_deref(),
        Some("the create stopped at 1 of 3 sandboxes: the replica making it went away; its objects are being deleted")
    );
    let done = with_members(&backend, "done", 1).await;
    assert_eq!(done.reason.as_deref(), Some("SandboxMissing"), "{done:?}");

    let before = fake.requests().len();
    let next = backend
        .reap_abandoned(Timestamp::now())
        .await
        .expect("reaped");
    assert_eq!(next, None);
    let lines: Vec<String> = fake.requests()[before..]
        .iter()
        .filter(|r| !r.is_watch() && r.plural != PODS)
        .map(Recorded::line)
        .collect();
    // The claimed one at once (no second claim), then "half": claimed by a
    // compare-and-swap from pending, then every object of that create, the
    // anchor last.
    assert_eq!(
        lines,
        [
            "LIST sandboxclaims",
            "LIST sandboxes",
            "LIST persistentvolumeclaims",
            "DELETE sandboxes/sandbox-claimed-0",
            "DELETE sandboxes/sandbox-claimed-1",
            "DELETE persistentvolumeclaims/claimed-workspace-1",
            "DELETE persistentvolumeclaims/claimed-workspace-0",
            "PATCH persistentvolumeclaims/half-workspace-0",
            "LIST sandboxclaims",
            "LIST sandboxes",
            "LIST persistentvolumeclaims",
            "DELETE sandboxes/sandbox-half-0",
            "DELETE persistentvolumeclaims/half-workspace-1",
            "DELETE persistentvolumeclaims/half-workspace-2",
            "DELETE persistentvolumeclaims/half-workspace-0",
        ]
    );
    assert_eq!(fake.names(SANDBOXES), ["sandbox-done-0", "sandbox-old-0"]);
    assert_eq!(
        fake.names(PVCS),
        [
            "done-workspace-0",
            "done-workspace-1",
            "old-workspace-0",
            "old-workspace-1"
        ]
    );
    assert_done_mark(&annotation(
        &fake,
        PVCS,
        "done-workspace-0",
        "context.rossoctl.io/created",
    ));
}

#[tokio::test]
async fn a_create_within_its_window_is_kept_and_the_reaper_wakes_at_its_end() {
    let fake = FakeApi::default();
    let until = seconds_from_now(60);
    half_made(&fake, "busy", 3, 1, until);
    let backend = fake.backend();
    backend.start_watchers();
    let status = backend
        .get_pool("busy")
        .await
        .expect("get")
        .expect("present");
    assert_eq!(status.phase, PoolPhase::Provisioning, "{status:?}");
    let before = fake.requests().len();
    let next = backend
        .reap_abandoned(Timestamp::now())
        .await
        .expect("reaped");
    assert_eq!(next, Some(until));
    assert!(
        fake.requests()[before..]
            .iter()
            .all(|r| r.method == Method::GET),
        "the reaper wrote"
    );
    assert_eq!(fake.names(SANDBOXES), ["sandbox-busy-0"]);
    assert_eq!(
        annotation(
            &fake,
            PVCS,
            "busy-workspace-0",
            "context.rossoctl.io/created"
        ),
        "false"
    );

    // Another replica's caches may see the mark on the first PVC before
    // the last Sandbox (one watch per kind): within the window that is
    // still `provisioning`, never `failed`.
    backend
        .create_pool(&spec("fresh", 2, dedicated()))
        .await
        .expect("created");
    fake.remove(SANDBOXES, "sandbox-fresh-1");
    let status = with_members(&backend, "fresh", 1).await;
    assert_eq!(status.phase, PoolPhase::Provisioning, "{status:?}");
}

#[tokio::test]
async fn a_reaper_that_loses_the_claim_deletes_nothing_and_looks_again_soon() {
    let fake = FakeApi::default();
    half_made(&fake, "late", 2, 1, seconds_from_now(-1));
    // The creator marked it done a moment before: the test fails.
    fake.fail(Method::PATCH, PVCS, "late-workspace-0", 422);
    let backend = fake.backend();
    backend.start_watchers();
    backend
        .wait_synced(Duration::from_secs(5))
        .await
        .expect("synced");
    let now = Timestamp::now();
    let next = backend.reap_abandoned(now).await.expect("reaped");
    let next = next.expect("a next look");
    assert!(next > now && next <= seconds_from_now(1), "{next}");
    assert_eq!(fake.names(SANDBOXES), ["sandbox-late-0"]);
    assert_eq!(fake.names(PVCS).len(), 2);
    assert!(!fake.lines().iter().any(|l| l.starts_with("DELETE")));
}

#[tokio::test]
async fn a_create_that_loses_its_mark_to_a_reaper_rolls_back() {
    let fake = FakeApi::default();
    // A reaper claimed the create (it ran past its window): the mark's
    // test fails.
    fake.insert(NS, WARM_POOLS, warm_pool("agents"));
    fake.fail(Method::PATCH, CLAIMS, "claim-slow-0", 422);
    let backend = fake.backend();
    let warm = warm_agents();
    let error = backend
        .create_pool(&spec("slow", 2, warm))
        .await
        .expect_err("the mark fails");
    assert_eq!(
        internal_context(error),
        "mark the create of sandbox pool slow complete"
    );
    let lines = fake.lines();
    assert_eq!(
        lines[lines.len() - 3..],
        [
            "PATCH sandboxclaims/claim-slow-0",
            "DELETE sandboxclaims/claim-slow-1",
            "DELETE sandboxclaims/claim-slow-0",
        ]
    );
    assert!(fake.names(CLAIMS).is_empty());
}

#[tokio::test]
async fn a_create_another_replica_runs_is_provisioning_until_its_window_ends() {
    use crate::sandbox::kube::objects::{
        self, PoolMeta, StrategyKind, WorkspaceRecord, WorkspaceVolume,
    };
    let fake = FakeApi::default();
    // Another replica began a 2-sandbox pool and made one Sandbox; its
    // window ends in 400 ms.
    let until = k8s_openapi::jiff::Timestamp::now()
        .checked_add(k8s_openapi::jiff::SignedDuration::from_millis(400))
        .expect("time");
    let meta = PoolMeta {
        name: "elsewhere",
        replicas: 2,
        owner_scope: OWNER,
        strategy: StrategyKind::Existing,
        expires_at: None,
        creating_until: Some(until),
    };
    let volume = WorkspaceVolume {
        claim_name: "data",
        read_only: false,
    };
    let record = WorkspaceRecord {
        size: "1Gi".into(),
        access_mode: "ReadWriteOnce".into(),
        storage_class: None,
    };
    let sandbox = objects::sandbox(&settings(), &meta, 0, volume, &record);
    fake.insert(NS, SANDBOXES, serde_json::to_value(&sandbox).expect("JSON"));
    let backend = fake.backend();
    backend.start_watchers();
    backend
        .wait_synced(Duration::from_secs(5))
        .await
        .expect("synced");
    let status = backend
        .get_pool("elsewhere")
        .await
        .expect("get")
        .expect("present");
    assert_eq!(status.phase, PoolPhase::Provisioning, "{status:?}");

    // No event marks the window's end: the waiter wakes at it and reports
    // the create abandoned (its first object never got the completion mark).
    let started = tokio::time::Instant::now();
    let status = backend
        .wait_pool("elsewhere", Duration::from_secs(20))
        .await
        .expect("wait")
        .expect("present");
    assert_eq!(status.phase, PoolPhase::Failed, "{status:?}");
    assert_eq!(status.reason.as_deref(), Some("CreateAbandoned"));
    assert_eq!(
        status.message.as_deref(),
        Some("the create stopped at 1 of 2 sandboxes: the replica making it went away; its objects are being deleted")
    );
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );

    // Within a create's window, a gap is a member deleted since (creates add
    // members in index order): failed at once.
    let gap = PoolMeta {
        name: "gap",
        creating_until: k8s_openapi::jiff::Timestamp::now()
            .checked_add(k8s_openapi::jiff::SignedDuration::from_secs(60))
            .ok(),
        ..meta
    };
    let sandbox = objects::sandbox(&settings(), &gap, 1, volume, &record);
    fake.insert(NS, SANDBOXES, serde_json::to_value(&sandbox).expect("JSON"));
    let status = loop {
        match backend.get_pool("gap").await.expect("get") {
            Some(status) => break status,
            None => tokio::time::sleep(Duration::from_millis(5)).await,
        }
    };
    assert_eq!(status.phase, PoolPhase::Failed, "{status:?}");
    assert_eq!(status.message.as_deref(), Some("1 of 2 sandboxes exist"));
}
