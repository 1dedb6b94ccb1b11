//! Who is pulling: the credential of a `/v2` request (one of our JWTs or a
//! registry token, as `Bearer` or as the password of `Basic`), what it may
//! pull, and the `401` challenge that sends a client to the token endpoint.

use std::time::{SystemTime, UNIX_EPOCH};

use axum::http::{header, HeaderMap};
use base64::engine::general_purpose::STANDARD;
use base64::Engine as _;

use super::error::{RegistryCode, RegistryError};
use crate::api::extract::SUBJECT_HEADER;
use crate::app::AppState;
use crate::auth::registry::{PullGrant, RegistryTokens};
use crate::auth::{AuthError, Principal, Scope};

/// The `service` of challenges and tokens.
pub(super) const SERVICE: &str = "context-service";

/// Repositories are `workloads/<workload>`.
pub(super) const REPO_PREFIX: &str = "workloads/";

/// A verified credential.
#[derive(Debug, Clone)]
pub(super) enum Credential {
    /// One of our JWTs: everything its owner may read.
    Principal(Principal),
    /// A registry token: pull of the workloads it names.
    Grant(PullGrant),
}

/// What a credential may pull of one repository: its owner's workload,
/// perhaps only one revision.
#[derive(Debug, Clone)]
pub(super) struct PullRight {
    /// The owner key the workload is looked up under.
    pub owner: String,
    /// When set, only this revision is visible.
    pub revision: Option<String>,
}

/// Seconds since the epoch.
pub(super) fn now_secs() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// The registry's public base URL: `--registry-url`, else `http://` and
/// the request's `Host` (when it is a plain host[:port]).
pub(super) fn base_url(state: &AppState, headers: &HeaderMap) -> String {
    if let Some(url) = &state.registry.url {
        return url.clone();
    }
    let host = headers
        .get(header::HOST)
        .and_then(|h| h.to_str().ok())
        .filter(|h| {
            !h.is_empty()
                && h.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"-.:[]_".contains(&b))
        })
        .unwrap_or("localhost");
    format!("http://{host}")
}

/// `Bearer realm="<base>/v2/token",service="context-service"` with the
/// repository's pull scope, and `error=...` when a token was refused.
pub(super) fn challenge(base: &str, repo: Option<&str>, error: Option<&str>) -> String {
    let mut c = format!("Bearer realm=\"{base}/v2/token\",service=\"{SERVICE}\"");
    if let Some(repo) = repo {
        c.push_str(&format!(",scope=\"repository:{repo}:pull\""));
    }
    if let Some(error) = error {
        c.push_str(&format!(",error=\"{error}\""));
    }
    c
}

/// `401 UNAUTHORIZED` with the challenge.
pub(super) fn unauthorized(
    base: &str,
    repo: Option<&str>,
    error: Option<&str>,
    message: impl Into<String>,
) -> RegistryError {
    RegistryError::new(RegistryCode::Unauthorized, message)
        .header(header::WWW_AUTHENTICATE, &challenge(base, repo, error))
}

/// The token a request carries: `Authorization: Bearer <token>`, or the
/// password of `Authorization: Basic` (the username is ignored). `None`
/// without an `Authorization` header.
pub(super) fn presented_token(headers: &HeaderMap) -> Result<Option<String>, String> {
    let Some(value) = headers.get(header::AUTHORIZATION) else {
        return Ok(None);
    };
    let value = value
        .to_str()
        .map_err(|_| "the Authorization header is not ASCII".to_owned())?;
    let (scheme, rest) = value
        .split_once(' ')
        .ok_or_else(|| "expected Authorization: Bearer or Basic".to_owned())?;
    let rest = rest.trim();
    if scheme.eq_ignore_ascii_case("bearer") && !rest.is_empty() {
        return Ok(Some(rest.to_owned()));
    }
    if scheme.eq_ignore_ascii_case("basic") {
        let decoded = STANDARD
            .decode(rest)
            .map_err(|_| "the Basic credentials are not base64".to_owned())?;
        let text = String::from_utf8(decoded)
            .map_err(|_| "the Basic credentials are not UTF-8".to_owned())?;
        let (_, password) = text
            .split_once(':')
            .ok_or_else(|| "the Basic credentials lack a ':'".to_owned())?;
        if password.is_empty() {
            return Err("the Basic password is empty: use one of your tokens".to_owned());
        }
        return Ok(Some(password.to_owned()));
    }
    Err("expected Authorization: Bearer <token> or Basic with a token as the password".to_owned())
}

/// Verifies `token`: a registry token by its MAC, anything else as one of
/// our JWTs (with `X-Context-Subject` for a delegating service).
pub(super) fn verify(
    state: &AppState,
    headers: &HeaderMap,
    token: &str,
) -> Result<Credential, String> {
    if RegistryTokens::is_registry_token(token) {
        return state
            .registry
            .tokens
            .verify(token, now_secs())
            .map(Credential::Grant)
            .map_err(|e| e.to_string());
    }
    let subject = headers
        .get(SUBJECT_HEADER)
        .map(|v| {
            v.to_str()
                .map_err(|_| "X-Context-Subject must be visible ASCII")
        })
        .transpose()?;
    state
        .auth
        .authenticate(token, subject)
        .map(Credential::Principal)
        .map_err(|e: AuthError| e.to_string())
}

/// The request's credential, or the `401` that asks for one (scoped to
/// `repo` when a repository is addressed).
pub(super) fn credential(
    state: &AppState,
    headers: &HeaderMap,
    repo: Option<&str>,
) -> Result<Credential, RegistryError> {
    let base = base_url(state, headers);
    let token = match presented_token(headers) {
        Ok(Some(t)) => t,
        Ok(None) => {
            return Err(unauthorized(
                &base,
                repo,
                None,
                "authentication required: a token from the realm of the challenge, or one of your API tokens",
            ))
        }
        Err(why) => return Err(unauthorized(&base, repo, Some("invalid_token"), why)),
    };
    verify(state, headers, &token)
        .map_err(|why| unauthorized(&base, repo, Some("invalid_token"), why))
}

impl Credential {
    /// What this credential may pull of workload `name` (`repo` is
    /// `workloads/<name>`, for the challenge).
    pub(super) fn pull_right(
        &self,
        base: &str,
        repo: &str,
        name: &str,
    ) -> Result<PullRight, RegistryError> {
        match self {
            Credential::Principal(p) => {
                if !p.has(Scope::WorkloadsRead) {
                    return Err(RegistryError::new(
                        RegistryCode::Denied,
                        "the token lacks the scope workloads:read",
                    ));
                }
                Ok(PullRight {
                    owner: p.owner().key(),
                    revision: None,
                })
            }
            Credential::Grant(g) if g.covers(name) => Ok(PullRight {
                owner: g.owner.clone(),
                revision: g.revision.clone(),
            }),
            Credential::Grant(_) => Err(unauthorized(
                base,
                Some(repo),
                Some("insufficient_scope"),
                format!("the registry token does not grant pull of {repo}"),
            )),
        }
    }
}
