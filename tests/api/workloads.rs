//! The workloads API over real HTTP: lifecycle, every error code, owner
//! isolation, grants, concurrency and downloads.

use crate::common::workload_bundles::{gunzip, noise, sha256, tgz, tgz_raw_name, unpack, MEDIA};
use crate::common::{assert_error, eventually, Caller, TestServer};
use context_service::client::ClientError;
use reqwest::{header, Method};
use serde_json::{json, Value};

fn api_code(e: &ClientError) -> (u16, String) {
    match e {
        ClientError::Api { status, body } => (status.as_u16(), body.error.clone()),
        other => panic!("expected an API error, got {other}"),
    }
}

/// Creates `name` for `sub`, uploads `files`, and returns the upload answer.
async fn uploaded(server: &TestServer, sub: &str, name: &str, files: &[(&str, &[u8])]) -> Value {
    let client = server.client(sub);
    client.create_workload(Some(name), None).await.unwrap();
    let rev = client.upload_bundle(name, tgz(files)).await.unwrap();
    serde_json::to_value(rev).unwrap()
}

#[tokio::test]
async fn full_lifecycle_through_the_typed_client() {
    let server = TestServer::start().await;
    let client = server.client("alice");

    let created = client.create_workload(Some("docs"), None).await.unwrap();
    assert_eq!(created.name, "docs");
    assert_eq!(created.kind, "workspace");
    assert_eq!(created.status, "awaiting_upload");
    assert!(created.revision.is_none());
    let grant = created
        .upload
        .clone()
        .expect("create answers an upload grant");
    assert!(grant.url.starts_with("/v1/uploads/"), "{}", grant.url);
    assert_eq!(grant.method, "PUT");
    assert_eq!(grant.content_type, MEDIA);
    assert_eq!(grant.max_bytes, 256 * 1024 * 1024);
    assert!(grant.token.len() >= 43, "32 random bytes, base64url");

    // Upload with the one-time grant (no user token).
    let files: &[(&str, &[u8])] = &[
        ("README.md", b"hello\n"),
        ("src/main.rs", b"fn main() {}\n"),
    ];
    let rev = client.upload_with_grant(&grant, tgz(files)).await.unwrap();
    assert_eq!(rev.name, "docs");
    assert_eq!(rev.files, 2);
    assert_eq!(rev.revision.len(), 64);
    assert_eq!(rev.bundle_digest.len(), 64);

    // The same files, differently ordered and compressed, give the same revision.
    let reordered: &[(&str, &[u8])] = &[
        ("src/main.rs", b"fn main() {}\n"),
        ("README.md", b"hello\n"),
    ];
    let rev2 = client.upload_bundle("docs", tgz(reordered)).await.unwrap();
    assert_eq!(rev2.revision, rev.revision);

    let got = client.workload("docs").await.unwrap();
    // An upload waits for activation.
    assert_eq!(got.status, "awaiting_activation");
    assert_eq!(
        got.candidate_revision.as_deref(),
        Some(rev.revision.as_str())
    );

    let active = client
        .activate_workload("docs", &rev.revision)
        .await
        .unwrap();
    assert_eq!(active.status, "ready");
    assert_eq!(active.revision.as_deref(), Some(rev.revision.as_str()));
    assert_eq!(
        active.bundle_digest.as_deref(),
        Some(rev.bundle_digest.as_str())
    );
    // Idempotent.
    let again = client
        .activate_workload("docs", &rev.revision)
        .await
        .unwrap();
    assert_eq!(again.status, "ready");

    let list = client.workloads().await.unwrap();
    assert_eq!(list.len(), 1);
    assert_eq!(list[0].name, "docs");

    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("docs.tar.gz");
    let report = client
        .download_bundle("docs", &rev.revision, &out, |_, _| {})
        .await
        .unwrap();
    assert_eq!(report.bundle_digest, rev.bundle_digest);
    assert_eq!(report.revision, rev.revision);
    let bytes = std::fs::read(&out).unwrap();
    assert_eq!(bytes.len() as u64, rev.bytes);
    assert_eq!(sha256(&bytes), rev.bundle_digest);
    assert_eq!(sha256(&gunzip(&bytes)), rev.revision);
    assert_eq!(
        unpack(&bytes),
        vec![
            ("README.md".to_owned(), b"hello\n".to_vec()),
            ("src/main.rs".to_owned(), b"fn main() {}\n".to_vec()),
        ]
    );

    client.delete_workload("docs").await.unwrap();
    let err = client.workload("docs").await.unwrap_err();
    assert_eq!(api_code(&err), (404, "workload_not_found".into()));
    let resp = Caller::user(&server, "alice")
        .get(&format!(
            "/v1/workloads/docs/revisions/{}/bundle",
            rev.revision
        ))
        .await;
    assert_error(resp, 404, "workload_not_found", "docs").await;
    assert!(client.workloads().await.unwrap().is_empty());
    // The blob is gone too: nothing else names it.
    let blobs = server.data_dir.join("blobs/sha256");
    let count = walk_files(&blobs);
    assert_eq!(count, 0, "blob removed on delete");
    // The name is free again.
    client.create_workload(Some("docs"), None).await.unwrap();
}

fn walk_files(dir: &std::path::Path) -> usize {
    let mut n = 0;
    for e in std::fs::read_dir(dir).unwrap() {
        let e = e.unwrap();
        if e.file_type().unwrap().is_dir() {
            n += walk_files(&e.path());
        } else {
            n += 1;
        }
    }
    n
}

#[tokio::test]
async fn create_validation_and_conflicts() {
    let server = TestServer::start_with(|c| c.workload_quota = 2).await;
    let alice = Caller::user(&server, "alice");
    // Default name and type with an empty body.
    let resp = alice.send(Method::POST, "/v1/workloads").await;
    assert_eq!(resp.status(), 201);
    let body: Value = resp.json().await.unwrap();
    let name = body["name"].as_str().unwrap();
    assert!(name.starts_with("wl-") && name.len() == 11, "{name}");
    assert_eq!(body["type"], "workspace");
    assert!(body.get("owner").is_none(), "never shows the owner: {body}");
    assert!(!body.to_string().contains("alice"), "{body}");

    assert_error(
        alice
            .post("/v1/workloads", &json!({"name": "Bad_Name"}))
            .await,
        400,
        "workload_name_invalid",
        "Bad_Name",
    )
    .await;
    assert_error(
        alice
            .post("/v1/workloads", &json!({"name": "a".repeat(51)}))
            .await,
        400,
        "workload_name_invalid",
        "at most 50",
    )
    .await;
    assert_error(
        alice
            .post("/v1/workloads", &json!({"name": "ok", "type": "nope"}))
            .await,
        400,
        "context_type_invalid",
        "nope",
    )
    .await;
    assert_error(
        alice
            .post(
                "/v1/workloads",
                &json!({"name": "ok", "contextUpload": true}),
            )
            .await,
        400,
        "invalid_request",
        "unknown field `contextUpload`",
    )
    .await;
    assert_error(
        alice
            .post("/v1/workloads", &json!(["not", "an", "object"]))
            .await,
        400,
        "invalid_request",
        "invalid JSON body",
    )
    .await;
    let resp = alice
        .post_raw("/v1/workloads", "application/json", "{\"name\": ")
        .await;
    assert_error(resp, 400, "invalid_request", "invalid JSON body").await;
    let resp = alice
        .post_raw("/v1/workloads", "text/plain", "{\"name\": \"x\"}")
        .await;
    assert_error(resp, 415, "unsupported_media_type", "application/json").await;
    let huge = json!({"name": "x".repeat(1024 * 1024 + 10)});
    assert_error(
        alice.post("/v1/workloads", &huge).await,
        413,
        "body_too_large",
        "1048576",
    )
    .await;

    let resp = alice
        .post(
            "/v1/workloads",
            &json!({"name": "second", "type": "memory"}),
        )
        .await;
    assert_eq!(resp.status(), 201);
    assert_error(
        alice
            .post("/v1/workloads", &json!({"name": "second"}))
            .await,
        409,
        "workload_name_taken",
        "second",
    )
    .await;
    // Quota of 2 reached (the default-named one and "second").
    assert_error(
        alice.post("/v1/workloads", &json!({"name": "third"})).await,
        429,
        "workload_quota_exceeded",
        "2 workloads",
    )
    .await;
    // Another owner has their own quota and namespace.
    let resp = Caller::user(&server, "bob")
        .post("/v1/workloads", &json!({"name": "second"}))
        .await;
    assert_eq!(resp.status(), 201);
}

#[tokio::test]
async fn upload_errors() {
    let server = TestServer::start_with(|c| c.bundle_max_bytes = 64 * 1024).await;
    let alice = Caller::user(&server, "alice");
    server
        .client("alice")
        .create_workload(Some("w"), None)
        .await
        .unwrap();

    assert_error(
        alice
            .put("/v1/workloads/w/bundle", "text/plain", tgz(&[("a", b"a")]))
            .await,
        415,
        "unsupported_media_type",
        "text/plain",
    )
    .await;
    // application/gzip is accepted too.
    assert_eq!(
        alice
            .put(
                "/v1/workloads/w/bundle",
                "application/gzip",
                tgz(&[("a", b"a")])
            )
            .await
            .status(),
        201
    );

    // Declared too large: refused before the body is read.
    let big = tgz(&[("n.bin", &noise(100 * 1024, 1))]);
    assert_error(
        alice
            .put("/v1/workloads/w/bundle", MEDIA, big.clone())
            .await,
        413,
        "upload_too_large",
        "limit is 65536",
    )
    .await;
    // Chunked (no Content-Length): counted while streaming.
    let chunks: Vec<Result<Vec<u8>, std::io::Error>> =
        big.chunks(8192).map(|c| Ok(c.to_vec())).collect();
    let resp = alice
        .put(
            "/v1/workloads/w/bundle",
            MEDIA,
            reqwest::Body::wrap_stream(futures::stream::iter(chunks)),
        )
        .await;
    assert_error(resp, 413, "upload_too_large", "65536").await;

    // Rejected bundles name the inspector's reason and the entry.
    assert_error(
        alice
            .put(
                "/v1/workloads/w/bundle",
                MEDIA,
                tgz_raw_name("../x", b"evil"),
            )
            .await,
        400,
        "bundle_rejected",
        "path_traversal: ../x",
    )
    .await;
    assert_error(
        alice
            .put("/v1/workloads/w/bundle", MEDIA, b"not gzip at all".to_vec())
            .await,
        400,
        "bundle_rejected",
        "gzip",
    )
    .await;
    // Nothing of the rejected uploads stays on disk: one blob (the accepted one).
    assert_eq!(walk_files(&server.data_dir.join("blobs/sha256")), 1);
    assert_eq!(walk_files(&server.data_dir.join("tmp")), 0);

    // Unknown workload.
    let resp = alice
        .put("/v1/workloads/nope/bundle", MEDIA, tgz(&[("a", b"a")]))
        .await;
    assert_error(resp, 404, "workload_not_found", "nope").await;

    // Rejections are counted by reason on /metrics.
    let metrics = Caller::anonymous(&server)
        .get("/metrics")
        .await
        .text()
        .await
        .unwrap();
    for line in [
        "context_service_bundle_rejections_total{reason=\"path_traversal\"} 1",
        "context_service_bundle_rejections_total{reason=\"upload_too_large\"} 1",
        "context_service_bundle_uploads_total 1",
    ] {
        assert!(metrics.contains(line), "{line} missing from:\n{metrics}");
    }
}

#[tokio::test]
async fn activation_rules() {
    let server = TestServer::start().await;
    let alice = Caller::user(&server, "alice");
    let client = server.client("alice");
    client.create_workload(Some("w"), None).await.unwrap();
    let activate = |rev: &str| {
        let body = json!({ "revision": rev });
        let alice = alice.clone();
        async move { alice.post("/v1/workloads/w/activate", &body).await }
    };
    // Checked before the lookup.
    assert_error(
        activate("abc").await,
        400,
        "revision_invalid",
        "64 lowercase hex",
    )
    .await;
    let resp = alice
        .post(
            "/v1/workloads/missing/activate",
            &json!({ "revision": "XYZ" }),
        )
        .await;
    assert_error(resp, 400, "revision_invalid", "XYZ").await;
    let resp = alice.post("/v1/workloads/w/activate", &json!({})).await;
    assert_error(resp, 400, "invalid_request", "missing field `revision`").await;
    assert_error(
        activate(&"a".repeat(64)).await,
        409,
        "revision_mismatch",
        "nothing has been uploaded",
    )
    .await;

    let first = client
        .upload_bundle("w", tgz(&[("a", b"1")]))
        .await
        .unwrap();
    let second = client
        .upload_bundle("w", tgz(&[("a", b"2")]))
        .await
        .unwrap();
    assert_ne!(first.revision, second.revision);
    // The second upload replaced the candidate.
    assert_error(
        activate(&first.revision).await,
        409,
        "revision_mismatch",
        &second.revision,
    )
    .await;
    // Downloading before activation.
    let resp = alice
        .get(&format!(
            "/v1/workloads/w/revisions/{}/bundle",
            second.revision
        ))
        .await;
    assert_error(
        resp,
        409,
        "workload_not_ready",
        "workload \"w\" is awaiting_activation; activate its uploaded revision first",
    )
    .await;

    assert_eq!(activate(&second.revision).await.status(), 200);
    assert_eq!(activate(&second.revision).await.status(), 200);
    assert_error(
        activate(&first.revision).await,
        409,
        "workload_already_active",
        &second.revision,
    )
    .await;
    // A ready workload is frozen.
    let err = client
        .upload_bundle("w", tgz(&[("a", b"3")]))
        .await
        .unwrap_err();
    assert_eq!(api_code(&err), (409, "workload_already_active".into()));
    let err = client.upload_grant("w").await.unwrap_err();
    assert_eq!(api_code(&err), (409, "workload_already_active".into()));
    // The replaced candidate's blob was collected: only the active one stays.
    assert_eq!(walk_files(&server.data_dir.join("blobs/sha256")), 1);
    // Another revision of a ready workload is not served.
    let resp = alice
        .get(&format!(
            "/v1/workloads/w/revisions/{}/bundle",
            first.revision
        ))
        .await;
    assert_error(resp, 404, "revision_not_found", &first.revision).await;
    let resp = alice.get("/v1/workloads/w/revisions/nothex/bundle").await;
    assert_error(resp, 400, "revision_invalid", "nothex").await;
}

#[tokio::test]
async fn grants_are_single_use_bound_and_survive_failures() {
    let server =
        TestServer::start_with(|c| c.upload_grant_ttl = std::time::Duration::from_secs(2)).await;
    let alice = server.client("alice");
    let bob = server.client("bob");
    let grant = alice
        .create_workload(Some("a"), None)
        .await
        .unwrap()
        .upload
        .unwrap();
    bob.create_workload(Some("b"), None).await.unwrap();

    // A failed upload leaves the grant usable.
    let err = alice
        .upload_with_grant(&grant, tgz_raw_name("/abs", b"x"))
        .await
        .unwrap_err();
    assert_eq!(api_code(&err), (400, "bundle_rejected".into()));
    // B cannot use A's grant as a token for B's workload.
    let resp = Caller::with_token(&server, &grant.token)
        .put("/v1/workloads/b/bundle", MEDIA, tgz(&[("f", b"b")]))
        .await;
    assert_error(resp, 401, "token_invalid", "").await;
    // Nor with a wrong secret on A's grant URL.
    let mut forged = grant.clone();
    forged.token = "A".repeat(43);
    let err = bob
        .upload_with_grant(&forged, tgz(&[("f", b"b")]))
        .await
        .unwrap_err();
    assert_eq!(api_code(&err), (401, "token_invalid".into()));
    // No token at all.
    let resp = Caller::anonymous(&server)
        .put(&grant.url, MEDIA, tgz(&[("f", b"b")]))
        .await;
    assert_error(resp, 401, "token_required", "").await;

    let rev = alice
        .upload_with_grant(&grant, tgz(&[("f", b"a")]))
        .await
        .unwrap();
    assert_eq!(rev.name, "a");
    // Single use.
    let err = alice
        .upload_with_grant(&grant, tgz(&[("f", b"a2")]))
        .await
        .unwrap_err();
    assert_eq!(api_code(&err), (401, "token_invalid".into()));
    // It landed in A's workload, and B's is untouched.
    assert_eq!(
        alice.workload("a").await.unwrap().candidate_revision,
        Some(rev.revision)
    );
    assert!(bob
        .workload("b")
        .await
        .unwrap()
        .candidate_revision
        .is_none());

    // A fresh grant expires.
    let fresh = alice.upload_grant("a").await.unwrap();
    tokio::time::sleep(std::time::Duration::from_millis(2100)).await;
    let err = alice
        .upload_with_grant(&fresh, tgz(&[("f", b"late")]))
        .await
        .unwrap_err();
    assert_eq!(api_code(&err), (401, "token_expired".into()));

    // A grant dies with its workload, even if the name is re-created.
    let g2 = alice.upload_grant("a").await.unwrap();
    alice.delete_workload("a").await.unwrap();
    alice.create_workload(Some("a"), None).await.unwrap();
    let err = alice
        .upload_with_grant(&g2, tgz(&[("f", b"x")]))
        .await
        .unwrap_err();
    assert_eq!(api_code(&err), (401, "token_invalid".into()));
}

#[tokio::test]
async fn owners_are_isolated() {
    let server = TestServer::start().await;
    let rev = uploaded(&server, "alice", "secret", &[("k", b"v")]).await;
    let revision = rev["revision"].as_str().unwrap().to_owned();
    server
        .client("alice")
        .activate_workload("secret", &revision)
        .await
        .unwrap();
    let bob = server.client("bob");
    bob.create_workload(Some("mine"), None).await.unwrap();

    // Bob sees exactly what a missing workload looks like.
    let bob_calls = Caller::user(&server, "bob");
    for (method, path) in [
        (Method::GET, "/v1/workloads/secret".to_owned()),
        (Method::DELETE, "/v1/workloads/secret".to_owned()),
        (Method::POST, "/v1/workloads/secret/uploads".to_owned()),
        (
            Method::GET,
            format!("/v1/workloads/secret/revisions/{revision}/bundle"),
        ),
    ] {
        let resp = bob_calls.send(method, &path).await;
        assert_error(resp, 404, "workload_not_found", "\"secret\"").await;
    }
    let resp = bob_calls
        .post(
            "/v1/workloads/secret/activate",
            &json!({"revision": revision}),
        )
        .await;
    assert_error(resp, 404, "workload_not_found", "secret").await;
    let resp = bob_calls
        .put("/v1/workloads/secret/bundle", MEDIA, tgz(&[("x", b"y")]))
        .await;
    assert_error(resp, 404, "workload_not_found", "secret").await;
    // A name that is missing everywhere answers the same way.
    let resp = bob_calls.get("/v1/workloads/nothing").await;
    assert_error(resp, 404, "workload_not_found", "\"nothing\"").await;

    let names: Vec<String> = bob
        .workloads()
        .await
        .unwrap()
        .into_iter()
        .map(|w| w.name)
        .collect();
    assert_eq!(names, vec!["mine"]);
    // Bob may use the same name for his own workload.
    bob.create_workload(Some("secret"), None).await.unwrap();
    // Alice's workload is untouched.
    let w = server.client("alice").workload("secret").await.unwrap();
    assert_eq!(w.status, "ready");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_uploads_to_one_workload() {
    // Room for all 8 at once (the default is 4 per owner).
    let server = TestServer::start_with(|c| c.upload_max_per_owner = 8).await;
    let client = server.client("alice");
    client.create_workload(Some("busy"), None).await.unwrap();
    let tasks: Vec<_> = (0..8u8)
        .map(|i| {
            let client = client.clone();
            tokio::spawn(async move {
                let body = tgz(&[("data.bin", &noise(200_000, u64::from(i))), ("i", &[i])]);
                client.upload_bundle("busy", body).await
            })
        })
        .collect();
    let mut revisions = Vec::new();
    for t in tasks {
        revisions.push(t.await.unwrap().unwrap().revision);
    }
    let w = client.workload("busy").await.unwrap();
    let candidate = w.candidate_revision.unwrap();
    assert!(revisions.contains(&candidate));
    // Only the winner's blob stays.
    assert_eq!(walk_files(&server.data_dir.join("blobs/sha256")), 1);
    let active = client.activate_workload("busy", &candidate).await.unwrap();
    assert_eq!(active.status, "ready");

    // One grant, many concurrent users: exactly one upload lands.
    let grant = client
        .create_workload(Some("once"), None)
        .await
        .unwrap()
        .upload
        .unwrap();
    let tasks: Vec<_> = (0..6u8)
        .map(|i| {
            let client = client.clone();
            let grant = grant.clone();
            tokio::spawn(async move {
                let body = tgz(&[("data.bin", &noise(300_000, 100 + u64::from(i)))]);
                client.upload_with_grant(&grant, body).await
            })
        })
        .collect();
    let mut ok = 0;
    for t in tasks {
        match t.await.unwrap() {
            Ok(_) => ok += 1,
            // Used by the winner, or still in use by another upload.
            Err(e) => assert!(
                [
                    (401, "token_invalid".into()),
                    (409, "upload_in_progress".into())
                ]
                .contains(&api_code(&e)),
                "{e}"
            ),
        }
    }
    assert_eq!(ok, 1);
    assert_eq!(walk_files(&server.data_dir.join("blobs/sha256")), 2);
}

/// Asserts that `bytes` in all have left by sendfile(2). On loopback the
/// client may hold the last byte before the call that sent it returns and
/// counts it, so the count is polled briefly.
async fn assert_sendfile_bytes(server: &TestServer, bytes: u64) {
    let line = format!("context_service_http_sendfile_bytes_total {bytes}\n");
    let mut metrics = String::new();
    let counted = eventually(std::time::Duration::from_secs(5), async || {
        metrics = Caller::anonymous(server)
            .get("/metrics")
            .await
            .text()
            .await
            .unwrap();
        metrics.contains(&line)
    })
    .await;
    assert!(counted, "{line} in {metrics}");
}

#[tokio::test]
async fn downloads_ranges_and_conditional_requests() {
    let server = TestServer::start().await;
    let content = noise(700_000, 7);
    let rev = uploaded(
        &server,
        "alice",
        "big",
        &[("blob.bin", &content), ("note", b"n")],
    )
    .await;
    let revision = rev["revision"].as_str().unwrap();
    let digest = rev["bundleDigest"].as_str().unwrap();
    let len = rev["bytes"].as_u64().unwrap();
    server
        .client("alice")
        .activate_workload("big", revision)
        .await
        .unwrap();
    let alice = Caller::user(&server, "alice");
    let path = format!("/v1/workloads/big/revisions/{revision}/bundle");
    let get = |headers: &[(&'static str, String)]| {
        let caller = headers
            .iter()
            .fold(alice.clone(), |c, (k, v)| c.with_header(k, v));
        let path = path.clone();
        async move { caller.get(&path).await }
    };

    let full = get(&[]).await;
    assert_eq!(full.status(), 200);
    let h = full.headers().clone();
    let etag = format!("\"sha256:{digest}\"");
    assert_eq!(h[header::ETAG], etag.as_str());
    assert_eq!(
        h[header::CACHE_CONTROL],
        "private, max-age=31536000, immutable"
    );
    assert_eq!(h["x-context-revision"], revision);
    assert_eq!(h[header::CONTENT_LENGTH], len.to_string().as_str());
    assert_eq!(h[header::CONTENT_TYPE], MEDIA);
    assert_eq!(h[header::ACCEPT_RANGES], "bytes");
    let bytes = full.bytes().await.unwrap().to_vec();
    assert_eq!(bytes.len() as u64, len);
    assert_eq!(sha256(&bytes), digest);
    assert_eq!(sha256(&gunzip(&bytes)), revision);
    assert_eq!(unpack(&bytes)[0], ("blob.bin".to_owned(), content.clone()));
    // Byte-identical again (now from the cache).
    assert_eq!(get(&[]).await.bytes().await.unwrap().to_vec(), bytes);
    let metrics = Caller::anonymous(&server)
        .get("/metrics")
        .await
        .text()
        .await
        .unwrap();
    assert!(
        metrics.contains("context_service_bundle_downloads_total{source=\"memory\"} 2"),
        "{metrics}"
    );
    assert!(
        metrics.contains("context_service_bundle_cache_loads_total 1"),
        "{metrics}"
    );
    assert!(
        metrics.contains("context_service_bundle_cache_hits_total 1"),
        "{metrics}"
    );
    // Both answers left by sendfile(2) from the cached blob file, not copied.
    assert_sendfile_bytes(&server, 2 * len).await;

    let resp = get(&[("if-none-match", etag.clone())]).await;
    assert_eq!(resp.status(), 304);
    assert_eq!(resp.headers()[header::ETAG], etag.as_str());
    assert!(resp.bytes().await.unwrap().is_empty());
    let resp = get(&[("if-none-match", format!("\"other\", {etag}"))]).await;
    assert_eq!(resp.status(), 304);
    let resp = get(&[("if-none-match", "\"sha256:00\"".into())]).await;
    assert_eq!(resp.status(), 200);
    // Read to the end: a dropped answer leaves the rest unsent.
    assert_eq!(resp.bytes().await.unwrap().to_vec(), bytes);

    let resp = get(&[("range", "bytes=0-9".into())]).await;
    assert_eq!(resp.status(), 206);
    assert_eq!(
        resp.headers()[header::CONTENT_RANGE],
        format!("bytes 0-9/{len}").as_str()
    );
    assert_eq!(resp.headers()[header::CONTENT_LENGTH], "10");
    assert_eq!(resp.bytes().await.unwrap().to_vec(), bytes[..10]);
    let resp = get(&[("range", "bytes=-5".into())]).await;
    assert_eq!(resp.status(), 206);
    assert_eq!(
        resp.bytes().await.unwrap().to_vec(),
        bytes[bytes.len() - 5..]
    );
    let mid = format!("bytes=300000-{}", len - 2);
    let resp = get(&[("range", mid)]).await;
    assert_eq!(resp.status(), 206);
    assert_eq!(
        resp.bytes().await.unwrap().to_vec(),
        bytes[300_000..bytes.len() - 1]
    );
    // Ranges of a cached bundle go by sendfile(2) too (after three whole
    // answers: two above and the one to a stale If-None-Match).
    let ranged = 10 + 5 + (len - 1 - 300_000);
    assert_sendfile_bytes(&server, 3 * len + ranged).await;
    let resp = get(&[("range", format!("bytes={len}-"))]).await;
    assert_eq!(
        resp.headers()[header::CONTENT_RANGE],
        format!("bytes */{len}").as_str()
    );
    assert_error(resp, 416, "range_not_satisfiable", &len.to_string()).await;
    // Several ranges: the whole bundle.
    let resp = get(&[("range", "bytes=0-1,5-6".into())]).await;
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.bytes().await.unwrap().len() as u64, len);
    // A stale If-Range: the whole bundle.
    let resp = get(&[
        ("range", "bytes=0-1".into()),
        ("if-range", "\"sha256:00\"".into()),
    ])
    .await;
    assert_eq!(resp.status(), 200);
    let resp = get(&[("range", "bytes=0-1".into()), ("if-range", etag.clone())]).await;
    assert_eq!(resp.status(), 206);
}

/// The cache and download lines of `/metrics`.
async fn cache_metrics(server: &TestServer) -> Vec<String> {
    let text = Caller::anonymous(server)
        .get("/metrics")
        .await
        .text()
        .await
        .unwrap();
    text.lines()
        .filter(|l| {
            l.starts_with("context_service_bundle_cache_")
                || l.starts_with("context_service_bundle_downloads_total")
        })
        .map(str::to_owned)
        .collect()
}

#[tokio::test]
async fn head_answers_from_the_record_without_loading_the_cache() {
    let server = TestServer::start().await;
    let rev = uploaded(&server, "alice", "h", &[("a.bin", &noise(50_000, 5))]).await;
    let revision = rev["revision"].as_str().unwrap();
    let digest = rev["bundleDigest"].as_str().unwrap();
    let len = rev["bytes"].as_u64().unwrap();
    server
        .client("alice")
        .activate_workload("h", revision)
        .await
        .unwrap();
    let alice = Caller::user(&server, "alice");
    let path = format!("/v1/workloads/h/revisions/{revision}/bundle");
    let before = cache_metrics(&server).await;
    for range in [None, Some("bytes=0-9")] {
        let caller = match range {
            Some(r) => alice.with_header("range", r),
            None => alice.clone(),
        };
        let resp = caller.send(Method::HEAD, &path).await;
        assert_eq!(resp.status(), if range.is_some() { 206 } else { 200 });
        let h = resp.headers().clone();
        let want = if range.is_some() { 10 } else { len };
        assert_eq!(h[header::CONTENT_LENGTH], want.to_string().as_str());
        assert_eq!(h[header::ETAG], format!("\"sha256:{digest}\"").as_str());
        assert_eq!(h[header::CONTENT_TYPE], MEDIA);
        assert!(resp.bytes().await.unwrap().is_empty());
    }
    // Nothing was loaded, hit or counted as a download.
    assert_eq!(cache_metrics(&server).await, before);
    // A GET then loads it once.
    let resp = alice.get(&path).await;
    assert_eq!(sha256(&resp.bytes().await.unwrap()), digest);
    let after = cache_metrics(&server).await;
    assert!(
        after.contains(&"context_service_bundle_cache_loads_total 1".to_owned()),
        "{after:?}"
    );
    // A HEAD of an unknown revision is still 404.
    let resp = alice
        .send(
            Method::HEAD,
            &format!("/v1/workloads/h/revisions/{}/bundle", "0".repeat(64)),
        )
        .await;
    assert_eq!(resp.status(), 404);
}

#[tokio::test]
async fn bundles_larger_than_the_cache_stream_from_disk() {
    let server = TestServer::start_with(|c| c.cache_bytes = 1024).await;
    let content = noise(400_000, 3);
    let rev = uploaded(&server, "alice", "big", &[("blob.bin", &content)]).await;
    let revision = rev["revision"].as_str().unwrap();
    let client = server.client("alice");
    client.activate_workload("big", revision).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    for i in 0..2 {
        let out = dir.path().join(format!("b{i}"));
        let report = client
            .download_bundle("big", revision, &out, |_, _| {})
            .await
            .unwrap();
        assert_eq!(report.bytes, rev["bytes"].as_u64().unwrap());
        assert_eq!(unpack(&std::fs::read(&out).unwrap())[0].1, content);
    }
}

/// A name in the path is parsed once, where it enters: a name that breaks
/// the rule can never exist, so every workload route answers it like a
/// missing workload, after the checks that come first (the scope; a
/// malformed revision to activate).
#[tokio::test]
async fn invalid_names_in_the_path_answer_like_missing_workloads() {
    use crate::compat_support::error_body;
    let server = TestServer::start().await;
    let alice = Caller::user(&server, "alice");
    uploaded(&server, "alice", "w", &[("a", b"a")]).await;
    let missing = |name: &str| {
        error_body(
            "workload_not_found",
            &format!("workload {name:?} not found"),
        )
    };
    let good = "0f".repeat(32);
    for (raw, name) in [("Bad_Name", "Bad_Name"), ("a%20b", "a b"), ("-a", "-a")] {
        let base = format!("/v1/workloads/{raw}");
        let answers = [
            alice.get(&base).await,
            alice.delete(&base).await,
            alice.send(Method::POST, &format!("{base}/uploads")).await,
            alice
                .put(&format!("{base}/bundle"), MEDIA, tgz(&[("a", b"a")]))
                .await,
            alice
                .post(&format!("{base}/activate"), &json!({"revision": good}))
                .await,
            alice.get(&format!("{base}/revisions/{good}/bundle")).await,
            alice.get(&format!("{base}/revisions/XYZ/bundle")).await,
        ];
        for resp in answers {
            crate::compat_support::assert_json(resp, 404, &missing(name)).await;
        }
        // The revision of an activation is checked first.
        let resp = alice
            .post(&format!("{base}/activate"), &json!({"revision": "XYZ"}))
            .await;
        assert_error(resp, 400, "revision_invalid", "XYZ").await;
    }
    // A workload that exists: the malformed revision is the answer.
    let resp = alice.get("/v1/workloads/w/revisions/XYZ/bundle").await;
    assert_error(resp, 400, "revision_invalid", "\"XYZ\"").await;
    // The scope comes before the name.
    let reader = Caller::with_token(&server, server.token("alice", "workloads:read"));
    let resp = reader.delete("/v1/workloads/Bad_Name").await;
    assert_error(resp, 403, "scope_missing", "workloads:write").await;
}
