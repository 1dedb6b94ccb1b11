//! [`KubeBackend`] against a mocked Kubernetes API: a `tower-test` mock
//! service answered by a small in-memory API server that records every
//! request, can inject failures and streams watch events. This file holds
//! the fake and the fixtures; the tests are in one file per concern
//! (`create`, `delete`, `caches`, `abandoned`, `named_contexts`, `binding`).

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

mod abandoned;
mod binding;
mod caches;
mod create;
mod delete;
mod named_contexts;

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

/// Waits until `check` holds, at most 5 s.
async fn until(what: &str, check: impl Fn() -> bool) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    while !check() {
        assert!(tokio::time::Instant::now() < deadline, "never: {what}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
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
