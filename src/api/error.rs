//! The one API error type: every failure a handler returns becomes
//! `{"error": "<code>", "message": "<text>"}` with a fitting status (a
//! failed delivery also carries every sandbox's outcome).
//!
//! Domain layers return their own errors; the `From` impls here are the one
//! place where a domain error becomes a [`Code`] (which fixes the status)
//! and a message.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};

use super::error_body::ErrorBody;
use crate::auth::AuthError;
use crate::bundle::BundleError;
use crate::delivery::{FailedBody, SandboxOutcome};
use crate::workload::{WorkloadError, UPLOAD_RETRY_AFTER_SECS};

/// `Retry-After` of [`Code::DatabaseUnavailable`], in seconds.
pub const DATABASE_RETRY_AFTER_SECS: u32 = 2;

/// Declares [`Code`]: each variant with its status and wire string.
macro_rules! codes {
    ($($(#[$doc:meta])* $variant:ident = ($status:ident, $wire:literal),)*) => {
        /// The stable `error` code of an answer. Each code has one status.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
        pub enum Code {
            $($(#[$doc])* $variant,)*
        }

        impl Code {
            /// Every code.
            pub const ALL: &'static [Code] = &[$(Code::$variant),*];

            /// The code as the wire spells it, e.g. `workload_not_found`.
            pub const fn as_str(self) -> &'static str {
                match self {
                    $(Code::$variant => $wire,)*
                }
            }

            /// The HTTP status every answer with this code has.
            pub const fn status(self) -> StatusCode {
                match self {
                    $(Code::$variant => StatusCode::$status,)*
                }
            }
        }
    };
}

codes! {
    // 400
    /// A value breaks its rule (also: an undecodable path or body).
    InvalidRequest = (BAD_REQUEST, "invalid_request"),
    /// `X-Context-Subject` of a trusted route is missing or bad.
    InvalidSubject = (BAD_REQUEST, "invalid_subject"),
    /// A workload name that is not a lowercase DNS label.
    WorkloadNameInvalid = (BAD_REQUEST, "workload_name_invalid"),
    /// An unknown context type.
    ContextTypeInvalid = (BAD_REQUEST, "context_type_invalid"),
    /// A revision that is not 64 lowercase hex digits.
    RevisionInvalid = (BAD_REQUEST, "revision_invalid"),
    /// The bundle breaks a rule of the bundle engine.
    BundleRejected = (BAD_REQUEST, "bundle_rejected"),
    // 401
    /// No token.
    TokenRequired = (UNAUTHORIZED, "token_required"),
    /// A token (or upload grant) that is not valid.
    TokenInvalid = (UNAUTHORIZED, "token_invalid"),
    /// An expired token (or upload grant).
    TokenExpired = (UNAUTHORIZED, "token_expired"),
    /// Not a platform service, or a bad upload capability (trusted API).
    Unauthorized = (UNAUTHORIZED, "unauthorized"),
    // 403
    /// The token lacks the route's scope.
    ScopeMissing = (FORBIDDEN, "scope_missing"),
    // 404
    /// No such pool or context resource (upstream's code).
    NotFound = (NOT_FOUND, "not_found"),
    /// No such workload.
    WorkloadNotFound = (NOT_FOUND, "workload_not_found"),
    /// No such revision.
    RevisionNotFound = (NOT_FOUND, "revision_not_found"),
    /// No such sandbox (delivery target).
    SandboxNotFound = (NOT_FOUND, "sandbox_not_found"),
    /// No such pool (delivery target).
    PoolNotFound = (NOT_FOUND, "pool_not_found"),
    /// No such run.
    RunNotFound = (NOT_FOUND, "run_not_found"),
    // 408
    /// No part of the request body arrived for too long.
    RequestTimeout = (REQUEST_TIMEOUT, "request_timeout"),
    // 409
    /// The pool or context resource exists (upstream's code).
    AlreadyExists = (CONFLICT, "already_exists"),
    /// The owner already has a workload of that name.
    WorkloadNameTaken = (CONFLICT, "workload_name_taken"),
    /// Activation of a revision that is not the latest upload.
    RevisionMismatch = (CONFLICT, "revision_mismatch"),
    /// The workload is active with another revision.
    WorkloadAlreadyActive = (CONFLICT, "workload_already_active"),
    /// The workload has no servable revision.
    WorkloadNotReady = (CONFLICT, "workload_not_ready"),
    /// Another upload uses the same grant.
    UploadInProgress = (CONFLICT, "upload_in_progress"),
    /// The trusted Context is frozen.
    ContextFrozen = (CONFLICT, "context_frozen"),
    /// The pool cannot be suspended.
    PoolNotSuspendable = (CONFLICT, "pool_not_suspendable"),
    /// The run id is registered with another revision.
    RunConflict = (CONFLICT, "run_conflict"),
    /// The target sandbox or pool is suspended.
    SandboxSuspended = (CONFLICT, "sandbox_suspended"),
    // 413
    /// The JSON body is over its limit.
    BodyTooLarge = (PAYLOAD_TOO_LARGE, "body_too_large"),
    /// The upload is over the compressed limit.
    UploadTooLarge = (PAYLOAD_TOO_LARGE, "upload_too_large"),
    /// The compressed bundle is over its limit (the bundle engine's code).
    CompressedTooLarge = (PAYLOAD_TOO_LARGE, "compressed_too_large"),
    /// The bundle inflates past its limit.
    InflatedTooLarge = (PAYLOAD_TOO_LARGE, "inflated_too_large"),
    /// The bundle has too many entries.
    TooManyEntries = (PAYLOAD_TOO_LARGE, "too_many_entries"),
    /// A file of the bundle is over the per-file limit.
    FileTooLarge = (PAYLOAD_TOO_LARGE, "file_too_large"),
    // 415
    /// The body's media type is not the route's.
    UnsupportedMediaType = (UNSUPPORTED_MEDIA_TYPE, "unsupported_media_type"),
    // 416
    /// The range is outside the bundle.
    RangeNotSatisfiable = (RANGE_NOT_SATISFIABLE, "range_not_satisfiable"),
    // 429
    /// The owner's workload quota is reached.
    WorkloadQuotaExceeded = (TOO_MANY_REQUESTS, "workload_quota_exceeded"),
    /// The owner's pool quota is reached.
    PoolQuotaExceeded = (TOO_MANY_REQUESTS, "pool_quota_exceeded"),
    /// The owner's context quota is reached.
    ContextQuotaExceeded = (TOO_MANY_REQUESTS, "context_quota_exceeded"),
    /// Too many uploads are running.
    TooManyUploads = (TOO_MANY_REQUESTS, "too_many_uploads"),
    // 500
    /// A failure the client cannot fix (the cause is logged).
    InternalError = (INTERNAL_SERVER_ERROR, "internal_error"),
    // 501
    /// Deliveries on a backend without an exec port.
    NotImplemented = (NOT_IMPLEMENTED, "not_implemented"),
    // 502
    /// Object storage holds other bytes under a bundle's digest.
    BundleCorrupt = (BAD_GATEWAY, "bundle_corrupt"),
    /// A delivery or release failed in a sandbox.
    DeliveryFailed = (BAD_GATEWAY, "delivery_failed"),
    // 503
    /// The metadata database cannot be reached.
    DatabaseUnavailable = (SERVICE_UNAVAILABLE, "database_unavailable"),
    /// Object storage cannot be reached.
    StorageUnavailable = (SERVICE_UNAVAILABLE, "storage_unavailable"),
    /// The temporary space uploads share is in use.
    TempSpaceExhausted = (SERVICE_UNAVAILABLE, "temp_space_exhausted"),
    /// The request did not finish within the deadline.
    DeadlineExceeded = (SERVICE_UNAVAILABLE, "deadline_exceeded"),
    /// The sandbox backend is not ready.
    NotReady = (SERVICE_UNAVAILABLE, "not_ready"),
    /// The service is shutting down.
    ShuttingDown = (SERVICE_UNAVAILABLE, "shutting_down"),
}

impl std::fmt::Display for Code {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// An error answered to an API client.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{code}: {message}")]
pub struct ApiError {
    code: Code,
    message: String,
    retry_after: Option<u32>,
    /// Answer with `Connection: close` (the request body was not read to
    /// its end, so the connection cannot carry another request).
    close: bool,
    /// Answer with `WWW-Authenticate: Bearer`.
    challenge: bool,
    /// Every sandbox's outcome of a failed delivery or release: answered
    /// as [`FailedBody`] (`{error, message, deliveries}`).
    deliveries: Option<Vec<SandboxOutcome>>,
}

impl ApiError {
    /// An error with `code` (and its status) and `message`.
    pub fn new(code: Code, message: impl Into<String>) -> Self {
        Self {
            code,
            message: message.into(),
            retry_after: None,
            close: false,
            challenge: false,
            deliveries: None,
        }
    }

    /// The same error, answered with `WWW-Authenticate: Bearer`.
    pub fn with_bearer_challenge(mut self) -> Self {
        self.challenge = true;
        self
    }

    /// The same error, answered with `Retry-After: <secs>`.
    pub fn with_retry_after(mut self, secs: u32) -> Self {
        self.retry_after = Some(secs);
        self
    }

    /// Seconds of `Retry-After`, if any.
    pub fn retry_after(&self) -> Option<u32> {
        self.retry_after
    }

    /// The same error, answered with `Connection: close`.
    pub fn closing(mut self) -> Self {
        self.close = true;
        self
    }

    /// `400 invalid_request`.
    pub fn invalid_request(message: impl Into<String>) -> Self {
        Self::new(Code::InvalidRequest, message)
    }

    /// `404 not_found`.
    pub fn not_found(message: impl Into<String>) -> Self {
        Self::new(Code::NotFound, message)
    }

    /// `409 already_exists`.
    pub fn already_exists(message: impl Into<String>) -> Self {
        Self::new(Code::AlreadyExists, message)
    }

    /// `500 internal_error` with a generic message. The cause is logged here,
    /// never sent to the client.
    pub fn internal(cause: impl std::fmt::Display) -> Self {
        tracing::error!(error = %cause, "internal error");
        Self::new(Code::InternalError, "internal error; see the service log")
    }

    /// `503 database_unavailable` with a fixed message and `Retry-After`.
    /// The cause (which may name hosts) is logged here, never sent.
    pub fn database_unavailable(cause: impl std::fmt::Display) -> Self {
        tracing::warn!(error = %cause, "metadata database unavailable");
        Self::new(
            Code::DatabaseUnavailable,
            "the metadata database is unavailable; retry shortly",
        )
        .with_retry_after(DATABASE_RETRY_AFTER_SECS)
    }

    /// The HTTP status (the code's).
    pub fn status(&self) -> StatusCode {
        self.code.status()
    }

    /// The stable error code.
    pub fn code(&self) -> Code {
        self.code
    }

    /// The message.
    pub fn message(&self) -> &str {
        &self.message
    }

    /// Every sandbox's outcome, on a failed delivery or release.
    pub fn deliveries(&self) -> Option<&[SandboxOutcome]> {
        self.deliveries.as_deref()
    }
}

impl From<AuthError> for ApiError {
    fn from(e: AuthError) -> Self {
        use AuthError as A;
        let code = match &e {
            A::TokenRequired => Code::TokenRequired,
            A::TokenInvalid(_) => Code::TokenInvalid,
            A::TokenExpired => Code::TokenExpired,
            A::ScopeMissing(_) | A::DelegateMissing => Code::ScopeMissing,
            A::SubjectInvalid => Code::InvalidRequest,
        };
        ApiError::new(code, e.to_string())
    }
}

/// The code of a bundle over one of its size limits (answered `413` with
/// the bundle engine's own code), `None` for any other bundle error.
fn too_large(b: &BundleError) -> Option<Code> {
    match b {
        BundleError::CompressedTooLarge { .. } => Some(Code::CompressedTooLarge),
        BundleError::InflatedTooLarge { .. } => Some(Code::InflatedTooLarge),
        BundleError::TooManyEntries { .. } => Some(Code::TooManyEntries),
        BundleError::FileTooLarge { .. } => Some(Code::FileTooLarge),
        _ => None,
    }
}

impl From<WorkloadError> for ApiError {
    fn from(e: WorkloadError) -> Self {
        use WorkloadError as W;
        let msg = e.to_string();
        match e {
            W::NotFound(_) => ApiError::new(Code::WorkloadNotFound, msg),
            W::NameInvalid(_) => ApiError::new(Code::WorkloadNameInvalid, msg),
            W::TypeInvalid(_) => ApiError::new(Code::ContextTypeInvalid, msg),
            W::NameTaken(_) => ApiError::new(Code::WorkloadNameTaken, msg),
            W::QuotaExceeded(_) => ApiError::new(Code::WorkloadQuotaExceeded, msg),
            W::RevisionInvalid(_) => ApiError::new(Code::RevisionInvalid, msg),
            W::RevisionMismatch(_) => ApiError::new(Code::RevisionMismatch, msg),
            W::AlreadyActive(_) => ApiError::new(Code::WorkloadAlreadyActive, msg),
            W::NotReady(_) => ApiError::new(Code::WorkloadNotReady, msg),
            W::RevisionNotFound(_) => ApiError::new(Code::RevisionNotFound, msg),
            W::GrantInvalid => ApiError::new(Code::TokenInvalid, msg),
            W::GrantExpired => ApiError::new(Code::TokenExpired, msg),
            W::Bundle(b) => match too_large(&b) {
                // The size limits answer 413 with their own code.
                Some(code) => {
                    let message = match b.entry() {
                        Some(entry) if !msg.contains(entry) => format!("{b} (at {entry:?})"),
                        _ => b.to_string(),
                    };
                    ApiError::new(code, message)
                }
                None => {
                    let message = match b.entry() {
                        Some(entry) => format!("{}: {entry} ({b})", b.code()),
                        None => format!("{}: {b}", b.code()),
                    };
                    ApiError::new(Code::BundleRejected, message)
                }
            },
            W::TooManyUploads(_) => {
                ApiError::new(Code::TooManyUploads, msg).with_retry_after(UPLOAD_RETRY_AFTER_SECS)
            }
            W::UploadInProgress => ApiError::new(Code::UploadInProgress, msg),
            W::TempSpaceExhausted(_) => ApiError::new(Code::TempSpaceExhausted, msg)
                .with_retry_after(UPLOAD_RETRY_AFTER_SECS),
            W::TooLarge(_) => ApiError::new(Code::UploadTooLarge, msg),
            W::UploadBroken(_) => ApiError::invalid_request(msg),
            W::StorageUnavailable(_) => ApiError::new(Code::StorageUnavailable, msg)
                .with_retry_after(UPLOAD_RETRY_AFTER_SECS),
            W::BundleCorrupt(_) => {
                tracing::error!(error = %msg, "stored bundle refused");
                ApiError::new(Code::BundleCorrupt, msg)
            }
            W::StoreUnavailable(cause) => ApiError::database_unavailable(cause),
            W::Internal(cause) => ApiError::internal(cause),
        }
    }
}

impl IntoResponse for ApiError {
    /// `{"error":…,"message":…}` (with `deliveries` after a failed
    /// delivery) as upstream's Go encoder writes it: a trailing newline and
    /// `<`, `>`, `&` escaped.
    fn into_response(self) -> Response {
        let error = self.code.as_str().to_owned();
        let mut resp = match self.deliveries {
            None => respond(
                self.code.status(),
                &ErrorBody {
                    error,
                    message: self.message,
                },
            ),
            Some(deliveries) => respond(
                self.code.status(),
                &FailedBody {
                    error,
                    message: self.message,
                    deliveries,
                },
            ),
        };
        resp.extensions_mut()
            .insert(super::answer::ErrorCode(self.code.as_str()));
        if let Some(secs) = self.retry_after {
            resp.headers_mut()
                .insert(axum::http::header::RETRY_AFTER, secs.into());
        }
        if self.close {
            resp.headers_mut().insert(
                axum::http::header::CONNECTION,
                axum::http::HeaderValue::from_static("close"),
            );
        }
        if self.challenge {
            resp.headers_mut().insert(
                axum::http::header::WWW_AUTHENTICATE,
                axum::http::HeaderValue::from_static("Bearer"),
            );
        }
        resp
    }
}

/// A JSON answer as upstream's Go encoder writes it
/// ([`super::json::encode::to_vec`]):
/// `Content-Type: application/json`, HTML-safe escapes, a trailing newline.
pub fn respond<T: serde::Serialize>(status: StatusCode, value: &T) -> Response {
    match super::json::encode::to_vec(value) {
        Ok(bytes) => (
            status,
            [(
                axum::http::header::CONTENT_TYPE,
                axum::http::HeaderValue::from_static("application/json"),
            )],
            bytes,
        )
            .into_response(),
        Err(e) => ApiError::internal(format!("encoding an answer: {e}")).into_response(),
    }
}

/// Result type of handlers.
pub type ApiResult<T> = Result<T, ApiError>;

// ---------------------------------------------------------------------------
// Trusted Context domain → API: upstream's `writeContextError` codes.
// ---------------------------------------------------------------------------

impl From<crate::workload::trusted::TrustedContextError> for ApiError {
    fn from(err: crate::workload::trusted::TrustedContextError) -> Self {
        use crate::workload::trusted::TrustedContextError as C;
        let msg = err.to_string();
        match err {
            C::Invalid(_) => Self::invalid_request(msg),
            C::NotFound => Self::not_found(msg),
            C::AlreadyExists => Self::already_exists(msg),
            C::Frozen => Self::new(Code::ContextFrozen, msg),
            C::UploadInProgress => Self::new(Code::UploadInProgress, msg),
            C::RevisionMismatch => Self::new(Code::RevisionMismatch, msg),
            C::CapabilityInvalid => Self::new(Code::Unauthorized, msg),
            C::UploadTooLarge(_) => Self::new(Code::UploadTooLarge, msg),
            C::QuotaExceeded(_) => Self::new(Code::ContextQuotaExceeded, msg),
            C::Workload(w) => w.into(),
        }
    }
}

// ---------------------------------------------------------------------------
// Pool domain → API: the one place a `PoolError` becomes a status, an error
// code and a message.
// ---------------------------------------------------------------------------

impl From<crate::pool::PoolError> for ApiError {
    fn from(err: crate::pool::PoolError) -> Self {
        use crate::pool::PoolError;
        match &err {
            PoolError::Invalid(message) => Self::invalid_request(message.clone()),
            PoolError::NotFound(_) => Self::not_found(err.to_string()),
            PoolError::AlreadyExists(_) => Self::already_exists(err.to_string()),
            PoolError::PoolQuotaExceeded { .. } => {
                Self::new(Code::PoolQuotaExceeded, err.to_string())
            }
            PoolError::ContextQuotaExceeded(_) => {
                Self::new(Code::ContextQuotaExceeded, err.to_string())
            }
            PoolError::NotSuspendable(message) => {
                Self::new(Code::PoolNotSuspendable, message.clone())
            }
            PoolError::NotReady(_) => Self::new(Code::NotReady, err.to_string()),
            // Logs the cause (what was being done, and the backend's error).
            PoolError::Internal { .. } => Self::internal(err),
        }
    }
}

#[cfg(test)]
mod pool_error_tests {
    use super::*;
    use crate::pool::{BackendError, PoolError, Subject};

    fn api(err: PoolError) -> (u16, &'static str, String) {
        let err = ApiError::from(err);
        let code = err.code().as_str();
        (err.status().as_u16(), code, err.message().to_owned())
    }

    #[test]
    fn pool_errors_keep_their_status_code_and_message() {
        assert_eq!(
            api(PoolError::Invalid("replicas must be at least 1".into())),
            (400, "invalid_request", "replicas must be at least 1".into())
        );
        assert_eq!(
            api(PoolError::NotFound(Subject::Pool)),
            (404, "not_found", "sandbox pool not found".into())
        );
        assert_eq!(
            api(PoolError::NotFound(Subject::Context)),
            (404, "not_found", "context resource not found".into())
        );
        assert_eq!(
            api(PoolError::AlreadyExists(Subject::Pool)),
            (409, "already_exists", "sandbox pool already exists".into())
        );
        assert_eq!(
            api(PoolError::AlreadyExists(Subject::Context)),
            (
                409,
                "already_exists",
                "context resource already exists".into()
            )
        );
        let invalid = BackendError::Invalid("workspace claim \"x\" not found".into());
        assert_eq!(
            api(PoolError::from_backend(
                invalid,
                Subject::Pool,
                "create".into()
            )),
            (
                400,
                "invalid_request",
                "invalid sandbox pool: workspace claim \"x\" not found".into()
            )
        );
    }

    #[test]
    fn backend_causes_never_reach_the_client() {
        let cause = || BackendError::internal("create sandbox 3", std::io::Error::other("secret"));
        let (status, code, message) = api(PoolError::NotReady(cause()));
        assert_eq!((status, code), (503, "not_ready"));
        assert!(!message.contains("secret"), "{message}");
        let internal = PoolError::from_backend(cause(), Subject::Pool, "create pool p".into());
        assert_eq!(
            api(internal),
            (
                500,
                "internal_error",
                "internal error; see the service log".into()
            )
        );
    }
}

// ---------------------------------------------------------------------------
// Delivery domain → API.
// ---------------------------------------------------------------------------

impl From<crate::delivery::DeliveryError> for ApiError {
    fn from(err: crate::delivery::DeliveryError) -> Self {
        use crate::delivery::DeliveryError as D;
        let msg = err.to_string();
        match err {
            D::InvalidRequest(_) => Self::invalid_request(msg),
            D::WorkloadNotFound(_) => Self::new(Code::WorkloadNotFound, msg),
            D::SandboxNotFound(_) => Self::new(Code::SandboxNotFound, msg),
            D::PoolNotFound(_) => Self::new(Code::PoolNotFound, msg),
            D::RunNotFound(_) => Self::new(Code::RunNotFound, msg),
            D::SandboxSuspended(_) => Self::new(Code::SandboxSuspended, msg),
            D::WorkloadNotReady(_) => Self::new(Code::WorkloadNotReady, msg),
            D::RunConflict { .. } => Self::new(Code::RunConflict, msg),
            // `502` with every sandbox's outcome.
            D::Failed { outcomes, .. } => {
                tracing::warn!(reason = %msg, "delivery failed");
                Self {
                    deliveries: Some(outcomes),
                    ..Self::new(Code::DeliveryFailed, msg)
                }
            }
            D::StoreUnavailable(cause) => Self::database_unavailable(cause),
            D::Internal(cause) => Self::internal(cause),
        }
    }
}

#[cfg(test)]
mod delivery_error_tests {
    use super::*;
    use crate::delivery::{DeliveryError as D, DeliveryFailure, SandboxFailure};

    fn api(err: D) -> (u16, &'static str, String) {
        let err = ApiError::from(err);
        let code = err.code().as_str();
        (err.status().as_u16(), code, err.message().to_owned())
    }

    #[test]
    fn delivery_errors_map_to_their_codes() {
        assert_eq!(api(D::InvalidRequest("x".into())).1, "invalid_request");
        assert_eq!(
            api(D::SandboxNotFound("s".into())),
            (404, "sandbox_not_found", "sandbox \"s\" not found".into())
        );
        assert_eq!(api(D::PoolNotFound("p".into())).1, "pool_not_found");
        assert_eq!(api(D::RunNotFound("r".into())).1, "run_not_found");
        assert_eq!(api(D::WorkloadNotFound("w".into())).1, "workload_not_found");
        assert_eq!(api(D::WorkloadNotReady("w".into())).0, 409);
        let failed = D::Failed {
            failure: DeliveryFailure::Sandboxes {
                sandbox: "s".into(),
                failure: SandboxFailure::Script {
                    code: "disk_full".into(),
                    reason: "no space".into(),
                },
                failed: 1,
                of: 1,
            },
            outcomes: Vec::new(),
        };
        assert_eq!(
            api(failed),
            (502, "delivery_failed", "disk_full: no space".into())
        );
        let (status, code, message) = api(D::Internal("secret path".into()));
        assert_eq!((status, code), (500, "internal_error"));
        assert!(!message.contains("secret"));
    }

    #[test]
    fn the_bundle_size_limits_answer_413_with_their_own_code() {
        let samples = [
            BundleError::CompressedTooLarge { limit: 1 },
            BundleError::InflatedTooLarge {
                limit: 1,
                entry: None,
            },
            BundleError::TooManyEntries {
                limit: 1,
                entry: "e".into(),
            },
            BundleError::FileTooLarge {
                entry: "e".into(),
                size: 2,
                limit: 1,
            },
            BundleError::PathTraversal { entry: "e".into() },
            BundleError::TruncatedGzip,
        ];
        for b in samples {
            assert_eq!(too_large(&b).is_some(), b.is_too_large(), "{b}");
            if let Some(code) = too_large(&b) {
                assert_eq!((code.as_str(), code.status().as_u16()), (b.code(), 413));
            }
        }
    }

    #[test]
    fn every_code_is_snake_case_and_unique() {
        let mut seen = std::collections::BTreeSet::new();
        for code in Code::ALL {
            let s = code.as_str();
            assert!(
                s.bytes().all(|b| b.is_ascii_lowercase() || b == b'_'),
                "{s}"
            );
            assert!(seen.insert(s), "{s} twice");
            assert!(code.status().is_client_error() || code.status().is_server_error());
        }
    }
}
