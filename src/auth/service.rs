//! Service authentication of the trusted ("Moca") routes: the caller is a
//! platform service, proven either by the configured service token or by a
//! JWT with scope `delegate`.
//!
//! The service token is kept only as its sha256, and a presented bearer is
//! compared digest to digest in constant time (as upstream compares its
//! `CS_CONTROL_PLANE_TOKEN`), so neither the token's length nor a matching
//! prefix shows in the timing.

use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

use super::{AuthError, Authenticator, Scope};

/// Shortest service token accepted, in bytes: a shared bearer secret must
/// not be guessable.
pub const MIN_SERVICE_TOKEN_BYTES: usize = 32;

/// The configured service token (`--service-token-file`), as its sha256.
#[derive(Clone)]
pub struct ServiceToken {
    digest: [u8; 32],
}

impl std::fmt::Debug for ServiceToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ServiceToken(..)")
    }
}

/// Why a service token file is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ServiceTokenError {
    /// Fewer than [`MIN_SERVICE_TOKEN_BYTES`] bytes.
    #[error("the service token must be at least {MIN_SERVICE_TOKEN_BYTES} bytes; it is {0}")]
    TooShort(usize),
    /// A byte that cannot travel in `Authorization: Bearer <token>`.
    #[error(
        "the service token must be visible ASCII without spaces (it is sent as a bearer token)"
    )]
    NotABearer,
}

impl ServiceToken {
    /// Parses a token file: its contents less one trailing `\n` (or
    /// `\r\n`), which must be at least [`MIN_SERVICE_TOKEN_BYTES`] of
    /// visible ASCII.
    pub fn from_file_contents(contents: &[u8]) -> Result<Self, ServiceTokenError> {
        let token = contents
            .strip_suffix(b"\r\n")
            .or_else(|| contents.strip_suffix(b"\n"))
            .unwrap_or(contents);
        if !token.iter().all(u8::is_ascii_graphic) {
            return Err(ServiceTokenError::NotABearer);
        }
        if token.len() < MIN_SERVICE_TOKEN_BYTES {
            return Err(ServiceTokenError::TooShort(token.len()));
        }
        Ok(Self {
            digest: Sha256::digest(token).into(),
        })
    }

    /// Whether `presented` is the token (constant time over the digests).
    pub fn matches(&self, presented: &str) -> bool {
        let digest: [u8; 32] = Sha256::digest(presented.as_bytes()).into();
        bool::from(digest.ct_eq(&self.digest))
    }
}

/// How a trusted caller proved it is a platform service.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ServiceCaller {
    /// It presented the configured service token.
    Token,
    /// It presented a JWT with scope `delegate`; the token's `sub`.
    Jwt(String),
}

impl Authenticator {
    /// Authenticates the bearer of a trusted route: the configured service
    /// `token` (when there is one), else a JWT that verifies and carries the
    /// scope `delegate`. Any other bearer is refused.
    pub fn authenticate_service(
        &self,
        token: Option<&ServiceToken>,
        bearer: &str,
    ) -> Result<ServiceCaller, AuthError> {
        if token.is_some_and(|t| t.matches(bearer)) {
            return Ok(ServiceCaller::Token);
        }
        let claims = self.verify(bearer)?;
        if !claims
            .scope
            .split_whitespace()
            .any(|s| s == Scope::Delegate.as_str())
        {
            return Err(AuthError::DelegateMissing);
        }
        Ok(ServiceCaller::Jwt(claims.sub))
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::auth::tests::fixture;
    use crate::auth::TokenPolicy;

    const TOKEN: &str = "moca-service-token-0123456789abcdef";

    #[test]
    fn token_files_strip_one_newline_and_need_a_strong_bearer() {
        let t = ServiceToken::from_file_contents(format!("{TOKEN}\n").as_bytes()).unwrap();
        assert!(t.matches(TOKEN));
        assert!(!t.matches(&format!("{TOKEN}\n")));
        assert!(!t.matches(&TOKEN[..TOKEN.len() - 1]));
        assert!(!t.matches(""));
        let crlf = ServiceToken::from_file_contents(format!("{TOKEN}\r\n").as_bytes()).unwrap();
        assert!(crlf.matches(TOKEN));
        assert_eq!(
            ServiceToken::from_file_contents(b"short\n").unwrap_err(),
            ServiceTokenError::TooShort(5)
        );
        assert_eq!(
            ServiceToken::from_file_contents(format!("{TOKEN} x").as_bytes()).unwrap_err(),
            ServiceTokenError::NotABearer
        );
        assert_eq!(
            ServiceToken::from_file_contents(format!("{TOKEN}\n\n").as_bytes()).unwrap_err(),
            ServiceTokenError::NotABearer
        );
        assert_eq!(format!("{t:?}"), "ServiceToken(..)");
    }

    #[test]
    fn the_token_or_a_delegate_jwt_authenticates_a_service() {
        let f = fixture();
        let token = ServiceToken::from_file_contents(TOKEN.as_bytes()).unwrap();
        let mint = |scope: &str| {
            f.issuer
                .mint(
                    &TokenPolicy::default(),
                    "moca",
                    scope,
                    Duration::from_secs(60),
                )
                .unwrap()
        };
        assert_eq!(
            f.auth.authenticate_service(Some(&token), TOKEN),
            Ok(ServiceCaller::Token)
        );
        // Without a configured token only a JWT can succeed.
        assert!(f.auth.authenticate_service(None, TOKEN).is_err());
        assert_eq!(
            f.auth
                .authenticate_service(Some(&token), &mint("delegate workloads:read")),
            Ok(ServiceCaller::Jwt("moca".into()))
        );
        assert_eq!(
            f.auth.authenticate_service(None, &mint("workloads:write")),
            Err(AuthError::DelegateMissing)
        );
        assert!(matches!(
            f.auth.authenticate_service(Some(&token), "wrong"),
            Err(AuthError::TokenInvalid(_))
        ));
    }
}
