//! Issue 10, tokens: a maximum token lifetime, a standard array `aud`, and
//! no RSA key under 2048 bits in the JWKS.

use std::time::{SystemTime, UNIX_EPOCH};

use context_service::auth::dev::{signing_key_path, DevIssuer};
use jsonwebtoken::{encode, Algorithm, EncodingKey, Header};
use serde_json::{json, Value};

use crate::common::{assert_error, Caller, TestServer};

fn now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

/// Signs `claims` with the server's own key.
fn signed(server: &TestServer, claims: &Value) -> String {
    let pem = std::fs::read(signing_key_path(&server.data_dir)).unwrap();
    let mut header = Header::new(Algorithm::EdDSA);
    header.kid = Some(DevIssuer::load(&server.data_dir).unwrap().kid().to_owned());
    encode(&header, claims, &EncodingKey::from_ed_pem(&pem).unwrap()).unwrap()
}

fn claims(aud: Value, iat: Option<u64>, exp: u64) -> Value {
    let mut c = json!({
        "sub": "carol", "iss": "context-service", "aud": aud, "exp": exp,
        "scope": "workloads:read workloads:write",
    });
    if let Some(iat) = iat {
        c["iat"] = iat.into();
    }
    c
}

#[tokio::test]
async fn lifetime_and_array_audience_over_http() {
    let server = TestServer::start_with(|c| {
        c.token_max_lifetime = Some(std::time::Duration::from_secs(3600));
    })
    .await;
    let list = |token: String| {
        let caller = Caller::with_token(&server, token);
        async move { caller.get("/v1/workloads").await }
    };
    let t = now();

    let array = claims(json!(["billing", "context-service"]), Some(t), t + 600);
    assert_eq!(list(signed(&server, &array)).await.status(), 200);
    let elsewhere = claims(json!(["billing", "search"]), Some(t), t + 600);
    let resp = list(signed(&server, &elsewhere)).await;
    assert_error(resp, 401, "token_invalid", "not meant for this service").await;

    let long = claims(json!("context-service"), Some(t), t + 7200);
    let resp = list(signed(&server, &long)).await;
    assert_error(
        resp,
        401,
        "token_invalid",
        "the token's lifetime (exp - iat) is 7200s; at most 3600s is accepted",
    )
    .await;
    let no_iat = claims(json!("context-service"), None, t + 600);
    let resp = list(signed(&server, &no_iat)).await;
    assert_error(resp, 401, "token_invalid", "\"iat\"").await;

    // The development token (contextctl's default) fits the maximum, and
    // another user is served all along.
    let dev = std::fs::read_to_string(server.data_dir.join("auth/dev-token")).unwrap();
    assert_eq!(list(dev.trim().to_owned()).await.status(), 200);
    assert_eq!(
        Caller::user(&server, "bob")
            .get("/v1/workloads")
            .await
            .status(),
        200
    );
}

#[tokio::test]
async fn a_jwks_with_a_small_rsa_key_refuses_to_start() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("jwks.json");
    let n = "s-azoYI2miqaQPIIys94cxqyXAeQ-Tlf8Pvx3R2xakm8VvuGy9m0wWQTn8dx4BrVk-MyNu6YzFzQhtEThmd3thIS3mBBX96NY3V2-yLfTmkBk71604A7EYet5P2iHcDSP-morhT5Dmw0lKSnRdg3hUzEC8qi3_bI_CsWeA-fBUs";
    let jwks =
        json!({"keys": [{"kty": "RSA", "kid": "small", "alg": "RS256", "e": "AQAB", "n": n}]});
    std::fs::write(&path, jwks.to_string()).unwrap();
    let err = match TestServer::try_start_with(|c| c.jwks_file = Some(path.clone())).await {
        Ok(_) => panic!("started with a 1024-bit RSA key"),
        Err(e) => format!("{e:#}"),
    };
    assert!(err.contains("loading the JWKS"), "{err}");
    assert!(
        err.contains("key \"small\": its RSA modulus has 1024 bits; at least 2048 are required"),
        "{err}"
    );
}
