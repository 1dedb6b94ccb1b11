//! Pool lifetime on the real control plane: suspend deletes the pods and
//! keeps Sandboxes, names and PVCs; resume brings new pods back on the same
//! volumes; a `ttl` puts `shutdownTime` on the members and expiry removes
//! every managed object, also when the service was down at the instant.
//! Each test restarts its service in between, so nothing rests on memory.

use super::*;

use k8s_openapi::jiff::SignedDuration;

/// `POST /v1/sandbox-pools/{name}/{verb}` as [`USER`]: the pool on `200`.
async fn lifecycle(env: &Env, name: &str, verb: &str) -> Result<Pool> {
    let resp = env
        .request(
            reqwest::Method::POST,
            &format!("/v1/sandbox-pools/{name}/{verb}"),
        )
        .send()
        .await?;
    let status = resp.status().as_u16();
    let text = resp.text().await?;
    ensure!(status == 200, "{verb} answered {status}: {text}");
    Ok(serde_json::from_str(&text)?)
}

/// UIDs of the PVCs `selector` matches, by name.
async fn pvc_uids(env: &Env, selector: &str) -> Result<Vec<(String, String)>> {
    let list = env
        .api::<PersistentVolumeClaim>()
        .list(&kube::api::ListParams::default().labels(selector))
        .await?;
    let mut out: Vec<(String, String)> = list
        .items
        .iter()
        .map(|p| (p.name_any(), p.uid().unwrap_or_default()))
        .collect();
    out.sort();
    Ok(out)
}

/// Suspend removes every pod and keeps the Sandboxes (same UIDs) and their
/// PVCs (bound, same UIDs); the state survives a restart of the service;
/// resume makes new pods with the same names on the same volumes; both are
/// idempotent; warm-pool pools are refused.
#[tokio::test]
async fn suspend_and_resume_remove_and_restore_pods_keeping_volumes() {
    with_env("e2e-suspend", |env| async move {
        let body = json!({"name": "nap", "replicas": 2,
            "workspace": {"size": "1Gi", "accessMode": "ReadWriteOnce", "storageClass": "standard"}});
        env.create_pool(&body).await?;
        let ready = env.wait_ready("nap").await?;
        let pods = member_pods(&ready)?;
        assert_eq!(pods, names(&["sandbox-nap-0", "sandbox-nap-1"]));
        let sel = selector("nap");
        let pvcs_before = pvc_uids(&env, &sel).await?;
        assert_eq!(pvcs_before.len(), 2, "{pvcs_before:?}");
        let mut sandbox_uids = Vec::new();
        for pod in &pods {
            sandbox_uids.push(env.api::<Sandbox>().get(pod).await?.uid());
        }
        let pod_uids: Vec<Option<String>> = {
            let mut out = Vec::new();
            for pod in &pods {
                out.push(env.api::<Pod>().get(pod).await?.uid());
            }
            out
        };

        let suspended = lifecycle(&env, "nap", "suspend").await?;
        assert_eq!(suspended.status, "suspended", "{suspended:#?}");
        assert_eq!(suspended.ready_replicas, 0);
        assert!(suspended.sandboxes.iter().all(|s| !s.ready), "{suspended:#?}");
        // The controller deletes the pods.
        poll_until("pods of suspended pool gone", || async {
            let left = env.names::<Pod>(&sel).await?;
            Ok(left.is_empty().then_some(()).ok_or_else(|| format!("{left:?}")))
        })
        .await?;
        for (pod, uid) in pods.iter().zip(&sandbox_uids) {
            let sb = env.api::<Sandbox>().get(pod).await?;
            assert_eq!(&sb.uid(), uid, "the Sandbox is kept");
            assert_eq!(sb.spec.operating_mode.as_deref(), Some("Suspended"));
        }
        assert_eq!(pvc_uids(&env, &sel).await?, pvcs_before, "the PVCs are kept");
        for (name, _) in &pvcs_before {
            let pvc = env.api::<PersistentVolumeClaim>().get(name).await?;
            assert_eq!(pvc.status.and_then(|s| s.phase).as_deref(), Some("Bound"));
        }
        // Idempotent, and a waiter answers at once.
        let again = lifecycle(&env, "nap", "suspend").await?;
        assert_eq!(again.status, "suspended");
        let (waited, took) = env.wait_pool("nap", Duration::from_secs(30)).await?;
        assert_eq!(waited.status, "suspended");
        assert!(took < Duration::from_secs(10), "{took:?}");

        // The state is in the cluster, not in the service.
        let Env {
            kube, ns, server, ..
        } = env;
        let env = Env::new(kube, ns, server.restart().await);
        let (status, text) = env.get_pool("nap").await;
        assert_eq!(status, 200, "{text}");
        let read: Pool = serde_json::from_str(&text)?;
        assert_eq!(read.status, "suspended", "{text}");

        let resumed = lifecycle(&env, "nap", "resume").await?;
        assert_ne!(resumed.status, "suspended", "{resumed:#?}");
        let back = env.wait_ready("nap").await?;
        assert_eq!(member_pods(&back)?, pods, "same names");
        assert_eq!(env.pods_matching(&back.sandbox_selector).await?, pods);
        for (pod, old) in pods.iter().zip(&pod_uids) {
            let live = env.api::<Pod>().get(pod).await?;
            assert_ne!(&live.uid(), old, "a new pod");
        }
        assert_eq!(pvc_uids(&env, &sel).await?, pvcs_before, "same volumes");
        for pod in &pods {
            let sb = env.api::<Sandbox>().get(pod).await?;
            assert_eq!(sb.spec.operating_mode.as_deref(), Some("Running"));
            let expected = (format!("nap-workspace-{}", &pod[pod.len() - 1..]), false, false);
            assert_eq!(volumes_of(&env, pod).await?, [expected.clone(), expected]);
        }
        let again = lifecycle(&env, "nap", "resume").await?;
        assert_eq!(again.status, "ready");

        // Warm-pool pools cannot be suspended.
        env.warm_pool("wp", "tpl", 1).await?;
        env.create_pool(&json!({"name": "hot", "replicas": 1, "warmPoolRef": "wp"}))
            .await?;
        let resp = env
            .request(reqwest::Method::POST, "/v1/sandbox-pools/hot/suspend")
            .send()
            .await?;
        assert_error(
            resp,
            409,
            "pool_not_suspendable",
            "a warm-pool pool cannot be suspended",
        )
        .await;

        env.delete_pool("nap").await?;
        env.wait_pool_objects_gone("nap").await?;
        env.delete_pool("hot").await?;
        Ok(())
    })
    .await;
}

/// A `ttl` is on every managed object (annotation, `shutdownTime` +
/// `Delete` on Sandboxes, `lifecycle.shutdownTime` on claims); the pools
/// expire while the service is down and the restarted service removes what
/// the controller leaves (the shared PVC), so nothing of them remains.
#[tokio::test]
async fn ttl_expiry_removes_every_object_across_a_restart() {
    let short_ttls = |c: &mut context_service::config::ServeConfig| {
        c.pool_ttl_min = Duration::from_secs(1);
    };
    with_env_with("e2e-ttl", short_ttls, |env| async move {
        env.warm_pool("wp", "tpl", 1).await?;
        let shared = env
            .create_pool(&json!({"name": "brief", "replicas": 2, "ttl": "25s",
                "workspace": {"size": "1Gi", "accessMode": "ReadWriteMany"}}))
            .await?;
        let at: Timestamp = shared.expires_at.clone().context("no expiresAt")?.parse()?;
        let left = at.duration_since(Timestamp::now());
        ensure!(
            left > SignedDuration::from_secs(15) && left <= SignedDuration::from_secs(26),
            "expiresAt {at} is {left:?} away"
        );
        let warm = env
            .create_pool(&json!({"name": "hot", "replicas": 1, "warmPoolRef": "wp", "ttl": "25s"}))
            .await?;
        let warm_at: Timestamp = warm.expires_at.clone().context("no expiresAt")?.parse()?;
        // A pool without a ttl is left alone.
        env.create_pool(&json!({"name": "stays", "replicas": 1,
            "workspace": {"size": "1Gi", "accessMode": "ReadWriteOnce"}}))
            .await?;
        env.wait_ready("brief").await?;
        env.wait_ready("hot").await?;

        let rfc = at.to_string();
        for i in 0..2 {
            let sb = env
                .api::<Sandbox>()
                .get(&format!("sandbox-brief-{i}"))
                .await?;
            assert_eq!(sb.spec.shutdown_time.as_deref(), Some(rfc.as_str()));
            assert_eq!(sb.spec.shutdown_policy.as_deref(), Some("Delete"));
            assert_eq!(
                sb.annotations().get("context.rossoctl.io/expires-at"),
                Some(&rfc)
            );
        }
        let pvc = env
            .api::<PersistentVolumeClaim>()
            .get("brief-workspace")
            .await?;
        assert_eq!(
            pvc.annotations().get("context.rossoctl.io/expires-at"),
            Some(&rfc)
        );
        let claim = env.api::<SandboxClaim>().get("claim-hot-0").await?;
        let lifecycle = claim.spec.lifecycle.clone().context("no lifecycle")?;
        let claim_at: Timestamp = lifecycle
            .shutdown_time
            .context("no shutdownTime")?
            .parse()?;
        assert_eq!(claim_at, warm_at);
        assert_eq!(lifecycle.shutdown_policy.as_deref(), Some("Delete"));

        // Down across the expiry.
        let Env {
            kube,
            ns,
            mut server,
            ..
        } = env;
        server.stop().await;
        let wait = at
            .max(warm_at)
            .duration_since(Timestamp::now())
            .as_secs()
            .max(0)
            + 3;
        tokio::time::sleep(Duration::from_secs(wait.unsigned_abs())).await;
        let env = Env::new(kube, ns, server.restart().await);
        env.wait_pool_objects_gone("brief").await?;
        env.wait_pool_objects_gone("hot").await?;
        wait_deleted(&env.api::<PersistentVolumeClaim>(), "brief-workspace").await?;
        for name in ["brief", "hot"] {
            poll_until(&format!("{name} answers 404"), || async {
                let (status, text) = env.get_pool(name).await;
                Ok((status == 404).then_some(()).ok_or(text))
            })
            .await?;
        }
        let stays = env.wait_ready("stays").await?;
        assert!(stays.expires_at.is_none());
        Ok(())
    })
    .await;
}
