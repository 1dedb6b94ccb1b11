//! The service's identity: every service of these tests runs as the
//! deploy's ServiceAccount with the deploy's RBAC (`common::rbac`). These
//! tests pin that identity down and cover the ClusterRole, which only named
//! contexts outside the pool namespace need; `tests/k8s/rbac-check.sh`
//! removes one verb at a time and expects a test here or elsewhere to fail.

use super::*;

use common::rbac::{service_client, Rbac};
use k8s_openapi::api::authentication::v1::SelfSubjectReview;
use k8s_openapi::api::core::v1::Namespace;
use kube::Api;

/// The status code of a failed API call (`None`: it succeeded or failed
/// without an API status).
fn api_code<T>(result: &kube::Result<T>) -> Option<u16> {
    match result {
        Err(kube::Error::Api(e)) => Some(e.code),
        _ => None,
    }
}

/// The services' client is the ServiceAccount, not the harness's admin: the
/// API server names it so, it may not list namespaces, and outside its pool
/// namespace it may not read Sandboxes or pods.
#[tokio::test]
async fn services_run_as_the_deploy_service_account() {
    with_env("e2e-identity", |env| async move {
        let client = service_client(&env.kube, &env.ns).await?;
        let review = Api::<SelfSubjectReview>::all(client.clone())
            .create(&PostParams::default(), &SelfSubjectReview::default())
            .await?;
        let user = review
            .status
            .and_then(|s| s.user_info)
            .and_then(|u| u.username);
        assert_eq!(user, Some(Rbac::get().username()));
        assert_eq!(
            user.as_deref(),
            Some("system:serviceaccount:context-service:context-service")
        );

        let namespaces = Api::<Namespace>::all(client.clone())
            .list(&Default::default())
            .await;
        assert_eq!(api_code(&namespaces), Some(403), "{namespaces:?}");
        // Its Role is bound in the pool namespace only.
        let here = Api::<Pod>::namespaced(client.clone(), &env.ns)
            .list(&Default::default())
            .await;
        assert!(here.is_ok(), "{here:?}");
        let elsewhere = Api::<Pod>::namespaced(client.clone(), "default")
            .list(&Default::default())
            .await;
        assert_eq!(api_code(&elsewhere), Some(403), "{elsewhere:?}");
        let sandboxes = dyn_api(&client, "default", &common::k8s::sandboxes())
            .list(&Default::default())
            .await;
        assert_eq!(api_code(&sandboxes), Some(403), "{sandboxes:?}");
        Ok(())
    })
    .await;
}

/// A named context in a namespace other than the pool namespace, through
/// the ClusterRole alone: create (after the quota's cluster-wide list),
/// read, list, delete; its PVC `context-<name>` appears and goes.
#[tokio::test]
async fn named_context_in_another_namespace_uses_the_cluster_role() {
    with_env("e2e-ctx", |env| async move {
        let other = unique("e2e-ctx-other");
        let namespaces: Api<Namespace> = Api::all(env.kube.clone());
        let meta = Namespace {
            metadata: kube::api::ObjectMeta {
                name: Some(other.clone()),
                ..Default::default()
            },
            ..Default::default()
        };
        namespaces.create(&PostParams::default(), &meta).await?;
        let outcome = context_round_trip(&env, &other).await;
        let _ = namespaces.delete(&other, &DeleteParams::background()).await;
        outcome
    })
    .await;
}

/// The body of `resp`, which must have answered `want` (`what` names the
/// call in the failure).
async fn body_of(resp: reqwest::Response, want: u16, what: &str) -> Result<String> {
    let status = resp.status().as_u16();
    let text = resp.text().await?;
    ensure!(status == want, "{what} answered {status}: {text}");
    Ok(text)
}

async fn context_round_trip(env: &Env, other: &str) -> Result<()> {
    assert!(
        env.server.config().context_quota > 0,
        "the quota lists cluster-wide"
    );
    let body = json!({"name": "notes", "namespace": other, "type": "memory",
                      "storage": {"backend": "pvc", "size": "1Gi", "accessMode": "ReadWriteOnce"}});
    let resp = env
        .request(reqwest::Method::POST, "/v1/contexts")
        .json(&body)
        .send()
        .await?;
    body_of(resp, 201, "create context").await?;

    let pvcs: Api<PersistentVolumeClaim> = Api::namespaced(env.kube.clone(), other);
    let pvc = pvcs.get("context-notes").await?;
    assert_eq!(
        pvc.labels()
            .get("app.kubernetes.io/managed-by")
            .map(String::as_str),
        Some("context-service"),
        "{pvc:?}"
    );

    let path = format!("/v1/namespaces/{other}/contexts/notes");
    let resp = env.request(reqwest::Method::GET, &path).send().await?;
    let text = body_of(resp, 200, "get context").await?;
    let got: serde_json::Value = serde_json::from_str(&text)?;
    assert_eq!(got["name"], "notes", "{text}");
    assert_eq!(got["namespace"], other, "{text}");

    let list = format!("/v1/namespaces/{other}/contexts");
    let resp = env.request(reqwest::Method::GET, &list).send().await?;
    let text = body_of(resp, 200, "list contexts").await?;
    let listed: serde_json::Value = serde_json::from_str(&text)?;
    let names: Vec<&str> = listed["items"]
        .as_array()
        .context("items")?
        .iter()
        .filter_map(|c| c["name"].as_str())
        .collect();
    assert_eq!(names, ["notes"], "{text}");

    let resp = env.request(reqwest::Method::DELETE, &path).send().await?;
    body_of(resp, 204, "delete context").await?;
    wait_deleted(&pvcs, "context-notes").await?;
    let resp = Caller::user(&env.server, USER).get(&path).await;
    assert_error(resp, 404, "not_found", "context resource not found").await;
    Ok(())
}
