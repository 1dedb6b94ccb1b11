//! The JWT/Principal path of every API call: `Authorization` and
//! `X-Context-Subject` headers through the same extractor the handlers use.
//! Besides raw header bytes, the input can be a token whose header and
//! claims JSON come from the fuzzer and that is correctly signed with the
//! HS256 secret this target trusts, so claim decoding, time checks,
//! audiences, lifetimes, scopes and delegation are reached too.
//! Invariants: no panic; refusals are 400/401/403 with a message; an
//! accepted principal has a non-empty subject, owns as a token subject
//! unless a `delegate` token named `user:<id>`, and then owns as that user.
#![no_main]

use std::sync::OnceLock;
use std::time::Duration;

use arbitrary::Arbitrary;
use base64::Engine as _;
use context_service::api::extract::principal;
use context_service::auth::{Authenticator, KeySet, Owner, Scope, TokenPolicy};
use http::{HeaderMap, HeaderValue};
use jsonwebtoken::{Algorithm, EncodingKey};

const SECRET: &[u8] = b"fuzzing-secret-0123456789-abcdefghijklmnop";

fn auth() -> &'static Authenticator {
    static AUTH: OnceLock<Authenticator> = OnceLock::new();
    AUTH.get_or_init(|| {
        let mut keys = KeySet::new();
        keys.set_hs256_secret(SECRET).expect("secret");
        let policy = TokenPolicy {
            max_lifetime: Some(Duration::from_secs(3600)),
            ..TokenPolicy::default()
        };
        Authenticator::new(keys, policy)
    })
}

#[derive(Debug, Arbitrary)]
enum Authorization<'a> {
    /// The header's bytes as they arrive.
    Raw(&'a [u8]),
    /// `Bearer <b64(header)>.<b64(claims)>.<HS256 signature>`.
    Signed { header: &'a str, claims: &'a str },
    /// Like `Signed`, with claims that pass most checks and fuzzed values
    /// where it matters.
    Shaped {
        sub: &'a str,
        aud: Vec<&'a str>,
        scope: &'a str,
        /// Adds the `delegate` scope (a hash lookup gives the fuzzer no
        /// comparison to learn it from).
        delegate: bool,
        exp_offset: i32,
        iat_offset: Option<i32>,
    },
}

#[derive(Debug, Arbitrary)]
enum SubjectHeader<'a> {
    /// The header's bytes as they arrive.
    Raw(&'a [u8]),
    /// `user:<id>`.
    User(&'a str),
}

#[derive(Debug, Arbitrary)]
struct Input<'a> {
    authorization: Authorization<'a>,
    subject: Option<SubjectHeader<'a>>,
}

fn sign(header: &str, claims: &str) -> String {
    let b64 = base64::engine::general_purpose::URL_SAFE_NO_PAD;
    let message = format!("{}.{}", b64.encode(header), b64.encode(claims));
    let key = EncodingKey::from_secret(SECRET).expect("key");
    let signature =
        jsonwebtoken::crypto::sign(message.as_bytes(), &key, Algorithm::HS256).expect("sign");
    format!("Bearer {message}.{signature}")
}

fn now() -> i64 {
    jsonwebtoken::get_current_timestamp() as i64
}

libfuzzer_sys::fuzz_target!(|input: Input| {
    let value = match input.authorization {
        Authorization::Raw(bytes) => bytes.to_vec(),
        Authorization::Signed { header, claims } => sign(header, claims).into_bytes(),
        Authorization::Shaped {
            sub,
            aud,
            scope,
            delegate,
            exp_offset,
            iat_offset,
        } => {
            let scope = if delegate {
                format!("{scope} delegate")
            } else {
                scope.to_owned()
            };
            let mut claims = serde_json::json!({
                "sub": sub, "iss": "context-service", "scope": scope,
                "exp": now() + i64::from(exp_offset),
            });
            claims["aud"] = match aud.as_slice() {
                [one] => serde_json::json!(one),
                many => serde_json::json!(many),
            };
            if let Some(offset) = iat_offset {
                claims["iat"] = (now() + i64::from(offset)).into();
            }
            sign(r#"{"alg":"HS256","typ":"JWT"}"#, &claims.to_string()).into_bytes()
        }
    };
    let mut headers = HeaderMap::new();
    let Ok(value) = HeaderValue::from_bytes(&value) else {
        return;
    };
    headers.insert(http::header::AUTHORIZATION, value);
    let mut named = None;
    if let Some(subject) = input.subject {
        let bytes = match subject {
            SubjectHeader::Raw(bytes) => bytes.to_vec(),
            SubjectHeader::User(id) => format!("user:{id}").into_bytes(),
        };
        let Ok(value) = HeaderValue::from_bytes(&bytes) else {
            return;
        };
        named = value.to_str().ok().map(str::to_owned);
        headers.insert("x-context-subject", value);
    }
    match principal(auth(), &headers) {
        Ok(p) => {
            assert!(!p.subject().is_empty());
            match (p.owner(), p.delegated_by()) {
                (Owner::Subject(_), None) => assert!(named.is_none()),
                (Owner::User(id), Some(by)) => {
                    assert!(!by.is_empty());
                    assert_eq!(named.as_deref(), Some(format!("user:{id}").as_str()));
                    assert!(p.has(Scope::Delegate));
                }
                (owner, by) => panic!("owner {owner:?} delegated by {by:?}"),
            }
        }
        Err(e) => {
            let status = e.status().as_u16();
            assert!(matches!(status, 400 | 401 | 403), "status {status}: {e}");
            assert!(!e.message().is_empty());
        }
    }
});
