//! The HTTP API's JSON body decoders (pool create, context create,
//! workload create, activate), each exactly as its handler runs it, then
//! the validation that follows. Invariants: no panic; every refusal is a
//! `400 invalid_request` (or `415` for a non-JSON media type) with a
//! message; whatever is accepted satisfies the rules it was checked for.
#![no_main]

use arbitrary::Arbitrary;
use context_service::api::decode;
use context_service::pool::validate;
use context_service::workload::names;

#[derive(Debug, Arbitrary)]
enum Body {
    Pool { truncated: bool },
    Context { truncated: bool },
    Workload { content_type: ContentType },
    Activate { content_type: ContentType },
}

#[derive(Debug, Arbitrary)]
enum ContentType {
    Json,
    Problem,
    Text,
    Missing,
}

impl ContentType {
    fn header(&self) -> Option<&'static str> {
        match self {
            ContentType::Json => Some("application/json; charset=utf-8"),
            ContentType::Problem => Some("application/merge-patch+json"),
            ContentType::Text => Some("text/plain"),
            ContentType::Missing => None,
        }
    }
}

fn refused(err: &context_service::api::ApiError) {
    let status = err.status().as_u16();
    assert!(status == 400 || status == 415, "status {status}: {err}");
    assert!(!err.message().is_empty());
}

libfuzzer_sys::fuzz_target!(|input: (Body, &[u8])| {
    let (body, bytes) = input;
    match body {
        Body::Pool { truncated } => {
            let req = match decode::pool_create(bytes, !truncated) {
                Ok(req) => req,
                Err(message) => return assert!(!message.is_empty()),
            };
            if let Ok(spec) = validate::pool(&req, "0123456789abcdef0123456789abcdef") {
                assert!((1..=100).contains(&spec.replicas), "{spec:?}");
                assert!(validate::is_pool_name(&spec.name), "{spec:?}");
                assert_eq!(i64::from(spec.replicas), req.replicas);
            }
        }
        Body::Context { truncated } => {
            let req = match decode::context_create(bytes, !truncated) {
                Ok(req) => req,
                Err(message) => return assert!(!message.is_empty()),
            };
            if let Ok(spec) = validate::context(&req, "0123456789abcdef0123456789abcdef") {
                assert!(validate::is_pool_name(&spec.name), "{spec:?}");
                assert!(validate::is_dns1123_label(&spec.namespace), "{spec:?}");
            }
        }
        Body::Workload { content_type } => {
            match decode::parse_json::<decode::WorkloadCreateBody>(bytes, content_type.header()) {
                Ok(body) => {
                    // An accepted name is a DNS label (it names objects and
                    // folders).
                    if let Some(name) = body.name.as_deref().filter(|n| names::is_valid_name(n)) {
                        assert!(validate::is_dns1123_label(name), "{name:?}");
                    }
                }
                Err(e) => refused(&e),
            }
        }
        Body::Activate { content_type } => {
            match decode::parse_json::<decode::ActivateBody>(bytes, content_type.header()) {
                Ok(body) => {
                    let hex = body.revision.len() == 64
                        && body
                            .revision
                            .bytes()
                            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b));
                    assert_eq!(
                        names::is_valid_revision(&body.revision),
                        hex,
                        "{:?}",
                        body.revision
                    );
                }
                Err(e) => refused(&e),
            }
        }
    }
});
