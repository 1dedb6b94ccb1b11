//! Helpers of the trusted ("Moca") API tests: a server with a service token,
//! callers acting for a subject, and the steps of the flow.

use reqwest::{header, Method, Response};
use serde_json::{json, Value};

use crate::common::workload_bundles::{tgz, MEDIA};
use crate::common::{json_of, Caller, TestServer};
use context_service::config::ServeConfig;

/// The service token the test servers trust.
pub(crate) const SERVICE_TOKEN: &str = "moca-service-token-0123456789abcdefABCDEF";

/// The message of every refused service credential.
pub(crate) const UNAUTHORIZED: &str = "valid control-plane bearer token required";

/// The message of every refused `X-Context-Subject`.
pub(crate) const INVALID_SUBJECT: &str =
    "X-Context-Subject must contain a valid delegated kind:name";

/// A server trusting [`SERVICE_TOKEN`] (the file lives in the data dir's
/// parent temp dir, kept by the returned guard), after `adjust`.
pub(crate) async fn server_with(
    adjust: impl FnOnce(&mut ServeConfig),
) -> (TestServer, tempfile::TempDir) {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("service-token");
    std::fs::write(&path, format!("{SERVICE_TOKEN}\n")).expect("token file");
    let server = TestServer::start_with(|c| {
        c.service_token_file = Some(path);
        adjust(c);
    })
    .await;
    (server, dir)
}

/// [`server_with`] default settings.
pub(crate) async fn server() -> (TestServer, tempfile::TempDir) {
    server_with(|_| {}).await
}

/// The platform service (service token) acting for `subject`.
pub(crate) fn moca(server: &TestServer, subject: &str) -> Caller {
    Caller::with_token(server, SERVICE_TOKEN).with_header("x-context-subject", subject)
}

/// `POST /internal/v1/contexts` body for `name` in `namespace`.
pub(crate) fn create_body(namespace: &str, name: &str) -> Value {
    json!({"name": name, "namespace": namespace, "type": "workspace",
           "storage": {"backend": "pvc", "size": "1Gi", "accessMode": "ReadWriteOnce"}})
}

/// `/namespaces/<ns>/contexts/<name>`.
pub(crate) fn context_path(namespace: &str, name: &str) -> String {
    format!("/namespaces/{namespace}/contexts/{name}")
}

/// Creates `namespace/name` as `caller`; the trusted view.
pub(crate) async fn create(caller: &Caller, namespace: &str, name: &str) -> Value {
    let resp = caller
        .post("/internal/v1/contexts", &create_body(namespace, name))
        .await;
    json_of(resp, 201).await
}

/// Issues an upload capability for `namespace/name` as `caller`.
pub(crate) async fn capability(caller: &Caller, namespace: &str, name: &str) -> Value {
    let path = format!("/v1{}/upload-capabilities", context_path(namespace, name));
    json_of(caller.send(Method::POST, &path).await, 201).await
}

/// `PUT`s `bundle` with capability `cap` (its URL and token).
pub(crate) async fn put(server: &TestServer, cap: &Value, bundle: Vec<u8>) -> Response {
    let url = cap["uploadUrl"].as_str().expect("uploadUrl");
    let token = cap["token"].as_str().expect("token");
    Caller::with_token(server, token)
        .put(url, MEDIA, bundle)
        .await
}

/// A small valid bundle whose content depends on `seed`.
pub(crate) fn bundle(seed: &str) -> Vec<u8> {
    tgz(&[
        ("knowledge/notes.md", seed.as_bytes()),
        ("memory/state.json", b"{}"),
    ])
}

/// `POST .../freeze {revision}` as `caller`.
pub(crate) async fn freeze(
    caller: &Caller,
    namespace: &str,
    name: &str,
    revision: &str,
) -> Response {
    let path = format!("/internal/v1{}/freeze", context_path(namespace, name));
    caller.post(&path, &json!({ "revision": revision })).await
}

/// `GET .../revisions/<revision>/bundle` as `caller`.
pub(crate) async fn export(
    caller: &Caller,
    namespace: &str,
    name: &str,
    revision: &str,
) -> Response {
    let path = format!(
        "/internal/v1{}/revisions/{revision}/bundle",
        context_path(namespace, name)
    );
    caller.get(&path).await
}

/// `DELETE /internal/v1/namespaces/<ns>/contexts/<name>` as `caller`.
pub(crate) async fn remove(caller: &Caller, namespace: &str, name: &str) -> Response {
    let path = format!("/internal/v1{}", context_path(namespace, name));
    caller.delete(&path).await
}

/// The value of header `name`, if any.
pub(crate) fn header_of(resp: &Response, name: header::HeaderName) -> Option<&str> {
    resp.headers().get(name).and_then(|v| v.to_str().ok())
}
