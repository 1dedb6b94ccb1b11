//! The OCI distribution API's pull category under `/v2`, over the caller's
//! workloads (`/v2/workloads/<workload>/...`), with the registry token flow
//! (`/v2/token`). Answers follow the distribution spec, not the `/v1`
//! conventions: errors are `{"errors":[{"code","message","detail"}]}`.
//! Push and delete answer `405 UNSUPPORTED`: revisions are created by
//! upload and activation. See `docs/oci.md`.
//!
//! The routes are outside the OpenAPI document (they are the distribution
//! spec's), so they are added to the router on their own.

mod access;
mod error;
mod pull;
mod token;

pub use error::{RegistryCode, RegistryError};
pub use pull::ACTIVE_TAG;
pub use token::{DEFAULT_TTL_SECS, MAX_TTL_SECS};

use axum::extract::{Request, State};
use axum::http::request::Parts;
use axum::http::{header, Method};
use axum::response::{IntoResponse, Response};
use axum::routing::any;
use axum::Router;

use crate::app::AppState;
use access::REPO_PREFIX;
use pull::Repo;

/// The `/v2` routes.
pub(super) fn router() -> Router<AppState> {
    Router::new()
        .route("/v2", any(dispatch))
        .route("/v2/", any(dispatch))
        .route("/v2/{*rest}", any(dispatch))
}

/// What a `/v2` path addresses.
enum Target<'a> {
    Base,
    Token,
    Manifest(&'a str, &'a str),
    Blob(&'a str, &'a str),
    Tags(&'a str),
    /// Uploads and anything else under a repository: push.
    Push,
    Unknown,
}

fn target(path: &str) -> Target<'_> {
    let rest = path.strip_prefix("/v2").unwrap_or(path);
    let rest = rest.strip_prefix('/').unwrap_or(rest);
    if rest.is_empty() {
        return Target::Base;
    }
    if rest == "token" {
        return Target::Token;
    }
    if let Some(repo) = rest.strip_suffix("/tags/list") {
        return Target::Tags(repo);
    }
    for marker in ["/manifests/", "/blobs/"] {
        if let Some(at) = rest.rfind(marker) {
            let (repo, reference) = (&rest[..at], &rest[at + marker.len()..]);
            if reference.starts_with("uploads") {
                return Target::Push;
            }
            if !reference.is_empty() && !reference.contains('/') {
                return if marker == "/blobs/" {
                    Target::Blob(repo, reference)
                } else {
                    Target::Manifest(repo, reference)
                };
            }
        }
    }
    if rest.contains("/blobs/uploads") {
        return Target::Push;
    }
    Target::Unknown
}

fn unsupported(what: &str) -> RegistryError {
    RegistryError::new(
        RegistryCode::Unsupported,
        format!("{what} is not supported: this registry is read-only (revisions are created by upload and activation)"),
    )
    .header(header::ALLOW, "GET, HEAD")
}

async fn dispatch(State(state): State<AppState>, request: Request) -> Response {
    // The body is never read (no push).
    let (parts, _) = request.into_parts();
    match serve(&state, &parts).await {
        Ok(resp) => resp,
        Err(err) => err.into_response(),
    }
}

async fn serve(state: &AppState, request: &Parts) -> Result<Response, RegistryError> {
    let method = request.method.clone();
    let headers = &request.headers;
    let path = request.uri.path();
    let query = request.uri.query();
    let read = method == Method::GET || method == Method::HEAD;
    let (repo, kind) = match target(path) {
        Target::Base if read => {
            access::credential(state, headers, None)?;
            return Ok(pull::base_answer());
        }
        Target::Token if method == Method::GET => {
            return token::issue(state, headers, query);
        }
        Target::Token => {
            // containerd tries the OAuth2 form first and falls back to GET
            // on a 405.
            return Err(RegistryError::new(
                RegistryCode::Unsupported,
                format!(
                    "{method} /v2/token is not supported: use GET with Basic or Bearer credentials"
                ),
            )
            .header(header::ALLOW, "GET"));
        }
        Target::Base => return Err(unsupported(&format!("{method} /v2/"))),
        Target::Push => return Err(unsupported("push")),
        Target::Unknown => {
            return Err(RegistryError::new(
                RegistryCode::NameUnknown,
                format!("{path} is not a route of this registry's pull API"),
            ))
        }
        Target::Manifest(repo, _) | Target::Blob(repo, _) | Target::Tags(repo) if !read => {
            return Err(unsupported(&format!("{method} on {repo}")));
        }
        t @ (Target::Manifest(repo, _) | Target::Blob(repo, _) | Target::Tags(repo)) => (repo, t),
    };
    let cred = access::credential(state, headers, Some(repo))?;
    // Only `workloads/<name>`: anything else is no repository of ours.
    let Some(name) = repo.strip_prefix(REPO_PREFIX).filter(|n| !n.contains('/')) else {
        return Err(RegistryError::name_unknown(repo));
    };
    let base = access::base_url(state, headers);
    let right = cred.pull_right(&base, repo, name)?;
    let r = Repo { repo, name, right };
    match kind {
        Target::Manifest(_, reference) => {
            pull::manifest(&state.workloads, &r, reference, &method).await
        }
        Target::Blob(_, digest) => pull::blob(&state.workloads, &r, digest, &method, headers).await,
        Target::Tags(_) => pull::tags(&state.workloads, &r, query).await,
        _ => Err(RegistryError::name_unknown(repo)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_address_their_targets() {
        assert!(matches!(target("/v2/"), Target::Base));
        assert!(matches!(target("/v2"), Target::Base));
        assert!(matches!(target("/v2/token"), Target::Token));
        assert!(matches!(
            target("/v2/workloads/docs/manifests/active"),
            Target::Manifest("workloads/docs", "active")
        ));
        assert!(matches!(
            target("/v2/workloads/docs/blobs/sha256:ab"),
            Target::Blob("workloads/docs", "sha256:ab")
        ));
        assert!(matches!(
            target("/v2/workloads/docs/tags/list"),
            Target::Tags("workloads/docs")
        ));
        assert!(matches!(
            target("/v2/workloads/docs/blobs/uploads/"),
            Target::Push
        ));
        assert!(matches!(
            target("/v2/workloads/docs/blobs/uploads/abc"),
            Target::Push
        ));
        assert!(matches!(target("/v2/_catalog"), Target::Unknown));
    }
}
