//! The one API error type: every failure a handler returns becomes
//! `{"error": "<code>", "message": "<text>"}` with a fitting status.
//!
//! Domain layers return their own errors; the `From` impls here are the one
//! place where a domain error becomes a status, a code and a message.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};

use super::error_body::ErrorBody;
use crate::auth::AuthError;
use crate::workload::{WorkloadError, UPLOAD_RETRY_AFTER_SECS};

/// Error code of a request that needs the metadata database while it
/// cannot be reached.
pub const DATABASE_UNAVAILABLE: &str = "database_unavailable";

/// `Retry-After` of [`DATABASE_UNAVAILABLE`], in seconds.
pub const DATABASE_RETRY_AFTER_SECS: u32 = 2;

/// An error answered to an API client.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{code}: {message}")]
pub struct ApiError {
    status: StatusCode,
    code: &'static str,
    message: String,
    retry_after: Option<u32>,
    /// Answer with `Connection: close` (the request body was not read to
    /// its end, so the connection cannot carry another request).
    close: bool,
    /// Answer with `WWW-Authenticate: Bearer`.
    challenge: bool,
}

impl ApiError {
    /// An error with an explicit status, code and message.
    pub fn new(status: StatusCode, code: &'static str, message: impl Into<String>) -> Self {
        Self {
            status,
            code,
            message: message.into(),
            retry_after: None,
            close: false,
            challenge: false,
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
        Self::new(StatusCode::BAD_REQUEST, "invalid_request", message)
    }

    /// `404 not_found`.
    pub fn not_found(message: impl Into<String>) -> Self {
        Self::new(StatusCode::NOT_FOUND, "not_found", message)
    }

    /// `409 already_exists`.
    pub fn already_exists(message: impl Into<String>) -> Self {
        Self::new(StatusCode::CONFLICT, "already_exists", message)
    }

    /// `500 internal_error` with a generic message. The cause is logged here,
    /// never sent to the client.
    pub fn internal(cause: impl std::fmt::Display) -> Self {
        tracing::error!(error = %cause, "internal error");
        Self::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "internal_error",
            "internal error; see the service log",
        )
    }

    /// `503 database_unavailable` with a fixed message and `Retry-After`.
    /// The cause (which may name hosts) is logged here, never sent.
    pub fn database_unavailable(cause: impl std::fmt::Display) -> Self {
        tracing::warn!(error = %cause, "metadata database unavailable");
        Self::new(
            StatusCode::SERVICE_UNAVAILABLE,
            DATABASE_UNAVAILABLE,
            "the metadata database is unavailable; retry shortly",
        )
        .with_retry_after(DATABASE_RETRY_AFTER_SECS)
    }

    /// The HTTP status.
    pub fn status(&self) -> StatusCode {
        self.status
    }

    /// The stable error code.
    pub fn code(&self) -> &'static str {
        self.code
    }

    /// The message.
    pub fn message(&self) -> &str {
        &self.message
    }
}

impl From<AuthError> for ApiError {
    fn from(e: AuthError) -> Self {
        use AuthError as A;
        let (status, code) = match &e {
            A::TokenRequired => (StatusCode::UNAUTHORIZED, "token_required"),
            A::TokenInvalid(_) => (StatusCode::UNAUTHORIZED, "token_invalid"),
            A::TokenExpired => (StatusCode::UNAUTHORIZED, "token_expired"),
            A::ScopeMissing(_) | A::DelegateMissing => (StatusCode::FORBIDDEN, "scope_missing"),
            A::SubjectInvalid => (StatusCode::BAD_REQUEST, "invalid_request"),
        };
        ApiError::new(status, code, e.to_string())
    }
}

impl From<WorkloadError> for ApiError {
    fn from(e: WorkloadError) -> Self {
        use WorkloadError as W;
        let msg = e.to_string();
        match e {
            W::NotFound(_) => ApiError::new(StatusCode::NOT_FOUND, "workload_not_found", msg),
            W::NameInvalid(_) => {
                ApiError::new(StatusCode::BAD_REQUEST, "workload_name_invalid", msg)
            }
            W::TypeInvalid(_) => {
                ApiError::new(StatusCode::BAD_REQUEST, "context_type_invalid", msg)
            }
            W::NameTaken(_) => ApiError::new(StatusCode::CONFLICT, "workload_name_taken", msg),
            W::QuotaExceeded(_) => ApiError::new(
                StatusCode::TOO_MANY_REQUESTS,
                "workload_quota_exceeded",
                msg,
            ),
            W::RevisionInvalid(_) => {
                ApiError::new(StatusCode::BAD_REQUEST, "revision_invalid", msg)
            }
            W::RevisionMismatch(_) => ApiError::new(StatusCode::CONFLICT, "revision_mismatch", msg),
            W::AlreadyActive(_) => {
                ApiError::new(StatusCode::CONFLICT, "workload_already_active", msg)
            }
            W::NotReady(_) => ApiError::new(StatusCode::CONFLICT, "workload_not_ready", msg),
            W::RevisionNotFound(_) => {
                ApiError::new(StatusCode::NOT_FOUND, "revision_not_found", msg)
            }
            W::GrantInvalid => ApiError::new(StatusCode::UNAUTHORIZED, "token_invalid", msg),
            W::GrantExpired => ApiError::new(StatusCode::UNAUTHORIZED, "token_expired", msg),
            // The size limits answer 413 with their own code.
            W::Bundle(b) if b.is_too_large() => {
                let message = match b.entry() {
                    Some(entry) if !msg.contains(entry) => format!("{b} (at {entry:?})"),
                    _ => b.to_string(),
                };
                ApiError::new(StatusCode::PAYLOAD_TOO_LARGE, b.code(), message)
            }
            W::Bundle(b) => {
                let message = match b.entry() {
                    Some(entry) => format!("{}: {entry} ({b})", b.code()),
                    None => format!("{}: {b}", b.code()),
                };
                ApiError::new(StatusCode::BAD_REQUEST, "bundle_rejected", message)
            }
            W::TooManyUploads(_) => {
                ApiError::new(StatusCode::TOO_MANY_REQUESTS, "too_many_uploads", msg)
                    .with_retry_after(UPLOAD_RETRY_AFTER_SECS)
            }
            W::UploadInProgress => ApiError::new(StatusCode::CONFLICT, "upload_in_progress", msg),
            W::TempSpaceExhausted(_) => {
                ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "temp_space_exhausted", msg)
                    .with_retry_after(UPLOAD_RETRY_AFTER_SECS)
            }
            W::TooLarge(_) => ApiError::new(StatusCode::PAYLOAD_TOO_LARGE, "upload_too_large", msg),
            W::UploadBroken(_) => ApiError::invalid_request(msg),
            W::StorageUnavailable(_) => {
                ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "storage_unavailable", msg)
                    .with_retry_after(UPLOAD_RETRY_AFTER_SECS)
            }
            W::BundleCorrupt(_) => {
                tracing::error!(error = %msg, "stored bundle refused");
                ApiError::new(StatusCode::BAD_GATEWAY, "bundle_corrupt", msg)
            }
            W::StoreUnavailable(cause) => ApiError::database_unavailable(cause),
            W::Internal(cause) => ApiError::internal(cause),
        }
    }
}

impl IntoResponse for ApiError {
    /// `{"error":…,"message":…}` as upstream's Go encoder writes it: a
    /// trailing newline and `<`, `>`, `&` escaped.
    fn into_response(self) -> Response {
        let body = ErrorBody {
            error: self.code.to_owned(),
            message: self.message,
        };
        let mut resp = respond(self.status, &body);
        resp.extensions_mut()
            .insert(super::answer::ErrorCode(self.code));
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
            C::Frozen => Self::new(StatusCode::CONFLICT, "context_frozen", msg),
            C::UploadInProgress => Self::new(StatusCode::CONFLICT, "upload_in_progress", msg),
            C::RevisionMismatch => Self::new(StatusCode::CONFLICT, "revision_mismatch", msg),
            C::CapabilityInvalid => Self::new(StatusCode::UNAUTHORIZED, "unauthorized", msg),
            C::UploadTooLarge(_) => {
                Self::new(StatusCode::PAYLOAD_TOO_LARGE, "upload_too_large", msg)
            }
            C::QuotaExceeded(_) => {
                Self::new(StatusCode::TOO_MANY_REQUESTS, "context_quota_exceeded", msg)
            }
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
            PoolError::PoolQuotaExceeded { .. } => Self::new(
                StatusCode::TOO_MANY_REQUESTS,
                "pool_quota_exceeded",
                err.to_string(),
            ),
            PoolError::ContextQuotaExceeded(_) => Self::new(
                StatusCode::TOO_MANY_REQUESTS,
                "context_quota_exceeded",
                err.to_string(),
            ),
            PoolError::NotSuspendable(message) => Self::new(
                StatusCode::CONFLICT,
                "pool_not_suspendable",
                message.clone(),
            ),
            PoolError::NotReady(_) => Self::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "not_ready",
                err.to_string(),
            ),
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
        (err.status().as_u16(), err.code(), err.message().to_owned())
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
            D::WorkloadNotFound(_) => Self::new(StatusCode::NOT_FOUND, "workload_not_found", msg),
            D::SandboxNotFound(_) => Self::new(StatusCode::NOT_FOUND, "sandbox_not_found", msg),
            D::PoolNotFound(_) => Self::new(StatusCode::NOT_FOUND, "pool_not_found", msg),
            D::RunNotFound(_) => Self::new(StatusCode::NOT_FOUND, "run_not_found", msg),
            D::SandboxSuspended(_) => Self::new(StatusCode::CONFLICT, "sandbox_suspended", msg),
            D::WorkloadNotReady(_) => Self::new(StatusCode::CONFLICT, "workload_not_ready", msg),
            D::RunConflict { .. } => Self::new(StatusCode::CONFLICT, "run_conflict", msg),
            D::Failed { .. } => Self::new(StatusCode::BAD_GATEWAY, DELIVERY_FAILED, msg),
            D::StoreUnavailable(cause) => Self::database_unavailable(cause),
            D::Internal(cause) => Self::internal(cause),
        }
    }
}

/// Error code of a delivery or release that failed in a sandbox.
pub const DELIVERY_FAILED: &str = "delivery_failed";

/// A delivery handler's failure: any API error, or a failed delivery, whose
/// `502` answer also carries every sandbox's outcome
/// (`{error, message, deliveries}`).
#[derive(Debug)]
pub enum DeliveryApiError {
    /// Answered like any other API error.
    Api(ApiError),
    /// Answered `502 delivery_failed` with the outcomes.
    Failed {
        /// The first failure's one-line reason.
        message: String,
        /// Every sandbox's outcome.
        outcomes: Vec<crate::delivery::SandboxOutcome>,
    },
}

impl From<ApiError> for DeliveryApiError {
    fn from(e: ApiError) -> Self {
        DeliveryApiError::Api(e)
    }
}

impl From<AuthError> for DeliveryApiError {
    fn from(e: AuthError) -> Self {
        DeliveryApiError::Api(e.into())
    }
}

impl From<crate::delivery::DeliveryError> for DeliveryApiError {
    fn from(e: crate::delivery::DeliveryError) -> Self {
        match e {
            crate::delivery::DeliveryError::Failed { reason, outcomes } => {
                tracing::warn!(reason = %reason, "delivery failed");
                DeliveryApiError::Failed {
                    message: reason,
                    outcomes,
                }
            }
            other => DeliveryApiError::Api(other.into()),
        }
    }
}

impl IntoResponse for DeliveryApiError {
    fn into_response(self) -> Response {
        match self {
            DeliveryApiError::Api(e) => e.into_response(),
            DeliveryApiError::Failed { message, outcomes } => {
                let body = crate::delivery::FailedBody {
                    error: DELIVERY_FAILED.to_owned(),
                    message,
                    deliveries: outcomes,
                };
                let mut resp = respond(StatusCode::BAD_GATEWAY, &body);
                resp.extensions_mut()
                    .insert(super::answer::ErrorCode(DELIVERY_FAILED));
                resp
            }
        }
    }
}

#[cfg(test)]
mod delivery_error_tests {
    use super::*;
    use crate::delivery::DeliveryError as D;

    fn api(err: D) -> (u16, &'static str, String) {
        let err = ApiError::from(err);
        (err.status().as_u16(), err.code(), err.message().to_owned())
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
            reason: "disk_full: no space".into(),
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
}
