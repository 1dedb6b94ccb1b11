//! `DELETE` of what the caller does not have answers `404`, as upstream (and
//! Kubernetes) do: `sandbox pool not found` / `context resource not found`.
//! Another owner's pool or context counts as missing. Moca treats `404` on
//! delete as "already deleted", so a retried delete stays safe.

use crate::common::{json_of, Caller, TestServer};
use crate::compat_support::{assert_json, error_body, exact};
use serde_json::json;

const POOL_GONE: &str = "sandbox pool not found";
const CONTEXT_GONE: &str = "context resource not found";

#[tokio::test]
async fn deleting_a_missing_pool_is_404_not_found() {
    let server = TestServer::start().await;
    let alice = Caller::user(&server, "alice");
    let bob = Caller::user(&server, "bob");
    let never = alice.delete("/v1/sandbox-pools/never-was").await;
    assert_json(never, 404, &error_body("not_found", POOL_GONE)).await;
    // A name that cannot exist is simply missing, never a 400.
    let invalid = alice.delete("/v1/sandbox-pools/Not_A_Name").await;
    assert_json(invalid, 404, &error_body("not_found", POOL_GONE)).await;

    let body = json!({"name": "demo", "replicas": 2,
                      "workspace": {"size": "1Gi", "accessMode": "ReadWriteMany"}});
    json_of(alice.post("/v1/sandbox-pools", &body).await, 201).await;
    // Bob does not see alice's pool, so he cannot delete it.
    let foreign = bob.delete("/v1/sandbox-pools/demo").await;
    assert_json(foreign, 404, &error_body("not_found", POOL_GONE)).await;
    json_of(alice.get("/v1/sandbox-pools/demo").await, 200).await;

    // The owner's delete: 204, no body, no Content-Type.
    let deleted = exact(alice.delete("/v1/sandbox-pools/demo").await).await;
    assert_eq!((deleted.status, deleted.body.as_str()), (204, ""));
    assert_eq!(deleted.content_type, None);
    // And again: gone.
    let again = alice.delete("/v1/sandbox-pools/demo").await;
    assert_json(again, 404, &error_body("not_found", POOL_GONE)).await;
}

#[tokio::test]
async fn deleting_a_missing_context_is_404_not_found() {
    let server = TestServer::start().await;
    let alice = Caller::user(&server, "alice");
    let bob = Caller::user(&server, "bob");
    const PATH: &str = "/v1/namespaces/team1/contexts/notes";
    assert_json(
        alice.delete(PATH).await,
        404,
        &error_body("not_found", CONTEXT_GONE),
    )
    .await;
    for path in [
        "/v1/namespaces/Team_1/contexts/notes",
        "/v1/namespaces/team1/contexts/Bad_Name",
    ] {
        assert_json(
            alice.delete(path).await,
            404,
            &error_body("not_found", CONTEXT_GONE),
        )
        .await;
    }
    let body = json!({"name": "notes", "namespace": "team1", "type": "memory",
                      "storage": {"backend": "pvc", "size": "1Gi", "accessMode": "ReadWriteOnce"}});
    json_of(alice.post("/v1/contexts", &body).await, 201).await;
    assert_json(
        bob.delete(PATH).await,
        404,
        &error_body("not_found", CONTEXT_GONE),
    )
    .await;
    let deleted = exact(alice.delete(PATH).await).await;
    assert_eq!((deleted.status, deleted.body.as_str()), (204, ""));
    assert_eq!(deleted.content_type, None);
    assert_json(
        alice.delete(PATH).await,
        404,
        &error_body("not_found", CONTEXT_GONE),
    )
    .await;
}
