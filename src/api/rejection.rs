//! axum's own rejections and fallbacks, answered like every other error
//! (`{"error", "message"}` JSON) rather than as axum's plain text or empty
//! bodies: a path parameter that cannot be decoded (e.g. invalid UTF-8
//! after percent-decoding), a path no route matches, and a method the
//! matched path does not take.

use axum::extract::rejection::PathRejection;
use axum::extract::FromRequestParts;

use super::error::ApiError;

/// Path parameters, or `400 invalid_request` JSON when they cannot be
/// decoded.
#[derive(Debug, FromRequestParts)]
#[from_request(via(axum::extract::Path), rejection(ApiError))]
pub(super) struct ApiPath<T>(pub T);

impl From<PathRejection> for ApiError {
    fn from(rejection: PathRejection) -> Self {
        // 5xx rejections are route/extractor mismatches: a bug, not the
        // client's fault.
        if rejection.status().is_server_error() {
            ApiError::internal(rejection.body_text())
        } else {
            ApiError::invalid_request(rejection.body_text())
        }
    }
}
