//! Issue 10, item 1: the HS256 secret is used as the bytes stored in its
//! file, and a weak one stops the service from starting.

use std::path::Path;
use std::time::{SystemTime, UNIX_EPOCH};

use crate::common::{assert_error, Caller, TestServer};
use context_service::auth::{Claims, TokenPolicy};
use jsonwebtoken::{encode, Algorithm, EncodingKey, Header};

/// 32 distinct bytes, none of them valid UTF-8 on its own: a lossy UTF-8
/// conversion turns them into 32 U+FFFD, a constant anyone can compute.
fn non_utf8_secret() -> Vec<u8> {
    (0x80u8..0xa0).collect()
}

fn hs256_token(secret: &[u8], sub: &str) -> String {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let policy = TokenPolicy::default();
    let claims = Claims {
        sub: sub.into(),
        iss: policy.issuer,
        aud: policy.audience.into(),
        exp: now + 600,
        iat: Some(now),
        nbf: None,
        scope: "workloads:read workloads:write".into(),
    };
    encode(
        &Header::new(Algorithm::HS256),
        &claims,
        &EncodingKey::from_secret(secret).unwrap(),
    )
    .unwrap()
}

async fn start_with_secret(dir: &Path, contents: &[u8]) -> anyhow::Result<TestServer> {
    let path = dir.join("hs256.secret");
    std::fs::write(&path, contents).unwrap();
    TestServer::try_start_with(|c| c.hs256_secret_file = Some(path)).await
}

#[tokio::test]
async fn a_non_utf8_secret_is_used_as_stored() {
    let dir = tempfile::tempdir().unwrap();
    let secret = non_utf8_secret();
    let server = start_with_secret(dir.path(), &secret).await.unwrap();

    let genuine = Caller::with_token(&server, hs256_token(&secret, "carol"));
    let resp = genuine.get("/v1/workloads").await;
    assert_eq!(resp.status(), 200);
    let body: serde_json::Value = resp.json().await.unwrap();
    assert_eq!(body["workloads"], serde_json::json!([]));

    // What the old lossy UTF-8 conversion and trim() made of the secret.
    let mangled = String::from_utf8_lossy(&secret).trim().as_bytes().to_vec();
    assert_ne!(mangled, secret);
    let forged = Caller::with_token(&server, hs256_token(&mangled, "carol"));
    let resp = forged.get("/v1/workloads").await;
    assert_error(resp, 401, "token_invalid", "signature does not verify").await;

    // The service still answers its genuine callers and the dev token.
    assert_eq!(genuine.get("/v1/workloads").await.status(), 200);
    let alice = Caller::user(&server, "alice");
    assert_eq!(alice.get("/v1/workloads").await.status(), 200);
}

#[tokio::test]
async fn encoded_secrets_decode_before_use() {
    let dir = tempfile::tempdir().unwrap();
    let secret = non_utf8_secret();
    let file = format!("hex:{}\n", hex::encode(&secret));
    let server = start_with_secret(dir.path(), file.as_bytes())
        .await
        .unwrap();
    let genuine = Caller::with_token(&server, hs256_token(&secret, "carol"));
    assert_eq!(genuine.get("/v1/workloads").await.status(), 200);
    // The file's text is not the secret.
    let text = Caller::with_token(&server, hs256_token(file.as_bytes(), "carol"));
    let resp = text.get("/v1/workloads").await;
    assert_error(resp, 401, "token_invalid", "signature").await;
}

#[tokio::test]
async fn weak_secrets_refuse_to_start_with_one_line_naming_the_setting() {
    let dir = tempfile::tempdir().unwrap();
    let cases: [(&[u8], &str); 4] = [
        (b"short-secret\n", "at least 32 bytes; it is 13"),
        // 40 bytes of text, but only 16 once decoded.
        (
            b"hex:00112233445566778899aabbccddeeff\n",
            "at least 32 bytes; it is 16",
        ),
        (&[0xffu8; 64], "1 distinct byte values"),
        (b"base64:%%%\n", "base64 secret does not decode"),
    ];
    for (contents, expected) in cases {
        let err = match start_with_secret(dir.path(), contents).await {
            Ok(_) => panic!("started with the secret {contents:?}"),
            Err(e) => format!("{e:#}"),
        };
        assert!(!err.contains('\n'), "one line: {err}");
        assert!(
            err.contains("--hs256-secret-file/CS_HS256_SECRET_FILE"),
            "{err}"
        );
        assert!(err.contains(expected), "{err} should say {expected:?}");
    }

    // The binary prints the same line and exits non-zero.
    let path = dir.path().join("hs256.secret");
    std::fs::write(&path, [0x41u8; 48]).unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_context-service"))
        .args(["serve", "--listen", "127.0.0.1:0", "--data-dir"])
        .arg(dir.path().join("data"))
        .arg("--hs256-secret-file")
        .arg(&path)
        .env("RUST_LOG", "off")
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    let lines: Vec<&str> = stderr.lines().collect();
    assert_eq!(lines.len(), 1, "{stderr}");
    assert!(
        lines[0].starts_with("context-service: --hs256-secret-file/CS_HS256_SECRET_FILE"),
        "{stderr}"
    );
    assert!(lines[0].contains("1 distinct byte values"), "{stderr}");
}
