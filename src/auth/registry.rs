//! Registry tokens: short-lived, pull-only credentials of the OCI pull API
//! (`/v2`), issued by its token endpoint for our JWTs and printed into
//! pull secrets.
//!
//! A token is `csr1.<payload>.<mac>`: the payload is base64url JSON (owner
//! key, workload names, optional pinned revision, issue and expiry times),
//! the MAC is HMAC-SHA256 over `csr1.<payload>` with a key derived from the
//! server secret (the owner-scope secret replicas share), so every replica
//! verifies what any replica issued, and nothing else can mint one. A token
//! only ever grants `pull`, of the named workloads of that one owner.

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine as _;
use hmac::{Hmac, KeyInit, Mac};
use serde::{Deserialize, Serialize};
use sha2::Sha256;

/// Prefix of every registry token (a JWT never starts with it).
pub const TOKEN_PREFIX: &str = "csr1.";

/// Derives the token key from the server secret.
const KEY_LABEL: &[u8] = b"context-service registry pull tokens v1";

/// What a registry token grants: pull of `repos` of `owner`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PullGrant {
    /// The owner key (`sub:<sub>`, `user:<id>`, ...).
    #[serde(rename = "o")]
    pub owner: String,
    /// Workload names (without `workloads/`).
    #[serde(rename = "r")]
    pub repos: Vec<String>,
    /// When set, only this revision of them.
    #[serde(rename = "v", default, skip_serializing_if = "Option::is_none")]
    pub revision: Option<String>,
    /// Issued at, seconds since the epoch.
    #[serde(rename = "i")]
    pub issued_at: u64,
    /// Expiry, seconds since the epoch.
    #[serde(rename = "e")]
    pub expires_at: u64,
}

impl PullGrant {
    /// Whether the grant covers workload `name` (any revision, or the
    /// pinned one, checked by the caller against [`PullGrant::revision`]).
    pub fn covers(&self, name: &str) -> bool {
        self.repos.iter().any(|r| r == name)
    }
}

/// Why a registry token is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RegistryTokenError {
    /// Not of the token's shape, or its payload does not decode.
    #[error("the registry token is malformed")]
    Malformed,
    /// The MAC does not match (tampered, or another server's).
    #[error("the registry token's signature does not verify")]
    BadSignature,
    /// Past its expiry.
    #[error("the registry token expired at {0} (seconds since the epoch)")]
    Expired(u64),
}

/// Issues and verifies registry tokens.
#[derive(Clone)]
pub struct RegistryTokens {
    mac: Hmac<Sha256>,
}

impl std::fmt::Debug for RegistryTokens {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("RegistryTokens(..)")
    }
}

impl RegistryTokens {
    /// Keys derived from `secret` (the server's owner-scope secret); it
    /// must not be empty.
    pub fn new(secret: &[u8]) -> Result<Self, hmac::digest::InvalidLength> {
        if secret.is_empty() {
            return Err(hmac::digest::InvalidLength);
        }
        let mut derive = <Hmac<Sha256> as KeyInit>::new_from_slice(secret)?;
        derive.update(KEY_LABEL);
        let key = derive.finalize().into_bytes();
        Ok(Self {
            mac: <Hmac<Sha256> as KeyInit>::new_from_slice(&key)?,
        })
    }

    /// Whether `token` has the shape of a registry token (not a JWT).
    pub fn is_registry_token(token: &str) -> bool {
        token.starts_with(TOKEN_PREFIX)
    }

    fn sign(&self, signed: &str) -> String {
        let mut mac = self.mac.clone();
        mac.update(signed.as_bytes());
        URL_SAFE_NO_PAD.encode(mac.finalize().into_bytes())
    }

    /// The token of `grant`.
    pub fn issue(&self, grant: &PullGrant) -> String {
        // A struct of strings and numbers always serialises.
        let payload = serde_json::to_vec(grant).unwrap_or_default();
        let signed = format!("{TOKEN_PREFIX}{}", URL_SAFE_NO_PAD.encode(payload));
        let mac = self.sign(&signed);
        format!("{signed}.{mac}")
    }

    /// The grant of `token`, if it verifies and has not expired at `now`
    /// (seconds since the epoch).
    pub fn verify(&self, token: &str, now: u64) -> Result<PullGrant, RegistryTokenError> {
        let (signed, mac) = token
            .rsplit_once('.')
            .ok_or(RegistryTokenError::Malformed)?;
        let payload = signed
            .strip_prefix(TOKEN_PREFIX)
            .ok_or(RegistryTokenError::Malformed)?;
        let given = URL_SAFE_NO_PAD
            .decode(mac)
            .map_err(|_| RegistryTokenError::Malformed)?;
        let mut check = self.mac.clone();
        check.update(signed.as_bytes());
        // Constant-time comparison.
        check
            .verify_slice(&given)
            .map_err(|_| RegistryTokenError::BadSignature)?;
        let payload = URL_SAFE_NO_PAD
            .decode(payload)
            .map_err(|_| RegistryTokenError::Malformed)?;
        let grant: PullGrant =
            serde_json::from_slice(&payload).map_err(|_| RegistryTokenError::Malformed)?;
        if now >= grant.expires_at {
            return Err(RegistryTokenError::Expired(grant.expires_at));
        }
        Ok(grant)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn grant() -> PullGrant {
        PullGrant {
            owner: "sub:alice".into(),
            repos: vec!["docs".into()],
            revision: None,
            issued_at: 1000,
            expires_at: 2000,
        }
    }

    #[test]
    fn round_trip_and_expiry() {
        let tokens = RegistryTokens::new(b"server secret of some length....").unwrap();
        let t = tokens.issue(&grant());
        assert!(RegistryTokens::is_registry_token(&t));
        assert_eq!(tokens.verify(&t, 1999), Ok(grant()));
        assert_eq!(
            tokens.verify(&t, 2000),
            Err(RegistryTokenError::Expired(2000))
        );
        let mut pinned = grant();
        pinned.revision = Some("ab".repeat(32));
        assert_eq!(tokens.verify(&tokens.issue(&pinned), 1500), Ok(pinned));
    }

    #[test]
    fn tampered_or_foreign_tokens_are_refused() {
        let tokens = RegistryTokens::new(b"server secret of some length....").unwrap();
        let other = RegistryTokens::new(b"another secret of some length...").unwrap();
        let t = tokens.issue(&grant());
        assert_eq!(
            other.verify(&t, 1500),
            Err(RegistryTokenError::BadSignature)
        );
        // Another payload under the old MAC: widen the repositories.
        let mut wider = grant();
        wider.repos.push("secrets".into());
        let forged_payload = tokens.issue(&wider);
        let (signed, _) = forged_payload.rsplit_once('.').unwrap();
        let (_, mac) = t.rsplit_once('.').unwrap();
        assert_eq!(
            tokens.verify(&format!("{signed}.{mac}"), 1500),
            Err(RegistryTokenError::BadSignature)
        );
        for bad in ["", "csr1.", "csr1..", "eyJhbGciOi.x.y", "csr1.!!.!!"] {
            assert!(tokens.verify(bad, 1500).is_err(), "{bad:?}");
        }
        assert!(RegistryTokens::new(b"").is_err());
    }

    #[test]
    fn grants_cover_only_their_repositories() {
        let g = grant();
        assert!(g.covers("docs"));
        assert!(!g.covers("doc"));
        assert!(!g.covers("docs2"));
    }
}
