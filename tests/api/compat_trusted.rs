//! Upstream's trusted ("Moca") API, byte for byte: every route's answer and
//! every error code it documents (status, `{error, message}` body, and the
//! headers that matter: `WWW-Authenticate`, `Cache-Control: no-store`,
//! `Content-Disposition`).

use std::time::{Duration, Instant, SystemTime};

use bytes::Bytes;
use futures::channel::mpsc::unbounded;
use reqwest::{header, Method};
use serde_json::{json, Value};

use crate::common::workload_bundles::{gunzip, noise, sha256, tgz, unpack, MEDIA};
use crate::common::{json_of, Caller, TestServer};
use crate::compat_support::{assert_json, error_body, exact};
use crate::trusted_support::*;

const NS: &str = "team1";
const NAME: &str = "research";

fn rev(c: char) -> String {
    c.to_string().repeat(64)
}

/// `{contextId, name, namespace, type, status[, currentRevision,
/// frozenRevision]}` as upstream's encoder writes it.
fn view_bytes(id: &str, current: Option<&str>, frozen: Option<&str>) -> String {
    let mut s = format!(
        r#"{{"contextId":"{id}","name":"{NAME}","namespace":"{NS}","type":"workspace","status":"ready""#
    );
    if let Some(c) = current {
        s += &format!(r#","currentRevision":"{c}""#);
    }
    if let Some(f) = frozen {
        s += &format!(r#","frozenRevision":"{f}""#);
    }
    s + "}\n"
}

/// Asserts a successful JSON answer with `Cache-Control: no-store`.
async fn assert_stored_json(resp: reqwest::Response, status: u16, body: &str) {
    let got = exact(resp).await;
    assert_eq!((got.status, got.body.as_str()), (status, body), "{got:?}");
    assert_eq!(got.content_type.as_deref(), Some("application/json"));
    assert_eq!(got.headers[header::CACHE_CONTROL], "no-store");
}

/// Every trusted route but the upload, with a body where it takes one.
fn routes() -> Vec<(Method, String, Option<Value>)> {
    let path = context_path(NS, NAME);
    vec![
        (
            Method::POST,
            "/internal/v1/contexts".into(),
            Some(create_body(NS, NAME)),
        ),
        (Method::POST, format!("/v1{path}/upload-capabilities"), None),
        (
            Method::POST,
            format!("/internal/v1{path}/freeze"),
            Some(json!({"revision": rev('a')})),
        ),
        (
            Method::GET,
            format!("/internal/v1{path}/revisions/{}/bundle", rev('a')),
            None,
        ),
        (Method::DELETE, format!("/internal/v1{path}"), None),
    ]
}

async fn call(
    caller: &Caller,
    method: &Method,
    path: &str,
    body: &Option<Value>,
) -> reqwest::Response {
    let mut req = caller.request(method.clone(), path);
    if let Some(body) = body {
        req = req.json(body);
    }
    req.send().await.expect("answer")
}

#[tokio::test]
async fn the_service_is_authenticated_first_with_a_bearer_challenge() {
    let (server, _token) = server().await;
    let user_jwt = server.user_token("moca");
    let callers = [
        Caller::anonymous(&server).with_header("x-context-subject", "user:alice"),
        Caller::with_token(&server, "not-the-service-token")
            .with_header("x-context-subject", "user:alice"),
        // A valid JWT without the scope `delegate` is no service.
        Caller::with_token(&server, user_jwt).with_header("x-context-subject", "user:alice"),
        Caller::with_token(&server, format!("{SERVICE_TOKEN}x"))
            .with_header("x-context-subject", "user:alice"),
        // Before the subject is even looked at.
        Caller::anonymous(&server),
    ];
    for (method, path, body) in routes() {
        for caller in &callers {
            let got = exact(call(caller, &method, &path, &body).await).await;
            assert_eq!(
                (got.status, got.body.as_str()),
                (401, error_body("unauthorized", UNAUTHORIZED).as_str()),
                "{method} {path}: {got:?}"
            );
            assert_eq!(got.headers[header::WWW_AUTHENTICATE], "Bearer");
            assert_eq!(got.content_type.as_deref(), Some("application/json"));
        }
    }
}

#[tokio::test]
async fn the_subject_must_be_a_delegated_kind_and_name() {
    let (server, _token) = server().await;
    let service = Caller::with_token(&server, SERVICE_TOKEN);
    let bad = [
        None,
        Some("alice"),
        Some("group:alice"),
        Some("user:"),
        Some(":alice"),
        Some("User:alice"),
        Some("sub:alice"),
        Some("user:anonymous"),
        Some("service:context-service-admin"),
    ];
    for (method, path, body) in routes() {
        for subject in bad {
            let caller = match subject {
                Some(s) => service.with_header("x-context-subject", s),
                None => service.clone(),
            };
            let got = exact(call(&caller, &method, &path, &body).await).await;
            assert_eq!(
                (got.status, got.body.as_str()),
                (400, error_body("invalid_subject", INVALID_SUBJECT).as_str()),
                "{method} {path} as {subject:?}: {got:?}"
            );
        }
    }
}

#[tokio::test]
async fn a_delegate_jwt_or_x_sh_auth_also_authenticates_the_service() {
    let (server, _token) = server().await;
    let jwt = Caller::with_token(&server, server.token("moca", "delegate"))
        .with_header("x-context-subject", "user:alice");
    let created = create(&jwt, NS, NAME).await;
    assert_eq!(created["name"], NAME);
    // The service token in upstream clients' header reaches the same subject.
    let sh = Caller::anonymous(&server)
        .with_header("x-sh-auth", SERVICE_TOKEN)
        .with_header("x-context-subject", "user:alice");
    let resp = sh
        .post("/internal/v1/contexts", &create_body(NS, NAME))
        .await;
    assert_json(
        resp,
        409,
        &error_body("already_exists", "context already exists"),
    )
    .await;

    // Without a configured token, only delegate JWTs are services.
    let plain = TestServer::start().await;
    let resp = moca(&plain, "user:alice")
        .post("/internal/v1/contexts", &create_body(NS, NAME))
        .await;
    assert_json(resp, 401, &error_body("unauthorized", UNAUTHORIZED)).await;
    let jwt = Caller::with_token(&plain, plain.token("moca", "delegate"))
        .with_header("x-context-subject", "agent:planner");
    create(&jwt, NS, NAME).await;
}

#[tokio::test]
async fn create_answers_the_trusted_view_or_upstreams_errors() {
    let (server, _token) = server().await;
    let alice = moca(&server, "user:github:alice");
    let resp = alice
        .post("/internal/v1/contexts", &create_body(NS, NAME))
        .await;
    let got = exact(resp).await;
    let view: Value = serde_json::from_str(&got.body).expect("JSON");
    let id = view["contextId"].as_str().expect("contextId");
    assert_eq!(id.len(), 32, "{id}");
    assert_eq!(got.status, 201);
    assert_eq!(got.body, view_bytes(id, None, None));
    assert_eq!(got.headers[header::CACHE_CONTROL], "no-store");
    // No storage attachment is ever shown.
    assert!(!got.body.contains("claimName") && !got.body.contains("storage"));

    let resp = alice
        .post("/internal/v1/contexts", &create_body(NS, NAME))
        .await;
    assert_json(
        resp,
        409,
        &error_body("already_exists", "context already exists"),
    )
    .await;

    let storage = json!({"backend": "pvc", "size": "1Gi", "accessMode": "ReadWriteOnce"});
    let cases = [
        (
            json!({"name": "Bad", "namespace": NS, "type": "workspace", "storage": storage}),
            "name must be a lowercase Kubernetes name no longer than 50 characters",
        ),
        (
            json!({"name": "a", "namespace": "a.b", "type": "workspace", "storage": storage}),
            "namespace must be a lowercase Kubernetes name",
        ),
        (
            json!({"name": "a", "namespace": NS, "type": "notes", "storage": storage}),
            "type must be workspace, state, memory, knowledge, or artifacts",
        ),
        (
            json!({"name": "a", "namespace": NS, "type": "state",
                   "storage": {"backend": "s3", "size": "1Gi", "accessMode": "ReadWriteOnce"}}),
            "storage.backend must be pvc",
        ),
        (
            json!({"name": "a", "namespace": NS, "type": "state",
                   "storage": {"backend": "pvc", "size": "-1Gi", "accessMode": "ReadWriteOnce"}}),
            "storage.size must be a positive Kubernetes quantity",
        ),
        (
            json!({"name": "a", "namespace": NS, "type": "state",
                   "storage": {"backend": "pvc", "size": "1Gi", "accessMode": "RWO"}}),
            "storage.accessMode must be ReadWriteOnce or ReadWriteMany",
        ),
        (
            json!({"name": "a", "namespace": NS, "type": "state", "owner": "x"}),
            "json: unknown field \"owner\"",
        ),
        (
            json!({"name": 5}),
            "json: cannot unmarshal number into Go struct field CreateRequest.name of type string",
        ),
    ];
    for (body, message) in cases {
        let resp = alice.post("/internal/v1/contexts", &body).await;
        assert_json(resp, 400, &error_body("invalid_request", message)).await;
    }
    let resp = alice
        .post_raw("/internal/v1/contexts", "application/json", "")
        .await;
    assert_json(resp, 400, &error_body("invalid_request", "EOF")).await;
}

#[tokio::test]
async fn capabilities_have_upstreams_shape_and_refusals() {
    let (server, _token) = server().await;
    let alice = moca(&server, "user:alice");
    let path = format!("/v1{}/upload-capabilities", context_path(NS, NAME));
    assert_json(
        alice.send(Method::POST, &path).await,
        404,
        &error_body("not_found", "context not found"),
    )
    .await;
    create(&alice, NS, NAME).await;

    let before = SystemTime::now();
    let got = exact(alice.send(Method::POST, &path).await).await;
    let cap: Value = serde_json::from_str(&got.body).expect("JSON");
    let url = cap["uploadUrl"].as_str().unwrap();
    let token = cap["token"].as_str().unwrap();
    let expires = cap["expiresAt"].as_str().unwrap();
    let id = url.strip_prefix("/v1/uploads/").expect("upload URL");
    let base64url = |s: &str| {
        s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
    };
    // 18 and 32 random bytes, base64url without padding.
    assert!(id.len() == 24 && base64url(id), "{id}");
    assert!(token.len() == 43 && base64url(token), "{token}");
    assert_eq!(got.status, 201);
    assert_eq!(
        got.body,
        format!(
            r#"{{"uploadUrl":"{url}","token":"{token}","expiresAt":"{expires}","method":"PUT","contentType":"{MEDIA}","maxBytes":268435456}}"#
        ) + "\n"
    );
    assert_eq!(got.headers[header::CACHE_CONTROL], "no-store");
    // Go's time.Time: UTC, no trailing zeros in the fraction.
    let fraction = expires
        .strip_suffix('Z')
        .and_then(|t| t.split_once('.'))
        .map(|(_, f)| f);
    assert!(
        expires.ends_with('Z') && fraction.is_none_or(|f| !f.is_empty() && !f.ends_with('0')),
        "{expires}"
    );
    let at = humantime::parse_rfc3339(expires).expect("RFC 3339");
    let ttl = at.duration_since(before).expect("in the future");
    assert!(
        ttl > Duration::from_secs(298) && ttl <= Duration::from_secs(301),
        "{ttl:?}"
    );

    // Frozen: no new capabilities.
    let revision = json_of(put(&server, &cap, bundle("v1")).await, 201).await["revision"]
        .as_str()
        .unwrap()
        .to_owned();
    json_of(freeze(&alice, NS, NAME, &revision).await, 200).await;
    assert_json(
        alice.send(Method::POST, &path).await,
        409,
        &error_body("context_frozen", "context is frozen"),
    )
    .await;
}

#[tokio::test]
async fn uploads_check_media_type_then_size_then_capability() {
    let (server, _token) = server_with(|c| c.bundle_max_bytes = 1 << 20).await;
    let alice = moca(&server, "user:alice");
    create(&alice, NS, NAME).await;
    let cap = capability(&alice, NS, NAME).await;
    let url = cap["uploadUrl"].as_str().unwrap().to_owned();
    // Every upload route takes the same media types (ours: upstream's, and
    // `application/gzip`, in any case), with the same refusal.
    let media = |shown: &str| {
        error_body(
            "unsupported_media_type",
            &format!(
                "bundles are sent as application/vnd.rossoctl.context or application/gzip, not {shown}"
            ),
        )
    };
    // 415 before anything else, even without a token.
    let nobody = Caller::anonymous(&server);
    for ct in ["application/octet-stream", "text/plain"] {
        assert_json(nobody.put(&url, ct, bundle("x")).await, 415, &media(ct)).await;
    }
    let resp = nobody
        .request(Method::PUT, &url)
        .body(bundle("x"))
        .send()
        .await
        .unwrap();
    assert_json(resp, 415, &media("(no Content-Type)")).await;
    // 413 on the declared size, before the capability.
    let too_large = error_body(
        "upload_too_large",
        "compressed context bundle exceeds 1 MiB",
    );
    let big = vec![0u8; (1 << 20) + 1];
    assert_json(nobody.put(&url, MEDIA, big).await, 413, &too_large).await;
    // 401 for a missing, wrong or unknown capability; no challenge here.
    let denied = error_body(
        "unauthorized",
        "upload capability is invalid, expired, or already used",
    );
    let wrong = Caller::with_token(&server, "x".repeat(43));
    let unknown = format!("/v1/uploads/{}", "A".repeat(24));
    let token = cap["token"].as_str().unwrap();
    for (caller, path) in [
        (&nobody, url.as_str()),
        (&wrong, url.as_str()),
        (&Caller::with_token(&server, token), unknown.as_str()),
    ] {
        let got = exact(caller.put(path, MEDIA, bundle("x")).await).await;
        assert_eq!(
            (got.status, got.body.as_str()),
            (401, denied.as_str()),
            "{got:?}"
        );
        assert!(got.headers.get(header::WWW_AUTHENTICATE).is_none());
    }
    // A parameter on the media type is fine; a broken bundle is 400.
    let with_param = Caller::with_token(&server, token);
    let resp = with_param
        .put(
            &url,
            &format!("{MEDIA}; charset=binary"),
            b"not gzip".to_vec(),
        )
        .await;
    let body = json_of(resp, 400).await;
    assert_eq!(body["error"], "invalid_request");
    let message = body["message"].as_str().unwrap();
    assert!(
        message.starts_with("context bundle rejected: "),
        "{message}"
    );
    // A chunked (undeclared) body past the limit is 413 as well.
    let large = tgz(&[("knowledge/big.bin", &noise(3 << 20, 7))]);
    let chunks: Vec<Result<Bytes, std::io::Error>> = large
        .chunks(64 << 10)
        .map(|c| Ok(Bytes::copy_from_slice(c)))
        .collect();
    let resp = with_param
        .request(Method::PUT, &url)
        .header(header::CONTENT_TYPE, MEDIA)
        .body(reqwest::Body::wrap_stream(futures::stream::iter(chunks)))
        .send()
        .await
        .unwrap();
    assert_json(resp, 413, &too_large).await;

    // Success: 201, upstream's fields, no-store.
    let got = exact(put(&server, &cap, bundle("v1")).await).await;
    let result: Value = serde_json::from_str(&got.body).expect("JSON");
    let revision = result["revision"].as_str().unwrap();
    let bytes = result["bytes"].as_u64().unwrap();
    assert_eq!(got.status, 201, "{got:?}");
    assert_eq!(
        got.body,
        format!(
            r#"{{"revision":"{revision}","files":2,"bytes":{bytes},"workspacePath":".context-service/materialized/{revision}"}}"#
        ) + "\n"
    );
    assert_eq!(got.headers[header::CACHE_CONTROL], "no-store");
    // Used: 401 from now on.
    assert_json(put(&server, &cap, bundle("v2")).await, 401, &denied).await;
}

#[tokio::test]
async fn freeze_answers_the_view_or_upstreams_errors() {
    let (server, _token) = server().await;
    let alice = moca(&server, "user:alice");
    let invalid = error_body(
        "invalid_request",
        "revision must be a lowercase SHA-256 digest",
    );
    // The revision is checked before the Context is looked up.
    for bad in ["latest", &rev('A'), &"a".repeat(63)] {
        assert_json(freeze(&alice, NS, NAME, bad).await, 400, &invalid).await;
    }
    let path = format!("/internal/v1{}/freeze", context_path(NS, NAME));
    let resp = alice
        .post(&path, &json!({"revision": rev('a'), "force": true}))
        .await;
    assert_json(
        resp,
        400,
        &error_body("invalid_request", "json: unknown field \"force\""),
    )
    .await;
    let resp = alice.post_raw(&path, "application/json", "").await;
    assert_json(resp, 400, &error_body("invalid_request", "EOF")).await;
    let missing = error_body("not_found", "context not found");
    assert_json(freeze(&alice, NS, NAME, &rev('a')).await, 404, &missing).await;

    let view = create(&alice, NS, NAME).await;
    let id = view["contextId"].as_str().unwrap().to_owned();
    let mismatch = error_body(
        "revision_mismatch",
        "revision is not the context's current revision",
    );
    // Nothing uploaded yet.
    assert_json(freeze(&alice, NS, NAME, &rev('a')).await, 409, &mismatch).await;
    let cap = capability(&alice, NS, NAME).await;
    let revision = json_of(put(&server, &cap, bundle("v1")).await, 201).await["revision"]
        .as_str()
        .unwrap()
        .to_owned();
    assert_json(freeze(&alice, NS, NAME, &rev('a')).await, 409, &mismatch).await;

    let frozen = view_bytes(&id, Some(&revision), Some(&revision));
    assert_stored_json(freeze(&alice, NS, NAME, &revision).await, 200, &frozen).await;
    // Idempotent for the frozen revision; another one is not current.
    assert_stored_json(freeze(&alice, NS, NAME, &revision).await, 200, &frozen).await;
    assert_json(freeze(&alice, NS, NAME, &rev('b')).await, 409, &mismatch).await;
}

/// Waits until `n` uploads are admitted (the gauge on `/metrics`).
async fn until_running(server: &TestServer, n: i64) {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let text = Caller::anonymous(server)
            .get("/metrics")
            .await
            .text()
            .await
            .unwrap();
        let running = text
            .lines()
            .find_map(|l| l.strip_prefix("context_service_uploads_running "))
            .and_then(|v| v.trim().parse::<i64>().ok());
        if running == Some(n) {
            return;
        }
        assert!(Instant::now() < deadline, "uploads running: {running:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn freeze_during_an_upload_is_upload_in_progress() {
    let (server, _token) = server().await;
    let alice = moca(&server, "user:alice");
    create(&alice, NS, NAME).await;
    let first = capability(&alice, NS, NAME).await;
    let revision = json_of(put(&server, &first, bundle("v1")).await, 201).await["revision"]
        .as_str()
        .unwrap()
        .to_owned();
    // A second upload starts and holds its body open.
    let cap = capability(&alice, NS, NAME).await;
    let data = bundle("v2");
    let (tx, rx) = unbounded::<Result<Bytes, std::io::Error>>();
    tx.unbounded_send(Ok(Bytes::copy_from_slice(&data[..10])))
        .unwrap();
    let req = Caller::with_token(&server, cap["token"].as_str().unwrap())
        .request(Method::PUT, cap["uploadUrl"].as_str().unwrap())
        .header(header::CONTENT_TYPE, MEDIA)
        .body(reqwest::Body::wrap_stream(rx));
    let pending = tokio::spawn(async move { req.send().await.expect("answer") });
    until_running(&server, 1).await;
    assert_json(
        freeze(&alice, NS, NAME, &revision).await,
        409,
        &error_body("upload_in_progress", "a context upload is in progress"),
    )
    .await;
    tx.unbounded_send(Ok(Bytes::copy_from_slice(&data[10..])))
        .unwrap();
    drop(tx);
    let second = json_of(pending.await.unwrap(), 201).await;
    let current = second["revision"].as_str().unwrap();
    assert_ne!(current, revision);
    // The earlier revision is no longer current; the new one freezes.
    let body = json_of(freeze(&alice, NS, NAME, current).await, 200).await;
    assert_eq!(body["frozenRevision"], current);
}

#[tokio::test]
async fn export_streams_only_the_frozen_revision() {
    let (server, _token) = server().await;
    let alice = moca(&server, "user:alice");
    let invalid = error_body(
        "invalid_request",
        "revision must be a lowercase SHA-256 digest",
    );
    assert_json(export(&alice, NS, NAME, "latest").await, 400, &invalid).await;
    let missing = error_body("not_found", "context not found");
    assert_json(export(&alice, NS, NAME, &rev('a')).await, 404, &missing).await;
    create(&alice, NS, NAME).await;
    let cap = capability(&alice, NS, NAME).await;
    let data = bundle("v1");
    let revision = json_of(put(&server, &cap, data.clone()).await, 201).await["revision"]
        .as_str()
        .unwrap()
        .to_owned();
    // Current but not frozen: not found.
    assert_json(export(&alice, NS, NAME, &revision).await, 404, &missing).await;
    json_of(freeze(&alice, NS, NAME, &revision).await, 200).await;
    assert_json(export(&alice, NS, NAME, &rev('b')).await, 404, &missing).await;

    let resp = export(&alice, NS, NAME, &revision).await;
    assert_eq!(resp.status(), 200);
    assert_eq!(header_of(&resp, header::CONTENT_TYPE), Some(MEDIA));
    assert_eq!(header_of(&resp, header::CACHE_CONTROL), Some("no-store"));
    let disposition = format!("attachment; filename=\"context-{revision}.context\"");
    assert_eq!(
        header_of(&resp, header::CONTENT_DISPOSITION),
        Some(disposition.as_str())
    );
    let len: usize = header_of(&resp, header::CONTENT_LENGTH)
        .unwrap()
        .parse()
        .unwrap();
    let body = resp.bytes().await.unwrap().to_vec();
    assert_eq!(body.len(), len);
    // Our revision is the sha256 of the canonical tar inside the bundle.
    assert_eq!(sha256(&gunzip(&body)), revision);
    assert_eq!(unpack(&body), unpack(&data));
}

#[tokio::test]
async fn delete_answers_204_then_404() {
    let (server, _token) = server().await;
    let alice = moca(&server, "user:alice");
    create(&alice, NS, NAME).await;
    let got = exact(remove(&alice, NS, NAME).await).await;
    assert_eq!((got.status, got.body.as_str()), (204, ""));
    assert_eq!(got.content_type, None);
    // Moca treats 404 as already deleted.
    let missing = error_body("not_found", "context not found");
    assert_json(remove(&alice, NS, NAME).await, 404, &missing).await;
    for (ns, name) in [("Team_1", NAME), (NS, "Bad_Name")] {
        assert_json(remove(&alice, ns, name).await, 404, &missing).await;
    }
    // `?force=true` deletes the same way.
    create(&alice, NS, NAME).await;
    let path = format!("/internal/v1{}?force=true", context_path(NS, NAME));
    let got = exact(alice.delete(&path).await).await;
    assert_eq!((got.status, got.body.as_str()), (204, ""));
    assert_json(remove(&alice, NS, NAME).await, 404, &missing).await;
}

#[tokio::test]
async fn a_weak_service_token_stops_the_start() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("service-token");
    std::fs::write(&path, "short-token\n").unwrap();
    let refused = TestServer::try_start_with(|c| c.service_token_file = Some(path.clone()))
        .await
        .err()
        .expect("refused");
    let message = format!("{refused:#}");
    assert!(
        message.contains("--service-token-file/CS_SERVICE_TOKEN_FILE")
            && message.contains("the service token must be at least 32 bytes; it is 11"),
        "{message}"
    );
    let missing = dir.path().join("absent");
    assert!(
        TestServer::try_start_with(|c| c.service_token_file = Some(missing))
            .await
            .is_err()
    );
}
