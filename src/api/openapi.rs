//! The OpenAPI document of the API (`GET /openapi.json`), generated from
//! the handlers' `#[utoipa::path]` attributes and the view types' schemas.
//! The router and the document are built from the same `routes!` list
//! (see [`super::routes`]), so a route cannot be served undocumented.
//!
//! Every error answer of an operation is listed under its status with the
//! exact error codes in the `x-error-codes` extension (an array of strings)
//! and in the description; the per-route lists are [`ErrorSet`]s built
//! from the shared sets below, which follow the mapping in
//! [`super::error`].

use std::collections::BTreeMap;
use std::marker::PhantomData;

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Extension;
use bytes::Bytes;
use utoipa::openapi::extensions::ExtensionsBuilder;
use utoipa::openapi::security::{ApiKey, ApiKeyValue, HttpAuthScheme, HttpBuilder, SecurityScheme};
use utoipa::openapi::{ContentBuilder, Ref, RefOr, ResponseBuilder};
use utoipa::{IntoParams, IntoResponses, Modify, OpenApi, ToSchema};

use super::error::Code;
use super::error_body::ErrorBody;
use crate::delivery::FailedBody;

/// The extension of an error response that lists its error codes.
pub const ERROR_CODES_EXTENSION: &str = "x-error-codes";

/// Security scheme: `Authorization: Bearer <JWT>`.
pub const BEARER: &str = "bearer";
/// Security scheme: upstream's `X-SH-Auth: <JWT>` header (the same token).
pub const SH_AUTH: &str = "shAuth";
/// Security scheme: `Authorization: Bearer <upload grant token>`.
pub const UPLOAD_GRANT: &str = "uploadGrant";
/// Security scheme of the trusted routes: `Authorization: Bearer <service
/// token or delegate JWT>`.
pub const SERVICE: &str = "service";
/// Security scheme of the trusted routes: the same credential in
/// `X-SH-Auth`.
pub const SERVICE_SH_AUTH: &str = "serviceShAuth";

/// The document's fixed part: metadata, shared schemas, security schemes.
#[derive(OpenApi)]
#[openapi(
    info(
        title = "Context Service",
        description = "Allocation engine and context gateway for AI-agent sandboxes. \
            Every error answer is `{\"error\": \"<code>\", \"message\": \"<text>\"}`; \
            the codes an operation can answer are listed per status in `x-error-codes`.",
        license(name = "Apache-2.0", identifier = "Apache-2.0")
    ),
    components(schemas(ErrorBody, FailedBody)),
    modifiers(&SecuritySchemes),
    tags(
        (name = "service", description = "Health, readiness, metrics and this document"),
        (name = "pools", description = "Sandbox pools"),
        (name = "contexts", description = "Named contexts"),
        (name = "workloads", description = "Workloads and their bundles"),
        (name = "deliveries", description = "Deliveries of workloads into sandboxes"),
        (name = "trusted", description = "The trusted (Moca) API: a platform service \
            manages Contexts for the subject named in `X-Context-Subject`"),
    )
)]
pub(super) struct Base;

struct SecuritySchemes;

impl Modify for SecuritySchemes {
    fn modify(&self, doc: &mut utoipa::openapi::OpenApi) {
        let components = doc.components.get_or_insert_with(Default::default);
        components.add_security_scheme(
            BEARER,
            SecurityScheme::Http(
                HttpBuilder::new()
                    .scheme(HttpAuthScheme::Bearer)
                    .bearer_format("JWT")
                    .description(Some(
                        "An API token: a JWT carrying `sub` and `scope`. A `401` for it \
                         carries `WWW-Authenticate: Bearer realm=\"context-service\"` (with \
                         `error=\"invalid_token\"` when a token was sent and refused).",
                    ))
                    .build(),
            ),
        );
        components.add_security_scheme(
            SH_AUTH,
            SecurityScheme::ApiKey(ApiKey::Header(ApiKeyValue::with_description(
                "X-SH-Auth",
                "The same JWT as `Authorization: Bearer`, as upstream clients send it. \
                 When both are sent they must carry the same token.",
            ))),
        );
        components.add_security_scheme(
            UPLOAD_GRANT,
            SecurityScheme::Http(
                HttpBuilder::new()
                    .scheme(HttpAuthScheme::Bearer)
                    .description(Some(
                        "The single-use token of an upload grant (`upload.token`), or of a \
                         trusted upload capability (`token`).",
                    ))
                    .build(),
            ),
        );
        components.add_security_scheme(
            SERVICE,
            SecurityScheme::Http(
                HttpBuilder::new()
                    .scheme(HttpAuthScheme::Bearer)
                    .description(Some(
                        "A platform service: the token of `--service-token-file`, or a JWT \
                         carrying the scope `delegate`. Anything else is `401 unauthorized` \
                         with `WWW-Authenticate: Bearer`.",
                    ))
                    .build(),
            ),
        );
        components.add_security_scheme(
            SERVICE_SH_AUTH,
            SecurityScheme::ApiKey(ApiKey::Header(ApiKeyValue::with_description(
                "X-SH-Auth",
                "The same service credential as `Authorization: Bearer` on the trusted \
                 routes. When both are sent they must carry the same token.",
            ))),
        );
    }
}

/// `X-Context-Subject`: a trusted service (scope `delegate`) acting for a
/// user.
#[derive(Debug, IntoParams)]
#[into_params(parameter_in = Header)]
pub(super) struct Delegation {
    /// `user:<id>`: act for this user (needs the scope `delegate`).
    #[param(rename = "X-Context-Subject")]
    #[allow(dead_code)]
    subject: Option<String>,
}

/// `X-Context-Subject` of a trusted route: the subject the platform
/// service acts for (required).
#[derive(Debug, IntoParams)]
#[into_params(parameter_in = Header)]
pub(super) struct TrustedSubject {
    /// `<kind>:<name>`: kind `user`, `agent`, `workload` or `service`, name
    /// 1 to 256 visible ASCII characters (`:` allowed); else `400
    /// invalid_subject`.
    #[param(rename = "X-Context-Subject")]
    #[allow(dead_code)]
    subject: String,
}

/// Authentication and authorisation of a user-token route
/// (`api::extract`): no, a bad or an expired token, a missing scope, a bad
/// `X-Context-Subject`.
pub(super) const AUTH: &[Code] = &[
    Code::TokenRequired,
    Code::TokenInvalid,
    Code::TokenExpired,
    Code::ScopeMissing,
    Code::InvalidRequest,
];

/// Every route but the streaming ones: the request deadline
/// (`api::limits`), and a failure the client cannot fix.
pub(super) const BASE: &[Code] = &[
    Code::DeadlineExceeded,
    Code::DatabaseUnavailable,
    Code::InternalError,
];

/// Streaming routes (no deadline): a failure the client cannot fix.
pub(super) const INTERNAL: &[Code] = &[Code::DatabaseUnavailable, Code::InternalError];

/// A route that reads a request body: it went quiet (`api::limits`).
pub(super) const BODY: &[Code] = &[Code::RequestTimeout];

/// A path parameter that cannot be decoded (`api::rejection`).
pub(super) const PATH: &[Code] = &[Code::InvalidRequest];

/// A JSON body read by `ApiJson` (`api::extract`): too large, not JSON,
/// not the schema.
pub(super) const JSON_BODY: &[Code] = &[
    Code::BodyTooLarge,
    Code::UnsupportedMediaType,
    Code::InvalidRequest,
];

/// A JSON body decoded like upstream's Go handlers (`api::json`): every
/// failure, even a body past the limit, is `400 invalid_request`.
pub(super) const GO_JSON_BODY: &[Code] = &[Code::InvalidRequest];

/// `PoolError::NotFound`.
pub(super) const NOT_FOUND: &[Code] = &[Code::NotFound];

/// A workload that does not exist (or is not the caller's).
pub(super) const WORKLOAD_NOT_FOUND: &[Code] = &[Code::WorkloadNotFound];

/// Whether a workload takes an upload (`check_uploadable`).
pub(super) const UPLOADABLE: &[Code] = &[Code::WorkloadAlreadyActive, Code::WorkloadNotReady];

/// Receiving a bundle (`api::workloads::upload`, the workload service and
/// the bundle engine's limits and rules).
pub(super) const BUNDLE_UPLOAD: &[Code] = &[
    Code::UnsupportedMediaType,
    Code::UploadTooLarge,
    Code::InflatedTooLarge,
    Code::TooManyEntries,
    Code::FileTooLarge,
    Code::BundleRejected,
    Code::InvalidRequest,
    Code::UploadInProgress,
    Code::TooManyUploads,
    Code::TempSpaceExhausted,
    Code::InternalError,
];

/// Reading or writing bundle bytes in object storage (`--blob-url`): it is
/// unreachable, or holds other bytes under a bundle's digest.
pub(super) const OBJECT_STORAGE: &[Code] = &[Code::StorageUnavailable, Code::BundleCorrupt];

/// A trusted route (`api::trusted`): the caller is not a platform service
/// (`WWW-Authenticate: Bearer`), or `X-Context-Subject` is missing or bad.
pub(super) const TRUSTED_AUTH: &[Code] = &[Code::Unauthorized, Code::InvalidSubject];

/// A backend without an exec port (`api::deliveries::service`).
pub(super) const DELIVERIES_OFF: &[Code] = &[Code::NotImplemented];

/// The bytes of a bundle: a gzip-compressed tar.
#[derive(Debug, ToSchema)]
#[schema(value_type = String, format = Binary)]
pub(super) struct BundleBytes(#[allow(dead_code)] Vec<u8>);

/// The error answers of one operation: the union of a few sets.
pub trait ErrorSet {
    /// The sets; a status and code may appear in several.
    const SETS: &'static [&'static [Code]];

    /// Every code, each once, by status then code.
    fn cases() -> Vec<Code> {
        let mut cases: Vec<Code> = Self::SETS.iter().flat_map(|s| s.iter().copied()).collect();
        cases.sort_by_key(|c| (c.status().as_u16(), c.as_str()));
        cases.dedup();
        cases
    }
}

/// The error responses of an [`ErrorSet`], for `responses(...)` of
/// `#[utoipa::path]`.
pub struct Errors<S>(PhantomData<S>);

impl<S: ErrorSet> IntoResponses for Errors<S> {
    fn responses() -> BTreeMap<String, RefOr<utoipa::openapi::response::Response>> {
        let mut by_status: BTreeMap<u16, Vec<Code>> = BTreeMap::new();
        for c in S::cases() {
            by_status.entry(c.status().as_u16()).or_default().push(c);
        }
        by_status
            .into_iter()
            .map(|(status, codes)| (status.to_string(), RefOr::T(error_response(&codes))))
            .collect()
    }
}

/// An error response listing `codes`; `delivery_failed` answers also carry
/// every sandbox's outcome ([`FailedBody`]).
fn error_response(codes: &[Code]) -> utoipa::openapi::response::Response {
    let schema = if codes == [Code::DeliveryFailed] {
        "FailedBody"
    } else {
        "ErrorBody"
    };
    let wire: Vec<&str> = codes.iter().map(|c| c.as_str()).collect();
    let listed: Vec<String> = wire.iter().map(|c| format!("`{c}`")).collect();
    ResponseBuilder::new()
        .description(format!("Error codes: {}.", listed.join(", ")))
        .content(
            "application/json",
            ContentBuilder::new()
                .schema(Some(Ref::from_schema_name(schema)))
                .build(),
        )
        .extensions(Some(
            ExtensionsBuilder::new()
                .add(ERROR_CODES_EXTENSION, serde_json::json!(wire))
                .build(),
        ))
        .build()
}

/// Declares an [`ErrorSet`] type per operation.
macro_rules! error_set {
    ($(#[$doc:meta])* $name:ident = [$($set:expr),* $(,)?]) => {
        $(#[$doc])*
        pub(super) struct $name;

        impl $crate::api::openapi::ErrorSet for $name {
            const SETS: &'static [&'static [$crate::api::error::Code]] = &[$($set),*];
        }
    };
}
pub(super) use error_set;

/// The served document: its JSON, encoded once.
#[derive(Debug, Clone)]
pub(super) struct Served(Bytes);

impl Served {
    /// Encodes `doc`.
    pub(super) fn new(doc: &utoipa::openapi::OpenApi) -> Self {
        // Encoding a document of plain maps and strings cannot fail; an
        // empty object would still be valid JSON if it ever did.
        let json = doc.to_pretty_json().unwrap_or_else(|e| {
            tracing::error!(error = %e, "encoding the OpenAPI document");
            "{}".to_owned()
        });
        Self(Bytes::from(json))
    }
}

/// This document.
#[utoipa::path(
    get,
    path = "/openapi.json",
    operation_id = "getOpenApi",
    tag = "service",
    responses(
        (status = OK, description = "The OpenAPI 3.1 document of this API.", body = Object),
        Errors<ServeErrors>,
    )
)]
pub(super) async fn serve(Extension(served): Extension<Served>) -> Response {
    (
        StatusCode::OK,
        [(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        )],
        served.0,
    )
        .into_response()
}

error_set!(
    /// Errors of `GET /openapi.json`.
    ServeErrors = [BASE]
);

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use super::ERROR_CODES_EXTENSION;
    use crate::api::ApiError;
    use crate::auth::{AuthError, Scope};
    use crate::bundle::BundleError;
    use crate::delivery::{DeliveryError as D, DeliveryFailure};
    use crate::pool::{BackendError, PoolError as P, Subject};
    use crate::workload::trusted::TrustedContextError as C;
    use crate::workload::WorkloadError as W;

    /// Every (status, code) some operation of the document lists.
    fn listed() -> BTreeSet<(u16, String)> {
        let doc = serde_json::to_value(crate::api::openapi_document(true)).unwrap();
        let mut listed = BTreeSet::new();
        for item in doc["paths"].as_object().unwrap().values() {
            for op in item.as_object().unwrap().values() {
                for (status, response) in op["responses"].as_object().unwrap() {
                    for code in response[ERROR_CODES_EXTENSION]
                        .as_array()
                        .into_iter()
                        .flatten()
                    {
                        let status = status.parse().unwrap();
                        listed.insert((status, code.as_str().unwrap().to_owned()));
                    }
                }
            }
        }
        listed
    }

    /// Compiles only while every variant is named, so that a new domain
    /// error gets a sample in the test below.
    fn named(w: &W, p: &P, d: &D, a: &AuthError, c: &C) {
        match w {
            W::NotFound(_)
            | W::NameInvalid(_)
            | W::TypeInvalid(_)
            | W::NameTaken(_)
            | W::QuotaExceeded(_)
            | W::RevisionInvalid(_)
            | W::RevisionMismatch(_)
            | W::AlreadyActive(_)
            | W::NotReady(_)
            | W::RevisionNotFound(_)
            | W::GrantInvalid
            | W::GrantExpired
            | W::Bundle(_)
            | W::TooManyUploads(_)
            | W::UploadInProgress
            | W::TempSpaceExhausted(_)
            | W::StorageUnavailable(_)
            | W::BundleCorrupt(_)
            | W::TooLarge(_)
            | W::UploadBroken(_)
            | W::StoreUnavailable(_)
            | W::Internal(_) => {}
        }
        match p {
            P::Invalid(_)
            | P::NotFound(_)
            | P::AlreadyExists(_)
            | P::PoolQuotaExceeded { .. }
            | P::ContextQuotaExceeded(_)
            | P::NotSuspendable(_)
            | P::NotReady(_)
            | P::Internal { .. } => {}
        }
        match d {
            D::InvalidRequest(_)
            | D::WorkloadNotFound(_)
            | D::SandboxNotFound(_)
            | D::PoolNotFound(_)
            | D::SandboxSuspended(_)
            | D::RunNotFound(_)
            | D::WorkloadNotReady(_)
            | D::RunConflict { .. }
            | D::Failed { .. }
            | D::StoreUnavailable(_)
            | D::Internal(_) => {}
        }
        match a {
            AuthError::TokenRequired
            | AuthError::TokenInvalid(_)
            | AuthError::TokenExpired
            | AuthError::ScopeMissing(_)
            | AuthError::DelegateMissing
            | AuthError::SubjectInvalid => {}
        }
        match c {
            C::Invalid(_)
            | C::NotFound
            | C::AlreadyExists
            | C::Frozen
            | C::UploadInProgress
            | C::RevisionMismatch
            | C::CapabilityInvalid
            | C::UploadTooLarge(_)
            | C::QuotaExceeded(_)
            | C::Workload(_) => {}
        }
    }

    #[test]
    fn every_domain_error_is_listed_by_some_route() {
        named(
            &W::UploadInProgress,
            &P::Invalid(String::new()),
            &D::Internal(String::new()),
            &AuthError::TokenRequired,
            &C::NotFound,
        );
        let s = String::new;
        let backend = || BackendError::internal("x", std::io::Error::other("x"));
        let mut answers: Vec<ApiError> = [
            W::NotFound(s()),
            W::NameInvalid(s()),
            W::TypeInvalid(s()),
            W::NameTaken(s()),
            W::QuotaExceeded(1),
            W::RevisionInvalid(s()),
            W::RevisionMismatch(s()),
            W::AlreadyActive(s()),
            W::NotReady(s()),
            W::RevisionNotFound(s()),
            W::GrantInvalid,
            W::GrantExpired,
            W::Bundle(BundleError::InflatedTooLarge {
                limit: 1,
                entry: None,
            }),
            W::Bundle(BundleError::TooManyEntries {
                limit: 1,
                entry: s(),
            }),
            W::Bundle(BundleError::FileTooLarge {
                entry: s(),
                size: 2,
                limit: 1,
            }),
            W::Bundle(BundleError::PathTraversal { entry: s() }),
            W::TooManyUploads(s()),
            W::UploadInProgress,
            W::TempSpaceExhausted(s()),
            W::StorageUnavailable(s()),
            W::BundleCorrupt(s()),
            W::TooLarge(s()),
            W::UploadBroken(s()),
            W::StoreUnavailable(s()),
            W::Internal(s()),
        ]
        .into_iter()
        .map(ApiError::from)
        .collect();
        answers.extend(
            [
                P::Invalid(s()),
                P::NotFound(Subject::Pool),
                P::AlreadyExists(Subject::Context),
                P::PoolQuotaExceeded {
                    quota: 1,
                    held: 1,
                    asked: 1,
                },
                P::ContextQuotaExceeded(1),
                P::NotSuspendable(s()),
                P::NotReady(backend()),
                P::Internal {
                    doing: s(),
                    source: backend(),
                },
            ]
            .into_iter()
            .map(ApiError::from),
        );
        answers.extend(
            [
                D::InvalidRequest(s()),
                D::WorkloadNotFound(s()),
                D::SandboxNotFound(s()),
                D::PoolNotFound(s()),
                D::SandboxSuspended(s()),
                D::RunNotFound(s()),
                D::WorkloadNotReady(s()),
                D::RunConflict {
                    run: s(),
                    revision: s(),
                },
                D::Failed {
                    failure: DeliveryFailure::NoReadySandbox { pool: s() },
                    outcomes: Vec::new(),
                },
                D::StoreUnavailable(s()),
                D::Internal(s()),
            ]
            .into_iter()
            .map(ApiError::from),
        );
        answers.extend(
            [
                AuthError::TokenRequired,
                AuthError::TokenInvalid(s()),
                AuthError::TokenExpired,
                AuthError::ScopeMissing(Scope::PoolsRead),
                AuthError::DelegateMissing,
                AuthError::SubjectInvalid,
            ]
            .into_iter()
            .map(ApiError::from),
        );
        // `C::Workload` answers as the workload API does (above).
        answers.extend(
            [
                C::Invalid(s()),
                C::NotFound,
                C::AlreadyExists,
                C::Frozen,
                C::UploadInProgress,
                C::RevisionMismatch,
                C::CapabilityInvalid,
                C::UploadTooLarge(1),
                C::QuotaExceeded(1),
            ]
            .into_iter()
            .map(ApiError::from),
        );
        let listed = listed();
        let missing: Vec<String> = answers
            .iter()
            .map(|e| (e.status().as_u16(), e.code().as_str().to_owned()))
            .filter(|answer| !listed.contains(answer))
            .map(|(status, code)| format!("{status} {code}"))
            .collect();
        assert!(missing.is_empty(), "no route lists {missing:?}");
    }
}
