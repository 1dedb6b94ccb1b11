//! The service's identity in the e2e tests: the ServiceAccount of
//! `deploy/base` with exactly the deploy's RBAC, and a client that
//! authenticates as it with a token from the TokenRequest API.
//!
//! The manifests are `kubectl kustomize deploy/base`, or the file
//! `CONTEXT_SERVICE_E2E_RBAC` names (YAML or JSON; `tests/k8s/rbac-check.sh`
//! points it at the rendered deploy minus one verb). Their ServiceAccount,
//! ClusterRoles and ClusterRoleBindings are applied as rendered; their Roles
//! and RoleBindings, which production puts in the pool namespace
//! (`CS_NAMESPACE`), go into each test's own namespace, which is that test's
//! pool namespace. The harness itself keeps the admin identity of
//! `KUBECONFIG`.

use std::future::Future;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context as _, Result};
use k8s_openapi::api::authentication::v1::{TokenRequest, TokenRequestSpec};
use k8s_openapi::api::authorization::v1::{
    ResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec,
};
use k8s_openapi::api::core::v1::ServiceAccount;
use kube::api::{ApiResource, DynamicObject, GroupVersionKind, Patch, PatchParams, PostParams};
use kube::client::ClientBuilder;
use kube::config::AuthInfo;
use kube::{Api, Client, Config};
use serde_json::{json, Value};

/// Field manager of the RBAC objects the harness applies.
const FIELD_MANAGER: &str = "context-service-e2e-rbac";
/// Lifetime of the token (the longest test is a few minutes).
const TOKEN_SECONDS: i64 = 3600;

/// The RBAC part of the deploy, read once per test process.
#[derive(Debug, Clone)]
pub(crate) struct Rbac {
    /// `(namespace, name)` of the ServiceAccount.
    pub account: (String, String),
    /// Cluster-scoped objects (ClusterRole, ClusterRoleBinding), as rendered.
    cluster: Vec<Value>,
    /// Namespaced objects of the ServiceAccount's namespace (Namespace,
    /// ServiceAccount), as rendered.
    home: Vec<Value>,
    /// Roles and RoleBindings, applied into each pool namespace.
    per_namespace: Vec<Value>,
}

/// One rule's `(apiGroup, resource, verb)` triples.
type Grant = (String, String, String);

impl Rbac {
    /// The deploy's RBAC (see the module docs); panics with the cause when
    /// it cannot be read, as every e2e test needs it.
    pub(crate) fn get() -> &'static Rbac {
        static RBAC: OnceLock<std::result::Result<Rbac, String>> = OnceLock::new();
        match RBAC.get_or_init(|| Rbac::load().map_err(|e| format!("{e:#}"))) {
            Ok(rbac) => rbac,
            Err(e) => panic!("cannot read the deploy's RBAC: {e}"),
        }
    }

    fn load() -> Result<Rbac> {
        let text = match std::env::var_os("CONTEXT_SERVICE_E2E_RBAC") {
            Some(path) => std::fs::read_to_string(&path)
                .with_context(|| format!("reading {}", path.to_string_lossy()))?,
            None => String::from_utf8(kubectl(&["kustomize", &deploy_base().to_string_lossy()])?)?,
        };
        let objects = objects_of(&text)?;
        let mut rbac = Rbac {
            account: (String::new(), String::new()),
            cluster: Vec::new(),
            home: Vec::new(),
            per_namespace: Vec::new(),
        };
        for obj in objects {
            match obj["kind"].as_str().unwrap_or_default() {
                "ClusterRole" | "ClusterRoleBinding" => rbac.cluster.push(obj),
                "Role" | "RoleBinding" => rbac.per_namespace.push(obj),
                "ServiceAccount" => {
                    ensure!(
                        rbac.account.1.is_empty(),
                        "the deploy has more than one ServiceAccount"
                    );
                    rbac.account = (
                        str_at(&obj, "/metadata/namespace")?,
                        str_at(&obj, "/metadata/name")?,
                    );
                    rbac.home.push(obj);
                }
                "Namespace" => rbac.home.push(obj),
                _ => {}
            }
        }
        ensure!(
            !rbac.account.1.is_empty(),
            "the deploy has no ServiceAccount"
        );
        // The Namespace first: the ServiceAccount lives in it.
        rbac.home
            .sort_by_key(|o| o["kind"].as_str() != Some("Namespace"));
        Ok(rbac)
    }

    /// `system:serviceaccount:<namespace>:<name>`.
    pub(crate) fn username(&self) -> String {
        format!(
            "system:serviceaccount:{}:{}",
            self.account.0, self.account.1
        )
    }

    /// Every `(apiGroup, resource, verb)` a kind of role grants.
    fn grants(&self, kind: &str) -> Vec<Grant> {
        let roles = self.cluster.iter().chain(&self.per_namespace);
        let mut grants = Vec::new();
        for role in roles.filter(|o| o["kind"] == kind) {
            for rule in role["rules"].as_array().into_iter().flatten() {
                let strings = |key: &str| -> Vec<String> {
                    rule[key]
                        .as_array()
                        .into_iter()
                        .flatten()
                        .filter_map(|v| v.as_str().map(str::to_owned))
                        .collect()
                };
                for group in strings("apiGroups") {
                    for resource in strings("resources") {
                        for verb in strings("verbs") {
                            grants.push((group.clone(), resource.clone(), verb));
                        }
                    }
                }
            }
        }
        grants
    }
}

/// A client for the service that authenticates as the deploy's
/// ServiceAccount, with the deploy's Roles bound in `ns`. Applies the RBAC
/// first and waits until the authorizer grants all of it.
pub(crate) async fn service_client(admin: &Client, ns: &str) -> Result<Client> {
    client_as_service(admin, ns, None).await
}

/// [`service_client`] whose process "dies" at `die`: from then on no
/// request gets an answer.
pub(crate) async fn dying_service_client(admin: &Client, ns: &str, die: DieAt) -> Result<Client> {
    client_as_service(admin, ns, Some(die)).await
}

async fn client_as_service(admin: &Client, ns: &str, die: Option<DieAt>) -> Result<Client> {
    let config = service_config(admin, ns).await?;
    let builder = ClientBuilder::try_from(config)
        .context("building the ServiceAccount's client")?
        .with_layer(&tower::layer::layer_fn(RecordForbidden));
    Ok(match die {
        None => builder.build(),
        Some(die) => builder
            .with_layer(&tower::layer::layer_fn(move |inner| Dying {
                inner,
                die: die.clone(),
            }))
            .build(),
    })
}

/// Where a service's API client dies, as if its process were killed there
/// (kill -9 or node loss): at the `at`th `POST` of a Sandbox, that request
/// and every later one never get an answer, so nothing further is made and
/// nothing rolled back.
#[derive(Clone)]
pub(crate) struct DieAt {
    at: usize,
    sandbox_posts: Arc<AtomicUsize>,
    dead: Arc<AtomicBool>,
}

impl DieAt {
    /// Dies at the `at`th Sandbox `POST` (1-based).
    pub(crate) fn sandbox_post(at: usize) -> Self {
        Self {
            at,
            sandbox_posts: Arc::default(),
            dead: Arc::default(),
        }
    }

    /// Whether it died.
    pub(crate) fn is_dead(&self) -> bool {
        self.dead.load(Ordering::SeqCst)
    }
}

#[derive(Clone)]
struct Dying<S> {
    inner: S,
    die: DieAt,
}

impl<S, B> tower::Service<http::Request<kube::client::Body>> for Dying<S>
where
    S: tower::Service<http::Request<kube::client::Body>, Response = http::Response<B>>,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
    B: Send + 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = std::result::Result<S::Response, S::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<std::result::Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: http::Request<kube::client::Body>) -> Self::Future {
        let sandbox_post =
            req.method() == http::Method::POST && req.uri().path().ends_with("/sandboxes");
        if sandbox_post && self.die.sandbox_posts.fetch_add(1, Ordering::SeqCst) + 1 >= self.die.at
        {
            self.die.dead.store(true, Ordering::SeqCst);
        }
        if self.die.is_dead() {
            return Box::pin(std::future::pending());
        }
        Box::pin(self.inner.call(req))
    }
}

/// The API server's address and CA from `KUBECONFIG` with a token of the
/// deploy's ServiceAccount, whose RBAC is applied (and granted) in `ns`.
async fn service_config(admin: &Client, ns: &str) -> Result<Config> {
    let rbac = Rbac::get();
    for obj in rbac.home.iter().chain(&rbac.cluster) {
        apply(admin, obj.clone(), None).await?;
    }
    for obj in &rbac.per_namespace {
        apply(admin, obj.clone(), Some(ns)).await?;
    }
    wait_granted(admin, rbac, ns).await?;
    let (sa_ns, sa_name) = &rbac.account;
    let request = TokenRequest {
        spec: Some(TokenRequestSpec {
            expiration_seconds: Some(TOKEN_SECONDS),
            ..Default::default()
        }),
        ..Default::default()
    };
    let token = Api::<ServiceAccount>::namespaced(admin.clone(), sa_ns)
        .create_token_request(sa_name, &PostParams::default(), &request)
        .await
        .with_context(|| format!("TokenRequest for ServiceAccount {sa_ns}/{sa_name}"))?
        .status
        .and_then(|s| s.token)
        .context("TokenRequest answered without a token")?;
    // The admin kubeconfig's API server and CA, with only the token.
    let mut config = Config::infer()
        .await
        .context("reading KUBECONFIG for the API server's address")?;
    config.auth_info = AuthInfo {
        token: Some(token.into()),
        ..Default::default()
    };
    Ok(config)
}

/// Reports every `403` the API server answers the service: on stderr (shown
/// with a failing test) and, when `CONTEXT_SERVICE_E2E_FORBIDDEN_LOG` names a
/// file, as a line `METHOD /path?query` appended to it, so that
/// `tests/k8s/rbac-check.sh` can tell that a test failed because the verb it
/// removed was denied.
#[derive(Clone)]
struct RecordForbidden<S>(S);

impl<S, B> tower::Service<http::Request<kube::client::Body>> for RecordForbidden<S>
where
    S: tower::Service<http::Request<kube::client::Body>, Response = http::Response<B>>,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
    B: Send + 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = std::result::Result<S::Response, S::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<std::result::Result<(), S::Error>> {
        self.0.poll_ready(cx)
    }

    fn call(&mut self, req: http::Request<kube::client::Body>) -> Self::Future {
        let what = format!(
            "{} {}",
            req.method(),
            req.uri().path_and_query().map_or("/", |p| p.as_str())
        );
        let answer = self.0.call(req);
        Box::pin(async move {
            let resp = answer.await?;
            if resp.status() == http::StatusCode::FORBIDDEN {
                record_forbidden(&what);
            }
            Ok(resp)
        })
    }
}

fn record_forbidden(what: &str) {
    eprintln!("the API server answered the service's ServiceAccount 403: {what}");
    if let Some(path) = std::env::var_os("CONTEXT_SERVICE_E2E_FORBIDDEN_LOG") {
        // One short O_APPEND write per line: concurrent tests do not interleave.
        let line = format!("{what}\n");
        let written = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
            .and_then(|mut f| std::io::Write::write_all(&mut f, line.as_bytes()));
        if let Err(e) = written {
            eprintln!("cannot append to {}: {e}", path.to_string_lossy());
        }
    }
}

/// Server-side apply of a rendered object (into `ns` when given).
async fn apply(admin: &Client, mut obj: Value, ns: Option<&str>) -> Result<()> {
    let api_version = str_at(&obj, "/apiVersion")?;
    let kind = str_at(&obj, "/kind")?;
    let name = str_at(&obj, "/metadata/name")?;
    let (group, version) = match api_version.split_once('/') {
        Some((g, v)) => (g, v),
        None => ("", api_version.as_str()),
    };
    let ar = ApiResource::from_gvk(&GroupVersionKind::gvk(group, version, &kind));
    let namespace = match ns {
        Some(ns) => {
            obj["metadata"]["namespace"] = json!(ns);
            Some(ns.to_owned())
        }
        None => obj["metadata"]["namespace"].as_str().map(str::to_owned),
    };
    let api: Api<DynamicObject> = match &namespace {
        Some(ns) => Api::namespaced_with(admin.clone(), ns, &ar),
        None => Api::all_with(admin.clone(), &ar),
    };
    let params = PatchParams::apply(FIELD_MANAGER).force();
    // Tests apply the same objects at once; a create race answers 409.
    let mut attempts = 0;
    loop {
        match api.patch(&name, &params, &Patch::Apply(&obj)).await {
            Ok(_) => return Ok(()),
            Err(kube::Error::Api(e)) if e.code == 409 && attempts < 3 => attempts += 1,
            Err(e) => return Err(e).with_context(|| format!("applying {kind} {name}")),
        }
    }
}

/// Waits until the authorizer allows the ServiceAccount every grant of the
/// Roles in `ns` and of the ClusterRoles cluster-wide (RBAC changes reach
/// the authorizer through an informer, a moment after the write).
async fn wait_granted(admin: &Client, rbac: &Rbac, ns: &str) -> Result<()> {
    let reviews: Api<SubjectAccessReview> = Api::all(admin.clone());
    let wanted = rbac
        .grants("Role")
        .into_iter()
        .map(|g| (g, Some(ns)))
        .chain(rbac.grants("ClusterRole").into_iter().map(|g| (g, None)));
    let deadline = Instant::now() + Duration::from_secs(20);
    for ((group, resource, verb), namespace) in wanted {
        let (resource, subresource) = match resource.split_once('/') {
            Some((r, s)) => (r.to_owned(), Some(s.to_owned())),
            None => (resource.clone(), None),
        };
        let review = SubjectAccessReview {
            spec: SubjectAccessReviewSpec {
                user: Some(rbac.username()),
                resource_attributes: Some(ResourceAttributes {
                    group: Some(group.clone()),
                    resource: Some(resource.clone()),
                    subresource: subresource.clone(),
                    verb: Some(verb.clone()),
                    namespace: namespace.map(str::to_owned),
                    ..Default::default()
                }),
                ..Default::default()
            },
            ..Default::default()
        };
        loop {
            let answer = reviews.create(&PostParams::default(), &review).await?;
            if answer.status.is_some_and(|s| s.allowed) {
                break;
            }
            if Instant::now() >= deadline {
                bail!(
                    "{} is still not allowed to {verb} {group}/{resource} {subresource:?} in {namespace:?}",
                    rbac.username()
                );
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    Ok(())
}

/// `deploy/base` of this repository.
fn deploy_base() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/base")
}

/// The objects of a YAML (or JSON) manifest file; a `List` counts as its
/// items.
fn objects_of(text: &str) -> Result<Vec<Value>> {
    let documents: Vec<Value> =
        serde_saphyr::from_multiple(text).context("parsing the manifests")?;
    let mut objects = Vec::new();
    for doc in documents {
        match doc["kind"].as_str() {
            Some("List") => objects.extend(doc["items"].as_array().cloned().unwrap_or_default()),
            Some(_) => objects.push(doc),
            None => {}
        }
    }
    Ok(objects)
}

/// Runs the test environment's kubectl (for `kustomize`); its stdout.
fn kubectl(args: &[&str]) -> Result<Vec<u8>> {
    let kubectl = std::env::var_os("CONTEXT_SERVICE_TESTENV_KUBECTL").context(
        "CONTEXT_SERVICE_TESTENV_KUBECTL is not set: eval \"$(tests/k8s/testenv.sh env)\"",
    )?;
    let out = Command::new(&kubectl)
        .args(args)
        .output()
        .with_context(|| format!("running {}", kubectl.to_string_lossy()))?;
    ensure!(
        out.status.success(),
        "kubectl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(out.stdout)
}

fn str_at(obj: &Value, pointer: &str) -> Result<String> {
    obj.pointer(pointer)
        .and_then(Value::as_str)
        .map(str::to_owned)
        .with_context(|| format!("no {pointer} in {obj}"))
}
