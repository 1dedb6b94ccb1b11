//! Helpers for end-to-end tests of the `kube` backend against the control
//! plane of `tests/k8s/testenv.sh`: a fresh namespace with a service running
//! the `kube` backend in it, kube-rs arrangement (warm pools, existing PVCs)
//! and verification (waits, listings by label).

use std::collections::BTreeMap;
use std::future::Future;
use std::time::{Duration, Instant};

use anyhow::{bail, Context as _, Result};
use context_service::app::BuildOptions;
use context_service::config::BackendKind;
use k8s_openapi::api::core::v1::{Namespace, PersistentVolumeClaim, Pod, ServiceAccount};
use kube::api::{
    ApiResource, DeleteParams, DynamicObject, GroupVersionKind, ListParams, ObjectMeta, Patch,
    PatchParams, PostParams,
};
use kube::runtime::wait::{await_condition, Condition};
use kube::{Api, Client, Resource};
use serde_json::{json, Value};

use super::{Caller, TestServer};

// The crate's own types the e2e targets name, imported in this one place so
// that a module rename touches one line.
pub(crate) use context_service::pool::view::Pool;
#[allow(unused_imports)]
pub(crate) use context_service::sandbox::kube::crd::{Sandbox, SandboxClaim};

/// How long a wait may take: 90 s, generous since two cores are shared by
/// the whole control plane and cargo; `CONTEXT_SERVICE_E2E_TIMEOUT`
/// (seconds) shortens it where failures are expected
/// (`tests/k8s/rbac-check.sh`).
pub(crate) fn timeout() -> Duration {
    let secs = std::env::var("CONTEXT_SERVICE_E2E_TIMEOUT")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(90);
    Duration::from_secs(secs)
}
/// Field manager of what the tests arrange directly.
pub(crate) const FIELD_MANAGER: &str = "context-service-e2e";
/// Image of the sandbox containers (kwok ignores it).
pub(crate) const IMAGE: &str = "busybox:stable";
/// The subject the tests act as.
pub(crate) const USER: &str = "alice";

/// Fails (does not skip) when the environment is missing.
pub(crate) async fn kube_client() -> Client {
    if std::env::var_os("KUBECONFIG").is_none() {
        panic!(
            "KUBECONFIG is not set. Start the environment and export it first:\n  \
             tests/k8s/testenv.sh up && eval \"$(tests/k8s/testenv.sh env)\""
        );
    }
    Client::try_default()
        .await
        .expect("cannot build a client from KUBECONFIG")
}

/// `prefix-<8 hex digits>`.
pub(crate) fn unique(prefix: &str) -> String {
    format!("{prefix}-{:08x}", rand::random::<u32>())
}

/// One test's world: a namespace and a service whose `kube` backend works
/// in it.
pub(crate) struct Env {
    /// Direct client, to arrange and verify only.
    pub kube: Client,
    /// The namespace (`CS_NAMESPACE` of the service).
    pub ns: String,
    /// The service under test.
    pub server: TestServer,
    /// [`USER`]'s caller of `server`, made once: a client and a signed
    /// token per request would time the test's own set-up (a TLS client
    /// config and a signature each) in every figure of the bench.
    caller: Caller,
}

/// Runs `body` in a fresh namespace and deletes the namespace afterwards,
/// also when `body` fails or panics.
pub(crate) async fn with_namespace<F, Fut>(prefix: &str, body: F)
where
    F: FnOnce(Client, String) -> Fut,
    Fut: Future<Output = Result<()>> + Send + 'static,
{
    let kube = kube_client().await;
    let ns = unique(prefix);
    let namespaces: Api<Namespace> = Api::all(kube.clone());
    let meta = Namespace {
        metadata: ObjectMeta {
            name: Some(ns.clone()),
            ..Default::default()
        },
        ..Default::default()
    };
    namespaces
        .create(&PostParams::default(), &meta)
        .await
        .expect("create namespace");
    // ServiceAccount admission rejects pods until kube-controller-manager has
    // created the namespace's default ServiceAccount.
    let accounts: Api<ServiceAccount> = Api::namespaced(kube.clone(), &ns);
    wait_for(
        &accounts,
        "default",
        "default ServiceAccount",
        |sa: Option<&ServiceAccount>| sa.is_some(),
    )
    .await
    .expect("default ServiceAccount");
    let outcome = tokio::spawn(body(kube, ns.clone())).await;
    // Background deletion: the namespace controller and the garbage collector
    // clean up; the test does not wait for it.
    let _ = namespaces.delete(&ns, &DeleteParams::background()).await;
    match outcome {
        Ok(Ok(())) => {}
        Ok(Err(e)) => panic!("{e:?}"),
        Err(e) => std::panic::resume_unwind(e.into_panic()),
    }
}

/// Creates a fresh namespace and starts the service with the `kube` backend
/// in it, runs `body`, and deletes the namespace afterwards, also when `body`
/// fails or panics.
pub(crate) async fn with_env<F, Fut>(prefix: &str, body: F)
where
    F: FnOnce(Env) -> Fut + Send + 'static,
    Fut: Future<Output = Result<()>> + Send + 'static,
{
    with_env_with(prefix, |_| {}, body).await;
}

/// [`with_env`] whose service starts after `adjust` changed its settings.
pub(crate) async fn with_env_with<A, F, Fut>(prefix: &str, adjust: A, body: F)
where
    A: FnOnce(&mut context_service::config::ServeConfig) + Send + 'static,
    F: FnOnce(Env) -> Fut + Send + 'static,
    Fut: Future<Output = Result<()>> + Send + 'static,
{
    with_namespace(prefix, |kube, ns| async move {
        let server = start_server_with(&ns, adjust).await;
        body(Env::new(kube, ns, server)).await
    })
    .await;
}

/// The real service with the `kube` backend on namespace `ns`.
pub(crate) async fn start_server(ns: &str) -> TestServer {
    start_server_with(ns, |_| {}).await
}

/// [`start_server`] after `adjust` changes further settings.
///
/// The service talks to the API server as the deploy's ServiceAccount
/// (token from the TokenRequest API), with the deploy's Roles bound in `ns`
/// and its ClusterRoles (see [`super::rbac`]), so every e2e test that goes
/// through the service also proves the RBAC grants what the code uses.
pub(crate) async fn start_server_with(
    ns: &str,
    adjust: impl FnOnce(&mut context_service::config::ServeConfig),
) -> TestServer {
    let admin = kube_client().await;
    let client = super::rbac::service_client(&admin, ns)
        .await
        .expect("a client as the deploy's ServiceAccount");
    start_server_as(ns, adjust, client).await
}

/// [`start_server_with`] whose API client dies at `die` (see
/// [`super::rbac::DieAt`]): a replica killed half-way through a request.
pub(crate) async fn start_dying_server_with(
    ns: &str,
    adjust: impl FnOnce(&mut context_service::config::ServeConfig),
    die: super::rbac::DieAt,
) -> TestServer {
    let admin = kube_client().await;
    let client = super::rbac::dying_service_client(&admin, ns, die)
        .await
        .expect("a client as the deploy's ServiceAccount");
    start_server_as(ns, adjust, client).await
}

/// A `kube` service in `ns` whose API client is `client`.
async fn start_server_as(
    ns: &str,
    adjust: impl FnOnce(&mut context_service::config::ServeConfig),
    client: kube::Client,
) -> TestServer {
    let ns = ns.to_owned();
    TestServer::start_with_options(
        move |cfg| {
            cfg.backend = BackendKind::Kube;
            cfg.namespace = ns;
            cfg.kube_sandbox_image = Some(IMAGE.to_owned());
            adjust(cfg);
        },
        BuildOptions {
            kube_client: Some(client),
            ..BuildOptions::default()
        },
    )
    .await
}

impl Env {
    /// The world of namespace `ns` with `server` as the service under test.
    pub(crate) fn new(kube: Client, ns: String, server: TestServer) -> Self {
        let caller = Caller::user(&server, USER);
        Self {
            kube,
            ns,
            server,
            caller,
        }
    }

    /// `Api<K>` in the test namespace.
    pub(crate) fn api<K>(&self) -> Api<K>
    where
        K: Resource<Scope = k8s_openapi::NamespaceResourceScope, DynamicType = ()>,
    {
        Api::namespaced(self.kube.clone(), &self.ns)
    }

    /// A dynamic API in the test namespace.
    pub(crate) fn dyn_api(&self, ar: &ApiResource) -> Api<DynamicObject> {
        dyn_api(&self.kube, &self.ns, ar)
    }

    /// A raw request as [`USER`] (fallible, unlike [`Caller`]'s shortcuts,
    /// so that a failure is reported as the step's error).
    pub(crate) fn request(&self, method: reqwest::Method, path: &str) -> reqwest::RequestBuilder {
        self.caller.request(method, path)
    }

    /// `POST /v1/sandbox-pools` with `body`, as [`USER`].
    pub(crate) async fn post_pool(&self, body: &Value) -> reqwest::Response {
        self.request(reqwest::Method::POST, "/v1/sandbox-pools")
            .json(body)
            .send()
            .await
            .expect("POST /v1/sandbox-pools")
    }

    /// Creates a pool and expects `201` with a pool body.
    pub(crate) async fn create_pool(&self, body: &Value) -> Result<Pool> {
        let resp = self.post_pool(body).await;
        let status = resp.status().as_u16();
        let text = resp.text().await?;
        if status != 201 {
            bail!("create answered {status}: {text}");
        }
        serde_json::from_str(&text).with_context(|| format!("pool body: {text}"))
    }

    /// `GET /v1/sandbox-pools/{name}?wait=ready&timeout=<timeout>`: the
    /// long poll, with its own duration.
    pub(crate) async fn wait_pool(
        &self,
        name: &str,
        timeout: Duration,
    ) -> Result<(Pool, Duration)> {
        let started = Instant::now();
        let resp = self
            .request(
                reqwest::Method::GET,
                &format!(
                    "/v1/sandbox-pools/{name}?wait=ready&timeout={}s",
                    timeout.as_secs()
                ),
            )
            .timeout(timeout + Duration::from_secs(30))
            .send()
            .await?;
        let status = resp.status().as_u16();
        let text = resp.text().await?;
        if status != 200 {
            bail!("wait answered {status}: {text}");
        }
        let pool = serde_json::from_str(&text).with_context(|| format!("pool body: {text}"))?;
        Ok((pool, started.elapsed()))
    }

    /// Waits through the API for `ready` and fails on anything else.
    pub(crate) async fn wait_ready(&self, name: &str) -> Result<Pool> {
        let limit = timeout();
        let (pool, _) = self.wait_pool(name, limit).await?;
        if pool.status != "ready" {
            bail!("pool {name} is not ready after {limit:?}: {pool:#?}");
        }
        Ok(pool)
    }

    /// Lists the pools once, so that the service's watch caches have synced
    /// and its API connection is open before anything is timed.
    pub(crate) async fn warm_up(&self) -> Result<()> {
        let resp = self
            .request(reqwest::Method::GET, "/v1/sandbox-pools")
            .send()
            .await?;
        let status = resp.status().as_u16();
        if status != 200 {
            bail!("list answered {status}: {}", resp.text().await?);
        }
        Ok(())
    }

    /// `GET /v1/sandbox-pools/{name}` as [`USER`]: status and body.
    pub(crate) async fn get_pool(&self, name: &str) -> (u16, String) {
        let resp = self
            .request(reqwest::Method::GET, &format!("/v1/sandbox-pools/{name}"))
            .send()
            .await
            .expect("GET pool");
        let status = resp.status().as_u16();
        (status, resp.text().await.expect("body"))
    }

    /// Polls `GET /v1/sandbox-pools/{name}` (which must answer `200`)
    /// until the pool satisfies `done`; returns that pool.
    pub(crate) async fn poll_pool(
        &self,
        name: &str,
        what: &str,
        done: impl Fn(&Pool) -> bool,
    ) -> Result<Pool> {
        poll_until(what, || async {
            let (status, text) = self.get_pool(name).await;
            if status != 200 {
                bail!("GET answered {status}: {text}");
            }
            let pool: Pool = serde_json::from_str(&text)?;
            Ok(if done(&pool) { Ok(pool) } else { Err(text) })
        })
        .await
    }

    /// `DELETE /v1/sandbox-pools/{name}`; expects `204`.
    pub(crate) async fn delete_pool(&self, name: &str) -> Result<()> {
        let resp = self
            .request(
                reqwest::Method::DELETE,
                &format!("/v1/sandbox-pools/{name}"),
            )
            .send()
            .await?;
        let status = resp.status().as_u16();
        if status != 204 {
            bail!("delete answered {status}: {}", resp.text().await?);
        }
        Ok(())
    }

    /// Sorted names of the objects matching `selector` (deleting ones
    /// included).
    pub(crate) async fn names<K>(&self, selector: &str) -> Result<Vec<String>>
    where
        K: Resource<Scope = k8s_openapi::NamespaceResourceScope, DynamicType = ()>
            + Clone
            + std::fmt::Debug
            + serde::de::DeserializeOwned,
    {
        let list = self
            .api::<K>()
            .list(&ListParams::default().labels(selector))
            .await?;
        let mut names: Vec<String> = list.items.iter().map(kube::ResourceExt::name_any).collect();
        names.sort();
        Ok(names)
    }

    /// Sorted names of the pods a harness gets with `selector` (running ones:
    /// pods being deleted are not the pool's any more).
    pub(crate) async fn pods_matching(&self, selector: &str) -> Result<Vec<String>> {
        let list = self
            .api::<Pod>()
            .list(&ListParams::default().labels(selector))
            .await?;
        let mut names: Vec<String> = list
            .items
            .iter()
            .filter(|p| p.metadata.deletion_timestamp.is_none())
            .map(kube::ResourceExt::name_any)
            .collect();
        names.sort();
        Ok(names)
    }

    /// Waits until nothing labelled `context.rossoctl.io/pool=<pool>` is left:
    /// no Sandbox, SandboxClaim, PVC or Pod (also the ones being deleted).
    pub(crate) async fn wait_pool_objects_gone(&self, pool: &str) -> Result<()> {
        let selector = format!("context.rossoctl.io/pool={pool}");
        let (sandboxes, claims) = (sandboxes(), claims());
        let left = || async {
            let mut left = Vec::new();
            for (kind, names) in [
                ("Sandbox", self.dyn_names(&sandboxes, &selector).await?),
                ("SandboxClaim", self.dyn_names(&claims, &selector).await?),
                ("PVC", self.names::<PersistentVolumeClaim>(&selector).await?),
                ("Pod", self.names::<Pod>(&selector).await?),
            ] {
                left.extend(names.into_iter().map(|n| format!("{kind} {n}")));
            }
            Ok::<_, anyhow::Error>(left)
        };
        poll_until(&format!("objects of pool {pool} gone"), || async {
            let left = left().await?;
            Ok(left
                .is_empty()
                .then_some(())
                .ok_or_else(|| format!("{left:?}")))
        })
        .await
    }

    /// Sorted names of dynamic objects matching `selector`.
    pub(crate) async fn dyn_names(&self, ar: &ApiResource, selector: &str) -> Result<Vec<String>> {
        let list = self
            .dyn_api(ar)
            .list(&ListParams::default().labels(selector))
            .await?;
        let mut names: Vec<String> = list.items.iter().map(kube::ResourceExt::name_any).collect();
        names.sort();
        Ok(names)
    }

    /// Creates PVC `name` (class `standard`, 1Gi, `mode`) and waits until it
    /// is Bound: an existing claim as a user would have made it.
    pub(crate) async fn existing_pvc(
        &self,
        name: &str,
        mode: &str,
    ) -> Result<PersistentVolumeClaim> {
        let pvc: PersistentVolumeClaim = serde_json::from_value(json!({
            "metadata": {"name": name, "labels": {"team": "e2e"}},
            "spec": {
                "accessModes": [mode],
                "storageClassName": "standard",
                "resources": {"requests": {"storage": "1Gi"}}
            }
        }))?;
        let api = self.api::<PersistentVolumeClaim>();
        api.create(&PostParams::default(), &pvc).await?;
        wait_for(
            &api,
            name,
            "PVC Bound",
            |p: Option<&PersistentVolumeClaim>| {
                p.and_then(|p| p.status.as_ref())
                    .and_then(|s| s.phase.as_deref())
                    == Some("Bound")
            },
        )
        .await
    }

    /// A SandboxTemplate `template` and a SandboxWarmPool `name` of
    /// `replicas` on it; waits until `replicas` warm sandboxes are ready.
    pub(crate) async fn warm_pool(&self, name: &str, template: &str, replicas: i64) -> Result<()> {
        create_warm_pool(&self.kube, &self.ns, name, template, replicas).await
    }
}

/// A dynamic API in namespace `ns`.
pub(crate) fn dyn_api(kube: &Client, ns: &str, ar: &ApiResource) -> Api<DynamicObject> {
    Api::namespaced_with(kube.clone(), ns, ar)
}

/// A SandboxTemplate `template` (one sleeping container) and a
/// SandboxWarmPool `name` of `replicas` on it, in `ns`; waits until
/// `replicas` warm sandboxes are ready.
pub(crate) async fn create_warm_pool(
    kube: &Client,
    ns: &str,
    name: &str,
    template: &str,
    replicas: i64,
) -> Result<()> {
    apply(
        &dyn_api(kube, ns, &templates()),
        &templates(),
        template,
        json!({"spec": {"podTemplate": {"spec": {"containers": [
            {"name": "main", "image": IMAGE, "command": ["sleep", "infinity"]}
        ]}}}}),
    )
    .await?;
    let pools = dyn_api(kube, ns, &warm_pools());
    apply(
        &pools,
        &warm_pools(),
        name,
        json!({"spec": {"replicas": replicas, "sandboxTemplateRef": {"name": template}}}),
    )
    .await?;
    wait_for(
        &pools,
        name,
        "warm pool filled",
        move |o: Option<&DynamicObject>| ready_replicas(o) == replicas,
    )
    .await?;
    Ok(())
}

/// Polls `check` (every 100 ms, up to [`timeout`]) until it gives `Ok(value)`;
/// `Err(text)` is the state so far, reported on timeout. For conditions over
/// lists, where no single-object watch applies.
pub(crate) async fn poll_until<T, F, Fut>(what: &str, mut check: F) -> Result<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<std::result::Result<T, String>>>,
{
    let limit = timeout();
    let deadline = Instant::now() + limit;
    loop {
        match check().await? {
            Ok(value) => return Ok(value),
            Err(state) if Instant::now() >= deadline => {
                bail!("timed out after {limit:?} waiting for {what}; last state: {state}")
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    }
}

/// Waits for `cond` on the named object through a watch; on timeout the error
/// carries the object's last state.
pub(crate) async fn wait_for<K>(
    api: &Api<K>,
    name: &str,
    what: &str,
    cond: impl Condition<K>,
) -> Result<K>
where
    K: Resource + Clone + std::fmt::Debug + serde::de::DeserializeOwned + Send + 'static,
{
    let limit = timeout();
    match tokio::time::timeout(limit, await_condition(api.clone(), name, cond)).await {
        Ok(Ok(Some(obj))) => Ok(obj),
        Ok(Ok(None)) => bail!("{name} was deleted while waiting for {what}"),
        Ok(Err(e)) => Err(e).with_context(|| format!("watching {name} for {what}")),
        Err(_) => {
            let last = api.get_opt(name).await.ok().flatten();
            bail!("timed out after {limit:?} waiting for {name}: {what}; last state: {last:#?}")
        }
    }
}

/// Waits until the named object is gone.
pub(crate) async fn wait_deleted<K>(api: &Api<K>, name: &str) -> Result<()>
where
    K: Resource + Clone + std::fmt::Debug + serde::de::DeserializeOwned + Send + 'static,
{
    let limit = timeout();
    match tokio::time::timeout(
        limit,
        await_condition(api.clone(), name, |o: Option<&K>| o.is_none()),
    )
    .await
    {
        Ok(Ok(_)) => Ok(()),
        Ok(Err(e)) => Err(e).with_context(|| format!("watching {name} for deletion")),
        Err(_) => bail!(
            "{name} still exists after {limit:?}: {:#?}",
            api.get_opt(name).await?
        ),
    }
}

// --- agent-sandbox resources (v1beta1 only) ----------------------------------

fn resource(group: &str, kind: &str, plural: &str) -> ApiResource {
    ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk(group, "v1beta1", kind), plural)
}

/// `agents.x-k8s.io/v1beta1` Sandbox.
pub(crate) fn sandboxes() -> ApiResource {
    resource("agents.x-k8s.io", "Sandbox", "sandboxes")
}
/// `extensions.agents.x-k8s.io/v1beta1` SandboxTemplate.
pub(crate) fn templates() -> ApiResource {
    resource(
        "extensions.agents.x-k8s.io",
        "SandboxTemplate",
        "sandboxtemplates",
    )
}
/// `extensions.agents.x-k8s.io/v1beta1` SandboxWarmPool.
pub(crate) fn warm_pools() -> ApiResource {
    resource(
        "extensions.agents.x-k8s.io",
        "SandboxWarmPool",
        "sandboxwarmpools",
    )
}
/// `extensions.agents.x-k8s.io/v1beta1` SandboxClaim.
pub(crate) fn claims() -> ApiResource {
    resource(
        "extensions.agents.x-k8s.io",
        "SandboxClaim",
        "sandboxclaims",
    )
}

/// Server-side apply of a manifest given as JSON.
pub(crate) async fn apply(
    api: &Api<DynamicObject>,
    ar: &ApiResource,
    name: &str,
    body: Value,
) -> Result<DynamicObject> {
    let mut obj = body;
    obj["apiVersion"] = json!(ar.api_version);
    obj["kind"] = json!(ar.kind);
    obj["metadata"]["name"] = json!(name);
    api.patch(name, &PatchParams::apply(FIELD_MANAGER), &Patch::Apply(obj))
        .await
        .with_context(|| format!("server-side apply of {} {name}", ar.kind))
}

/// `.status.readyReplicas` of a warm pool.
pub(crate) fn ready_replicas(obj: Option<&DynamicObject>) -> i64 {
    obj.and_then(|o| o.data["status"]["readyReplicas"].as_i64())
        .unwrap_or(0)
}

/// The labels of `obj`, for equality checks.
pub(crate) fn labels_of(meta: &ObjectMeta) -> BTreeMap<String, String> {
    meta.labels.clone().unwrap_or_default()
}

/// Sorted member names of a pool body.
pub(crate) fn member_names(pool: &Pool) -> Vec<String> {
    let mut names: Vec<String> = pool.sandboxes.iter().map(|s| s.name.clone()).collect();
    names.sort();
    names
}

/// Sorted pod names of a pool body (members without a pod are an error).
pub(crate) fn member_pods(pool: &Pool) -> Result<Vec<String>> {
    let mut pods = Vec::new();
    for s in &pool.sandboxes {
        pods.push(
            s.pod
                .clone()
                .with_context(|| format!("member {} has no pod: {pool:#?}", s.name))?,
        );
    }
    pods.sort();
    Ok(pods)
}
