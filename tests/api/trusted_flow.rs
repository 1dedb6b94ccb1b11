//! The trusted ("Moca") flow end to end over HTTP: create → capability →
//! upload → freeze → export → delete; subject isolation (another subject
//! gets `404`); and upload capabilities being single-use, expiring, and
//! dying with a freeze or a re-created Context.

use std::time::Duration;

use reqwest::Method;
use serde_json::json;

use crate::common::workload_bundles::{unpack, MEDIA};
use crate::common::{json_of, Caller};
use crate::compat_support::{assert_json, error_body};
use crate::trusted_support::*;

const NS: &str = "moca";

fn denied() -> String {
    error_body(
        "unauthorized",
        "upload capability is invalid, expired, or already used",
    )
}

fn missing() -> String {
    error_body("not_found", "context not found")
}

#[tokio::test]
async fn create_upload_freeze_export_delete() {
    let (server, _token) = server().await;
    // Moca's subjects keep their provider prefix in the name.
    let moca_for_alice = moca(&server, "user:github:alice");
    let created = create(&moca_for_alice, NS, "w-1").await;
    assert_eq!(created["status"], "ready");
    assert!(created.get("currentRevision").is_none());

    let cap = capability(&moca_for_alice, NS, "w-1").await;
    assert_eq!(cap["method"], "PUT");
    assert_eq!(cap["contentType"], MEDIA);
    // The client uploads with nothing but the capability.
    let data = bundle("incident report 1");
    let uploaded = json_of(put(&server, &cap, data.clone()).await, 201).await;
    let revision = uploaded["revision"].as_str().unwrap().to_owned();
    assert_eq!(uploaded["files"], 2);

    let frozen = json_of(freeze(&moca_for_alice, NS, "w-1", &revision).await, 200).await;
    assert_eq!(frozen["contextId"], created["contextId"]);
    assert_eq!(frozen["currentRevision"], revision.as_str());
    assert_eq!(frozen["frozenRevision"], revision.as_str());

    let resp = export(&moca_for_alice, NS, "w-1", &revision).await;
    assert_eq!(resp.status(), 200);
    let exported = resp.bytes().await.unwrap().to_vec();
    assert_eq!(unpack(&exported), unpack(&data));
    // Exporting again serves the same bytes.
    let again = export(&moca_for_alice, NS, "w-1", &revision).await;
    assert_eq!(again.bytes().await.unwrap().to_vec(), exported);

    assert_eq!(remove(&moca_for_alice, NS, "w-1").await.status(), 204);
    assert_json(
        export(&moca_for_alice, NS, "w-1", &revision).await,
        404,
        &missing(),
    )
    .await;
    assert_json(remove(&moca_for_alice, NS, "w-1").await, 404, &missing()).await;
}

#[tokio::test]
async fn the_flow_also_runs_with_a_delegate_jwt() {
    let (server, _token) = server().await;
    let service = Caller::with_token(&server, server.token("moca", "delegate"))
        .with_header("x-context-subject", "agent:planner");
    create(&service, NS, "plan").await;
    let cap = capability(&service, NS, "plan").await;
    let revision = json_of(put(&server, &cap, bundle("plan")).await, 201).await["revision"]
        .as_str()
        .unwrap()
        .to_owned();
    json_of(freeze(&service, NS, "plan", &revision).await, 200).await;
    assert_eq!(export(&service, NS, "plan", &revision).await.status(), 200);
    assert_eq!(remove(&service, NS, "plan").await.status(), 204);
}

#[tokio::test]
async fn another_subject_gets_404_everywhere() {
    let (server, _token) = server().await;
    let alice = moca(&server, "user:alice");
    let view = create(&alice, NS, "shared-name").await;
    let cap = capability(&alice, NS, "shared-name").await;
    let revision = json_of(put(&server, &cap, bundle("alice")).await, 201).await["revision"]
        .as_str()
        .unwrap()
        .to_owned();
    json_of(freeze(&alice, NS, "shared-name", &revision).await, 200).await;

    // Another user, the same name of another kind, and the same subject in
    // another namespace are all someone else.
    let others = [
        (moca(&server, "user:bob"), NS),
        (moca(&server, "agent:alice"), NS),
        (moca(&server, "service:alice"), NS),
        (moca(&server, "user:alice"), "other-ns"),
    ];
    for (other, ns) in &others {
        let path = format!("/v1{}/upload-capabilities", context_path(ns, "shared-name"));
        assert_json(other.send(Method::POST, &path).await, 404, &missing()).await;
        assert_json(
            freeze(other, ns, "shared-name", &revision).await,
            404,
            &missing(),
        )
        .await;
        assert_json(
            export(other, ns, "shared-name", &revision).await,
            404,
            &missing(),
        )
        .await;
        assert_json(remove(other, ns, "shared-name").await, 404, &missing()).await;
    }
    // Names are per subject: bob's Context of that name is his own.
    let bobs = create(&others[0].0, NS, "shared-name").await;
    assert_ne!(bobs["contextId"], view["contextId"]);
    assert!(bobs.get("frozenRevision").is_none());
    // Alice's is untouched.
    assert_eq!(
        export(&alice, NS, "shared-name", &revision).await.status(),
        200
    );
    // The public workload API of the same user sees no trusted Context.
    let public = Caller::with_token(
        &server,
        server.token(
            "gateway",
            &format!("delegate {}", context_service::auth::Scope::user_scopes()),
        ),
    )
    .with_header("x-context-subject", "user:alice");
    let list: serde_json::Value = public.get("/v1/workloads").await.json().await.unwrap();
    assert_eq!(list["workloads"], json!([]));
}

#[tokio::test]
async fn a_capability_is_single_use_but_survives_failures() {
    let (server, _token) = server().await;
    let alice = moca(&server, "user:alice");
    create(&alice, NS, "w").await;
    let cap = capability(&alice, NS, "w").await;
    let url = cap["uploadUrl"].as_str().unwrap();
    let token = cap["token"].as_str().unwrap();
    // Refused uploads leave it usable: wrong media type, broken bundle.
    let client = Caller::with_token(&server, token);
    assert_eq!(
        client
            .put(url, "application/octet-stream", bundle("v1"))
            .await
            .status(),
        415
    );
    let resp = client.put(url, MEDIA, b"not a bundle".to_vec()).await;
    assert_eq!(json_of(resp, 400).await["error"], "invalid_request");
    let first = json_of(put(&server, &cap, bundle("v1")).await, 201).await;
    // Used up, even for the same bytes.
    assert_json(put(&server, &cap, bundle("v1")).await, 401, &denied()).await;
    // A fresh capability uploads a new current revision.
    let cap2 = capability(&alice, NS, "w").await;
    assert_ne!(cap2["uploadUrl"], cap["uploadUrl"]);
    let second = json_of(put(&server, &cap2, bundle("v2")).await, 201).await;
    assert_ne!(second["revision"], first["revision"]);
    // Only the latest upload is current.
    let stale = first["revision"].as_str().unwrap();
    assert_eq!(freeze(&alice, NS, "w", stale).await.status(), 409);
    let current = second["revision"].as_str().unwrap();
    assert_eq!(freeze(&alice, NS, "w", current).await.status(), 200);
}

#[tokio::test]
async fn a_capability_expires() {
    let (server, _token) = server_with(|c| c.upload_grant_ttl = Duration::from_secs(1)).await;
    let alice = moca(&server, "user:alice");
    create(&alice, NS, "w").await;
    let cap = capability(&alice, NS, "w").await;
    tokio::time::sleep(Duration::from_millis(1_300)).await;
    assert_json(put(&server, &cap, bundle("late")).await, 401, &denied()).await;
    // A new one works at once.
    let fresh = capability(&alice, NS, "w").await;
    json_of(put(&server, &fresh, bundle("on time")).await, 201).await;
}

#[tokio::test]
async fn a_freeze_consumes_outstanding_capabilities() {
    let (server, _token) = server().await;
    let alice = moca(&server, "user:alice");
    create(&alice, NS, "w").await;
    let first = capability(&alice, NS, "w").await;
    let issued_before_freeze = capability(&alice, NS, "w").await;
    let revision = json_of(put(&server, &first, bundle("v1")).await, 201).await["revision"]
        .as_str()
        .unwrap()
        .to_owned();
    json_of(freeze(&alice, NS, "w", &revision).await, 200).await;
    assert_json(
        put(&server, &issued_before_freeze, bundle("v2")).await,
        409,
        &error_body("context_frozen", "context is frozen"),
    )
    .await;
    // That refusal consumed it for good.
    assert_json(
        put(&server, &issued_before_freeze, bundle("v2")).await,
        401,
        &denied(),
    )
    .await;
    // The frozen revision is still what is exported.
    assert_eq!(export(&alice, NS, "w", &revision).await.status(), 200);
}

#[tokio::test]
async fn a_recreated_context_is_a_new_identity() {
    let (server, _token) = server().await;
    let alice = moca(&server, "user:alice");
    let first = create(&alice, NS, "w").await;
    let old = capability(&alice, NS, "w").await;
    assert_eq!(remove(&alice, NS, "w").await.status(), 204);
    let second = create(&alice, NS, "w").await;
    assert_ne!(first["contextId"], second["contextId"]);
    // A capability of the old Context cannot upload into the new one.
    assert_json(put(&server, &old, bundle("old")).await, 401, &denied()).await;
    let fresh = capability(&alice, NS, "w").await;
    json_of(put(&server, &fresh, bundle("new")).await, 201).await;
}

/// The three front doors of a bundle upload (the owner's route, a workload
/// grant, a trusted capability) take the same media types, in any case and
/// with parameters, and refuse every other with the same answer.
#[tokio::test]
async fn every_upload_route_takes_the_same_media_types() {
    let (server, _token) = server().await;
    let owner = Caller::with_token(
        &server,
        server.token("alice", "workloads:read workloads:write"),
    );
    let created = owner.post("/v1/workloads", &json!({"name": "w"})).await;
    assert_eq!(created.status(), 201);
    let created: serde_json::Value = created.json().await.unwrap();
    let alice = moca(&server, "user:alice");
    create(&alice, NS, "c").await;
    // A fresh credential per door: grants and capabilities are single use.
    let mut grant = created["upload"].clone();
    let doors = |grant: &serde_json::Value, cap: &serde_json::Value| {
        [
            (owner.clone(), "/v1/workloads/w/bundle".to_owned()),
            (
                Caller::with_token(&server, grant["token"].as_str().unwrap()),
                grant["url"].as_str().unwrap().to_owned(),
            ),
            (
                Caller::with_token(&server, cap["token"].as_str().unwrap()),
                cap["uploadUrl"].as_str().unwrap().to_owned(),
            ),
        ]
    };
    let cap = capability(&alice, NS, "c").await;
    let refused = |shown: &str| {
        error_body(
            "unsupported_media_type",
            &format!(
                "bundles are sent as application/vnd.rossoctl.context or application/gzip, not {shown}"
            ),
        )
    };
    for (caller, url) in doors(&grant, &cap) {
        for ct in [
            "text/plain",
            "application/octet-stream",
            "application/x-gzip",
            "application/json",
        ] {
            assert_json(caller.put(&url, ct, bundle("x")).await, 415, &refused(ct)).await;
        }
        let resp = caller
            .request(Method::PUT, &url)
            .body(bundle("x"))
            .send()
            .await
            .unwrap();
        assert_json(resp, 415, &refused("(no Content-Type)")).await;
    }
    for ct in [
        MEDIA,
        "application/gzip",
        "Application/GZIP",
        "application/vnd.rossoctl.context; version=1",
    ] {
        let cap = capability(&alice, NS, "c").await;
        for (caller, url) in doors(&grant, &cap) {
            let resp = caller.put(&url, ct, bundle(ct)).await;
            assert_eq!(resp.status(), 201, "{ct} to {url}");
        }
        let resp = owner.send(Method::POST, "/v1/workloads/w/uploads").await;
        assert_eq!(resp.status(), 201);
        grant = resp.json().await.unwrap();
    }
}
