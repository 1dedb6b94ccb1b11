//! Reads from the watch caches: pool status, readiness of the watches,
//! waiting on a pool, and the shared sandboxes a selector names.

use super::*;

#[tokio::test]
async fn pool_reads_come_from_the_watch_caches() {
    let fake = FakeApi::default();
    let backend = fake.backend();
    assert!(backend.get_pool("any").await.is_err(), "caches not started");
    backend.start_watchers();
    backend
        .wait_synced(Duration::from_secs(5))
        .await
        .expect("synced");
    backend
        .create_pool(&spec("review", 2, dedicated()))
        .await
        .expect("created");

    // Reads right after the create already see the pool, with no LIST.
    let before = fake.lines().len();
    let status = backend
        .get_pool("review")
        .await
        .expect("get")
        .expect("present");
    assert_eq!(status.phase, PoolPhase::Provisioning);
    assert_eq!(status.members.len(), 2);
    assert_eq!(status.workspace.size, "1Gi");
    assert_eq!(backend.get_pool("missing").await.expect("get"), None);
    let pools = backend.list_pools().await.expect("list");
    assert_eq!(pools.len(), 1);
    assert_eq!(fake.lines().len(), before, "reads made API calls");

    // The controller reports sandbox 0 ready and sandbox 1's pod failed.
    fake.update(SANDBOXES, "sandbox-review-0", |sandbox| {
        sandbox["metadata"]["annotations"]["agents.x-k8s.io/pod-name"] = json!("sandbox-review-0");
        sandbox["status"] =
            json!({"conditions": [ready_condition("True", "DependenciesReady", "")]});
    });
    fake.update(SANDBOXES, "sandbox-review-1", |sandbox| {
        sandbox["status"] = json!({"conditions": [
            ready_condition("False", "PodFailed", "Pod failed with exit code 1")
        ]});
    });
    let status = backend
        .wait_pool("review", Duration::from_secs(10))
        .await
        .expect("wait")
        .expect("present");
    assert_eq!(status.phase, PoolPhase::Failed);
    assert_eq!(status.reason.as_deref(), Some("PodFailed"));
    assert_eq!(status.ready_replicas, 1);
    assert_eq!(status.members[0].pod.as_deref(), Some("sandbox-review-0"));
}

/// The readiness probes' requests so far.
fn probes(fake: &FakeApi) -> Vec<String> {
    fake.requests()
        .iter()
        .filter(|r| r.is_probe())
        .map(Recorded::line)
        .collect()
}

/// Waits until the fake has answered `plural`'s watch at least `n` times.
async fn watched(fake: &FakeApi, plural: &str, n: usize) {
    let count = || {
        fake.requests()
            .iter()
            .filter(|r| r.is_watch() && r.plural == plural)
            .count()
    };
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    while count() < n {
        assert!(
            tokio::time::Instant::now() < deadline,
            "no watch of {plural}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test]
async fn readiness_fails_while_a_cache_cannot_watch_and_recovers_when_it_can() {
    let fake = FakeApi::default();
    // The Role lacks `watch` on pods: the lists work, so the caches sync
    // (and kube-runtime keeps serving the first list as if all were well).
    fake.forbid_watches(PODS);
    let backend = fake.backend();
    backend.start_watchers();
    backend
        .wait_synced(Duration::from_secs(5))
        .await
        .expect("the lists work");
    watched(&fake, PODS, 1).await;
    let err = backend
        .check_ready()
        .await
        .expect_err("pods cannot be watched");
    let text = err.to_string();
    assert!(
        text.starts_with("watch the sandbox objects: the pods watch cannot run: ")
            && text.contains("cannot watch resource \"pods\""),
        "{text}"
    );
    // Asked again, it probes again: still unready.
    assert!(backend.check_ready().await.is_err());

    // Fixed: the probe's watch starts, so the replica is ready at once,
    // before the reflector's backed-off retry.
    fake.allow_watches(PODS);
    backend
        .check_ready()
        .await
        .expect("ready once pods can be watched");
    // A proven watch is not probed again.
    let before = probes(&fake).len();
    backend.check_ready().await.expect("still ready");
    assert_eq!(probes(&fake).len(), before, "probed a proven watch");
}

#[tokio::test]
async fn readiness_probes_each_watch_once_then_trusts_the_events() {
    let fake = FakeApi::default();
    let backend = fake.backend();
    assert!(
        backend.check_ready().await.is_err(),
        "ready with no watch caches"
    );
    backend.start_watchers();
    backend
        .wait_synced(Duration::from_secs(5))
        .await
        .expect("synced");
    assert!(probes(&fake).is_empty());
    backend.check_ready().await.expect("ready");
    // One list and one watch start for each of the five caches (quiet
    // watches: no event has shown them running).
    let first = probes(&fake);
    assert_eq!(first.len(), 10, "{first:?}");
    for plural in [CLAIMS, SANDBOXES, PVCS, PODS] {
        assert!(first.contains(&format!("LIST {plural}")), "{first:?}");
        assert!(first.contains(&format!("WATCH {plural}")), "{first:?}");
    }
    backend.check_ready().await.expect("ready");
    assert_eq!(probes(&fake), first, "probed again");
}

#[tokio::test]
async fn concurrent_waiters_all_see_the_caches_sync() {
    let fake = FakeApi::default();
    let backend = Arc::new(fake.backend());
    backend.start_watchers();
    // Registered before any reflector ran its first list (the reaper's
    // start scan, the metrics sampler and a request, all at start-up).
    let waiters: Vec<_> = (0..3)
        .map(|_| {
            let backend = backend.clone();
            tokio::spawn(async move { backend.wait_synced(Duration::from_secs(20)).await })
        })
        .collect();
    let started = tokio::time::Instant::now();
    for waiter in waiters {
        waiter.await.expect("task").expect("synced");
    }
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "a waiter slept until its timeout: {:?}",
        started.elapsed()
    );
}

#[tokio::test]
async fn wait_pool_wakes_on_watch_events_and_times_out_with_the_current_status() {
    let fake = FakeApi::default();
    let backend = Arc::new(fake.backend());
    backend.start_watchers();
    backend
        .create_pool(&spec("slow", 1, dedicated()))
        .await
        .expect("created");

    let started = tokio::time::Instant::now();
    let status = backend
        .wait_pool("slow", Duration::from_millis(200))
        .await
        .expect("wait")
        .expect("present");
    assert_eq!(status.phase, PoolPhase::Provisioning);
    assert!(started.elapsed() >= Duration::from_millis(200));

    let waiter = {
        let backend = backend.clone();
        tokio::spawn(async move { backend.wait_pool("slow", Duration::from_secs(30)).await })
    };
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert!(!waiter.is_finished());
    let started = tokio::time::Instant::now();
    fake.update(SANDBOXES, "sandbox-slow-0", |sandbox| {
        sandbox["status"] =
            json!({"conditions": [ready_condition("True", "DependenciesReady", "")]});
    });
    let status = waiter.await.expect("task").expect("wait").expect("present");
    assert_eq!(status.phase, PoolPhase::Ready);
    assert_eq!(status.ready_replicas, 1);
    assert!(started.elapsed() < Duration::from_secs(5));

    // No such pool: answered at once.
    let status = backend
        .wait_pool("absent", Duration::from_secs(30))
        .await
        .expect("wait");
    assert_eq!(status, None);
}

#[tokio::test]
async fn shared_sandboxes_come_from_a_cache_of_the_selector() {
    let fake = FakeApi::default();
    let sandbox = |name: &str, tier: &str, ready: &str| {
        json!({
            "apiVersion": "agents.x-k8s.io/v1beta1", "kind": "Sandbox",
            "metadata": {"name": name, "labels": {"tier": tier}},
            "spec": {"podTemplate": {"spec": {"containers": []}}},
            "status": {"conditions": [ready_condition(ready, "DependenciesReady", "")]},
        })
    };
    let mut annotated = sandbox("shared-b", "shared", "True");
    annotated["metadata"]["annotations"] = json!({"agents.x-k8s.io/pod-name": "shared-b-pod"});
    fake.insert(NS, SANDBOXES, annotated);
    fake.insert(NS, SANDBOXES, sandbox("shared-a", "shared", "False"));
    fake.insert(NS, SANDBOXES, sandbox("private", "private", "True"));
    let backend = fake.backend();
    let selector: LabelSelector = "tier=shared".parse().expect("selector");

    let members = backend.list_sandboxes(&selector).await.expect("list");
    let expected = |a_ready: bool| {
        vec![
            Member {
                name: "shared-a".into(),
                pod: Some("shared-a".into()),
                ready: a_ready,
            },
            Member {
                name: "shared-b".into(),
                pod: Some("shared-b-pod".into()),
                ready: true,
            },
        ]
    };
    assert_eq!(members, expected(false));
    assert_eq!(fake.lines(), ["LIST sandboxes"]);
    assert!(fake
        .requests()
        .iter()
        .all(|r| r.query.contains("labelSelector=tier%3Dshared")));

    // Later reads come from the cache, which follows the watch.
    fake.update(SANDBOXES, "shared-a", |sandbox| {
        sandbox["status"] =
            json!({"conditions": [ready_condition("True", "DependenciesReady", "")]});
    });
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let members = backend.list_sandboxes(&selector).await.expect("list");
        if members == expected(true) {
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "{members:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(fake.lines(), ["LIST sandboxes"], "reads made API calls");
}
