//! Named contexts over real HTTP on the `local` backend.

use crate::common::{assert_error, Caller, TestServer};
use serde_json::{json, Value};

/// The path of the context most of the end-to-end test works on.
const MEMORY: &str = "/v1/namespaces/team1/contexts/c-memory";

fn ctx(name: &str, ns: &str, ty: &str, backend: &str, size: &str, mode: &str) -> Value {
    json!({"name": name, "namespace": ns, "type": ty, "storage": {"backend": backend, "size": size, "accessMode": mode}})
}

#[tokio::test]
async fn every_validation_rule_with_upstream_messages() {
    let server = TestServer::start().await;
    let alice = Caller::user(&server, "alice");
    let cases = [
        (ctx("", "ns", "memory", "pvc", "1Gi", "ReadWriteOnce"), "name must be a lowercase Kubernetes name no longer than 50 characters"),
        (ctx(&"a".repeat(51), "ns", "memory", "pvc", "1Gi", "ReadWriteOnce"), "name must be a lowercase Kubernetes name"),
        (ctx("a", "", "memory", "pvc", "1Gi", "ReadWriteOnce"), "namespace must be a lowercase Kubernetes name"),
        (ctx("a", "a.b", "memory", "pvc", "1Gi", "ReadWriteOnce"), "namespace must be a lowercase Kubernetes name"),
        (ctx("a", &"n".repeat(64), "memory", "pvc", "1Gi", "ReadWriteOnce"), "namespace must be a lowercase Kubernetes name"),
        (ctx("a", "ns", "session", "pvc", "1Gi", "ReadWriteOnce"), "type must be workspace, memory, knowledge, or artifacts"),
        (ctx("a", "ns", "memory", "s3", "1Gi", "ReadWriteOnce"), "storage.backend must be pvc"),
        (ctx("a", "ns", "memory", "pvc", "", "ReadWriteOnce"), "storage.size must be a positive Kubernetes quantity"),
        (ctx("a", "ns", "memory", "pvc", "0", "ReadWriteOnce"), "storage.size must be a positive Kubernetes quantity"),
        (ctx("a", "ns", "memory", "pvc", "1Gi", "ReadOnlyMany"), "storage.accessMode must be ReadWriteOnce or ReadWriteMany"),
        (json!({"name": "a", "bogus": 1}), r#"json: unknown field "bogus""#),
        (json!({"name": "a", "storage": {"size": 5}}), "json: cannot unmarshal number into Go struct field Storage.storage.size of type string"),
        (json!([1]), "json: cannot unmarshal array into Go value of type contextresource.CreateRequest"),
    ];
    for (body, message) in cases {
        assert_error(
            alice.post("/v1/contexts", &body).await,
            400,
            "invalid_request",
            message,
        )
        .await;
    }
}

#[tokio::test]
async fn contexts_end_to_end_and_owner_isolation() {
    let server = TestServer::start().await;
    let alice = Caller::user(&server, "alice");
    let bob = Caller::user(&server, "bob");
    for ty in ["workspace", "memory", "knowledge", "artifacts"] {
        let body = ctx(
            &format!("c-{ty}"),
            "team1",
            ty,
            "pvc",
            "5Gi",
            "ReadWriteMany",
        );
        let resp = alice.post("/v1/contexts", &body).await;
        assert_eq!(resp.status().as_u16(), 201);
        let text = resp.text().await.unwrap();
        assert_eq!(
            text,
            format!(
                "{{\"name\":\"c-{ty}\",\"namespace\":\"team1\",\"type\":\"{ty}\",\"status\":\"ready\",\"storage\":{{\"backend\":\"pvc\",\"size\":\"5Gi\",\"accessMode\":\"ReadWriteMany\"}},\"attachment\":{{\"kind\":\"pvc\",\"claimName\":\"context-c-{ty}\"}}}}\n"
            )
        );
    }
    let body = ctx("c-memory", "team1", "memory", "pvc", "1Gi", "ReadWriteOnce");
    assert_error(
        alice.post("/v1/contexts", &body).await,
        409,
        "already_exists",
        "context resource already exists",
    )
    .await;
    assert_error(
        bob.post("/v1/contexts", &body).await,
        409,
        "already_exists",
        "context resource already exists",
    )
    .await;

    let list: Value = alice
        .get("/v1/namespaces/team1/contexts")
        .await
        .json()
        .await
        .unwrap();
    let names: Vec<_> = list["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["name"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(
        names,
        ["c-artifacts", "c-knowledge", "c-memory", "c-workspace"]
    );
    let empty: Value = bob
        .get("/v1/namespaces/team1/contexts")
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(empty, json!({"items": []}));
    let other: Value = alice
        .get("/v1/namespaces/other/contexts")
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(other, json!({"items": []}));

    assert_error(
        bob.get(MEMORY).await,
        404,
        "not_found",
        "context resource not found",
    )
    .await;
    assert_error(
        alice.get("/v1/namespaces/team1/contexts/nope").await,
        404,
        "not_found",
        "context resource not found",
    )
    .await;
    let got: Value = alice.get(MEMORY).await.json().await.unwrap();
    assert_eq!(got["type"], "memory");

    // Another owner's context is missing to bob, on delete too.
    assert_error(
        bob.delete(MEMORY).await,
        404,
        "not_found",
        "context resource not found",
    )
    .await;
    assert_eq!(alice.get(MEMORY).await.status().as_u16(), 200);
    assert_eq!(alice.delete(MEMORY).await.status().as_u16(), 204);
    assert_error(
        alice.delete(MEMORY).await,
        404,
        "not_found",
        "context resource not found",
    )
    .await;
    assert_error(
        alice.get(MEMORY).await,
        404,
        "not_found",
        "context resource not found",
    )
    .await;

    let reader = Caller::with_token(&server, server.token("carol", "contexts:read"));
    assert_error(
        reader.post("/v1/contexts", &body).await,
        403,
        "scope_missing",
        "contexts:write",
    )
    .await;
    let pools_only = Caller::with_token(&server, server.token("carol", "pools:read pools:write"));
    assert_error(
        pools_only.get("/v1/namespaces/team1/contexts").await,
        403,
        "scope_missing",
        "contexts:read",
    )
    .await;
}
