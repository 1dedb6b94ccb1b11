//! Token verification against the attacks the design names.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use base64::Engine;
use jsonwebtoken::{encode, Algorithm, EncodingKey, Header};

use super::dev::DevIssuer;
use super::*;

const ES256_PEM: &[u8] = include_bytes!("testdata/es256.pem");
const RS256_PEM: &[u8] = include_bytes!("testdata/rs256.pem");
const TEST_JWKS: &str = include_str!("testdata/jwks.json");

fn now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

fn claims(sub: &str, scope: &str) -> Claims {
    let policy = TokenPolicy::default();
    Claims {
        sub: sub.into(),
        iss: policy.issuer,
        aud: policy.audience.into(),
        exp: now() + 600,
        iat: Some(now()),
        nbf: None,
        scope: scope.into(),
    }
}

/// A development issuer and an authenticator that trusts it (and the test
/// JWKS); the API's extractor tests use it too.
pub(crate) struct Fixture {
    _dir: tempfile::TempDir,
    pub(crate) issuer: DevIssuer,
    pub(crate) auth: Authenticator,
}

/// A fresh [`Fixture`] in a temp dir.
pub(crate) fn fixture() -> Fixture {
    let dir = tempfile::tempdir().unwrap();
    let issuer = DevIssuer::ensure(dir.path()).unwrap();
    let mut keys = KeySet::new();
    keys.add_jwks(&issuer.jwks()).unwrap();
    keys.add_jwks(&serde_json::from_str(TEST_JWKS).unwrap())
        .unwrap();
    Fixture {
        _dir: dir,
        issuer,
        auth: Authenticator::new(keys, TokenPolicy::default()),
    }
}

fn refused(result: Result<Principal, AuthError>) -> AuthError {
    result.expect_err("token must be refused")
}

fn is_invalid(result: Result<Principal, AuthError>) -> bool {
    matches!(refused(result), AuthError::TokenInvalid(_))
}

#[test]
fn dev_token_verifies_with_its_scopes() {
    let f = fixture();
    let token = f
        .issuer
        .mint(
            &TokenPolicy::default(),
            "alice",
            "pools:read workloads:write",
            Duration::from_secs(60),
        )
        .unwrap();
    let p = f.auth.authenticate(&token, None).unwrap();
    assert_eq!(p.subject(), "alice");
    assert!(p.has(Scope::PoolsRead));
    assert!(p.require(Scope::WorkloadsWrite).is_ok());
    let missing = p.require(Scope::PoolsWrite).unwrap_err();
    assert_eq!(missing, AuthError::ScopeMissing(Scope::PoolsWrite));
    assert!(missing.to_string().contains("pools:write"));
}

#[test]
fn dev_key_is_reused_across_starts() {
    let dir = tempfile::tempdir().unwrap();
    let a = DevIssuer::ensure(dir.path()).unwrap();
    let b = DevIssuer::ensure(dir.path()).unwrap();
    assert_eq!(a.kid(), b.kid());
    let path = a
        .write_dev_token(dir.path(), &TokenPolicy::default())
        .unwrap();
    let token = std::fs::read_to_string(path).unwrap();
    let mut keys = KeySet::new();
    keys.add_jwks(&b.jwks()).unwrap();
    let auth = Authenticator::new(keys, TokenPolicy::default());
    assert_eq!(
        auth.authenticate(token.trim(), None).unwrap().subject(),
        dev::DEV_SUBJECT
    );
}

#[test]
fn es256_and_rs256_keys_from_jwks_verify() {
    let f = fixture();
    for (alg, kid, pem) in [
        (Algorithm::ES256, "test-es256", ES256_PEM),
        (Algorithm::RS256, "test-rs256", RS256_PEM),
    ] {
        let key = match alg {
            Algorithm::ES256 => EncodingKey::from_ec_pem(pem).unwrap(),
            _ => EncodingKey::from_rsa_pem(pem).unwrap(),
        };
        let mut header = Header::new(alg);
        header.kid = Some(kid.into());
        let token = encode(&header, &claims("bob", "pools:read"), &key).unwrap();
        assert_eq!(f.auth.authenticate(&token, None).unwrap().subject(), "bob");
        // The same token under the other key's kid does not verify.
        let other = if kid == "test-es256" {
            "test-rs256"
        } else {
            "test-es256"
        };
        let mut header = Header::new(alg);
        header.kid = Some(other.into());
        let token = encode(&header, &claims("bob", "pools:read"), &key).unwrap();
        assert!(is_invalid(f.auth.authenticate(&token, None)));
    }
}

#[test]
fn wrong_signature_is_invalid() {
    let f = fixture();
    let stranger_dir = tempfile::tempdir().unwrap();
    let stranger = DevIssuer::ensure(stranger_dir.path()).unwrap();
    let token = stranger
        .mint(
            &TokenPolicy::default(),
            "alice",
            "pools:read",
            Duration::from_secs(60),
        )
        .unwrap();
    // Same kid as the trusted key, forged with another key.
    let parts: Vec<&str> = token.split('.').collect();
    let mut header: serde_json::Value = serde_json::from_slice(
        &base64::engine::general_purpose::URL_SAFE_NO_PAD
            .decode(parts[0])
            .unwrap(),
    )
    .unwrap();
    header["kid"] = f.issuer.kid().into();
    let forged = format!(
        "{}.{}.{}",
        base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(header.to_string()),
        parts[1],
        parts[2]
    );
    let err = f.auth.authenticate(&forged, None).unwrap_err();
    assert!(matches!(err, AuthError::TokenInvalid(_)));
    assert!(err.to_string().contains("signature"), "{err}");
}

#[test]
fn alg_none_is_invalid() {
    let f = fixture();
    let b64 = base64::engine::general_purpose::URL_SAFE_NO_PAD;
    let header = b64.encode(format!(
        r#"{{"alg":"none","typ":"JWT","kid":"{}"}}"#,
        f.issuer.kid()
    ));
    let body = b64.encode(serde_json::to_vec(&claims("alice", "pools:read")).unwrap());
    for token in [format!("{header}.{body}."), format!("{header}.{body}")] {
        assert!(is_invalid(f.auth.authenticate(&token, None)));
    }
}

#[test]
fn hs256_with_the_public_key_as_secret_is_invalid() {
    let f = fixture();
    let public = serde_json::to_vec(&f.issuer.jwks()).unwrap();
    let x = match &f.issuer.jwks().keys[0].algorithm {
        jsonwebtoken::jwk::AlgorithmParameters::OctetKeyPair(p) => p.x.clone(),
        other => panic!("not an OKP key: {other:?}"),
    };
    for secret in [public.clone(), x.into_bytes()] {
        let mut header = Header::new(Algorithm::HS256);
        header.kid = Some(f.issuer.kid().into());
        let token = encode(
            &header,
            &claims("alice", "pools:read"),
            &EncodingKey::from_secret(&secret).unwrap(),
        )
        .unwrap();
        assert!(is_invalid(f.auth.authenticate(&token, None)));
        // Without a kid: HS256 is not configured, so nothing verifies it.
        let token = encode(
            &Header::new(Algorithm::HS256),
            &claims("alice", "pools:read"),
            &EncodingKey::from_secret(&secret).unwrap(),
        )
        .unwrap();
        assert!(is_invalid(f.auth.authenticate(&token, None)));
    }
}

#[test]
fn hs256_works_only_when_configured() {
    let secret = b"0123456789abcdef0123456789abcdef";
    let mut keys = KeySet::new();
    assert!(matches!(
        keys.set_hs256_secret(b"short"),
        Err(KeyError::WeakSecret(secret::SecretError::TooShort(5)))
    ));
    keys.set_hs256_secret(secret).unwrap();
    let auth = Authenticator::new(keys, TokenPolicy::default());
    let token = encode(
        &Header::new(Algorithm::HS256),
        &claims("carol", "workloads:read"),
        &EncodingKey::from_secret(secret).unwrap(),
    )
    .unwrap();
    assert_eq!(auth.authenticate(&token, None).unwrap().subject(), "carol");
    let wrong = encode(
        &Header::new(Algorithm::HS256),
        &claims("carol", "workloads:read"),
        &EncodingKey::from_secret(b"another-secret-another-secret-xx").unwrap(),
    )
    .unwrap();
    assert!(is_invalid(auth.authenticate(&wrong, None)));
}

#[test]
fn expired_not_yet_valid_wrong_audience_and_issuer() {
    let f = fixture();
    let key = EncodingKey::from_ec_pem(ES256_PEM).unwrap();
    let mut header = Header::new(Algorithm::ES256);
    header.kid = Some("test-es256".into());
    let sign = |c: &Claims| encode(&header, c, &key).unwrap();

    let mut c = claims("alice", "pools:read");
    c.exp = now() - 3600;
    assert_eq!(
        refused(f.auth.authenticate(&sign(&c), None)),
        AuthError::TokenExpired
    );

    let mut c = claims("alice", "pools:read");
    c.nbf = Some(now() + 3600);
    assert!(is_invalid(f.auth.authenticate(&sign(&c), None)));

    let mut c = claims("alice", "pools:read");
    c.aud = "someone-else".into();
    let err = f.auth.authenticate(&sign(&c), None).unwrap_err();
    assert!(matches!(err, AuthError::TokenInvalid(_)));
    assert!(err.to_string().contains("not meant for this service"));

    let mut c = claims("alice", "pools:read");
    c.iss = "evil".into();
    let err = f.auth.authenticate(&sign(&c), None).unwrap_err();
    assert!(err.to_string().contains("issuer"));

    // A token without exp at all.
    let no_exp =
        serde_json::json!({"sub": "alice", "iss": "context-service", "aud": "context-service"});
    let err = f
        .auth
        .authenticate(&encode(&header, &no_exp, &key).unwrap(), None)
        .unwrap_err();
    assert!(matches!(err, AuthError::TokenInvalid(_)));
    assert!(err.to_string().contains("exp"), "{err}");
}

#[test]
fn delegation_needs_the_delegate_scope() {
    let f = fixture();
    let mint = |scope: &str| {
        f.issuer
            .mint(
                &TokenPolicy::default(),
                "moca",
                scope,
                Duration::from_secs(60),
            )
            .unwrap()
    };
    let p = f
        .auth
        .authenticate(&mint("delegate workloads:read"), Some("user:alice"))
        .unwrap();
    assert_eq!(p.subject(), "alice");
    // The user alice, never a token subject of that name.
    assert_eq!(p.owner(), &Owner::User("alice".into()));
    assert_eq!(p.owner().key(), "user:alice");
    assert_eq!(p.delegated_by(), Some("moca"));
    let direct = f.auth.authenticate(&mint("delegate"), None).unwrap();
    assert_eq!(direct.owner(), &Owner::Subject("moca".into()));
    assert!(p.has(Scope::WorkloadsRead));

    let err = f
        .auth
        .authenticate(&mint("workloads:read"), Some("user:alice"))
        .unwrap_err();
    assert_eq!(err, AuthError::DelegateMissing);
    assert!(err.to_string().contains("delegate"));

    // Upstream's other kinds are owners of their own kind.
    let agent = f
        .auth
        .authenticate(&mint("delegate"), Some("agent:alice"))
        .unwrap();
    assert_eq!(agent.owner(), &Owner::Agent("alice".into()));
    assert_ne!(agent.owner().key(), p.owner().key());

    for bad in [
        "alice",
        "user:",
        "group:x",
        "user:a b",
        "user:anonymous",
        "service:context-service-admin",
    ] {
        let err = f
            .auth
            .authenticate(&mint("delegate"), Some(bad))
            .unwrap_err();
        assert_eq!(err, AuthError::SubjectInvalid, "{bad}");
    }
}

/// A 1024-bit RSA public key: too small to trust.
pub(crate) const RSA_1024_JWKS: &str = r#"{"keys": [{"kty": "RSA", "kid": "small", "alg": "RS256", "e": "AQAB",
  "n": "s-azoYI2miqaQPIIys94cxqyXAeQ-Tlf8Pvx3R2xakm8VvuGy9m0wWQTn8dx4BrVk-MyNu6YzFzQhtEThmd3thIS3mBBX96NY3V2-yLfTmkBk71604A7EYet5P2iHcDSP-morhT5Dmw0lKSnRdg3hUzEC8qi3_bI_CsWeA-fBUs"}]}"#;

#[test]
fn rsa_keys_below_2048_bits_are_refused() {
    let mut keys = KeySet::new();
    let err = keys
        .add_jwks(&serde_json::from_str(RSA_1024_JWKS).unwrap())
        .unwrap_err();
    assert!(matches!(err, KeyError::Unsupported { .. }), "{err}");
    assert_eq!(
        err.to_string(),
        "key \"small\": its RSA modulus has 1024 bits; at least 2048 are required"
    );
    assert!(keys.is_empty());
    // The 2048-bit test key is accepted (the fixture loads it).
    assert_eq!(fixture().auth.keys.len(), 3);
    assert_eq!(keys::rsa_modulus_bits("AQAB"), Some(17));
    assert_eq!(keys::rsa_modulus_bits("AAAB"), Some(1));
    assert_eq!(keys::rsa_modulus_bits("AAAA"), None);
}

fn es256_token(c: &serde_json::Value) -> String {
    let mut header = Header::new(Algorithm::ES256);
    header.kid = Some("test-es256".into());
    encode(&header, c, &EncodingKey::from_ec_pem(ES256_PEM).unwrap()).unwrap()
}

fn with_policy(policy: TokenPolicy) -> Authenticator {
    let mut keys = KeySet::new();
    keys.add_jwks(&serde_json::from_str(TEST_JWKS).unwrap())
        .unwrap();
    Authenticator::new(keys, policy)
}

#[test]
fn an_array_audience_must_name_this_service() {
    let auth = with_policy(TokenPolicy::default());
    let mut c = serde_json::to_value(claims("alice", "pools:read")).unwrap();
    c["aud"] = serde_json::json!(["other", "context-service"]);
    let p = auth.authenticate(&es256_token(&c), None).unwrap();
    assert_eq!(p.subject(), "alice");
    for aud in [serde_json::json!(["a", "b"]), serde_json::json!([])] {
        c["aud"] = aud;
        let err = auth.authenticate(&es256_token(&c), None).unwrap_err();
        assert!(
            err.to_string().contains("not meant for this service"),
            "{err}"
        );
    }
    c["aud"] = serde_json::json!([1, 2]);
    assert!(is_invalid(auth.authenticate(&es256_token(&c), None)));
}

#[test]
fn the_maximum_lifetime_bounds_exp_minus_iat() {
    let policy = TokenPolicy {
        max_lifetime: Some(Duration::from_secs(3600)),
        ..TokenPolicy::default()
    };
    let auth = with_policy(policy.clone());
    let mut c = serde_json::to_value(claims("alice", "pools:read")).unwrap();
    let now = now();
    c["iat"] = now.into();
    c["exp"] = (now + 3600).into();
    assert!(auth.authenticate(&es256_token(&c), None).is_ok());
    c["exp"] = (now + 3601).into();
    let err = auth.authenticate(&es256_token(&c), None).unwrap_err();
    assert_eq!(
        err,
        AuthError::token_invalid(
            "the token's lifetime (exp - iat) is 3601s; at most 3600s is accepted"
        )
    );
    c["iat"] = (now + 7200).into();
    let err = auth.authenticate(&es256_token(&c), None).unwrap_err();
    assert!(err.to_string().contains("exp < iat"), "{err}");
    c.as_object_mut().unwrap().remove("iat");
    let err = auth.authenticate(&es256_token(&c), None).unwrap_err();
    assert!(err.to_string().contains("\"iat\""), "{err}");
    // Without a maximum, neither iat nor a short life is required.
    assert!(with_policy(TokenPolicy::default())
        .authenticate(&es256_token(&c), None)
        .is_ok());

    // The development token is minted within the maximum.
    let dir = tempfile::tempdir().unwrap();
    let issuer = DevIssuer::ensure(dir.path()).unwrap();
    let path = issuer.write_dev_token(dir.path(), &policy).unwrap();
    let mut keys = KeySet::new();
    keys.add_jwks(&issuer.jwks()).unwrap();
    let token = std::fs::read_to_string(path).unwrap();
    let claims = Authenticator::new(keys, policy)
        .verify(token.trim())
        .unwrap();
    assert_eq!(claims.exp - claims.iat.unwrap(), 3600);
}

#[test]
fn garbage_tokens_are_refused_in_plain_words() {
    let f = fixture();
    let b64 = |s: &str| base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(s);
    let header = b64(r#"{"alg":"EdDSA","kid":"nope"}"#);
    let not_json = "the bearer token is not a valid JWT: its header is not a JSON object naming a supported \"alg\"";
    let cases = [
        ("not-a-jwt", NOT_A_JWT),
        ("a.b", NOT_A_JWT),
        ("!!.!!.!!", NOT_A_JWT),
        (&*format!("{}.e30.sig", b64("not json")), not_json),
        (&*format!("{}.e30.sig", b64(r#"{"alg":"XX999"}"#)), not_json),
        (
            &*format!("{header}.e30.sig"),
            "no trusted key matches the token's kid and algorithm",
        ),
    ];
    for (token, message) in cases {
        assert_eq!(
            refused(f.auth.authenticate(token, None)),
            AuthError::token_invalid(message),
            "{token}"
        );
    }
    // Signed claims of the wrong shape; a signature that is not base64url.
    let shape = "the token's claims are not a JSON object with the expected types (strings for sub, iss and scope, numbers for exp, iat and nbf)";
    let mut wrong_type = serde_json::to_value(claims("a", "")).unwrap();
    wrong_type["sub"] = serde_json::json!(5);
    let good = es256_token(&serde_json::to_value(claims("a", "")).unwrap());
    let unsigned = format!("{}.!!", good.rsplit_once('.').unwrap().0);
    for (token, message) in [
        (es256_token(&serde_json::json!([1])), shape),
        (es256_token(&wrong_type), shape),
        (unsigned, NOT_A_JWT),
    ] {
        assert_eq!(
            refused(f.auth.authenticate(&token, None)),
            AuthError::token_invalid(message),
            "{token}"
        );
    }
}
