//! [`KubeBackend`] against a mocked Kubernetes API: a `tower-test` mock
//! service answered by a small in-memory API server that records every
//! request, can inject failures and streams watch events.

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http::{Method, Request, Response, StatusCode};
use k8s_openapi::jiff::Timestamp;
use kube::client::Body;
use kube::Client;
use serde_json::{json, Value};
use tokio::sync::mpsc;
use tower_test::mock;

use super::{status, KubeBackend, KubeSettings};
use crate::pool::model::Member;
use crate::pool::model::{
    AccessMode, ContextVolumePhase, ContextVolumeSpec, ContextVolumeType, PoolPhase, PoolSpec,
    Strategy,
};
use crate::pool::names;
use crate::pool::{BackendError, LabelSelector, SandboxBackend};

const NS: &str = "pools";
const OWNER: &str = "0123456789abcdef0123456789abcdef";
const OTHER_OWNER: &str = "fedcba9876543210fedcba9876543210";
const SANDBOXES: &str = "sandboxes";
const CLAIMS: &str = "sandboxclaims";
const PVCS: &str = "persistentvolumeclaims";
const WARM_POOLS: &str = "sandboxwarmpools";
const PODS: &str = "pods";
const STORAGE_CLASSES: &str = "storageclasses";

/// Response bodies: whole JSON documents, or a never-ending watch stream.
type MockBody = reqwest::Body;

/// One request as the fake API server saw it.
#[derive(Debug, Clone)]
struct Recorded {
    method: Method,
    /// Resource plural, e.g. `sandboxes`.
    plural: String,
    /// Namespace from the path.
    namespace: String,
    /// Object name from the path (or the body, for POST).
    name: Option<String>,
    /// Raw query string.
    query: String,
    /// Content type of the request.
    content_type: Option<String>,
    /// JSON body, `Null` when empty.
    body: Value,
}

impl Recorded {
    fn is_watch(&self) -> bool {
        self.query.contains("watch=true")
    }

    /// A readiness probe's list or watch (the reflectors' own ask for no
    /// limit and a long timeout).
    fn is_probe(&self) -> bool {
        query_param(&self.query, "limit").as_deref() == Some("1")
            || query_param(&self.query, "timeoutSeconds").as_deref() == Some("1")
    }

    /// `METHOD plural[/name]`, for readable order assertions.
    fn line(&self) -> String {
        let verb = match (self.method.as_str(), &self.name) {
            ("GET", None) if self.is_watch() => "WATCH",
            ("GET", None) => "LIST",
            (method, _) => method,
        };
        match &self.name {
            Some(name) => format!("{verb} {}/{name}", self.plural),
            None => format!("{verb} {}", self.plural),
        }
    }
}

/// A failure to inject: the first request matching method, plural and name
/// gets `code`.
#[derive(Debug, Clone)]
struct Fault {
    method: Method,
    plural: &'static str,
    name: String,
    code: u16,
}

struct WatchStream {
    namespace: String,
    plural: String,
    selector: String,
    events: mpsc::UnboundedSender<Bytes>,
}

#[derive(Default)]
struct State {
    /// `namespace/plural` → name → object.
    objects: BTreeMap<String, BTreeMap<String, Value>>,
    revision: u64,
    requests: Vec<Recorded>,
    faults: Vec<Fault>,
    /// Plurals whose watches answer `403` (a Role without `watch`).
    forbidden_watches: Vec<&'static str>,
    watches: Vec<WatchStream>,
    /// Requests of this method take this long to answer.
    latency: Option<(Method, Duration)>,
    /// Requests of the slow method being answered now, and the most at once.
    in_flight: usize,
    most_in_flight: usize,
    /// For each slow request in the order they came: how many were being
    /// answered then, itself included.
    in_flight_at_start: Vec<usize>,
}

/// An in-memory Kubernetes API server good enough for the backend.
#[derive(Clone, Default)]
struct FakeApi(Arc<Mutex<State>>);

impl FakeApi {
    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.0.lock().expect("fake state")
    }

    /// A client whose requests this fake answers.
    fn client(&self) -> Client {
        Client::new(self.service(), "default")
    }

    /// A client whose requests this fake answers, through the bound of
    /// [`super::backend::with_api_bound`].
    fn bounded_client(&self) -> Client {
        let builder = kube::client::ClientBuilder::new(self.service(), "default");
        super::backend::with_api_bound(builder).build()
    }

    /// A mock HTTP service this fake answers, each request on its own task
    /// as a real API server serves them.
    fn service(&self) -> mock::Mock<Request<Body>, Response<MockBody>> {
        let (service, mut handle) = mock::pair::<Request<Body>, Response<MockBody>>();
        let fake = self.clone();
        tokio::spawn(async move {
            while let Some((request, respond)) = handle.next_request().await {
                let fake = fake.clone();
                tokio::spawn(async move {
                    let response = fake.handle(request).await;
                    respond.send_response(response);
                });
            }
        });
        service
    }

    fn backend(&self) -> KubeBackend {
        KubeBackend::new(self.client(), settings()).expect("backend")
    }

    fn insert(&self, namespace: &str, plural: &str, mut object: Value) {
        let mut state = self.state();
        state.revision += 1;
        let name = object["metadata"]["name"]
            .as_str()
            .expect("name")
            .to_string();
        let rev = state.revision;
        object["metadata"]["namespace"] = json!(namespace);
        object["metadata"]["resourceVersion"] = json!(rev.to_string());
        if object["metadata"]["uid"].is_null() {
            object["metadata"]["uid"] = json!(format!("uid-{name}"));
        }
        state
            .objects
            .entry(format!("{namespace}/{plural}"))
            .or_default()
            .insert(name, object.clone());
        emit(&mut state, namespace, plural, "ADDED", &object);
    }

    /// Changes a stored object and tells the watchers.
    fn update(&self, plural: &str, name: &str, change: impl FnOnce(&mut Value)) {
        let mut state = self.state();
        state.revision += 1;
        let rev = state.revision;
        let object = state
            .objects
            .get_mut(&format!("{NS}/{plural}"))
            .and_then(|objects| objects.get_mut(name))
            .expect("object to update");
        change(object);
        object["metadata"]["resourceVersion"] = json!(rev.to_string());
        let object = object.clone();
        emit(&mut state, NS, plural, "MODIFIED", &object);
    }

    /// Deletes a stored object (as `kubectl delete` would) and tells the
    /// watchers.
    fn remove(&self, plural: &str, name: &str) {
        let mut state = self.state();
        let removed = state
            .objects
            .get_mut(&format!("{NS}/{plural}"))
            .and_then(|objects| objects.remove(name))
            .expect("object to remove");
        emit(&mut state, NS, plural, "DELETED", &removed);
    }

    fn names(&self, plural: &str) -> Vec<String> {
        self.state()
            .objects
            .get(&format!("{NS}/{plural}"))
            .map(|objects| objects.keys().cloned().collect())
            .unwrap_or_default()
    }

    fn object(&self, plural: &str, name: &str) -> Value {
        self.state().objects[&format!("{NS}/{plural}")][name].clone()
    }

    fn fail(&self, method: Method, plural: &'static str, name: &str, code: u16) {
        self.state().faults.push(Fault {
            method,
            plural,
            name: name.to_string(),
            code,
        });
    }

    /// Requests of `method` take `latency` to answer from now on.
    fn slow(&self, method: Method, latency: Duration) {
        self.state().latency = Some((method, latency));
    }

    /// The most requests of the slow method answered at once so far.
    fn most_in_flight(&self) -> usize {
        self.state().most_in_flight
    }

    /// For each slow request so far: how many were answered at its start.
    fn in_flight_at_start(&self) -> Vec<usize> {
        self.state().in_flight_at_start.clone()
    }

    /// Every watch of `plural` answers `403` from now on.
    fn forbid_watches(&self, plural: &'static str) {
        self.state().forbidden_watches.push(plural);
    }

    /// Watches of `plural` work again (the Role was fixed).
    fn allow_watches(&self, plural: &'static str) {
        self.state().forbidden_watches.retain(|p| *p != plural);
    }

    fn requests(&self) -> Vec<Recorded> {
        self.state().requests.clone()
    }

    /// The request lines, without the watch caches' traffic and the
    /// storage class lookups.
    fn lines(&self) -> Vec<String> {
        self.requests()
            .iter()
            .filter(|r| !r.is_watch() && r.plural != PODS && r.plural != STORAGE_CLASSES)
            .map(Recorded::line)
            .collect()
    }

    async fn handle(&self, request: Request<Body>) -> Response<MockBody> {
        let (parts, body) = request.into_parts();
        let bytes = body.collect_bytes().await.expect("request body");
        let body: Value = if bytes.is_empty() {
            Value::Null
        } else {
            serde_json::from_slice(&bytes).expect("JSON request body")
        };
        let latency = self.state().latency.clone();
        if let Some((_, latency)) = latency.filter(|(method, _)| *method == parts.method) {
            {
                let mut state = self.state();
                state.in_flight += 1;
                state.most_in_flight = state.most_in_flight.max(state.in_flight);
                let now = state.in_flight;
                state.in_flight_at_start.push(now);
            }
            tokio::time::sleep(latency).await;
            self.state().in_flight -= 1;
        }
        let segments: Vec<&str> = parts.uri.path().split('/').collect();
        if parts.uri.path() == "/version" {
            let info = json!({"major": "1", "minor": "36", "gitVersion": "v1.36.3",
                "gitCommit": "", "gitTreeState": "clean", "buildDate": "", "goVersion": "go1.26",
                "compiler": "gc", "platform": "linux/amd64"});
            return respond(StatusCode::OK, &info);
        }
        if let [.., STORAGE_CLASSES, name] = segments.as_slice() {
            // A cluster-scoped object: `/apis/storage.k8s.io/v1/storageclasses/<name>`.
            let mut state = self.state();
            state.requests.push(Recorded {
                method: parts.method.clone(),
                plural: STORAGE_CLASSES.to_string(),
                namespace: String::new(),
                name: Some(name.to_string()),
                query: parts.uri.query().unwrap_or_default().to_string(),
                content_type: None,
                body: Value::Null,
            });
            let key = format!("/{STORAGE_CLASSES}");
            return match state.objects.get(&key).and_then(|o| o.get(*name)) {
                Some(object) => respond(StatusCode::OK, object),
                None => not_found(name),
            };
        }
        let Some(at) = segments.iter().position(|s| *s == "namespaces") else {
            // A list across namespaces: `/api/v1/<plural>`.
            if parts.method == Method::GET {
                if let Some(plural) = segments.last() {
                    let query = parts.uri.query().unwrap_or_default();
                    let selector = query_param(query, "labelSelector").unwrap_or_default();
                    let suffix = format!("/{plural}");
                    let items: Vec<Value> = self
                        .state()
                        .objects
                        .iter()
                        .filter(|(key, _)| key.ends_with(&suffix))
                        .flat_map(|(_, objects)| objects.values())
                        .filter(|o| selector_matches(&selector, o))
                        .cloned()
                        .collect();
                    return respond(StatusCode::OK, &list(1, items));
                }
            }
            return respond(
                StatusCode::NOT_FOUND,
                &status_body(404, "NotFound", "no such path"),
            );
        };
        let namespace = segments[at + 1].to_string();
        let plural = segments[at + 2].to_string();
        let path_name = segments.get(at + 3).map(std::string::ToString::to_string);
        let body_name = body["metadata"]["name"].as_str().map(str::to_string);
        let name = path_name.clone().or(body_name);
        let query = parts.uri.query().unwrap_or_default().to_string();
        let recorded = Recorded {
            method: parts.method.clone(),
            plural: plural.clone(),
            namespace: namespace.clone(),
            name: name.clone(),
            query: query.clone(),
            content_type: parts
                .headers
                .get(http::header::CONTENT_TYPE)
                .and_then(|v| v.to_str().ok())
                .map(str::to_string),
            body: body.clone(),
        };
        let mut state = self.state();
        state.requests.push(recorded.clone());
        // A fault named "" hits a request on the collection (no name).
        let fault = state.faults.iter().position(|f| {
            f.method == parts.method
                && f.plural == plural
                && name
                    .as_ref()
                    .map_or(f.name.is_empty(), |name| *name == f.name)
        });
        if let Some(index) = fault {
            let fault = state.faults.remove(index);
            let reason = match fault.code {
                404 => "NotFound",
                409 => "AlreadyExists",
                _ => "InternalError",
            };
            return respond(
                StatusCode::from_u16(fault.code).expect("code"),
                &status_body(fault.code, reason, "injected failure"),
            );
        }
        if recorded.is_watch() && state.forbidden_watches.iter().any(|p| *p == plural) {
            let message = format!("{plural} is forbidden: cannot watch resource \"{plural}\"");
            return respond(
                StatusCode::FORBIDDEN,
                &status_body(403, "Forbidden", &message),
            );
        }
        let key = format!("{namespace}/{plural}");
        let selector = query_param(&query, "labelSelector").unwrap_or_default();
        match (parts.method.clone(), path_name) {
            (Method::GET, None) if recorded.is_watch() => {
                let (events, receiver) = mpsc::unbounded_channel();
                state.watches.push(WatchStream {
                    namespace,
                    plural,
                    selector,
                    events,
                });
                let stream = futures::stream::unfold(receiver, |mut receiver| async move {
                    let bytes = receiver.recv().await?;
                    Some((Ok::<_, Infallible>(bytes), receiver))
                });
                Response::new(MockBody::wrap_stream(stream))
            }
            (Method::GET, None) => {
                let limit: usize = query_param(&query, "limit")
                    .and_then(|l| l.parse().ok())
                    .unwrap_or(usize::MAX);
                let items: Vec<Value> = state
                    .objects
                    .get(&key)
                    .map(|objects| {
                        objects
                            .values()
                            .filter(|o| selector_matches(&selector, o))
                            .take(limit)
                            .cloned()
                            .collect()
                    })
                    .unwrap_or_default();
                respond(StatusCode::OK, &list(state.revision, items))
            }
            (Method::GET, Some(name)) => match state.objects.get(&key).and_then(|o| o.get(&name)) {
                Some(object) => respond(StatusCode::OK, object),
                None => not_found(&name),
            },
            (Method::POST, None) => {
                let name = name.expect("POST body has a name");
                if state
                    .objects
                    .get(&key)
                    .is_some_and(|o| o.contains_key(&name))
                {
                    return respond(
                        StatusCode::CONFLICT,
                        &status_body(409, "AlreadyExists", &format!("{name} already exists")),
                    );
                }
                state.revision += 1;
                let mut object = body;
                object["metadata"]["uid"] = json!(format!("uid-{name}"));
                object["metadata"]["namespace"] = json!(namespace);
                object["metadata"]["resourceVersion"] = json!(state.revision.to_string());
                state
                    .objects
                    .entry(key)
                    .or_default()
                    .insert(name, object.clone());
                emit(&mut state, &namespace, &plural, "ADDED", &object);
                respond(StatusCode::CREATED, &object)
            }
            (Method::PATCH, Some(name)) => {
                state.revision += 1;
                let rev = state.revision;
                let Some(object) = state.objects.get_mut(&key).and_then(|o| o.get_mut(&name))
                else {
                    return not_found(&name);
                };
                if recorded.content_type.as_deref() == Some("application/json-patch+json") {
                    if let Err(message) = json_patch(object, &body) {
                        return respond(
                            StatusCode::UNPROCESSABLE_ENTITY,
                            &status_body(422, "Invalid", &message),
                        );
                    }
                } else {
                    merge(object, &body);
                }
                object["metadata"]["resourceVersion"] = json!(rev.to_string());
                let object = object.clone();
                emit(&mut state, &namespace, &plural, "MODIFIED", &object);
                respond(StatusCode::OK, &object)
            }
            (Method::DELETE, Some(name)) => {
                match state.objects.get_mut(&key).and_then(|o| o.remove(&name)) {
                    Some(object) => {
                        emit(&mut state, &namespace, &plural, "DELETED", &object);
                        respond(StatusCode::OK, &object)
                    }
                    None => not_found(&name),
                }
            }
            (Method::DELETE, None) => {
                // `deletecollection`: every object the selector matches.
                let items: Vec<Value> = state
                    .objects
                    .get_mut(&key)
                    .map(|objects| {
                        objects
                            .extract_if(.., |_, o| selector_matches(&selector, o))
                            .map(|(_, object)| object)
                            .collect()
                    })
                    .unwrap_or_default();
                for object in &items {
                    emit(&mut state, &namespace, &plural, "DELETED", object);
                }
                respond(StatusCode::OK, &list(state.revision, items))
            }
            (method, _) => respond(
                StatusCode::METHOD_NOT_ALLOWED,
                &status_body(405, "MethodNotAllowed", method.as_str()),
            ),
        }
    }
}

/// A list answer of `items` at `revision`.
fn list(revision: u64, items: Vec<Value>) -> Value {
    json!({
        "apiVersion": "v1",
        "kind": "List",
        "metadata": {"resourceVersion": revision.to_string()},
        "items": items,
    })
}

/// Sends a watch event to every matching watch stream.
fn emit(state: &mut State, namespace: &str, plural: &str, kind: &str, object: &Value) {
    let mut line = serde_json::to_vec(&json!({"type": kind, "object": object})).expect("event");
    line.push(b'\n');
    let line = Bytes::from(line);
    state.watches.retain(|watch| {
        if watch.namespace != namespace
            || watch.plural != plural
            || !selector_matches(&watch.selector, object)
        {
            return !watch.events.is_closed();
        }
        watch.events.send(line.clone()).is_ok()
    });
}

/// JSON merge of `patch` into `target` (objects merge, everything else replaces).
fn merge(target: &mut Value, patch: &Value) {
    match (target, patch) {
        (Value::Object(target), Value::Object(patch)) => {
            for (key, value) in patch {
                merge(target.entry(key.clone()).or_insert(Value::Null), value);
            }
        }
        (target, patch) => *target = patch.clone(),
    }
}

/// Applies a JSON patch (`test`, `add`, `replace`, `remove` on object
/// members) to `target`, all or nothing; the API server's message on a
/// failed `test`.
fn json_patch(target: &mut Value, ops: &Value) -> Result<(), String> {
    let mut patched = target.clone();
    for op in ops.as_array().ok_or("not a JSON patch")? {
        let path = op["path"].as_str().ok_or("op without a path")?;
        let keys: Vec<String> = path
            .split('/')
            .skip(1)
            .map(|k| k.replace("~1", "/").replace("~0", "~"))
            .collect();
        let (last, parents) = keys.split_last().ok_or("empty path")?;
        let mut parent = &mut patched;
        for key in parents {
            parent = parent.get_mut(key).ok_or(format!("missing path {path}"))?;
        }
        let parent = parent.as_object_mut().ok_or("not an object")?;
        match op["op"].as_str() {
            Some("test") if parent.get(last) == Some(&op["value"]) => {}
            Some("test") => return Err(format!("testing value {path} failed")),
            Some("add") => {
                parent.insert(last.clone(), op["value"].clone());
            }
            Some("replace") if parent.contains_key(last) => {
                parent.insert(last.clone(), op["value"].clone());
            }
            Some("remove") if parent.remove(last).is_some() => {}
            _ => return Err(format!("cannot apply {op}")),
        }
    }
    *target = patched;
    Ok(())
}

/// `k=v` and `k` (exists) terms, comma-separated.
fn selector_matches(selector: &str, object: &Value) -> bool {
    let labels = &object["metadata"]["labels"];
    selector
        .split(',')
        .filter(|t| !t.is_empty())
        .all(|term| match term.split_once('=') {
            Some((key, value)) => labels[key].as_str() == Some(value),
            None => !labels[term].is_null(),
        })
}

fn query_param(query: &str, key: &str) -> Option<String> {
    query.split('&').find_map(|pair| {
        let (k, v) = pair.split_once('=')?;
        (k == key).then(|| percent_decode(v))
    })
}

fn percent_decode(value: &str) -> String {
    let bytes = value.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'%' if i + 2 < bytes.len() => {
                let hex = std::str::from_utf8(&bytes[i + 1..i + 3]).expect("hex");
                out.push(u8::from_str_radix(hex, 16).expect("hex digit"));
                i += 3;
            }
            b'+' => {
                out.push(b' ');
                i += 1;
            }
            byte => {
                out.push(byte);
                i += 1;
            }
        }
    }
    String::from_utf8(out).expect("utf-8")
}

fn respond(code: StatusCode, body: &Value) -> Response<MockBody> {
    let bytes = Bytes::from(serde_json::to_vec(body).expect("response"));
    Response::builder()
        .status(code)
        .header(http::header::CONTENT_TYPE, "application/json")
        .body(MockBody::from(bytes))
        .expect("response")
}

fn not_found(name: &str) -> Response<MockBody> {
    respond(
        StatusCode::NOT_FOUND,
        &status_body(404, "NotFound", &format!("{name} not found")),
    )
}

fn status_body(code: u16, reason: &str, message: &str) -> Value {
    json!({
        "kind": "Status",
        "apiVersion": "v1",
        "status": "Failure",
        "message": message,
        "reason": reason,
        "code": code,
    })
}

fn settings() -> KubeSettings {
    let mut settings = KubeSettings::new(NS, "registry.example/sandbox:1");
    settings.cache_sync_timeout = Duration::from_secs(5);
    settings.initial_sync_timeout = Duration::from_secs(5);
    settings
}

fn spec(name: &str, replicas: u32, strategy: Strategy) -> PoolSpec {
    PoolSpec {
        name: name.to_string(),
        replicas,
        strategy,
        owner_scope: OWNER.to_string(),
        expires_at: None,
    }
}

fn warm_agents() -> Strategy {
    Strategy::Warm {
        pool: "agents".to_string(),
    }
}

fn dedicated() -> Strategy {
    Strategy::Dedicated {
        size: "1Gi".to_string(),
        storage_class: Some("fast".to_string()),
    }
}

fn labels(pool: &str, owner: &str) -> Value {
    json!({
        "context.rossoctl.io/pool": pool,
        "app.kubernetes.io/managed-by": "context-service",
        "context.rossoctl.io/owner": owner,
    })
}

fn ready_condition(status: &str, reason: &str, message: &str) -> Value {
    json!({"type": "Ready", "status": status, "reason": reason, "message": message})
}

fn warm_pool(name: &str) -> Value {
    json!({
        "apiVersion": "extensions.agents.x-k8s.io/v1beta1",
        "kind": "SandboxWarmPool",
        "metadata": {"name": name},
        "spec": {"replicas": 2, "sandboxTemplateRef": {"name": "tpl"}},
    })
}

fn plain_pvc(name: &str, mode: &str, labels: Value) -> Value {
    json!({
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {"name": name, "labels": labels},
        "spec": {"accessModes": [mode], "resources": {"requests": {"storage": "2Gi"}}},
    })
}

fn internal_context(error: BackendError) -> String {
    match error {
        BackendError::Internal { context, .. } => context,
        other => panic!("expected an internal error, got {other:?}"),
    }
}

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
    assert_eq!(fake.most_in_flight(), super::create::CREATES_IN_FLIGHT);
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
        super::backend::API_REQUESTS_IN_FLIGHT
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
async fn every_object_of_a_create_records_when_it_may_still_add_members() {
    let fake = FakeApi::default();
    let backend = fake.backend();
    backend.start_watchers();
    let before = k8s_openapi::jiff::Timestamp::now();
    backend
        .create_pool(&spec("windowed", 2, dedicated()))
        .await
        .expect("created");
    let mut objects = vec![
        fake.object(SANDBOXES, "sandbox-windowed-0"),
        fake.object(SANDBOXES, "sandbox-windowed-1"),
    ];
    objects.extend(fake.names(PVCS).iter().map(|n| fake.object(PVCS, n)));
    assert_eq!(objects.len(), 4);
    for object in objects {
        let until: k8s_openapi::jiff::Timestamp = object["metadata"]["annotations"]
            ["context.rossoctl.io/creating-until"]
            .as_str()
            .unwrap_or_else(|| panic!("no creating-until on {object}"))
            .parse()
            .expect("RFC 3339");
        let ahead = until.duration_since(before).as_secs();
        assert!((119..=121).contains(&ahead), "{ahead} s ahead");
    }
}

#[tokio::test]
async fn a_create_marks_its_completion_on_its_first_object_with_one_patch() {
    let fake = FakeApi::default();
    fake.insert(NS, WARM_POOLS, warm_pool("agents"));
    let backend = fake.backend();
    let existing = Strategy::Existing {
        claim_name: "data".to_string(),
        read_only: false,
    };
    fake.insert(NS, PVCS, plain_pvc("data", "ReadWriteMany", json!({})));
    let warm = warm_agents();
    let shared = Strategy::Shared {
        size: "1Gi".to_string(),
        storage_class: None,
    };
    for (pool, strategy, plural, anchor) in [
        ("d", dedicated(), PVCS, "d-workspace-0"),
        ("s", shared, PVCS, "s-workspace"),
        ("e", existing, SANDBOXES, "sandbox-e-0"),
        ("w", warm, CLAIMS, "claim-w-0"),
    ] {
        let before = fake.requests().len();
        backend
            .create_pool(&spec(pool, 2, strategy))
            .await
            .expect("created");
        let requests = fake.requests()[before..].to_vec();
        // The anchor is the first object made, and the only one with a mark.
        let posts: Vec<&Recorded> = requests
            .iter()
            .filter(|r| r.method == Method::POST)
            .collect();
        assert_eq!(posts[0].name.as_deref(), Some(anchor), "{pool}");
        for post in &posts {
            let mark = &post.body["metadata"]["annotations"]["context.rossoctl.io/created"];
            if post.name.as_deref() == Some(anchor) {
                assert_eq!(mark, "false", "{pool}");
            } else {
                assert!(mark.is_null(), "{pool}: {post:?}");
            }
        }
        // One extra request, the last: a compare-and-swap from pending.
        let last = requests.last().expect("requests");
        assert_eq!(last.line(), format!("PATCH {plural}/{anchor}"), "{pool}");
        assert_eq!(
            last.content_type.as_deref(),
            Some("application/json-patch+json")
        );
        assert_eq!(last.body[0]["op"], "test");
        let stored = fake.object(plural, anchor);
        assert_done_mark(&stored["metadata"]["annotations"]["context.rossoctl.io/created"]);
    }
}

/// A completion mark as a create writes it: the time it finished, just now.
fn assert_done_mark(mark: &Value) {
    let at: Timestamp = mark
        .as_str()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("the mark is a time: {mark}"));
    let age = Timestamp::now().duration_since(at);
    assert!(
        age >= k8s_openapi::jiff::SignedDuration::ZERO && age.as_secs() < 60,
        "{mark}"
    );
}

/// Inserts what a dedicated create of `name` with `replicas` left when
/// its process died after `made` sandboxes: every PVC, the first Sandboxes,
/// all with its window ending at `until` (the first PVC with the pending
/// completion mark).
fn half_made(fake: &FakeApi, name: &str, replicas: u32, made: u32, until: Timestamp) {
    use super::objects::{self, PoolMeta, StrategyKind, WorkspaceRecord, WorkspaceVolume};
    let meta = PoolMeta {
        name,
        replicas,
        owner_scope: OWNER,
        strategy: StrategyKind::Dedicated,
        expires_at: None,
        creating_until: Some(until),
    };
    let record = WorkspaceRecord {
        size: "1Gi".into(),
        access_mode: "ReadWriteOnce".into(),
        storage_class: None,
    };
    let pvcs: Vec<String> = (0..replicas)
        .map(|i| crate::pool::names::dedicated_workspace(name, i))
        .collect();
    for pvc in &pvcs {
        let object = objects::workspace_pvc(&settings(), &meta, pvc, "1Gi", "ReadWriteOnce", None);
        fake.insert(NS, PVCS, serde_json::to_value(&object).expect("JSON"));
    }
    for i in 0..made {
        let volume = WorkspaceVolume {
            claim_name: &pvcs[i as usize],
            read_only: false,
        };
        let object = objects::sandbox(&settings(), &meta, i, volume, &record);
        fake.insert(NS, SANDBOXES, serde_json::to_value(&object).expect("JSON"));
    }
}

/// Pool `name` once the caches show `members` members.
async fn with_members(
    backend: &KubeBackend,
    name: &str,
    members: usize,
) -> crate::pool::model::PoolStatus {
    loop {
        let status = backend.get_pool(name).await.expect("get").expect("present");
        if status.members.len() == members {
            return status;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

fn seconds_from_now(seconds: i64) -> Timestamp {
    Timestamp::now()
        .checked_add(k8s_openapi::jiff::SignedDuration::from_secs(seconds))
        .expect("time")
}

/// The annotation `key` of a stored object.
fn annotation(fake: &FakeApi, plural: &str, name: &str, key: &str) -> Value {
    fake.object(plural, name)["metadata"]["annotations"][key].clone()
}

#[tokio::test]
async fn an_abandoned_create_is_deleted_once_its_window_passed_and_nothing_else() {
    let mut short = settings();
    short.create_window = Duration::from_millis(300);
    let fake = FakeApi::default();
    // Died after PVCs 0-2 and sandbox 0; its window ended a second ago.
    half_made(&fake, "half", 3, 1, seconds_from_now(-1));
    // A reaper claimed this one and died before deleting all (window still
    // open: claimed is claimed).
    half_made(&fake, "claimed", 2, 2, seconds_from_now(60));
    fake.update(PVCS, "claimed-workspace-0", |pvc| {
        pvc["metadata"]["annotations"]["context.rossoctl.io/created"] = json!("abandoned");
    });
    // An older version's half pool: a window but no mark. Never touched.
    half_made(&fake, "old", 2, 1, seconds_from_now(-1));
    fake.update(PVCS, "old-workspace-0", |pvc| {
        let annotations = pvc["metadata"]["annotations"].as_object_mut().expect("map");
        annotations.remove("context.rossoctl.io/created");
    });
    let backend = KubeBackend::new(fake.client(), short).expect("backend");
    backend.start_watchers();
    // A completed pool whose last member someone deleted after its window.
    backend
        .create_pool(&spec("done", 2, dedicated()))
        .await
        .expect("created");
    tokio::time::sleep(Duration::from_millis(400)).await;
    fake.remove(SANDBOXES, "sandbox-done-1");

    let status = backend
        .get_pool("half")
        .await
        .expect("get")
        .expect("present");
    assert_eq!(status.phase, PoolPhase::Failed, "{status:?}");
    assert_eq!(status.reason.as_deref(), Some("CreateAbandoned"));
    assert_eq!(
        status.message.as_deref(),
        Some("the create stopped at 1 of 3 sandboxes: the replica making it went away; its objects are being deleted")
    );
    let done = with_members(&backend, "done", 1).await;
    assert_eq!(done.reason.as_deref(), Some("SandboxMissing"), "{done:?}");

    let before = fake.requests().len();
    let next = backend
        .reap_abandoned(Timestamp::now())
        .await
        .expect("reaped");
    assert_eq!(next, None);
    let lines: Vec<String> = fake.requests()[before..]
        .iter()
        .filter(|r| !r.is_watch() && r.plural != PODS)
        .map(Recorded::line)
        .collect();
    // The claimed one at once (no second claim), then "half": claimed by a
    // compare-and-swap from pending, then every object of that create, the
    // anchor last.
    assert_eq!(
        lines,
        [
            "LIST sandboxclaims",
            "LIST sandboxes",
            "LIST persistentvolumeclaims",
            "DELETE sandboxes/sandbox-claimed-0",
            "DELETE sandboxes/sandbox-claimed-1",
            "DELETE persistentvolumeclaims/claimed-workspace-1",
            "DELETE persistentvolumeclaims/claimed-workspace-0",
            "PATCH persistentvolumeclaims/half-workspace-0",
            "LIST sandboxclaims",
            "LIST sandboxes",
            "LIST persistentvolumeclaims",
            "DELETE sandboxes/sandbox-half-0",
            "DELETE persistentvolumeclaims/half-workspace-1",
            "DELETE persistentvolumeclaims/half-workspace-2",
            "DELETE persistentvolumeclaims/half-workspace-0",
        ]
    );
    assert_eq!(fake.names(SANDBOXES), ["sandbox-done-0", "sandbox-old-0"]);
    assert_eq!(
        fake.names(PVCS),
        [
            "done-workspace-0",
            "done-workspace-1",
            "old-workspace-0",
            "old-workspace-1"
        ]
    );
    assert_done_mark(&annotation(
        &fake,
        PVCS,
        "done-workspace-0",
        "context.rossoctl.io/created",
    ));
}

#[tokio::test]
async fn a_create_within_its_window_is_kept_and_the_reaper_wakes_at_its_end() {
    let fake = FakeApi::default();
    let until = seconds_from_now(60);
    half_made(&fake, "busy", 3, 1, until);
    let backend = fake.backend();
    backend.start_watchers();
    let status = backend
        .get_pool("busy")
        .await
        .expect("get")
        .expect("present");
    assert_eq!(status.phase, PoolPhase::Provisioning, "{status:?}");
    let before = fake.requests().len();
    let next = backend
        .reap_abandoned(Timestamp::now())
        .await
        .expect("reaped");
    assert_eq!(next, Some(until));
    assert!(
        fake.requests()[before..]
            .iter()
            .all(|r| r.method == Method::GET),
        "the reaper wrote"
    );
    assert_eq!(fake.names(SANDBOXES), ["sandbox-busy-0"]);
    assert_eq!(
        annotation(
            &fake,
            PVCS,
            "busy-workspace-0",
            "context.rossoctl.io/created"
        ),
        "false"
    );

    // Another replica's caches may see the mark on the first PVC before
    // the last Sandbox (one watch per kind): within the window that is
    // still `provisioning`, never `failed`.
    backend
        .create_pool(&spec("fresh", 2, dedicated()))
        .await
        .expect("created");
    fake.remove(SANDBOXES, "sandbox-fresh-1");
    let status = with_members(&backend, "fresh", 1).await;
    assert_eq!(status.phase, PoolPhase::Provisioning, "{status:?}");
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
async fn a_reaper_that_loses_the_claim_deletes_nothing_and_looks_again_soon() {
    let fake = FakeApi::default();
    half_made(&fake, "late", 2, 1, seconds_from_now(-1));
    // The creator marked it done a moment before: the test fails.
    fake.fail(Method::PATCH, PVCS, "late-workspace-0", 422);
    let backend = fake.backend();
    backend.start_watchers();
    backend
        .wait_synced(Duration::from_secs(5))
        .await
        .expect("synced");
    let now = Timestamp::now();
    let next = backend.reap_abandoned(now).await.expect("reaped");
    let next = next.expect("a next look");
    assert!(next > now && next <= seconds_from_now(1), "{next}");
    assert_eq!(fake.names(SANDBOXES), ["sandbox-late-0"]);
    assert_eq!(fake.names(PVCS).len(), 2);
    assert!(!fake.lines().iter().any(|l| l.starts_with("DELETE")));
}

#[tokio::test]
async fn a_create_that_loses_its_mark_to_a_reaper_rolls_back() {
    let fake = FakeApi::default();
    // A reaper claimed the create (it ran past its window): the mark's
    // test fails.
    fake.insert(NS, WARM_POOLS, warm_pool("agents"));
    fake.fail(Method::PATCH, CLAIMS, "claim-slow-0", 422);
    let backend = fake.backend();
    let warm = warm_agents();
    let error = backend
        .create_pool(&spec("slow", 2, warm))
        .await
        .expect_err("the mark fails");
    assert_eq!(
        internal_context(error),
        "mark the create of sandbox pool slow complete"
    );
    let lines = fake.lines();
    assert_eq!(
        lines[lines.len() - 3..],
        [
            "PATCH sandboxclaims/claim-slow-0",
            "DELETE sandboxclaims/claim-slow-1",
            "DELETE sandboxclaims/claim-slow-0",
        ]
    );
    assert!(fake.names(CLAIMS).is_empty());
}

#[tokio::test]
async fn a_create_another_replica_runs_is_provisioning_until_its_window_ends() {
    use super::objects::{self, PoolMeta, StrategyKind, WorkspaceRecord, WorkspaceVolume};
    let fake = FakeApi::default();
    // Another replica began a 2-sandbox pool and made one Sandbox; its
    // window ends in 400 ms.
    let until = k8s_openapi::jiff::Timestamp::now()
        .checked_add(k8s_openapi::jiff::SignedDuration::from_millis(400))
        .expect("time");
    let meta = PoolMeta {
        name: "elsewhere",
        replicas: 2,
        owner_scope: OWNER,
        strategy: StrategyKind::Existing,
        expires_at: None,
        creating_until: Some(until),
    };
    let volume = WorkspaceVolume {
        claim_name: "data",
        read_only: false,
    };
    let record = WorkspaceRecord {
        size: "1Gi".into(),
        access_mode: "ReadWriteOnce".into(),
        storage_class: None,
    };
    let sandbox = objects::sandbox(&settings(), &meta, 0, volume, &record);
    fake.insert(NS, SANDBOXES, serde_json::to_value(&sandbox).expect("JSON"));
    let backend = fake.backend();
    backend.start_watchers();
    backend
        .wait_synced(Duration::from_secs(5))
        .await
        .expect("synced");
    let status = backend
        .get_pool("elsewhere")
        .await
        .expect("get")
        .expect("present");
    assert_eq!(status.phase, PoolPhase::Provisioning, "{status:?}");

    // No event marks the window's end: the waiter wakes at it and reports
    // the create abandoned (its first object never got the completion mark).
    let started = tokio::time::Instant::now();
    let status = backend
        .wait_pool("elsewhere", Duration::from_secs(20))
        .await
        .expect("wait")
        .expect("present");
    assert_eq!(status.phase, PoolPhase::Failed, "{status:?}");
    assert_eq!(status.reason.as_deref(), Some("CreateAbandoned"));
    assert_eq!(
        status.message.as_deref(),
        Some("the create stopped at 1 of 2 sandboxes: the replica making it went away; its objects are being deleted")
    );
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );

    // Within a create's window, a gap is a member deleted since (creates add
    // members in index order): failed at once.
    let gap = PoolMeta {
        name: "gap",
        creating_until: k8s_openapi::jiff::Timestamp::now()
            .checked_add(k8s_openapi::jiff::SignedDuration::from_secs(60))
            .ok(),
        ..meta
    };
    let sandbox = objects::sandbox(&settings(), &gap, 1, volume, &record);
    fake.insert(NS, SANDBOXES, serde_json::to_value(&sandbox).expect("JSON"));
    let status = loop {
        match backend.get_pool("gap").await.expect("get") {
            Some(status) => break status,
            None => tokio::time::sleep(Duration::from_millis(5)).await,
        }
    };
    assert_eq!(status.phase, PoolPhase::Failed, "{status:?}");
    assert_eq!(status.message.as_deref(), Some("1 of 2 sandboxes exist"));
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

/// Waits until `check` holds, at most 5 s.
async fn until(what: &str, check: impl Fn() -> bool) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    while !check() {
        assert!(tokio::time::Instant::now() < deadline, "never: {what}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// The storage class lookups so far.
fn class_lookups(fake: &FakeApi) -> usize {
    fake.requests()
        .iter()
        .filter(|r| r.plural == STORAGE_CLASSES)
        .count()
}

async fn watching(fake: &FakeApi, settings: KubeSettings) -> Arc<KubeBackend> {
    let backend = Arc::new(KubeBackend::new(fake.client(), settings).expect("backend"));
    backend.start_watchers();
    backend
        .wait_synced(Duration::from_secs(5))
        .await
        .expect("synced");
    backend
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
