//! Volumes bound before their sandboxes: on an `Immediate` storage class a
//! create makes a Sandbox only once its PVC is `Bound` (at most the bind
//! timeout), so no sandbox pod fails scheduling on an unbound volume and
//! waits out the scheduler's backoff.

use super::*;

use k8s_openapi::api::core::v1::Event;
use k8s_openapi::api::storage::v1::StorageClass;
use kube::api::ListParams;
use kube::Api;

/// A cluster-wide `Immediate` StorageClass no provisioner serves: its
/// claims never bind. The caller deletes it at the end.
async fn unserved_class(kube: &kube::Client, name: &str) -> Result<()> {
    let class: StorageClass = serde_json::from_value(json!({
        "apiVersion": "storage.k8s.io/v1",
        "kind": "StorageClass",
        "metadata": {"name": name},
        "provisioner": "example.com/nobody",
        "volumeBindingMode": "Immediate",
    }))?;
    Api::<StorageClass>::all(kube.clone())
        .create(&PostParams::default(), &class)
        .await?;
    Ok(())
}

/// Scheduling failures of pods in the namespace that name unbound claims.
async fn unbound_volume_failures(env: &Env) -> Result<Vec<String>> {
    let events = Api::<Event>::namespaced(env.kube.clone(), &env.ns)
        .list(&ListParams::default().fields("reason=FailedScheduling"))
        .await?;
    Ok(events
        .items
        .into_iter()
        .filter_map(|e| e.message)
        .filter(|m| m.contains("unbound"))
        .collect())
}

#[tokio::test]
async fn sandboxes_are_made_once_their_volumes_are_bound() {
    let bind_timeout = |c: &mut context_service::config::ServeConfig| {
        c.kube_volume_bind_timeout = Duration::from_secs(3);
    };
    with_env_with("e2e-binding", bind_timeout, |env| async move {

        // The test control plane's default class (`standard`, Immediate,
        // the hostPath provisioner): sandboxes wait for their PVCs, so no
        // pod ever meets an unbound claim.
        let created = env
            .create_pool(&json!({"name": "fast", "replicas": 3,
                "workspace": {"size": "1Gi", "accessMode": "ReadWriteOnce"}}))
            .await?;
        assert_eq!(created.workspace.storage_class.as_deref(), Some("standard"));
        env.create_pool(&json!({"name": "team", "replicas": 2,
                "workspace": {"size": "1Gi", "accessMode": "ReadWriteMany"}}))
            .await?;
        let pvcs = env.api::<PersistentVolumeClaim>();
        for pool in ["fast", "team"] {
            env.wait_ready(pool).await?;
        }
        for pvc in ["fast-workspace-0", "fast-workspace-1", "fast-workspace-2", "team-workspace"] {
            let phase = pvcs.get(pvc).await?.status.and_then(|s| s.phase);
            assert_eq!(phase.as_deref(), Some("Bound"), "{pvc}");
        }
        let failures = unbound_volume_failures(&env).await?;
        assert!(failures.is_empty(), "{failures:?}");

        // A class that never binds: the PVC is made, no Sandbox until the
        // bind timeout passed, then the create goes on (the pod waits).
        let class = unique("e2e-never");
        unserved_class(&env.kube, &class).await?;
        let started = Instant::now();
        let post = tokio::spawn({
            let body = json!({"name": "stuck", "replicas": 1,
                "workspace": {"size": "1Gi", "accessMode": "ReadWriteOnce", "storageClass": class}});
            let request = env.request(reqwest::Method::POST, "/v1/sandbox-pools").json(&body);
            async move { request.send().await }
        });
        let sandboxes = env.api::<Sandbox>();
        while pvcs.get_opt("stuck-workspace-0").await?.is_none() {
            ensure!(started.elapsed() < Duration::from_secs(3), "no PVC");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        while started.elapsed() < Duration::from_millis(2500) {
            ensure!(
                sandboxes.get_opt("sandbox-stuck-0").await?.is_none(),
                "a Sandbox before its volume bound, {:?} in",
                started.elapsed()
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let resp = post.await??;
        let took = started.elapsed();
        assert_eq!(resp.status().as_u16(), 201, "{}", resp.text().await?);
        assert!(took >= Duration::from_secs(3), "{took:?}");
        assert!(sandboxes.get_opt("sandbox-stuck-0").await?.is_some());

        for pool in ["fast", "team", "stuck"] {
            env.delete_pool(pool).await?;
        }
        Api::<StorageClass>::all(env.kube.clone())
            .delete(&class, &DeleteParams::default())
            .await?;
        Ok(())
    })
    .await;
}
