//! `WWW-Authenticate` on the `401` answers of `/v1` (RFC 6750 §3): a client
//! refused for its bearer token learns which scheme and realm to use, and
//! whether the token it sent was the problem.
//!
//! Answers that already carry a challenge keep theirs, and the upstream
//! routes' `unauthorized` answers (a service or upload capability refused)
//! stay as upstream sends them, without one.

use axum::extract::Request;
use axum::http::{header, HeaderValue, StatusCode};
use axum::middleware::Next;
use axum::response::Response;

use super::answer::ErrorCode;
use super::error::Code;

/// The challenge when no token was sent.
pub const NO_TOKEN: &str = "Bearer realm=\"context-service\"";

/// The challenge when the token sent was refused (malformed, unverifiable
/// or expired).
pub const INVALID_TOKEN: &str = "Bearer realm=\"context-service\", error=\"invalid_token\"";

/// Middleware (a route layer): adds the challenge to a `/v1` answer that
/// refuses the caller's bearer token.
pub(super) async fn bearer(request: Request, next: Next) -> Response {
    let v1 = request.uri().path().starts_with("/v1/");
    let mut response = next.run(request).await;
    if !v1
        || response.status() != StatusCode::UNAUTHORIZED
        || response.headers().contains_key(header::WWW_AUTHENTICATE)
    {
        return response;
    }
    let code = response.extensions().get::<ErrorCode>().map(|c| c.0);
    let challenge = if code == Some(Code::TokenRequired.as_str()) {
        NO_TOKEN
    } else if code == Some(Code::TokenInvalid.as_str()) || code == Some(Code::TokenExpired.as_str())
    {
        INVALID_TOKEN
    } else {
        return response;
    };
    response.headers_mut().insert(
        header::WWW_AUTHENTICATE,
        HeaderValue::from_static(challenge),
    );
    response
}
