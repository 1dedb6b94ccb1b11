//! Deleting pools: what is removed (and what never is), by claim names or
//! by selector, and how failures are counted.

use super::*;

#[tokio::test]
async fn delete_removes_managed_objects_but_never_the_existing_pvc_or_warm_pool() {
    let fake = FakeApi::default();
    fake.insert(NS, WARM_POOLS, warm_pool("agents"));
    fake.insert(NS, PVCS, plain_pvc("prepared", "ReadWriteMany", json!({})));
    let backend = watching(&fake, settings()).await;
    let existing = Strategy::Existing {
        claim_name: "prepared".to_string(),
        read_only: false,
    };
    backend
        .create_pool(&spec("readers", 2, existing))
        .await
        .expect("existing pool");
    backend
        .create_pool(&spec("fast", 1, warm_agents()))
        .await
        .expect("warm pool");
    backend
        .create_pool(&spec("review", 1, dedicated()))
        .await
        .expect("dedicated pool");

    // Other pools: one `deletecollection` by the pool's managed labels per
    // kind its strategy makes (as the caches know it), the kinds at once.
    let deleting = |name: &'static str| {
        let (fake, backend) = (&fake, &backend);
        async move {
            let before = fake.requests().len();
            assert!(backend.delete_pool(name).await.expect("delete"));
            let deletes = deletes_since(fake, before);
            let selector = format!(
                "labelSelector=context.rossoctl.io%2Fpool%3D{name}%2Capp.kubernetes.io%2Fmanaged-by%3Dcontext-service"
            );
            for delete in &deletes {
                assert!(delete.query.contains(&selector), "{delete:?}");
            }
            let mut lines: Vec<String> = deletes.iter().map(Recorded::line).collect();
            lines.sort();
            (lines, deletes)
        }
    };
    let (lines, _) = deleting("readers").await;
    assert_eq!(lines, ["DELETE sandboxes"]);
    let (lines, deletes) = deleting("review").await;
    assert_eq!(lines, ["DELETE persistentvolumeclaims", "DELETE sandboxes"]);
    assert!(deletes
        .iter()
        .all(|d| d.body["propagationPolicy"] == "Background"));
    assert_eq!(fake.names(PVCS), ["prepared"]);
    assert_eq!(fake.names(WARM_POOLS), ["agents"]);
    assert!(fake.names(SANDBOXES).is_empty());
    // A finished warm pool goes by its claims' names (see
    // `a_finished_warm_pool_the_caches_hold_whole_is_deleted_by_claim_names`).
    assert_eq!(fake.names(CLAIMS), ["claim-fast-0"]);
    until_finished(&backend, "fast", 1).await;
    assert!(backend.delete_pool("fast").await.expect("delete"));
    assert!(fake.names(CLAIMS).is_empty());

    // Idempotent: nothing left is not an error.
    assert!(!backend.delete_pool("readers").await.expect("second delete"));
}

/// The DELETE requests the fake answered after its first `before` requests.
fn deletes_since(fake: &FakeApi, before: usize) -> Vec<Recorded> {
    fake.requests()[before..]
        .iter()
        .filter(|r| r.method == Method::DELETE)
        .cloned()
        .collect()
}

/// A claim of warm pool `pool` at `index` whose create is still pending, as
/// a create makes it.
fn pending_claim(pool: &str, index: u32) -> Value {
    json!({
        "apiVersion": "extensions.agents.x-k8s.io/v1beta1",
        "kind": "SandboxClaim",
        "metadata": {
            "name": names::claim(pool, index),
            "labels": {
                names::POOL_LABEL: pool,
                names::MANAGED_BY_LABEL: names::MANAGED_BY_VALUE,
                names::REPLICAS_KEY: "1",
            },
            "annotations": {names::CREATED_ANNOTATION: names::CREATED_PENDING},
        },
        "spec": {"warmPoolRef": {"name": "agents"}},
    })
}

/// Waits until the caches show pool `name`'s create finished with every
/// claim cached.
async fn until_finished(backend: &KubeBackend, name: &str, replicas: u32) {
    until(&format!("{name} finished"), || {
        backend.caches().is_ok_and(|caches| {
            status::finished_claims(name, &caches.pool_objects(name), replicas).is_some()
        })
    })
    .await;
}

/// A fake API with warm pool `agents`, and a watching backend that made
/// warm pool `name` of `replicas` on it and whose caches show it finished.
async fn finished_warm_pool(name: &str, replicas: u32) -> (FakeApi, Arc<KubeBackend>) {
    let fake = FakeApi::default();
    fake.insert(NS, WARM_POOLS, warm_pool("agents"));
    let backend = watching(&fake, settings()).await;
    backend
        .create_pool(&spec(name, replicas, warm_agents()))
        .await
        .expect("warm pool");
    until_finished(&backend, name, replicas).await;
    (fake, backend)
}

#[tokio::test]
async fn a_finished_warm_pool_the_caches_hold_whole_is_deleted_by_claim_names() {
    let (fake, backend) = finished_warm_pool("fast", 3).await;

    let before = fake.requests().len();
    assert!(backend.delete_pool("fast").await.expect("delete"));
    let deletes = deletes_since(&fake, before);
    // One DELETE per claim, by name, in the foreground; no selector.
    let mut named: Vec<String> = deletes.iter().filter_map(|d| d.name.clone()).collect();
    named.sort();
    assert_eq!(named, ["claim-fast-0", "claim-fast-1", "claim-fast-2"]);
    assert_eq!(deletes.len(), 3, "{deletes:?}");
    for delete in &deletes {
        assert_eq!(delete.plural, CLAIMS);
        assert!(!delete.query.contains("labelSelector"), "{delete:?}");
        assert_eq!(delete.body["propagationPolicy"], "Foreground");
    }
    assert!(fake.names(CLAIMS).is_empty());
    assert_eq!(fake.names(WARM_POOLS), ["agents"]);
}

#[tokio::test]
async fn a_warm_pool_with_a_claim_the_caches_did_not_expect_is_deleted_by_selector() {
    let (fake, backend) = finished_warm_pool("fast", 1).await;
    // A claim of the pool beyond its replicas (say, left by a create these
    // caches never saw finish): deleting by name would miss it.
    fake.insert(NS, CLAIMS, pending_claim("fast", 5));
    until("the extra claim cached", || {
        backend
            .caches()
            .is_ok_and(|caches| caches.pool_objects("fast").claims.len() == 2)
    })
    .await;

    let before = fake.requests().len();
    assert!(backend.delete_pool("fast").await.expect("delete"));
    let deletes = deletes_since(&fake, before);
    let lines: Vec<String> = deletes
        .iter()
        .map(|r| format!("{} {:?}", r.line(), r.name))
        .collect();
    assert_eq!(lines, ["DELETE sandboxclaims None"]);
    assert!(fake.names(CLAIMS).is_empty());
    // Claims go in the foreground, as upstream.
    assert_eq!(deletes[0].body["propagationPolicy"], "Foreground");
    assert!(
        deletes[0].query.contains("labelSelector="),
        "{:?}",
        deletes[0]
    );
}

#[tokio::test]
async fn delete_counts_a_missing_resource_type_as_empty_and_reports_other_failures() {
    let fake = FakeApi::default();
    let backend = fake.backend();
    backend
        .create_pool(&spec("gone", 2, dedicated()))
        .await
        .expect("created");
    // Without the resource type (no CRD), a kind holds nothing.
    fake.fail(Method::DELETE, SANDBOXES, "", 404);
    assert!(backend.delete_pool("gone").await.expect("404 is fine"));
    assert_eq!(fake.names(PVCS), Vec::<String>::new());

    backend
        .create_pool(&spec("stuck", 1, dedicated()))
        .await
        .expect("created");
    fake.fail(Method::DELETE, PVCS, "", 500);
    let error = backend.delete_pool("stuck").await.expect_err("500");
    assert_eq!(internal_context(error), "delete workspace PVCs of stuck");
    // A retry finishes the job.
    assert!(backend.delete_pool("stuck").await.expect("retry"));
    assert!(fake.names(PVCS).is_empty());
}

#[tokio::test]
async fn a_foreign_object_with_the_pool_label_is_never_deleted() {
    let fake = FakeApi::default();
    fake.insert(
        NS,
        PVCS,
        plain_pvc(
            "intruder",
            "ReadWriteOnce",
            json!({"context.rossoctl.io/pool": "x"}),
        ),
    );
    let backend = fake.backend();
    assert!(!backend.delete_pool("x").await.expect("delete"));
    assert_eq!(fake.names(PVCS), ["intruder"]);
}
