//! Named contexts: PVCs in the requested namespace, read, listed and
//! deleted only when the service manages them.

use super::*;

#[tokio::test]
async fn named_contexts_are_pvcs_in_the_requested_namespace() {
    let fake = FakeApi::default();
    let backend = fake.backend();
    let context = ContextVolumeSpec {
        name: "research".to_string(),
        namespace: "team1".to_string(),
        context_type: ContextVolumeType::Memory,
        size: "5Gi".to_string(),
        access_mode: AccessMode::ReadWriteMany,
        storage_class: Some("fast".to_string()),
        owner_scope: OWNER.to_string(),
    };
    let status = backend.create_volume(&context).await.expect("created");
    assert_eq!(status.claim_name, "context-research");
    assert_eq!(status.namespace, "team1");
    assert_eq!(status.context_type, ContextVolumeType::Memory);
    assert_eq!(status.phase, ContextVolumePhase::Provisioning);
    assert_eq!(status.owner_scope, OWNER);
    let post = fake.requests().pop().expect("request");
    assert_eq!(post.namespace, "team1");
    assert_eq!(post.line(), "POST persistentvolumeclaims/context-research");
    let labels = &post.body["metadata"]["labels"];
    assert_eq!(labels["context.rossoctl.io/name"], "research");
    assert_eq!(labels["context.rossoctl.io/type"], "memory");
    assert_eq!(labels["app.kubernetes.io/managed-by"], "context-service");
    assert!(labels["context.rossoctl.io/pool"].is_null());

    let error = backend.create_volume(&context).await.expect_err("exists");
    assert!(matches!(error, BackendError::AlreadyExists));

    let got = backend
        .get_volume("team1", "research")
        .await
        .expect("get")
        .expect("present");
    assert_eq!(got.size, "5Gi");
    assert_eq!(got.storage_class.as_deref(), Some("fast"));
    assert_eq!(backend.list_volumes("team1").await.expect("list").len(), 1);
    // The quota counts contexts across namespaces.
    let all = backend.list_all_volumes().await.expect("list all");
    assert_eq!(all.len(), 1);
    assert_eq!(all[0].namespace, "team1");
    assert!(backend
        .list_volumes("team2")
        .await
        .expect("list")
        .is_empty());

    // An unmanaged PVC with the same name is not a context.
    fake.insert(
        "team2",
        PVCS,
        plain_pvc("context-research", "ReadWriteOnce", json!({})),
    );
    assert_eq!(
        backend.get_volume("team2", "research").await.expect("get"),
        None
    );
    assert!(!backend
        .delete_volume("team2", "research")
        .await
        .expect("delete"));

    assert!(backend
        .delete_volume("team1", "research")
        .await
        .expect("delete"));
    assert!(!backend
        .delete_volume("team1", "research")
        .await
        .expect("again"));
}
