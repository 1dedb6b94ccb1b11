//! Creating pools of each strategy: the objects a create makes and in
//! what order, owner references, concurrency, conflicts and rollback.

use super::*;

#[tokio::test]
async fn dedicated_create_makes_pvcs_then_sandboxes_and_owns_each_pvc() {
    let fake = FakeApi::default();
    let backend = fake.backend();
    let status = backend
        .create_pool(&spec("review", 2, dedicated()))
        .await
        .expect("created");

    let lines = fake.lines();
    let mut sorted = lines.clone();
    sorted.sort();
    assert_eq!(
        sorted,
        [
            "LIST persistentvolumeclaims",
            "LIST sandboxclaims",
            "LIST sandboxes",
            "PATCH persistentvolumeclaims/review-workspace-0",
            "PATCH persistentvolumeclaims/review-workspace-0",
            "PATCH persistentvolumeclaims/review-workspace-1",
            "POST persistentvolumeclaims/review-workspace-0",
            "POST persistentvolumeclaims/review-workspace-1",
            "POST sandboxes/sandbox-review-0",
            "POST sandboxes/sandbox-review-1",
        ]
    );
    // The conflict check, then the anchor alone, then the other PVCs, each
    // replica's PVC before its Sandbox before the owner patch; the
    // completion mark on the anchor is the last request.
    let at = |line: &str| lines.iter().position(|l| l == line).expect(line);
    assert!(
        lines[..3].iter().all(|l| l.starts_with("LIST")),
        "{lines:?}"
    );
    assert_eq!(lines[3], "POST persistentvolumeclaims/review-workspace-0");
    for i in 0..2 {
        let pvc = at(&format!("POST persistentvolumeclaims/review-workspace-{i}"));
        let sandbox = at(&format!("POST sandboxes/sandbox-review-{i}"));
        let owner = at(&format!(
            "PATCH persistentvolumeclaims/review-workspace-{i}"
        ));
        assert!(pvc < sandbox && sandbox < owner, "{lines:?}");
    }
    assert_eq!(
        lines.last().map(String::as_str),
        Some("PATCH persistentvolumeclaims/review-workspace-0")
    );
    let requests = fake.requests();
    // The conflict pre-check selects managed objects of this pool only.
    assert!(requests[0]
        .query
        .contains("labelSelector=context.rossoctl.io%2Fpool%3Dreview%2Capp.kubernetes.io%2Fmanaged-by%3Dcontext-service"));
    assert!(requests.iter().all(|r| r.namespace == NS));
    for post in requests.iter().filter(|r| r.method == Method::POST) {
        assert!(
            post.query.contains("fieldManager=context-service"),
            "{post:?}"
        );
    }
    let apply = requests
        .iter()
        .find(|r| r.method == Method::PATCH)
        .expect("an owner patch");
    assert_eq!(
        apply.content_type.as_deref(),
        Some("application/apply-patch+yaml")
    );
    assert!(apply.query.contains("fieldManager=context-service"));

    // Dedicated PVCs are owned by their Sandbox, so the GC removes them too.
    for i in 0..2 {
        let pvc = fake.object(PVCS, &format!("review-workspace-{i}"));
        let owners = pvc["metadata"]["ownerReferences"]
            .as_array()
            .expect("owners");
        assert_eq!(owners.len(), 1);
        assert_eq!(owners[0]["kind"], "Sandbox");
        assert_eq!(owners[0]["apiVersion"], "agents.x-k8s.io/v1beta1");
        assert_eq!(owners[0]["name"], format!("sandbox-review-{i}"));
        assert_eq!(owners[0]["uid"], format!("uid-sandbox-review-{i}"));
        assert_eq!(pvc["spec"]["storageClassName"], "fast");
        let sandbox = fake.object(SANDBOXES, &format!("sandbox-review-{i}"));
        let volume = &sandbox["spec"]["podTemplate"]["spec"]["volumes"][0];
        assert_eq!(
            volume["persistentVolumeClaim"]["claimName"],
            format!("review-workspace-{i}")
        );
        assert_eq!(
            sandbox["metadata"]["labels"]["context.rossoctl.io/owner"],
            OWNER
        );
    }

    assert_eq!(status.name, "review");
    assert_eq!(status.replicas, 2);
    assert_eq!(status.phase, PoolPhase::Provisioning);
    assert_eq!(status.ready_replicas, 0);
    assert_eq!(status.strategy, dedicated());
    assert_eq!(status.owner_scope, OWNER);
    assert_eq!(status.workspace.access_mode, "ReadWriteOnce");
    let members: Vec<_> = status.members.iter().map(|m| m.name.as_str()).collect();
    assert_eq!(members, ["sandbox-review-0", "sandbox-review-1"]);
}

#[tokio::test]
async fn shared_create_makes_one_rwx_pvc_owned_by_no_sandbox() {
    let fake = FakeApi::default();
    let backend = fake.backend();
    let strategy = Strategy::Shared {
        size: "5Gi".to_string(),
        storage_class: None,
    };
    backend
        .create_pool(&spec("team", 3, strategy))
        .await
        .expect("created");
    assert_eq!(fake.names(PVCS), ["team-workspace"]);
    let pvc = fake.object(PVCS, "team-workspace");
    assert_eq!(pvc["spec"]["accessModes"], json!(["ReadWriteMany"]));
    assert!(pvc["spec"]["storageClassName"].is_null());
    assert!(pvc["metadata"]["ownerReferences"].is_null());
    assert_eq!(
        pvc["metadata"]["labels"]["context.rossoctl.io/replicas"],
        "3"
    );
    // No owner for the shared PVC: the one patch is the completion mark.
    let patches: Vec<_> = fake
        .lines()
        .into_iter()
        .filter(|l| l.starts_with("PATCH"))
        .collect();
    assert_eq!(patches, ["PATCH persistentvolumeclaims/team-workspace"]);
    assert_done_mark(&pvc["metadata"]["annotations"]["context.rossoctl.io/created"]);
    assert_eq!(fake.names(SANDBOXES).len(), 3);
}

#[tokio::test]
async fn a_failure_on_sandbox_2_deletes_what_the_create_made() {
    let fake = FakeApi::default();
    fake.fail(Method::POST, SANDBOXES, "sandbox-review-2", 500);
    let backend = fake.backend();
    let error = backend
        .create_pool(&spec("review", 3, dedicated()))
        .await
        .expect_err("sandbox 2 fails");
    assert_eq!(internal_context(error), "create sandbox 2");

    // Sandboxes first, then PVCs, the anchor (PVC 0) last, so a rollback
    // cut short leaves the pending mark for a reaper.
    let deletes: Vec<String> = fake
        .lines()
        .into_iter()
        .filter(|l| l.starts_with("DELETE"))
        .collect();
    let mut sandboxes = deletes[..2].to_vec();
    sandboxes.sort();
    assert_eq!(
        sandboxes,
        [
            "DELETE sandboxes/sandbox-review-0",
            "DELETE sandboxes/sandbox-review-1"
        ]
    );
    let mut pvcs = deletes[2..4].to_vec();
    pvcs.sort();
    assert_eq!(
        pvcs,
        [
            "DELETE persistentvolumeclaims/review-workspace-1",
            "DELETE persistentvolumeclaims/review-workspace-2"
        ]
    );
    assert_eq!(
        deletes[4..],
        ["DELETE persistentvolumeclaims/review-workspace-0"]
    );
    assert!(fake.names(SANDBOXES).is_empty());
    assert!(fake.names(PVCS).is_empty());
}

#[tokio::test]
async fn a_big_pool_is_made_16_objects_at_a_time_after_its_anchor_alone() {
    let fake = FakeApi::default();
    fake.insert(NS, WARM_POOLS, warm_pool("agents"));
    fake.slow(Method::POST, Duration::from_millis(20));
    let backend = fake.backend();
    let status = backend
        .create_pool(&spec("big", 40, warm_agents()))
        .await
        .expect("created");
    assert_eq!(status.members.len(), 40);
    assert_eq!(fake.names(CLAIMS).len(), 40);
    assert_eq!(
        fake.most_in_flight(),
        crate::sandbox::kube::create::CREATES_IN_FLIGHT
    );
    // The anchor (claim 0) was answered before any other claim was sent.
    let starts = fake.in_flight_at_start();
    assert_eq!(starts.len(), 40);
    assert_eq!(starts[..2], [1, 1], "{starts:?}");
    let posts: Vec<String> = fake
        .lines()
        .into_iter()
        .filter(|l| l.starts_with("POST"))
        .collect();
    assert_eq!(posts[0], "POST sandboxclaims/claim-big-0");
}

#[tokio::test]
async fn the_default_client_keeps_64_api_requests_in_flight_at_most() {
    let fake = FakeApi::default();
    fake.slow(Method::GET, Duration::from_millis(20));
    let client = fake.bounded_client();
    let api: kube::Api<k8s_openapi::api::core::v1::PersistentVolumeClaim> =
        kube::Api::namespaced(client, NS);
    let gets = (0..200).map(|i| {
        let api = api.clone();
        async move { api.get_opt(&format!("pvc-{i}")).await }
    });
    for answer in futures::future::join_all(gets).await {
        assert!(answer.expect("get").is_none());
    }
    assert_eq!(
        fake.most_in_flight(),
        crate::sandbox::kube::backend::API_REQUESTS_IN_FLIGHT
    );
}

#[tokio::test]
async fn a_failure_among_concurrent_creates_rolls_back_also_what_was_in_flight() {
    let fake = FakeApi::default();
    fake.slow(Method::POST, Duration::from_millis(10));
    fake.fail(Method::POST, SANDBOXES, "sandbox-wide-5", 500);
    let backend = fake.backend();
    let error = backend
        .create_pool(&spec("wide", 20, dedicated()))
        .await
        .expect_err("sandbox 5 fails");
    assert_eq!(internal_context(error), "create sandbox 5");
    // Replicas past 5 were on their way when it failed; they finished and
    // were deleted with the rest (every accepted POST has its DELETE).
    let lines = fake.lines();
    let failed_at = lines
        .iter()
        .position(|l| l == "POST sandboxes/sandbox-wide-5")
        .expect("sandbox 5 attempted");
    assert!(
        lines[failed_at + 1..]
            .iter()
            .any(|l| l.starts_with("POST") || l.starts_with("PATCH")),
        "requests in flight finished after the failure: {lines:?}"
    );
    let mut made: Vec<String> = lines
        .iter()
        .filter(|l| l.starts_with("POST") && *l != "POST sandboxes/sandbox-wide-5")
        .map(|l| l.replacen("POST", "DELETE", 1))
        .collect();
    let mut deleted: Vec<String> = lines
        .iter()
        .filter(|l| l.starts_with("DELETE"))
        .cloned()
        .collect();
    made.sort();
    deleted.sort();
    assert_eq!(made, deleted);
    assert!(fake.names(SANDBOXES).is_empty());
    assert!(fake.names(PVCS).is_empty());
}

#[tokio::test]
async fn a_failed_owner_patch_also_rolls_back() {
    let fake = FakeApi::default();
    fake.fail(Method::PATCH, PVCS, "solo-workspace-0", 500);
    let backend = fake.backend();
    let error = backend
        .create_pool(&spec("solo", 1, dedicated()))
        .await
        .expect_err("patch fails");
    assert_eq!(
        internal_context(error),
        "set owner of workspace PVC solo-workspace-0"
    );
    assert!(fake.names(SANDBOXES).is_empty());
    assert!(fake.names(PVCS).is_empty());
}

#[tokio::test]
async fn existing_managed_objects_of_any_strategy_conflict_before_creating() {
    let fake = FakeApi::default();
    // A warm pool of the same name exists: a dedicated create must not add
    // direct objects beside its claims (upstream did not detect this).
    fake.insert(
        NS,
        CLAIMS,
        json!({
            "apiVersion": "extensions.agents.x-k8s.io/v1beta1",
            "kind": "SandboxClaim",
            "metadata": {"name": "claim-dup-0", "labels": labels("dup", OTHER_OWNER)},
            "spec": {"warmPoolRef": {"name": "wp"}},
        }),
    );
    let backend = fake.backend();
    let error = backend
        .create_pool(&spec("dup", 1, dedicated()))
        .await
        .expect_err("conflict");
    assert!(matches!(error, BackendError::AlreadyExists), "{error:?}");
    assert!(!fake.lines().iter().any(|l| l.starts_with("POST")));
}

#[tokio::test]
async fn a_409_on_create_is_already_exists_and_rolls_back() {
    let fake = FakeApi::default();
    // A foreign, unlabelled Sandbox holds the name of sandbox 1.
    fake.insert(
        NS,
        SANDBOXES,
        json!({
            "apiVersion": "agents.x-k8s.io/v1beta1",
            "kind": "Sandbox",
            "metadata": {"name": "sandbox-clash-1"},
            "spec": {"podTemplate": {"spec": {"containers": [{"name": "x"}]}}},
        }),
    );
    let backend = fake.backend();
    let error = backend
        .create_pool(&spec("clash", 2, dedicated()))
        .await
        .expect_err("conflict");
    assert!(matches!(error, BackendError::AlreadyExists), "{error:?}");
    assert_eq!(fake.names(SANDBOXES), ["sandbox-clash-1"]);
    assert!(fake.names(PVCS).is_empty());

    // The same for the first PVC of a shared pool.
    fake.insert(
        NS,
        PVCS,
        plain_pvc("other-workspace", "ReadWriteMany", json!({})),
    );
    let strategy = Strategy::Shared {
        size: "1Gi".to_string(),
        storage_class: None,
    };
    let error = backend
        .create_pool(&spec("other", 2, strategy))
        .await
        .expect_err("conflict");
    assert!(matches!(error, BackendError::AlreadyExists), "{error:?}");
    assert_eq!(fake.names(PVCS), ["other-workspace"]);
}

#[tokio::test]
async fn concurrent_creates_of_one_name_conflict() {
    let fake = FakeApi::default();
    let backend = Arc::new(fake.backend());
    let race = spec("race", 1, dedicated());
    let (a, b) = tokio::join!(backend.create_pool(&race), backend.create_pool(&race));
    let conflicts = [&a, &b]
        .iter()
        .filter(|r| matches!(r, Err(BackendError::AlreadyExists)))
        .count();
    assert_eq!(conflicts, 1, "{a:?} {b:?}");
    assert!(a.is_ok() || b.is_ok());
}

#[tokio::test]
async fn warm_create_checks_the_pool_and_makes_claims_with_a_lifecycle() {
    let fake = FakeApi::default();
    let backend = fake.backend();
    let warm = warm_agents();
    let error = backend
        .create_pool(&spec("fast", 2, warm.clone()))
        .await
        .expect_err("no warm pool");
    match error {
        BackendError::Invalid(message) => assert_eq!(message, r#"warm pool "agents" not found"#),
        other => panic!("{other:?}"),
    }
    assert!(fake.names(CLAIMS).is_empty());

    fake.insert(NS, WARM_POOLS, warm_pool("agents"));
    let before = fake.requests().len();
    let status = backend
        .create_pool(&spec("fast", 2, warm.clone()))
        .await
        .expect("created");
    let lines: Vec<String> = fake.requests()[before..]
        .iter()
        .map(Recorded::line)
        .collect();
    assert_eq!(
        lines,
        [
            "GET sandboxwarmpools/agents",
            "LIST sandboxclaims",
            "LIST sandboxes",
            "LIST persistentvolumeclaims",
            "POST sandboxclaims/claim-fast-0",
            "POST sandboxclaims/claim-fast-1",
            "PATCH sandboxclaims/claim-fast-0",
        ]
    );
    let claim = fake.object(CLAIMS, "claim-fast-1");
    assert_eq!(claim["spec"]["warmPoolRef"]["name"], "agents");
    assert_eq!(claim["spec"]["lifecycle"]["shutdownPolicy"], "Delete");
    let shutdown: k8s_openapi::jiff::Timestamp = claim["spec"]["lifecycle"]["shutdownTime"]
        .as_str()
        .expect("shutdownTime")
        .parse()
        .expect("RFC 3339");
    assert!(shutdown > k8s_openapi::jiff::Timestamp::now());
    assert_eq!(
        claim["spec"]["additionalPodMetadata"]["labels"],
        json!({"context.rossoctl.io/pool": "fast"})
    );
    assert_eq!(status.strategy, warm);
    assert_eq!(status.phase, PoolPhase::Provisioning);
    assert_eq!(status.members.len(), 2);
    // Nothing is ever written to the warm pool.
    assert!(!fake
        .requests()
        .iter()
        .any(|r| r.plural == WARM_POOLS && r.method != Method::GET));
}

#[tokio::test]
async fn existing_claim_is_validated_and_mounted_read_only() {
    let fake = FakeApi::default();
    let backend = fake.backend();
    let existing = |read_only| Strategy::Existing {
        claim_name: "prepared".to_string(),
        read_only,
    };
    let invalid = |error: BackendError| match error {
        BackendError::Invalid(message) => message,
        other => panic!("{other:?}"),
    };

    let error = backend
        .create_pool(&spec("readers", 1, existing(true)))
        .await
        .expect_err("missing claim");
    assert_eq!(invalid(error), r#"workspace claim "prepared" not found"#);

    // Another owner's managed volume is reported like a missing one.
    fake.insert(
        NS,
        PVCS,
        plain_pvc("prepared", "ReadWriteOnce", labels("theirs", OTHER_OWNER)),
    );
    let error = backend
        .create_pool(&spec("readers", 1, existing(true)))
        .await
        .expect_err("foreign claim");
    assert_eq!(invalid(error), r#"workspace claim "prepared" not found"#);

    fake.update(PVCS, "prepared", |pvc| {
        pvc["metadata"]["labels"] = json!({});
    });
    let error = backend
        .create_pool(&spec("readers", 3, existing(true)))
        .await
        .expect_err("RWO for 3");
    assert_eq!(
        invalid(error),
        r#"workspace claim "prepared" must support ReadWriteMany for multiple sandboxes"#
    );
    assert!(fake.names(SANDBOXES).is_empty());

    fake.update(PVCS, "prepared", |pvc| {
        pvc["spec"]["accessModes"] = json!(["ReadWriteMany"]);
    });
    let status = backend
        .create_pool(&spec("readers", 3, existing(true)))
        .await
        .expect("created");
    assert_eq!(fake.names(PVCS), ["prepared"]);
    let sandbox = fake.object(SANDBOXES, "sandbox-readers-2");
    let pod = &sandbox["spec"]["podTemplate"]["spec"];
    assert_eq!(
        pod["volumes"][0]["persistentVolumeClaim"]["claimName"],
        "prepared"
    );
    assert_eq!(pod["volumes"][0]["persistentVolumeClaim"]["readOnly"], true);
    assert_eq!(pod["containers"][0]["volumeMounts"][0]["readOnly"], true);
    assert_eq!(
        sandbox["metadata"]["annotations"]["context.rossoctl.io/workspace-claim"],
        "prepared"
    );
    assert_eq!(status.strategy, existing(true));
    assert_eq!(status.workspace.claim_name.as_deref(), Some("prepared"));
    assert_eq!(status.workspace.read_only, Some(true));
    assert_eq!(status.workspace.size, "2Gi");
    assert_eq!(status.workspace.access_mode, "ReadWriteMany");
}

#[tokio::test]
async fn a_failed_claim_deletes_the_claims_made_before_it() {
    let fake = FakeApi::default();
    fake.insert(NS, WARM_POOLS, warm_pool("agents"));
    fake.fail(Method::POST, CLAIMS, "claim-fast-2", 503);
    let backend = fake.backend();
    let warm = warm_agents();
    let error = backend
        .create_pool(&spec("fast", 3, warm))
        .await
        .expect_err("claim 2 fails");
    assert_eq!(internal_context(error), "create sandbox claim 2");
    let lines = fake.lines();
    assert_eq!(
        lines[lines.len() - 3..],
        [
            "POST sandboxclaims/claim-fast-2",
            "DELETE sandboxclaims/claim-fast-1",
            "DELETE sandboxclaims/claim-fast-0",
        ]
    );
    assert!(fake.names(CLAIMS).is_empty());
    assert_eq!(fake.names(WARM_POOLS), ["agents"]);
}

#[tokio::test]
async fn settings_without_an_image_are_refused() {
    let fake = FakeApi::default();
    let mut settings = settings();
    settings.sandbox_image = " ".to_string();
    let error = KubeBackend::new(fake.client(), settings).expect_err("no image");
    assert_eq!(
        error.to_string(),
        "kube backend setting sandbox image must not be empty"
    );
}
