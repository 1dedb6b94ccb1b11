//! Upstream clients (`contextctl`, the Go client library) send their token
//! as `X-SH-Auth: <token>` (from `CS_TOKEN`). It is accepted as a second
//! carrier of the same bearer JWT: same verification, same scopes. Upstream
//! itself has no authentication; we refuse anonymous callers on purpose.

use crate::common::{json_of, Caller, TestServer};
use crate::compat_support::{assert_json, error_body};
use serde_json::json;

fn pool(name: &str) -> serde_json::Value {
    json!({"name": name, "replicas": 1,
           "workspace": {"size": "1Gi", "accessMode": "ReadWriteOnce"}})
}

/// A caller that sends only `X-SH-Auth`, as upstream's `contextctl` does.
fn sh(server: &TestServer, token: &str) -> Caller {
    Caller::anonymous(server).with_header("X-SH-Auth", token)
}

#[tokio::test]
async fn x_sh_auth_alone_is_the_same_caller_as_the_bearer_token() {
    let server = TestServer::start().await;
    let token = server.user_token("alice");
    let upstream = sh(&server, &token);
    let created = json_of(upstream.post("/v1/sandbox-pools", &pool("demo")).await, 201).await;
    assert_eq!(created["name"], "demo");
    // The same owner, whichever header carries the token.
    let bearer = Caller::user(&server, "alice");
    json_of(bearer.get("/v1/sandbox-pools/demo").await, 200).await;
    json_of(upstream.get("/v1/sandbox-pools/demo").await, 200).await;
    let list = json_of(upstream.get("/v1/sandbox-pools").await, 200).await;
    assert_eq!(list["items"][0]["name"], "demo");
    // Another user's token in X-SH-Auth sees nothing of alice's.
    let bob = sh(&server, &server.user_token("bob"));
    assert_json(
        bob.get("/v1/sandbox-pools/demo").await,
        404,
        &error_body("not_found", "sandbox pool not found"),
    )
    .await;
    assert_eq!(
        upstream.delete("/v1/sandbox-pools/demo").await.status(),
        204
    );
}

#[tokio::test]
async fn x_sh_auth_tokens_need_the_same_scopes() {
    let server = TestServer::start().await;
    let reader = sh(&server, &server.token("alice", "pools:read contexts:read"));
    json_of(reader.get("/v1/sandbox-pools").await, 200).await;
    assert_json(
        reader.post("/v1/sandbox-pools", &pool("demo")).await,
        403,
        &error_body("scope_missing", "the token lacks the scope \"pools:write\""),
    )
    .await;
    let ctx = json!({"name": "docs", "namespace": "team1", "type": "memory",
                     "storage": {"backend": "pvc", "size": "1Gi", "accessMode": "ReadWriteOnce"}});
    assert_json(
        reader.post("/v1/contexts", &ctx).await,
        403,
        &error_body(
            "scope_missing",
            "the token lacks the scope \"contexts:write\"",
        ),
    )
    .await;
}

#[tokio::test]
async fn both_headers_must_carry_the_same_token() {
    let server = TestServer::start().await;
    let token = server.user_token("alice");
    let both = Caller::user(&server, "alice").with_header("X-SH-Auth", &token);
    json_of(both.post("/v1/sandbox-pools", &pool("demo")).await, 201).await;
    // Two valid tokens of the same user, but different: refused.
    let other = server.token("alice", "pools:read");
    let mixed = Caller::with_token(&server, other).with_header("X-SH-Auth", &token);
    assert_json(
        mixed.get("/v1/sandbox-pools/demo").await,
        401,
        &error_body(
            "token_invalid",
            "Authorization and X-SH-Auth carry different tokens",
        ),
    )
    .await;
    // A malformed Authorization header is not rescued by X-SH-Auth.
    let basic = Caller::anonymous(&server)
        .with_header("Authorization", &format!("Basic {token}"))
        .with_header("X-SH-Auth", &token);
    assert_json(
        basic.get("/v1/sandbox-pools/demo").await,
        401,
        &error_body(
            "token_invalid",
            "expected \"Authorization: Bearer <token>\"",
        ),
    )
    .await;
}

#[tokio::test]
async fn x_sh_auth_is_verified_like_a_bearer_token() {
    let server = TestServer::start().await;
    let forged = sh(&server, "not-a-jwt");
    assert_json(
        forged.get("/v1/sandbox-pools").await,
        401,
        &error_body("token_invalid", context_service::auth::NOT_A_JWT),
    )
    .await;
    assert_json(
        sh(&server, " ").get("/v1/sandbox-pools").await,
        401,
        &error_body("token_invalid", "the X-SH-Auth header is empty"),
    )
    .await;
    // No token at all: upstream would answer; we refuse (documented).
    assert_json(
        Caller::anonymous(&server).get("/v1/sandbox-pools").await,
        401,
        &error_body(
            "token_required",
            "an Authorization: Bearer token is required",
        ),
    )
    .await;
}
