//! What handlers take from a request, with failures as API errors: the
//! caller ([`Principal`], from `Authorization` or upstream's `X-SH-Auth`,
//! and `X-Context-Subject`), a bearer token, a JSON body ([`ApiJson`]) and
//! the headers of a bundle upload ([`BundleHeaders`]).

use std::sync::Arc;

use axum::body::Body;
use axum::extract::{FromRef, FromRequest, FromRequestParts, Request};
use axum::http::request::Parts;
use axum::http::{header, HeaderMap};
use serde::de::DeserializeOwned;

use super::error::{ApiError, Code};
use crate::auth::{AuthError, Authenticator, Principal};
use crate::workload::BUNDLE_MEDIA_TYPE;

/// Header a trusted service uses to act for a subject: `<kind>:<id>`, kind
/// `user`, `agent`, `workload` or `service`.
pub const SUBJECT_HEADER: &str = "x-context-subject";

/// Upstream clients' token header (`contextctl`, the Go client library):
/// `X-SH-Auth: <token>`, the same JWT as `Authorization: Bearer <token>`.
pub const SH_AUTH_HEADER: &str = "x-sh-auth";

/// The token of `Authorization: Bearer <token>`, for API tokens and upload
/// grants alike. `placeholder` names the token in the error message
/// (`token`, `upload token`).
pub fn bearer_token<'h>(headers: &'h HeaderMap, placeholder: &str) -> Result<&'h str, AuthError> {
    let value = headers
        .get(header::AUTHORIZATION)
        .ok_or(AuthError::TokenRequired)?
        .to_str()
        .map_err(|_| AuthError::token_invalid("the Authorization header is not ASCII"))?;
    match value.split_once(' ') {
        Some((scheme, token))
            if scheme.eq_ignore_ascii_case("bearer") && !token.trim().is_empty() =>
        {
            Ok(token.trim())
        }
        _ => Err(AuthError::token_invalid(format!(
            "expected \"Authorization: Bearer <{placeholder}>\""
        ))),
    }
}

/// The API token of a request: `Authorization: Bearer <token>` or
/// `X-SH-Auth: <token>` (either carrier, verified the same way). When both
/// are sent they must carry the same token, else neither is trusted.
pub fn api_token(headers: &HeaderMap) -> Result<&str, AuthError> {
    let mut sh = headers.get_all(SH_AUTH_HEADER).iter();
    let sh_token = match (sh.next(), sh.next()) {
        (None, _) => None,
        (Some(_), Some(_)) => {
            return Err(AuthError::token_invalid("send one X-SH-Auth header"));
        }
        (Some(v), None) => {
            let v = v
                .to_str()
                .map_err(|_| AuthError::token_invalid("the X-SH-Auth header is not ASCII"))?
                .trim();
            if v.is_empty() {
                return Err(AuthError::token_invalid("the X-SH-Auth header is empty"));
            }
            Some(v)
        }
    };
    match (headers.contains_key(header::AUTHORIZATION), sh_token) {
        (false, Some(token)) => Ok(token),
        (true, Some(token)) => {
            if bearer_token(headers, "token")? == token {
                Ok(token)
            } else {
                Err(AuthError::token_invalid(
                    "Authorization and X-SH-Auth carry different tokens",
                ))
            }
        }
        (_, None) => bearer_token(headers, "token"),
    }
}

/// Authenticates a request from its headers: the API token ([`api_token`]),
/// and the subject a trusted service acts for, if any.
pub fn principal(auth: &Authenticator, headers: &HeaderMap) -> Result<Principal, ApiError> {
    let token = api_token(headers)?;
    let subject =
        match headers.get(SUBJECT_HEADER) {
            None => None,
            Some(v) => Some(v.to_str().map_err(|_| {
                ApiError::invalid_request("X-Context-Subject must be visible ASCII")
            })?),
        };
    Ok(auth.authenticate(token, subject)?)
}

impl<S> FromRequestParts<S> for Principal
where
    S: Send + Sync,
    Arc<Authenticator>: FromRef<S>,
{
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Self::Rejection> {
        let auth = Arc::<Authenticator>::from_ref(state);
        principal(&auth, &parts.headers)
    }
}

/// The media types a bundle is uploaded as, on every upload route.
pub const BUNDLE_MEDIA_TYPES: [&str; 2] = [BUNDLE_MEDIA_TYPE, "application/gzip"];

/// The headers of a bundle upload, checked the same way on every upload
/// route (the owner's `PUT /v1/workloads/{name}/bundle`, and `PUT
/// /v1/uploads/{id}` with a grant or a trusted capability). Each route
/// checks them at its own point of its order of checks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BundleHeaders {
    /// `Content-Length`, when sent and a number.
    declared: Option<u64>,
}

impl BundleHeaders {
    /// The headers, if the media type (the part before `;`, in any case)
    /// is one of [`BUNDLE_MEDIA_TYPES`]; else `415 unsupported_media_type`.
    pub fn check(headers: &HeaderMap) -> Result<Self, ApiError> {
        let media = headers
            .get(header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .map(|v| {
                v.split(';')
                    .next()
                    .unwrap_or("")
                    .trim()
                    .to_ascii_lowercase()
            });
        match media.as_deref() {
            Some(m) if BUNDLE_MEDIA_TYPES.contains(&m) => {}
            other => {
                return Err(ApiError::new(
                    Code::UnsupportedMediaType,
                    format!(
                        "bundles are sent as {} or {}, not {}",
                        BUNDLE_MEDIA_TYPES[0],
                        BUNDLE_MEDIA_TYPES[1],
                        other.unwrap_or("(no Content-Type)")
                    ),
                ))
            }
        }
        let declared = headers
            .get(header::CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse::<u64>().ok());
        Ok(Self { declared })
    }

    /// The declared size when it is over `max`: such an upload is refused
    /// before a byte of its body is read.
    pub fn declared_over(&self, max: u64) -> Option<u64> {
        self.declared.filter(|n| *n > max)
    }
}

/// Largest JSON request body: the one limit every JSON route shares.
pub const JSON_LIMIT: usize = super::json::MAX_BODY;

/// A parsed JSON request body.
#[derive(Debug)]
pub struct ApiJson<T>(pub T);

/// The rest of the body stays unread: the connection cannot carry another
/// request, so the answer says `Connection: close`.
fn too_large() -> ApiError {
    ApiError::new(
        Code::BodyTooLarge,
        format!("the JSON body exceeds {JSON_LIMIT} bytes"),
    )
    .closing()
}

impl<S: Send + Sync, T: DeserializeOwned> FromRequest<S> for ApiJson<T> {
    type Rejection = ApiError;

    async fn from_request(req: Request, _state: &S) -> Result<Self, Self::Rejection> {
        let declared = req
            .headers()
            .get(header::CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse::<u64>().ok());
        if declared.is_some_and(|n| n > JSON_LIMIT as u64) {
            return Err(too_large());
        }
        let content_type = req
            .headers()
            .get(header::CONTENT_TYPE)
            .map(|v| v.to_str().unwrap_or("").to_owned());
        let bytes = axum::body::to_bytes(Body::new(req.into_body()), JSON_LIMIT)
            .await
            .map_err(|e| {
                let limit = std::error::Error::source(&e).is_some_and(
                    <dyn std::error::Error + 'static>::is::<http_body_util::LengthLimitError>,
                );
                if limit {
                    too_large()
                } else {
                    ApiError::invalid_request(format!("reading the body failed: {e}"))
                }
            })?;
        parse_json(&bytes, content_type.as_deref()).map(ApiJson)
    }
}

/// Decodes a JSON body read whole, sent as `content_type`: an empty (or
/// all-whitespace) body is `{}`; anything else must be JSON.
pub fn parse_json<T: DeserializeOwned>(
    bytes: &[u8],
    content_type: Option<&str>,
) -> Result<T, ApiError> {
    let body: &[u8] = if bytes.iter().all(u8::is_ascii_whitespace) {
        b"{}"
    } else {
        let is_json = content_type.is_some_and(|ct| {
            let essence = ct.split(';').next().unwrap_or("").trim();
            essence.eq_ignore_ascii_case("application/json")
                || essence.to_ascii_lowercase().ends_with("+json")
        });
        if !is_json {
            return Err(ApiError::new(
                Code::UnsupportedMediaType,
                "send the body as Content-Type: application/json",
            ));
        }
        bytes
    };
    serde_json::from_slice(body)
        .map_err(|e| ApiError::invalid_request(format!("invalid JSON body: {e}")))
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::auth::tests::{fixture, Fixture};
    use crate::auth::TokenPolicy;

    fn mint(f: &Fixture, scope: &str) -> String {
        f.issuer
            .mint(
                &TokenPolicy::default(),
                "alice",
                scope,
                Duration::from_secs(60),
            )
            .unwrap()
    }

    #[test]
    fn authorization_header_forms() {
        let f = fixture();
        let token = mint(&f, "");
        let mut headers = HeaderMap::new();
        let err = principal(&f.auth, &headers).unwrap_err();
        assert_eq!(err.code().as_str(), "token_required");
        assert_eq!(err.status(), 401);
        assert_eq!(err.message(), "an Authorization: Bearer token is required");
        headers.insert("authorization", format!("Basic {token}").parse().unwrap());
        let err = principal(&f.auth, &headers).unwrap_err();
        assert_eq!(err.code().as_str(), "token_invalid");
        assert_eq!(err.message(), "expected \"Authorization: Bearer <token>\"");
        headers.insert("authorization", format!("bearer {token}").parse().unwrap());
        assert_eq!(principal(&f.auth, &headers).unwrap().subject(), "alice");
        headers.insert("authorization", "Bearer garbage".parse().unwrap());
        assert_eq!(
            principal(&f.auth, &headers).unwrap_err().code().as_str(),
            "token_invalid"
        );
    }

    #[test]
    fn x_sh_auth_carries_the_same_token() {
        let f = fixture();
        let token = mint(&f, "");
        let other = mint(&f, "pools:read");
        let mut headers = HeaderMap::new();
        headers.insert(SH_AUTH_HEADER, token.parse().unwrap());
        assert_eq!(principal(&f.auth, &headers).unwrap().subject(), "alice");
        // Both carriers with the same token: fine.
        headers.insert("authorization", format!("Bearer {token}").parse().unwrap());
        assert_eq!(api_token(&headers), Ok(token.as_str()));
        // Different tokens: neither is trusted, even though both verify.
        headers.insert("authorization", format!("Bearer {other}").parse().unwrap());
        let err = principal(&f.auth, &headers).unwrap_err();
        assert_eq!(
            (err.status().as_u16(), err.code().as_str()),
            (401, "token_invalid")
        );
        assert_eq!(
            err.message(),
            "Authorization and X-SH-Auth carry different tokens"
        );
        // A malformed Authorization is not rescued by X-SH-Auth.
        headers.insert("authorization", format!("Basic {token}").parse().unwrap());
        assert_eq!(
            principal(&f.auth, &headers).unwrap_err().code().as_str(),
            "token_invalid"
        );
        // The X-SH-Auth token is verified like any bearer token.
        let mut headers = HeaderMap::new();
        headers.insert(SH_AUTH_HEADER, "garbage".parse().unwrap());
        assert_eq!(
            principal(&f.auth, &headers).unwrap_err().code().as_str(),
            "token_invalid"
        );
        headers.insert(SH_AUTH_HEADER, " ".parse().unwrap());
        assert_eq!(
            api_token(&headers),
            Err(AuthError::token_invalid("the X-SH-Auth header is empty"))
        );
        headers.insert(SH_AUTH_HEADER, token.parse().unwrap());
        headers.append(SH_AUTH_HEADER, token.parse().unwrap());
        assert_eq!(
            api_token(&headers),
            Err(AuthError::token_invalid("send one X-SH-Auth header"))
        );
    }

    #[test]
    fn upload_tokens_share_the_parser_with_their_own_wording() {
        let mut headers = HeaderMap::new();
        headers.insert("authorization", "Bearer  secret ".parse().unwrap());
        assert_eq!(bearer_token(&headers, "upload token"), Ok("secret"));
        headers.insert("authorization", "Bearer".parse().unwrap());
        let err = ApiError::from(bearer_token(&headers, "upload token").unwrap_err());
        assert_eq!(err.status(), 401);
        assert_eq!(err.code().as_str(), "token_invalid");
        assert_eq!(
            err.message(),
            "expected \"Authorization: Bearer <upload token>\""
        );
    }

    #[test]
    fn scope_and_delegation_failures_map_to_their_statuses() {
        let f = fixture();
        let p = f.auth.authenticate(&mint(&f, "pools:read"), None).unwrap();
        let missing = ApiError::from(p.require(crate::auth::Scope::PoolsWrite).unwrap_err());
        assert_eq!(missing.status(), 403);
        assert_eq!(missing.code().as_str(), "scope_missing");
        assert_eq!(
            missing.message(),
            "the token lacks the scope \"pools:write\""
        );

        let mut headers = HeaderMap::new();
        let bearer = format!("Bearer {}", mint(&f, "workloads:read"));
        headers.insert("authorization", bearer.parse().unwrap());
        headers.insert(SUBJECT_HEADER, "user:bob".parse().unwrap());
        let err = principal(&f.auth, &headers).unwrap_err();
        assert_eq!(
            (err.status().as_u16(), err.code().as_str()),
            (403, "scope_missing")
        );
        assert_eq!(
            err.message(),
            "X-Context-Subject needs a token with the scope \"delegate\""
        );

        let bearer = format!("Bearer {}", mint(&f, "delegate"));
        headers.insert("authorization", bearer.parse().unwrap());
        headers.insert(SUBJECT_HEADER, "group:x".parse().unwrap());
        let err = principal(&f.auth, &headers).unwrap_err();
        assert_eq!(
            (err.status().as_u16(), err.code().as_str()),
            (400, "invalid_request")
        );

        let err = ApiError::from(AuthError::TokenExpired);
        assert_eq!(
            (err.status().as_u16(), err.code().as_str()),
            (401, "token_expired")
        );
        assert_eq!(err.message(), "the token has expired");
    }
}
