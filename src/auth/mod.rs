//! Authentication and authorisation: bearer JWT verification, scopes, the
//! owner identity, delegation by trusted services, the service token of the
//! trusted routes, and the owner-scope HMAC.
//!
//! The algorithm of a token is always fixed by the key that verifies it
//! (selected by `kid`), never by the token's header.

pub mod dev;
mod error;
mod keys;
mod owner;
mod principal;
mod refusal;
pub mod registry;
mod scope;
pub mod secret;
mod service;

pub use error::AuthError;
pub use keys::{KeyError, KeySet, VerifyingKey, MIN_RSA_BITS};
pub use owner::{Owner, OwnerScope, MAX_SUBJECT_NAME};
pub use principal::Principal;
pub use refusal::NOT_A_JWT;
pub use scope::Scope;
pub use service::{ServiceCaller, ServiceToken, ServiceTokenError, MIN_SERVICE_TOKEN_BYTES};

use std::collections::HashSet;
use std::time::Duration;

use jsonwebtoken::{decode, decode_header, Validation};
use serde::{Deserialize, Serialize};

/// Longest leeway the design allows for `exp`/`nbf`.
pub const MAX_LEEWAY_SECS: u64 = 60;

/// The claims a token carries.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Claims {
    /// The owner (user or service) the token speaks for.
    pub sub: String,
    /// Issuer.
    pub iss: String,
    /// Audience: one, or an array of which one must be this service.
    pub aud: Audience,
    /// Expiry, seconds since the epoch.
    pub exp: u64,
    /// Issued-at, seconds since the epoch.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub iat: Option<u64>,
    /// Not-before, seconds since the epoch.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nbf: Option<u64>,
    /// Space-separated scopes.
    #[serde(default)]
    pub scope: String,
}

/// The `aud` claim: a string, or an array of strings (RFC 7519 §4.1.3).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum Audience {
    /// `"aud": "x"`.
    One(String),
    /// `"aud": ["x", "y"]`.
    Many(Vec<String>),
}

impl From<String> for Audience {
    fn from(aud: String) -> Self {
        Audience::One(aud)
    }
}

impl From<&str> for Audience {
    fn from(aud: &str) -> Self {
        Audience::One(aud.to_owned())
    }
}

/// What a token must say about where it comes from and whom it is for.
#[derive(Debug, Clone)]
pub struct TokenPolicy {
    /// Required `iss`.
    pub issuer: String,
    /// Required `aud` (or one of an array `aud`).
    pub audience: String,
    /// Clock leeway for `exp`/`nbf`, at most [`MAX_LEEWAY_SECS`].
    pub leeway_secs: u64,
    /// Longest `exp - iat` accepted; tokens then need `iat`. `None` accepts
    /// any lifetime.
    pub max_lifetime: Option<Duration>,
}

impl Default for TokenPolicy {
    fn default() -> Self {
        Self {
            issuer: "context-service".to_owned(),
            audience: "context-service".to_owned(),
            leeway_secs: 30,
            max_lifetime: None,
        }
    }
}

/// Verifies bearer tokens and turns them into [`Principal`]s.
#[derive(Debug)]
pub struct Authenticator {
    keys: KeySet,
    policy: TokenPolicy,
}

impl Authenticator {
    /// An authenticator that trusts `keys` under `policy`.
    pub fn new(keys: KeySet, mut policy: TokenPolicy) -> Self {
        policy.leeway_secs = policy.leeway_secs.min(MAX_LEEWAY_SECS);
        Self { keys, policy }
    }

    /// Verifies `token` and, when `delegated_subject` is given (the value of
    /// `X-Context-Subject`), checks the token may act for that subject.
    pub fn authenticate(
        &self,
        token: &str,
        delegated_subject: Option<&str>,
    ) -> Result<Principal, AuthError> {
        let claims = self.verify(token)?;
        let scopes: HashSet<String> = claims.scope.split_whitespace().map(str::to_owned).collect();
        let principal = Principal::new(claims.sub, scopes);
        match delegated_subject {
            None => Ok(principal),
            Some(value) => principal.delegate(value),
        }
    }

    /// Verifies signature, algorithm, `iss`, `aud`, `exp` and `nbf`.
    pub fn verify(&self, token: &str) -> Result<Claims, AuthError> {
        let header = decode_header(token).map_err(|e| refusal::malformed(&e))?;
        let key = self
            .keys
            .select(header.kid.as_deref(), header.alg)
            .ok_or_else(|| {
                AuthError::token_invalid("no trusted key matches the token's kid and algorithm")
            })?;
        let mut validation = Validation::new(key.algorithm());
        validation.algorithms = vec![key.algorithm()];
        validation.set_issuer(&[&self.policy.issuer]);
        validation.set_audience(&[&self.policy.audience]);
        let mut required = vec!["exp", "iss", "aud", "sub"];
        if self.policy.max_lifetime.is_some() {
            required.push("iat");
        }
        validation.set_required_spec_claims(&required);
        validation.leeway = self.policy.leeway_secs;
        validation.validate_nbf = true;
        let data = decode::<Claims>(token, key.decoding_key(), &validation)
            .map_err(|e| refusal::refused(&e))?;
        if data.claims.sub.is_empty() {
            return Err(AuthError::token_invalid("the token's subject is empty"));
        }
        if let Some(max) = self.policy.max_lifetime {
            check_lifetime(&data.claims, max)?;
        }
        Ok(data.claims)
    }
}

/// `Ok` when the token lives at most `max` (`exp - iat`).
fn check_lifetime(claims: &Claims, max: Duration) -> Result<(), AuthError> {
    let iat = claims.iat.ok_or_else(|| {
        AuthError::token_invalid("the token lacks the claim \"iat\" (a maximum lifetime is set)")
    })?;
    let lifetime = claims.exp.checked_sub(iat).ok_or_else(|| {
        AuthError::token_invalid("the token expires before it was issued (exp < iat)")
    })?;
    if lifetime > max.as_secs() {
        return Err(AuthError::token_invalid(format!(
            "the token's lifetime (exp - iat) is {lifetime}s; at most {}s is accepted",
            max.as_secs()
        )));
    }
    Ok(())
}

#[cfg(test)]
pub(crate) mod tests;
