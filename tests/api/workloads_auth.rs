//! Token attacks and delegation against the workloads endpoints.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::common::{assert_error, Caller, TestServer};
use base64::Engine as _;
use context_service::auth::dev::{signing_key_path, DevIssuer};
use context_service::auth::{Claims, TokenPolicy};
use jsonwebtoken::{encode, Algorithm, EncodingKey, Header};
use serde_json::json;

const B64: base64::engine::GeneralPurpose = base64::engine::general_purpose::URL_SAFE_NO_PAD;

fn now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

fn claims(sub: &str, exp: u64) -> Claims {
    Claims {
        sub: sub.into(),
        iss: "context-service".into(),
        aud: "context-service".into(),
        exp,
        iat: Some(now()),
        nbf: None,
        scope: "workloads:read workloads:write".into(),
    }
}

/// Signs `claims` with the server's own Ed25519 key.
fn sign_with_server_key(server: &TestServer, claims: &Claims) -> String {
    let pem = std::fs::read(signing_key_path(&server.data_dir)).unwrap();
    let key = EncodingKey::from_ed_pem(&pem).unwrap();
    let kid = DevIssuer::load(&server.data_dir).unwrap().kid().to_owned();
    let mut header = Header::new(Algorithm::EdDSA);
    header.kid = Some(kid);
    encode(&header, claims, &key).unwrap()
}

async fn list_with(server: &TestServer, token: &str) -> reqwest::Response {
    Caller::with_token(server, token).get("/v1/workloads").await
}

#[tokio::test]
async fn token_attacks_are_refused() {
    let server = TestServer::start().await;
    let anyone = Caller::anonymous(&server);
    // Control: a proper token works.
    assert_eq!(
        list_with(&server, &server.user_token("alice"))
            .await
            .status(),
        200
    );

    let resp = anyone.get("/v1/workloads").await;
    assert_error(resp, 401, "token_required", "Bearer").await;
    let resp = anyone
        .with_header("authorization", "Basic YWxpY2U6cHc=")
        .get("/v1/workloads")
        .await;
    assert_error(resp, 401, "token_invalid", "Bearer").await;

    // Wrong signature: a valid token with its signature altered.
    let good = server.user_token("alice");
    let (head, sig) = good.rsplit_once('.').unwrap();
    let mut raw = B64.decode(sig).unwrap();
    raw[0] ^= 0xff;
    let forged = format!("{head}.{}", B64.encode(raw));
    assert_error(
        list_with(&server, &forged).await,
        401,
        "token_invalid",
        "signature",
    )
    .await;

    // Signed by another key under the same kid.
    let other_dir = tempfile::tempdir().unwrap();
    let other = DevIssuer::ensure(other_dir.path()).unwrap();
    let foreign = other
        .mint(
            &TokenPolicy::default(),
            "alice",
            "workloads:read",
            Duration::from_secs(60),
        )
        .unwrap();
    assert_error(list_with(&server, &foreign).await, 401, "token_invalid", "").await;

    // alg: none.
    let kid = DevIssuer::load(&server.data_dir).unwrap().kid().to_owned();
    let header = B64.encode(json!({"alg": "none", "typ": "JWT", "kid": kid}).to_string());
    let body = B64.encode(serde_json::to_string(&claims("alice", now() + 600)).unwrap());
    let none = format!("{header}.{body}.");
    assert_error(list_with(&server, &none).await, 401, "token_invalid", "").await;

    // HS256 with the server's public key as the HMAC secret.
    let jwks = serde_json::to_value(DevIssuer::load(&server.data_dir).unwrap().jwks()).unwrap();
    let x = jwks["keys"][0]["x"].as_str().unwrap().to_owned();
    for secret in [B64.decode(&x).unwrap(), x.clone().into_bytes()] {
        let mut header = Header::new(Algorithm::HS256);
        header.kid = Some(kid.clone());
        let confused = encode(
            &header,
            &claims("alice", now() + 600),
            &EncodingKey::from_secret(&secret).unwrap(),
        )
        .unwrap();
        assert_error(
            list_with(&server, &confused).await,
            401,
            "token_invalid",
            "",
        )
        .await;
    }

    // Expired beyond the leeway.
    let expired = sign_with_server_key(&server, &claims("alice", now() - 3600));
    assert_error(
        list_with(&server, &expired).await,
        401,
        "token_expired",
        "expired",
    )
    .await;

    // Wrong audience, wrong issuer.
    let issuer = DevIssuer::load(&server.data_dir).unwrap();
    let policy = TokenPolicy {
        audience: "someone-else".into(),
        ..TokenPolicy::default()
    };
    let wrong_aud = issuer
        .mint(&policy, "alice", "workloads:read", Duration::from_secs(60))
        .unwrap();
    assert_error(
        list_with(&server, &wrong_aud).await,
        401,
        "token_invalid",
        "not meant for this service",
    )
    .await;
    let policy = TokenPolicy {
        issuer: "evil".into(),
        ..TokenPolicy::default()
    };
    let wrong_iss = issuer
        .mint(&policy, "alice", "workloads:read", Duration::from_secs(60))
        .unwrap();
    assert_error(
        list_with(&server, &wrong_iss).await,
        401,
        "token_invalid",
        "issuer",
    )
    .await;

    // Missing scope: read-only token cannot create, write-only cannot read.
    let read_only = Caller::with_token(&server, server.token("alice", "workloads:read"));
    let resp = read_only.post("/v1/workloads", &json!({})).await;
    assert_error(resp, 403, "scope_missing", "workloads:write").await;
    let write_only = server.token("alice", "workloads:write");
    assert_error(
        list_with(&server, &write_only).await,
        403,
        "scope_missing",
        "workloads:read",
    )
    .await;
    let pools_only = Caller::with_token(&server, server.token("alice", "pools:read pools:write"));
    let resp = pools_only
        .put("/v1/workloads/x/bundle", "application/gzip", vec![1, 2, 3])
        .await;
    assert_error(resp, 403, "scope_missing", "workloads:write").await;

    // None of the refused requests created anything.
    let alice = server.client("alice");
    assert!(alice.workloads().await.unwrap().is_empty());
}

#[tokio::test]
async fn a_trusted_service_acts_for_a_user() {
    let server = TestServer::start().await;
    let service = server.token("moca", "delegate workloads:read workloads:write");
    let for_alice =
        Caller::with_token(&server, &service).with_header("x-context-subject", "user:alice");
    let resp = for_alice
        .post("/v1/workloads", &json!({"name": "for-alice"}))
        .await;
    assert_eq!(resp.status(), 201);
    // Recorded under the user alice: not the service, and not a token
    // whose own subject is "alice" (owners carry their kind).
    let resp = for_alice.get("/v1/workloads").await;
    let body: serde_json::Value = resp.json().await.unwrap();
    assert_eq!(body["workloads"][0]["name"], "for-alice");
    assert!(server.client("alice").workloads().await.unwrap().is_empty());
    let resp = list_with(&server, &service).await;
    let body: serde_json::Value = resp.json().await.unwrap();
    assert_eq!(body["workloads"], json!([]));
    // Acting for bob, the service cannot see alice's workload.
    let resp = Caller::with_token(&server, &service)
        .with_header("x-context-subject", "user:bob")
        .get("/v1/workloads/for-alice")
        .await;
    assert_error(resp, 404, "workload_not_found", "for-alice").await;
    // A user token may not delegate.
    let resp = Caller::user(&server, "bob")
        .with_header("x-context-subject", "user:alice")
        .get("/v1/workloads/for-alice")
        .await;
    assert_error(resp, 403, "scope_missing", "delegate").await;
    let resp = Caller::with_token(&server, &service)
        .with_header("x-context-subject", "alice")
        .get("/v1/workloads")
        .await;
    assert_error(resp, 400, "invalid_request", "user:<id>").await;
    // Delegation keeps the token's scopes: no write without workloads:write.
    let read_only = server.token("moca", "delegate workloads:read");
    let resp = Caller::with_token(&server, read_only)
        .with_header("x-context-subject", "user:alice")
        .delete("/v1/workloads/for-alice")
        .await;
    assert_error(resp, 403, "scope_missing", "workloads:write").await;
}

/// Every `/v1` refusal of the caller's token says why in plain words and
/// carries the RFC 6750 challenge; `error="invalid_token"` only when a
/// token was sent.
#[tokio::test]
async fn token_refusals_carry_plain_words_and_a_bearer_challenge() {
    use crate::compat_support::{error_body, exact};
    use context_service::api::challenge::{INVALID_TOKEN, NO_TOKEN};
    use context_service::auth::NOT_A_JWT;
    let server = TestServer::start().await;
    let anyone = Caller::anonymous(&server);
    let expired = sign_with_server_key(&server, &claims("alice", now() - 3600));
    let cases = [
        (
            anyone.clone(),
            "/v1/workloads",
            "token_required",
            "an Authorization: Bearer token is required",
            NO_TOKEN,
        ),
        (
            Caller::with_token(&server, "not-a-jwt"),
            "/v1/workloads",
            "token_invalid",
            NOT_A_JWT,
            INVALID_TOKEN,
        ),
        (
            Caller::with_token(&server, "a.b.c"),
            "/v1/workloads/docs",
            "token_invalid",
            NOT_A_JWT,
            INVALID_TOKEN,
        ),
        (
            Caller::with_token(&server, expired),
            "/v1/workloads",
            "token_expired",
            "the token has expired",
            INVALID_TOKEN,
        ),
        // The upstream drop-in routes too (upstream itself has no auth).
        (
            anyone.with_header("X-SH-Auth", "garbage"),
            "/v1/sandbox-pools",
            "token_invalid",
            NOT_A_JWT,
            INVALID_TOKEN,
        ),
        (
            anyone.clone(),
            "/v1/namespaces/team1/contexts",
            "token_required",
            "an Authorization: Bearer token is required",
            NO_TOKEN,
        ),
    ];
    for (caller, path, code, message, challenge) in cases {
        let got = exact(caller.get(path).await).await;
        assert_eq!(
            (got.status, got.body.as_str()),
            (401, error_body(code, message).as_str()),
            "{path}: {got:?}"
        );
        assert_eq!(got.headers[reqwest::header::WWW_AUTHENTICATE], challenge);
    }
    // Not a `/v1` route, and not a refusal of the token: no challenge.
    let healthz = exact(anyone.get("/healthz").await).await;
    assert!(healthz
        .headers
        .get(reqwest::header::WWW_AUTHENTICATE)
        .is_none());
    let scoped = Caller::with_token(&server, server.token("alice", "pools:read"));
    let got = exact(scoped.get("/v1/workloads").await).await;
    assert_eq!(
        (got.status, got.body.as_str()),
        (
            403,
            error_body(
                "scope_missing",
                "the token lacks the scope \"workloads:read\""
            )
            .as_str()
        )
    );
    assert!(got.headers.get(reqwest::header::WWW_AUTHENTICATE).is_none());
}
