//! The one API error type: every failure a handler returns becomes
//! `{"error": "<code>", "message": "<text>"}` with a fitting status.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::{Deserialize, Serialize};

/// The JSON body of every error response.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ErrorBody {
    /// Stable snake_case error code, e.g. `workload_not_found`.
    pub error: String,
    /// Human-readable explanation; never raw backend text.
    pub message: String,
}

/// An error answered to an API client.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{code}: {message}")]
pub struct ApiError {
    status: StatusCode,
    code: &'static str,
    message: String,
}

impl ApiError {
    /// An error with an explicit status, code and message.
    pub fn new(status: StatusCode, code: &'static str, message: impl Into<String>) -> Self {
        Self {
            status,
            code,
            message: message.into(),
        }
    }

    /// `400 invalid_request`.
    pub fn invalid_request(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, "invalid_request", message)
    }

    /// `401 token_required`.
    pub fn token_required() -> Self {
        Self::new(
            StatusCode::UNAUTHORIZED,
            "token_required",
            "an Authorization: Bearer token is required",
        )
    }

    /// `401 token_invalid`.
    pub fn token_invalid(message: impl Into<String>) -> Self {
        Self::new(StatusCode::UNAUTHORIZED, "token_invalid", message)
    }

    /// `401 token_expired`.
    pub fn token_expired() -> Self {
        Self::new(
            StatusCode::UNAUTHORIZED,
            "token_expired",
            "the token has expired",
        )
    }

    /// `403 scope_missing`.
    pub fn scope_missing(scope: &str) -> Self {
        Self::new(
            StatusCode::FORBIDDEN,
            "scope_missing",
            format!("the token lacks the scope {scope:?}"),
        )
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

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = ErrorBody {
            error: self.code.to_owned(),
            message: self.message,
        };
        (self.status, Json(body)).into_response()
    }
}

/// Result type of handlers.
pub type ApiResult<T> = Result<T, ApiError>;

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
