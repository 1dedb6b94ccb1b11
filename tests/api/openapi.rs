//! `GET /openapi.json`: the document lists exactly the routes the router
//! serves, every answer of the error paths below is listed under its route
//! (the recorder in `common::answers` checks every answer of every API
//! test the same way), and a real OpenAPI validator accepts it.

use std::path::{Path, PathBuf};

use reqwest::Method;
use serde_json::{json, Value};

use crate::common::answers::{self, Answer};
use crate::common::{assert_error, Caller, TestServer};

/// Every documented operation: (method, path template, operation).
fn operations(doc: &Value) -> Vec<(Method, String, Value)> {
    let mut ops = Vec::new();
    for (path, item) in doc["paths"].as_object().expect("paths") {
        for (method, op) in item.as_object().expect("path item") {
            let method = Method::from_bytes(method.to_ascii_uppercase().as_bytes())
                .unwrap_or_else(|_| panic!("{path}: {method} is not a method"));
            ops.push((method, path.clone(), op.clone()));
        }
    }
    ops
}

/// The names of the operation's security schemes.
fn schemes(op: &Value) -> Vec<&str> {
    op["security"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|s| s.as_object())
        .flat_map(|s| s.keys().map(String::as_str))
        .collect()
}

/// `template` with every `{param}` replaced by `value`.
fn fill(template: &str, value: &str) -> String {
    template
        .split('/')
        .map(|seg| {
            if seg.starts_with('{') && seg.ends_with('}') {
                value
            } else {
                seg
            }
        })
        .collect::<Vec<_>>()
        .join("/")
}

/// A body the operation's JSON decoder accepts, so the request reaches
/// the handler's own checks.
fn sample_body(op: &Value) -> Option<Value> {
    match op["operationId"].as_str()? {
        "createPool" => Some(json!({"name": "probe", "replicas": 1})),
        "createContext" => Some(json!({"name": "probe", "namespace": "default"})),
        "createWorkload" => Some(json!({})),
        "activateWorkload" => Some(json!({"revision": "probe"})),
        "deliverWorkload" => Some(json!({"runId": "probe", "pool": "probe"})),
        _ => None,
    }
}

/// `method path` as `caller`, with the operation's sample body.
async fn call(caller: &Caller, method: &Method, path: &str, op: &Value) -> reqwest::Response {
    match sample_body(op) {
        Some(body) => caller.request(method.clone(), path).json(&body),
        None => caller.request(method.clone(), path),
    }
    .send()
    .await
    .unwrap_or_else(|e| panic!("{method} {path}: {e}"))
}

/// The answer's status and error code, asserted to be listed for `route`.
async fn documented(resp: reqwest::Response, method: &Method, route: &str) -> (u16, String) {
    let status = resp.status().as_u16();
    let text = resp.text().await.expect("body");
    let code = serde_json::from_str::<Value>(&text)
        .ok()
        .and_then(|v| v["error"].as_str().map(str::to_owned))
        .unwrap_or_default();
    let answer = Answer {
        method: method.to_string(),
        route: route.to_owned(),
        status,
        code: code.clone(),
    };
    if let Some(why) = answers::undocumented(answers::document(), &answer) {
        panic!("{why} (body {text})");
    }
    (status, code)
}

#[tokio::test]
async fn the_served_document_is_the_generated_one() {
    let server = TestServer::start().await;
    let resp = Caller::anonymous(&server).get("/openapi.json").await;
    assert_eq!(resp.status(), 200);
    assert_eq!(
        resp.headers()["content-type"].to_str().unwrap(),
        "application/json"
    );
    let served: Value = resp.json().await.expect("JSON");
    assert_eq!(&served, answers::document());
    assert!(served["openapi"].as_str().unwrap().starts_with("3.1"));
    // Every error response names its codes, and each code once.
    for (method, path, op) in operations(&served) {
        assert!(op["operationId"].is_string(), "{method} {path}");
        for (status, response) in op["responses"].as_object().unwrap() {
            let codes = &response["x-error-codes"];
            if status.starts_with('4') || status.starts_with('5') {
                let codes = codes
                    .as_array()
                    .unwrap_or_else(|| panic!("{method} {path} {status}: no x-error-codes"));
                assert!(!codes.is_empty(), "{method} {path} {status}");
            } else {
                assert!(codes.is_null(), "{method} {path} {status}");
            }
        }
    }
}

/// A workload is `{name}` in every path (as in the docs and the metrics'
/// route labels), and a run id carries the validator's own pattern, in the
/// body and in the path.
#[test]
fn workload_paths_say_name_and_run_ids_carry_their_pattern() {
    use context_service::delivery::{is_valid_run_id, RUN_ID_PATTERN};
    let doc = answers::document();
    let workload_paths: Vec<String> = operations(doc)
        .into_iter()
        .map(|(_, path, _)| path)
        .filter(|p| p.starts_with("/v1/workloads/"))
        .collect();
    assert!(workload_paths.len() >= 8, "{workload_paths:?}");
    for (method, path, op) in operations(doc) {
        if !path.starts_with("/v1/workloads/") {
            continue;
        }
        assert!(path.starts_with("/v1/workloads/{name}"), "{method} {path}");
        let names: Vec<&str> = op["parameters"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|p| p["in"] == "path")
            .map(|p| p["name"].as_str().unwrap())
            .collect();
        assert_eq!(names.first(), Some(&"name"), "{method} {path}");
    }
    let body = &doc["components"]["schemas"]["DeliverBody"]["properties"]["runId"];
    assert_eq!(body["pattern"], RUN_ID_PATTERN, "{body}");
    assert_eq!(body["type"], "string", "{body}");
    assert!(body["description"].is_string(), "{body}");
    let (_, _, release) = operations(doc)
        .into_iter()
        .find(|(m, p, _)| *m == Method::DELETE && p == "/v1/workloads/{name}/deliveries/{run}")
        .expect("the release operation");
    let run = release["parameters"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["name"] == "run")
        .expect("the run parameter");
    assert_eq!(run["schema"]["pattern"], RUN_ID_PATTERN, "{run}");
    assert_eq!(run["required"], true, "{run}");
    // The pattern is the validator's rule.
    assert_eq!(RUN_ID_PATTERN, "^[a-z0-9][a-z0-9._-]{0,62}$");
    assert!(is_valid_run_id(&"a".repeat(63)) && !is_valid_run_id(&"a".repeat(64)));
}

/// Document → router: every documented operation is routed (answered by
/// its handler, not by the mux's `404 page not found` or `405`), and its
/// unauthenticated answer is one it lists.
#[tokio::test]
async fn every_documented_operation_is_routed() {
    let server = TestServer::start().await;
    let anonymous = Caller::anonymous(&server);
    let doc = answers::document();
    let ops = operations(doc);
    assert!(ops.len() >= 24, "{} operations", ops.len());
    for (method, route, op) in &ops {
        let path = fill(route, "probe");
        let resp = call(&anonymous, method, &path, op).await;
        let content_type = resp
            .headers()
            .get("content-type")
            .map(|v| v.to_str().unwrap_or("").to_owned())
            .unwrap_or_default();
        assert!(
            !content_type.starts_with("text/plain") || route == "/metrics",
            "{method} {path}: answered by the mux ({content_type})"
        );
        let schemes = schemes(op);
        let (status, code) = documented(resp, method, route).await;
        if schemes.contains(&"service") {
            // The trusted routes answer upstream's code.
            assert_eq!(
                (status, code.as_str()),
                (401, "unauthorized"),
                "{method} {path}"
            );
        } else if !schemes.is_empty() {
            assert_eq!(
                (status, code.as_str()),
                (401, "token_required"),
                "{method} {path}"
            );
        } else {
            assert_eq!(status, 200, "{method} {path}");
        }
    }
}

/// Router → document: every route is registered through `routes!`, which
/// documents it; a plain `.route(...)` (or a nested or merged axum router)
/// in the service would be served undocumented. The exceptions: the
/// `/metrics` listener of `--metrics-addr`, which serves no API, and the
/// OCI distribution API under `/v2`, which is the distribution spec's
/// (docs/oci.md; tested by tests/api/registry.rs and the conformance
/// suite).
#[test]
fn no_route_is_registered_outside_the_documented_list() {
    const ALLOWED: &[(&str, &str)] = &[
        (
            "src/api/mod.rs",
            ".route(\"/metrics\", get(metrics::render))",
        ),
        ("src/api/registry/mod.rs", ".route(\"/v2\", any(dispatch))"),
        ("src/api/registry/mod.rs", ".route(\"/v2/\", any(dispatch))"),
        (
            "src/api/registry/mod.rs",
            ".route(\"/v2/{*rest}\", any(dispatch))",
        ),
    ];
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut files = Vec::new();
    rust_files(&root.join("src"), &mut files);
    assert!(files.len() > 20, "found {} source files", files.len());
    let mut found = Vec::new();
    for file in files {
        let rel = file
            .strip_prefix(root)
            .unwrap()
            .to_string_lossy()
            .into_owned();
        let text = std::fs::read_to_string(&file).expect("source");
        // Routes are registered on axum routers only; elsewhere `.route(`
        // is some other method (the bundle pipeline's `self.route(...)`).
        if !text.contains("Router") {
            continue;
        }
        for (n, line) in text.lines().enumerate() {
            let line = line.trim();
            let registers = [".route(", ".route_service(", ".nest(", ".nest_service("]
                .iter()
                .any(|call| line.contains(call));
            if registers && !ALLOWED.contains(&(rel.as_str(), line)) {
                found.push(format!("{rel}:{}: {line}", n + 1));
            }
        }
    }
    assert!(
        found.is_empty(),
        "routes registered without `routes!` (so missing from /openapi.json):\n{}",
        found.join("\n")
    );
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).expect("read dir") {
        let path = entry.expect("entry").path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// A request that provokes an error: method, path, content type and body,
/// then the status, code and message part of the answer.
type Provoked = (
    Method,
    &'static str,
    Option<(&'static str, Vec<u8>)>,
    u16,
    &'static str,
    &'static str,
);

/// Each route's error paths answer statuses and codes its entry lists
/// (with the error body asserted).
#[tokio::test]
async fn error_answers_are_listed_for_their_routes() {
    let server = TestServer::start().await;
    let doc = answers::document();
    let ops = operations(doc);

    // A token without scopes: 403 on every user-token route.
    let no_scope = Caller::with_token(&server, server.token("alice", ""));
    for (method, route, op) in &ops {
        if !schemes(op).contains(&"bearer") {
            continue;
        }
        let path = fill(route, "probe");
        let resp = call(&no_scope, method, &path, op).await;
        let (status, code) = documented(resp, method, route).await;
        assert_eq!(
            (status, code.as_str()),
            (403, "scope_missing"),
            "{method} {path}"
        );
    }

    let alice = Caller::user(&server, "alice");
    let route_of = |method: &Method, path: &str| -> String {
        ops.iter()
            .find(|(m, r, _)| m == method && matches(r, path))
            .map(|(_, r, _)| r.clone())
            .unwrap_or_else(|| panic!("{method} {path} is not documented"))
    };
    let cases: Vec<Provoked> = vec![
        (
            Method::GET,
            "/v1/sandbox-pools/%FF",
            None,
            400,
            "invalid_request",
            "UTF-8",
        ),
        (
            Method::GET,
            "/v1/sandbox-pools/x?wait=soon",
            None,
            400,
            "invalid_request",
            "wait must be",
        ),
        (
            Method::GET,
            "/v1/sandbox-pools/nope",
            None,
            404,
            "not_found",
            "sandbox pool not found",
        ),
        (
            Method::DELETE,
            "/v1/sandbox-pools/nope",
            None,
            404,
            "not_found",
            "sandbox pool not found",
        ),
        (
            Method::POST,
            "/v1/sandbox-pools",
            Some(("application/json", b"{".to_vec())),
            400,
            "invalid_request",
            "",
        ),
        (
            Method::GET,
            "/v1/namespaces/default/contexts/nope",
            None,
            404,
            "not_found",
            "context resource not found",
        ),
        (
            Method::DELETE,
            "/v1/namespaces/default/contexts/nope",
            None,
            404,
            "not_found",
            "context resource not found",
        ),
        (
            Method::GET,
            "/v1/workloads/nope",
            None,
            404,
            "workload_not_found",
            "nope",
        ),
        (
            Method::DELETE,
            "/v1/workloads/nope",
            None,
            404,
            "workload_not_found",
            "nope",
        ),
        (
            Method::POST,
            "/v1/workloads/nope/uploads",
            None,
            404,
            "workload_not_found",
            "nope",
        ),
        (
            Method::PUT,
            "/v1/workloads/nope/bundle",
            Some(("application/gzip", b"x".to_vec())),
            404,
            "workload_not_found",
            "nope",
        ),
        (
            Method::POST,
            "/v1/workloads/nope/activate",
            Some(("application/json", br#"{"revision":"XYZ"}"#.to_vec())),
            400,
            "revision_invalid",
            "XYZ",
        ),
        (
            Method::POST,
            "/v1/workloads",
            Some(("text/plain", b"{}".to_vec())),
            415,
            "unsupported_media_type",
            "application/json",
        ),
        (
            Method::POST,
            "/v1/workloads",
            Some(("application/json", vec![b' '; 2 << 20])),
            413,
            "body_too_large",
            "exceeds",
        ),
        (
            Method::POST,
            "/v1/workloads",
            Some(("application/json", br#"{"name":"Bad Name!"}"#.to_vec())),
            400,
            "workload_name_invalid",
            "Bad Name!",
        ),
        (
            Method::POST,
            "/v1/workloads",
            Some((
                "application/json",
                br#"{"name":"oa","type":"bogus"}"#.to_vec(),
            )),
            400,
            "context_type_invalid",
            "bogus",
        ),
        (
            Method::POST,
            "/v1/workloads/nope/deliveries",
            Some(("application/json", br#"{"runId":"r"}"#.to_vec())),
            400,
            "invalid_request",
            "exactly one of",
        ),
    ];
    for (method, path, body, status, code, message) in cases {
        let route = route_of(&method, path);
        let mut req = alice.request(method.clone(), path);
        if let Some((content_type, bytes)) = body {
            req = req.header("content-type", content_type).body(bytes);
        }
        let resp = req.send().await.expect("request");
        let listed = Answer {
            method: method.to_string(),
            route: route.clone(),
            status,
            code: code.to_owned(),
        };
        assert_eq!(answers::undocumented(doc, &listed), None, "{method} {path}");
        assert_error(resp, status, code, message).await;
    }

    // A workload that exists: name taken, uploads refused.
    let resp = alice.post("/v1/workloads", &json!({"name": "oa"})).await;
    assert_eq!(resp.status(), 201);
    let resp = alice.post("/v1/workloads", &json!({"name": "oa"})).await;
    assert_error(resp, 409, "workload_name_taken", "oa").await;
    let resp = alice
        .put("/v1/workloads/oa/bundle", "text/plain", "x")
        .await;
    assert_error(resp, 415, "unsupported_media_type", "text/plain").await;
    let resp = Caller::with_token(&server, "forged")
        .put("/v1/uploads/nope", "application/gzip", "x")
        .await;
    assert_error(resp, 401, "token_invalid", "").await;

    // A trusted service acting for a subject it may not name.
    let delegate = Caller::with_token(&server, server.token("svc", "delegate workloads:read"))
        .with_header("X-Context-Subject", "group:x");
    let resp = delegate.get("/v1/workloads").await;
    assert_error(resp, 400, "invalid_request", "").await;

    // The trusted routes: a delegate JWT acting for a subject.
    let svc = || Caller::with_token(&server, server.token("moca", "delegate"));
    let moca = svc().with_header("X-Context-Subject", "user:alice");
    let trusted: Vec<(Caller, Provoked)> = vec![
        (
            svc(),
            (
                Method::DELETE,
                "/internal/v1/namespaces/default/contexts/nope",
                None,
                400,
                "invalid_subject",
                "X-Context-Subject",
            ),
        ),
        (
            Caller::with_token(&server, server.token("moca", "workloads:read"))
                .with_header("X-Context-Subject", "user:alice"),
            (
                Method::DELETE,
                "/internal/v1/namespaces/default/contexts/nope",
                None,
                401,
                "unauthorized",
                "control-plane",
            ),
        ),
        (
            moca.clone(),
            (
                Method::DELETE,
                "/internal/v1/namespaces/default/contexts/nope",
                None,
                404,
                "not_found",
                "context not found",
            ),
        ),
        (
            moca.clone(),
            (
                Method::POST,
                "/v1/namespaces/default/contexts/nope/upload-capabilities",
                None,
                404,
                "not_found",
                "context not found",
            ),
        ),
        (
            moca.clone(),
            (
                Method::POST,
                "/internal/v1/namespaces/default/contexts/nope/freeze",
                Some(("application/json", br#"{"revision":"XYZ"}"#.to_vec())),
                400,
                "invalid_request",
                "SHA-256",
            ),
        ),
        (
            moca.clone(),
            (
                Method::GET,
                "/internal/v1/namespaces/default/contexts/nope/revisions/XYZ/bundle",
                None,
                400,
                "invalid_request",
                "SHA-256",
            ),
        ),
        (
            moca.clone(),
            (
                Method::POST,
                "/internal/v1/contexts",
                Some(("application/json", br#"{"name":"Bad!"}"#.to_vec())),
                400,
                "invalid_request",
                "name must be",
            ),
        ),
        // A capability id (24 base64url characters) on the shared upload
        // route answers upstream's codes.
        (
            Caller::with_token(&server, "forged"),
            (
                Method::PUT,
                "/v1/uploads/AAAAAAAAAAAAAAAAAAAAAAAA",
                Some(("text/plain", b"x".to_vec())),
                415,
                "unsupported_media_type",
                "application/vnd.rossoctl.context",
            ),
        ),
        (
            Caller::with_token(&server, "forged"),
            (
                Method::PUT,
                "/v1/uploads/AAAAAAAAAAAAAAAAAAAAAAAA",
                Some(("application/vnd.rossoctl.context", b"x".to_vec())),
                401,
                "unauthorized",
                "capability",
            ),
        ),
    ];
    for (caller, (method, path, body, status, code, message)) in trusted {
        let route = route_of(&method, path);
        let mut req = caller.request(method.clone(), path);
        if let Some((content_type, bytes)) = body {
            req = req.header("content-type", content_type).body(bytes);
        }
        let resp = req.send().await.expect("request");
        let listed = Answer {
            method: method.to_string(),
            route: route.clone(),
            status,
            code: code.to_owned(),
        };
        assert_eq!(answers::undocumented(doc, &listed), None, "{method} {path}");
        assert_error(resp, status, code, message).await;
    }

    // What the whole process has answered so far, for the log.
    let seen = answers::seen();
    eprintln!("OpenAPI: {} distinct answers recorded", seen.len());
    answers::check();
}

/// Whether `path` (without its query) fits the `template`'s segments.
fn matches(template: &str, path: &str) -> bool {
    let path = path.split('?').next().unwrap_or(path);
    let t: Vec<&str> = template.split('/').collect();
    let p: Vec<&str> = path.split('/').collect();
    t.len() == p.len()
        && t.iter()
            .zip(&p)
            .all(|(t, p)| (t.starts_with('{') && t.ends_with('}')) || t == p)
}

/// `openapi-spec-validator` (PyPI; installed by `.ci/run`) accepts the
/// served document. Without it the test is skipped with a note, except in
/// CI (`CI` set), where its absence fails.
#[tokio::test]
async fn a_real_validator_accepts_the_document() {
    const VALIDATOR: &str = "openapi-spec-validator";
    let found = std::process::Command::new(VALIDATOR)
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    if !found {
        assert!(
            std::env::var_os("CI").is_none(),
            "{VALIDATOR} is not installed (pip install openapi-spec-validator)"
        );
        eprintln!("note: {VALIDATOR} is not installed; skipping the validation");
        return;
    }
    let server = TestServer::start().await;
    let resp = Caller::anonymous(&server).get("/openapi.json").await;
    assert_eq!(resp.status(), 200);
    let text = resp.text().await.expect("body");
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("openapi.json");
    std::fs::write(&file, &text).expect("write");
    let out = std::process::Command::new(VALIDATOR)
        .arg(&file)
        .output()
        .expect("run the validator");
    assert!(
        out.status.success(),
        "{VALIDATOR} rejects the document:\n{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}
