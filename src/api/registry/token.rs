//! `GET /v2/token`: the token endpoint of the registry token flow. It takes
//! one of our JWTs (as `Bearer`, or as the password of `Basic`, whatever
//! the username) or a registry token, and answers `{"token",
//! "expires_in"}`: a pull-only registry token for the requested
//! repositories of the credential's owner, never more than the credential
//! itself grants.
//!
//! Beyond the spec's `service` and `scope` (repeatable, or several
//! space-separated), two parameters of ours, which `contextctl workload
//! pull-secret` uses: `ttl` (seconds, or `90s`, `24h`; default
//! [`DEFAULT_TTL_SECS`], at most [`MAX_TTL_SECS`]) and `revision` (pin the
//! token to one revision).

use std::time::Duration;

use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::json;

use super::access::{self, now_secs, Credential, REPO_PREFIX};
use super::error::{RegistryCode, RegistryError};
use crate::app::AppState;
use crate::auth::registry::PullGrant;
use crate::auth::Scope;
use crate::workload::names::{is_valid_name, is_valid_revision};
use crate::workload::rfc3339;

/// Lifetime of a token when `ttl` is not asked for.
pub const DEFAULT_TTL_SECS: u64 = 300;
/// Longest lifetime a token may be asked for (pull secrets).
pub const MAX_TTL_SECS: u64 = 30 * 24 * 3600;

fn bad_request(message: impl Into<String>) -> RegistryError {
    RegistryError::new(RegistryCode::Unknown(StatusCode::BAD_REQUEST), message)
}

/// The workload names of pull scopes (`repository:workloads/<name>:pull`);
/// other scopes (other resources, push only, other names) are not granted.
fn requested_repos(scopes: &[String]) -> Vec<String> {
    let mut names: Vec<String> = Vec::new();
    for scope in scopes.iter().flat_map(|s| s.split_whitespace()) {
        let mut parts = scope.splitn(3, ':');
        let (Some("repository"), Some(repo), Some(actions)) =
            (parts.next(), parts.next(), parts.next())
        else {
            continue;
        };
        let pull = actions.split(',').any(|a| a == "pull" || a == "*");
        match repo.strip_prefix(REPO_PREFIX) {
            Some(name) if pull && is_valid_name(name) && !names.iter().any(|n| n == name) => {
                names.push(name.to_owned());
            }
            _ => {}
        }
    }
    names
}

fn parse_ttl(value: &str) -> Result<u64, RegistryError> {
    let secs = match value.parse::<u64>() {
        Ok(s) => s,
        Err(_) => humantime::parse_duration(value)
            .map(|d: Duration| d.as_secs())
            .map_err(|e| bad_request(format!("invalid ttl {value:?}: {e}")))?,
    };
    if secs == 0 || secs > MAX_TTL_SECS {
        return Err(bad_request(format!(
            "ttl must be between 1s and {MAX_TTL_SECS}s (30 days); it is {secs}s"
        )));
    }
    Ok(secs)
}

/// `GET /v2/token`.
pub(super) fn issue(
    state: &AppState,
    headers: &HeaderMap,
    query: Option<&str>,
) -> Result<Response, RegistryError> {
    let mut scopes = Vec::new();
    let mut ttl = DEFAULT_TTL_SECS;
    let mut revision: Option<String> = None;
    for (k, v) in url::form_urlencoded::parse(query.unwrap_or("").as_bytes()) {
        match k.as_ref() {
            "scope" => scopes.push(v.into_owned()),
            "ttl" => ttl = parse_ttl(&v)?,
            "revision" if is_valid_revision(&v) => revision = Some(v.into_owned()),
            "revision" => {
                return Err(bad_request(format!(
                    "invalid revision {v:?}: expected 64 lowercase hex digits"
                )))
            }
            _ => {}
        }
    }
    let refused = |why: String| {
        RegistryError::new(RegistryCode::Unauthorized, why)
            .header(header::WWW_AUTHENTICATE, "Basic realm=\"context-service\"")
    };
    let token =
        match access::presented_token(headers) {
            Ok(Some(t)) => t,
            Ok(None) => return Err(refused(
                "authentication required: Basic with one of your tokens as the password, or Bearer"
                    .to_owned(),
            )),
            Err(why) => return Err(refused(why)),
        };
    let credential = access::verify(state, headers, &token).map_err(refused)?;
    let requested = requested_repos(&scopes);
    let now = now_secs();
    let grant = match credential {
        Credential::Principal(p) => {
            if !p.has(Scope::WorkloadsRead) {
                return Err(RegistryError::new(
                    RegistryCode::Denied,
                    "the token lacks the scope workloads:read",
                ));
            }
            PullGrant {
                owner: p.owner().key(),
                repos: requested,
                revision,
                issued_at: now,
                expires_at: now + ttl,
            }
        }
        Credential::Grant(g) => {
            let repos: Vec<String> = requested.into_iter().filter(|r| g.covers(r)).collect();
            if repos.is_empty() && !scopes.is_empty() {
                return Err(RegistryError::new(
                    RegistryCode::Denied,
                    "the registry token grants pull of none of the requested repositories",
                ));
            }
            if revision.is_some() && g.revision.is_some() && revision != g.revision {
                return Err(RegistryError::new(
                    RegistryCode::Denied,
                    "the registry token is pinned to another revision",
                ));
            }
            PullGrant {
                owner: g.owner,
                repos,
                revision: g.revision.or(revision),
                issued_at: now,
                // Never outlives the token it comes from.
                expires_at: (now + ttl).min(g.expires_at),
            }
        }
    };
    let token = state.registry.tokens.issue(&grant);
    let body = json!({
        "token": token,
        "access_token": token,
        "expires_in": grant.expires_at - now,
        "issued_at": rfc3339(now * 1000),
    });
    Ok((
        StatusCode::OK,
        [(header::CACHE_CONTROL, "no-store")],
        axum::Json(body),
    )
        .into_response())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scopes_name_pull_of_workloads_only() {
        let scopes = vec![
            "repository:workloads/docs:pull".to_owned(),
            "repository:workloads/a:pull,push repository:workloads/b:push".to_owned(),
            "repository:library/x:pull".to_owned(),
            "repository:workloads/Bad_Name:pull".to_owned(),
            "registry:catalog:*".to_owned(),
            "repository:workloads/docs:*".to_owned(),
        ];
        assert_eq!(requested_repos(&scopes), vec!["docs", "a"]);
    }

    #[test]
    fn ttls() {
        assert_eq!(parse_ttl("60").unwrap(), 60);
        assert_eq!(parse_ttl("24h").unwrap(), 86400);
        assert!(parse_ttl("0").is_err());
        assert!(parse_ttl("31d").is_err());
        assert!(parse_ttl("soon").is_err());
    }
}
