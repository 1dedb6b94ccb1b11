//! The distribution-spec error answer: `{"errors":[{"code","message",
//! "detail"}]}` with the spec's status for each code, and the `401`
//! challenge that starts the token flow.

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::{json, Value};

use crate::workload::WorkloadError;

/// One error code of the distribution spec (and its status).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RegistryCode {
    /// 401: no credential, or one refused.
    Unauthorized,
    /// 403: the credential may not pull at all (scope missing).
    Denied,
    /// 404: no such repository for this caller.
    NameUnknown,
    /// 404: no such manifest (tag or digest) in the repository.
    ManifestUnknown,
    /// 404: no such blob in the repository.
    BlobUnknown,
    /// 400: a digest that is not `sha256:<64 hex>`.
    DigestInvalid,
    /// 416: a range outside the blob.
    SizeInvalid,
    /// 405: push and delete (revisions are created by upload + activate).
    Unsupported,
    /// 5xx: the service failed (status kept from the cause).
    Unknown(StatusCode),
}

impl RegistryCode {
    /// The code as the spec spells it.
    pub fn as_str(self) -> &'static str {
        match self {
            RegistryCode::Unauthorized => "UNAUTHORIZED",
            RegistryCode::Denied => "DENIED",
            RegistryCode::NameUnknown => "NAME_UNKNOWN",
            RegistryCode::ManifestUnknown => "MANIFEST_UNKNOWN",
            RegistryCode::BlobUnknown => "BLOB_UNKNOWN",
            RegistryCode::DigestInvalid => "DIGEST_INVALID",
            RegistryCode::SizeInvalid => "SIZE_INVALID",
            RegistryCode::Unsupported => "UNSUPPORTED",
            RegistryCode::Unknown(_) => "UNKNOWN",
        }
    }

    /// The status the spec gives the code.
    pub fn status(self) -> StatusCode {
        match self {
            RegistryCode::Unauthorized => StatusCode::UNAUTHORIZED,
            RegistryCode::Denied => StatusCode::FORBIDDEN,
            RegistryCode::NameUnknown
            | RegistryCode::ManifestUnknown
            | RegistryCode::BlobUnknown => StatusCode::NOT_FOUND,
            RegistryCode::DigestInvalid => StatusCode::BAD_REQUEST,
            RegistryCode::SizeInvalid => StatusCode::RANGE_NOT_SATISFIABLE,
            RegistryCode::Unsupported => StatusCode::METHOD_NOT_ALLOWED,
            RegistryCode::Unknown(status) => status,
        }
    }
}

/// An error answer of `/v2`.
#[derive(Debug, Clone)]
pub struct RegistryError {
    code: RegistryCode,
    message: String,
    detail: Option<Value>,
    headers: Vec<(header::HeaderName, HeaderValue)>,
}

impl RegistryError {
    /// `code` with `message`.
    pub fn new(code: RegistryCode, message: impl Into<String>) -> Self {
        Self {
            code,
            message: message.into(),
            detail: None,
            headers: Vec::new(),
        }
    }

    /// Adds the spec's optional `detail`.
    pub fn detail(mut self, detail: Value) -> Self {
        self.detail = Some(detail);
        self
    }

    /// Adds a header (the challenge, `Content-Range`, `Allow`).
    pub fn header(mut self, name: header::HeaderName, value: &str) -> Self {
        if let Ok(v) = HeaderValue::from_str(value) {
            self.headers.push((name, v));
        }
        self
    }

    /// The code.
    pub fn code(&self) -> RegistryCode {
        self.code
    }

    /// `NAME_UNKNOWN` for `workloads/<name>`: the same answer for a missing
    /// workload and another owner's.
    pub fn name_unknown(repo: &str) -> Self {
        Self::new(
            RegistryCode::NameUnknown,
            format!("repository {repo} is not known to this registry"),
        )
        .detail(json!({ "name": repo }))
    }

    /// A workload failure as the registry tells it (`NotFound` is
    /// `NAME_UNKNOWN`; the service's own failures keep their status).
    pub fn of_workload(repo: &str, err: WorkloadError) -> Self {
        match err {
            WorkloadError::NotFound(_) => Self::name_unknown(repo),
            other => {
                let api = crate::api::ApiError::from(other);
                let status = if api.status().is_server_error() {
                    api.status()
                } else {
                    StatusCode::INTERNAL_SERVER_ERROR
                };
                tracing::warn!(repo, error = api.message(), "registry read failed");
                Self::new(RegistryCode::Unknown(status), api.message().to_owned())
            }
        }
    }
}

impl IntoResponse for RegistryError {
    fn into_response(self) -> Response {
        let mut entry = json!({ "code": self.code.as_str(), "message": self.message });
        if let Some(detail) = self.detail {
            entry["detail"] = detail;
        }
        let body = json!({ "errors": [entry] }).to_string();
        let mut resp = (
            self.code.status(),
            [(
                header::CONTENT_TYPE,
                HeaderValue::from_static("application/json"),
            )],
            body,
        )
            .into_response();
        for (name, value) in self.headers {
            resp.headers_mut().append(name, value);
        }
        resp
    }
}
