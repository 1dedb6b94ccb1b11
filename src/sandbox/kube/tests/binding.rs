//! Volumes bound before their sandboxes: waiting for PVCs on `Immediate`
//! storage classes only, and for at most the bind timeout.

use super::*;

/// Adds storage class `name` binding in `mode` (`None`: Kubernetes'
/// default, `Immediate`).
fn storage_class(fake: &FakeApi, name: &str, mode: Option<&str>) {
    let mut class = json!({
        "apiVersion": "storage.k8s.io/v1",
        "kind": "StorageClass",
        "metadata": {"name": name},
        "provisioner": "example.com/volumes",
    });
    if let Some(mode) = mode {
        class["volumeBindingMode"] = json!(mode);
    }
    fake.insert("", STORAGE_CLASSES, class);
}

/// Binds PVC `name` as the PV controller would.
fn bind(fake: &FakeApi, name: &str) {
    fake.update(PVCS, name, |pvc| pvc["status"] = json!({"phase": "Bound"}));
}

/// The storage class lookups so far.
fn class_lookups(fake: &FakeApi) -> usize {
    fake.requests()
        .iter()
        .filter(|r| r.plural == STORAGE_CLASSES)
        .count()
}

#[tokio::test]
async fn on_an_immediate_class_each_sandbox_waits_for_its_pvc_to_bind() {
    let fake = FakeApi::default();
    storage_class(&fake, "fast", None);
    let backend = watching(&fake, settings()).await;
    let create = tokio::spawn({
        let backend = backend.clone();
        async move { backend.create_pool(&spec("review", 2, dedicated())).await }
    });

    // Both PVCs at once, no Sandbox while neither is bound.
    until("both PVCs", || fake.names(PVCS).len() == 2).await;
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(fake.names(SANDBOXES).is_empty(), "{:?}", fake.lines());
    // Each Sandbox follows its own PVC's binding, in any order.
    bind(&fake, "review-workspace-1");
    until("sandbox 1", || !fake.names(SANDBOXES).is_empty()).await;
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert_eq!(fake.names(SANDBOXES), ["sandbox-review-1"]);
    assert!(!create.is_finished());
    bind(&fake, "review-workspace-0");
    let status = create.await.expect("joined").expect("created");
    assert_eq!(status.members.len(), 2);
    assert_eq!(
        fake.object(SANDBOXES, "sandbox-review-0")["spec"]["podTemplate"]["spec"]["volumes"][0]
            ["persistentVolumeClaim"]["claimName"],
        "review-workspace-0"
    );

    // The class's mode is looked up once per process: a second create
    // asks no more.
    let lookups = class_lookups(&fake);
    assert!((1..=2).contains(&lookups), "{lookups}");
    let shared = Strategy::Shared {
        size: "1Gi".to_string(),
        storage_class: Some("fast".to_string()),
    };
    let create = tokio::spawn({
        let backend = backend.clone();
        async move { backend.create_pool(&spec("team", 3, shared)).await }
    });
    until("the shared PVC", || fake.names(PVCS).len() == 3).await;
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert_eq!(fake.names(SANDBOXES).len(), 2, "{:?}", fake.lines());
    bind(&fake, "team-workspace");
    create.await.expect("joined").expect("created");
    assert_eq!(fake.names(SANDBOXES).len(), 5);
    assert_eq!(class_lookups(&fake), lookups);
}

#[tokio::test]
async fn classes_that_bind_later_or_cannot_be_read_are_not_waited_for() {
    let fake = FakeApi::default();
    storage_class(&fake, "later", Some("WaitForFirstConsumer"));
    // The default timeout (10 s) would outlast the 3 s allowed here.
    let backend = watching(&fake, settings()).await;
    for (name, class) in [("later", "later"), ("unknown", "missing")] {
        let strategy = Strategy::Dedicated {
            size: "1Gi".to_string(),
            storage_class: Some(class.to_string()),
        };
        let created = tokio::time::timeout(
            Duration::from_secs(3),
            backend.create_pool(&spec(name, 2, strategy)),
        )
        .await
        .expect("no wait for the volumes")
        .expect("created");
        assert_eq!(created.members.len(), 2);
    }
    // A claim with no class at all (none given, no default) is not looked up.
    let lookups = class_lookups(&fake);
    let strategy = Strategy::Shared {
        size: "1Gi".to_string(),
        storage_class: None,
    };
    tokio::time::timeout(
        Duration::from_secs(3),
        backend.create_pool(&spec("plain", 1, strategy)),
    )
    .await
    .expect("no wait for the volume")
    .expect("created");
    assert_eq!(class_lookups(&fake), lookups);
}

#[tokio::test]
async fn a_volume_that_never_binds_delays_the_create_by_the_timeout_once() {
    let fake = FakeApi::default();
    storage_class(&fake, "fast", Some("Immediate"));
    let mut settings = settings();
    settings.volume_bind_timeout = Duration::from_millis(300);
    let backend = watching(&fake, settings).await;
    let started = std::time::Instant::now();
    let status = backend
        .create_pool(&spec("review", 20, dedicated()))
        .await
        .expect("created anyway");
    let took = started.elapsed();
    assert_eq!(status.members.len(), 20);
    assert_eq!(fake.names(SANDBOXES).len(), 20);
    // One deadline for the create, not one per PVC: with 16 replicas in
    // flight, the 17th would wait from 300 ms to 600 ms.
    assert!(took >= Duration::from_millis(300), "{took:?}");
    assert!(took < Duration::from_millis(600), "{took:?}");

    // Zero: never wait.
    let mut settings = self::settings();
    settings.volume_bind_timeout = Duration::ZERO;
    let backend = watching(&fake, settings).await;
    let lookups = class_lookups(&fake);
    backend
        .create_pool(&spec("quick", 1, dedicated()))
        .await
        .expect("created");
    assert_eq!(
        class_lookups(&fake),
        lookups,
        "no lookup when never waiting"
    );
}
