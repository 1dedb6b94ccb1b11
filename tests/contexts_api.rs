//! Named contexts over real HTTP on the `local` backend.

mod common;

use common::{assert_error, TestServer};
use serde_json::{json, Value};

fn ctx(name: &str, ns: &str, ty: &str, backend: &str, size: &str, mode: &str) -> Value {
    json!({"name": name, "namespace": ns, "type": ty, "storage": {"backend": backend, "size": size, "accessMode": mode}})
}

async fn post(server: &TestServer, token: &str, body: &Value) -> reqwest::Response {
    server
        .http()
        .post(server.url("/v1/contexts"))
        .bearer_auth(token)
        .json(body)
        .send()
        .await
        .unwrap()
}

async fn get(server: &TestServer, token: &str, path: &str) -> reqwest::Response {
    server
        .http()
        .get(server.url(path))
        .bearer_auth(token)
        .send()
        .await
        .unwrap()
}

#[tokio::test]
async fn every_validation_rule_with_upstream_messages() {
    let server = TestServer::start().await;
    let token = server.user_token("alice");
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
            post(&server, &token, &body).await,
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
    let alice = server.user_token("alice");
    let bob = server.user_token("bob");
    for ty in ["workspace", "memory", "knowledge", "artifacts"] {
        let body = ctx(
            &format!("c-{ty}"),
            "team1",
            ty,
            "pvc",
            "5Gi",
            "ReadWriteMany",
        );
        let resp = post(&server, &alice, &body).await;
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
        post(&server, &alice, &body).await,
        409,
        "already_exists",
        "context resource already exists",
    )
    .await;
    assert_error(
        post(&server, &bob, &body).await,
        409,
        "already_exists",
        "context resource already exists",
    )
    .await;

    let list: Value = get(&server, &alice, "/v1/namespaces/team1/contexts")
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
    let empty: Value = get(&server, &bob, "/v1/namespaces/team1/contexts")
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(empty, json!({"items": []}));
    let other: Value = get(&server, &alice, "/v1/namespaces/other/contexts")
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(other, json!({"items": []}));

    assert_error(
        get(&server, &bob, "/v1/namespaces/team1/contexts/c-memory").await,
        404,
        "not_found",
        "context resource not found",
    )
    .await;
    assert_error(
        get(&server, &alice, "/v1/namespaces/team1/contexts/nope").await,
        404,
        "not_found",
        "context resource not found",
    )
    .await;
    let got: Value = get(&server, &alice, "/v1/namespaces/team1/contexts/c-memory")
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(got["type"], "memory");

    let del = |token: String| {
        let http = server.http();
        let url = server.url("/v1/namespaces/team1/contexts/c-memory");
        async move {
            http.delete(url)
                .bearer_auth(token)
                .send()
                .await
                .unwrap()
                .status()
                .as_u16()
        }
    };
    assert_eq!(del(bob.clone()).await, 204);
    assert_eq!(
        get(&server, &alice, "/v1/namespaces/team1/contexts/c-memory")
            .await
            .status()
            .as_u16(),
        200
    );
    assert_eq!(del(alice.clone()).await, 204);
    assert_eq!(del(alice.clone()).await, 204);
    assert_error(
        get(&server, &alice, "/v1/namespaces/team1/contexts/c-memory").await,
        404,
        "not_found",
        "context resource not found",
    )
    .await;

    let reader = server.token("carol", "contexts:read");
    assert_error(
        post(&server, &reader, &body).await,
        403,
        "scope_missing",
        "contexts:write",
    )
    .await;
    let pools_only = server.token("carol", "pools:read pools:write");
    assert_error(
        get(&server, &pools_only, "/v1/namespaces/team1/contexts").await,
        403,
        "scope_missing",
        "contexts:read",
    )
    .await;
}
