//! A JSON body extractor whose failures are API errors: at most 1 MiB,
//! `Content-Type: application/json`, unknown fields refused by the target
//! type (`#[serde(deny_unknown_fields)]`), and an empty body read as `{}`
//! when the target allows it.

use axum::body::Body;
use axum::extract::{FromRequest, Request};
use axum::http::{header, StatusCode};
use serde::de::DeserializeOwned;

use crate::error::ApiError;

/// Largest JSON request body: the one limit every JSON route shares.
pub const JSON_LIMIT: usize = super::json::MAX_BODY;

/// A parsed JSON request body.
#[derive(Debug)]
pub struct ApiJson<T>(pub T);

fn too_large() -> ApiError {
    ApiError::new(
        StatusCode::PAYLOAD_TOO_LARGE,
        "body_too_large",
        format!("the JSON body exceeds {JSON_LIMIT} bytes"),
    )
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
                let limit = std::error::Error::source(&e)
                    .is_some_and(|s| s.is::<http_body_util::LengthLimitError>());
                if limit {
                    too_large()
                } else {
                    ApiError::invalid_request(format!("reading the body failed: {e}"))
                }
            })?;
        let body: &[u8] = if bytes.iter().all(u8::is_ascii_whitespace) {
            b"{}"
        } else {
            let is_json = content_type.as_deref().is_some_and(|ct| {
                let essence = ct.split(';').next().unwrap_or("").trim();
                essence.eq_ignore_ascii_case("application/json")
                    || essence.to_ascii_lowercase().ends_with("+json")
            });
            if !is_json {
                return Err(ApiError::new(
                    StatusCode::UNSUPPORTED_MEDIA_TYPE,
                    "unsupported_media_type",
                    "send the body as Content-Type: application/json",
                ));
            }
            &bytes
        };
        serde_json::from_slice(body)
            .map(ApiJson)
            .map_err(|e| ApiError::invalid_request(format!("invalid JSON body: {e}")))
    }
}
