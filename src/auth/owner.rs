//! The owner scope: `HMAC-SHA256(server secret, owner)` truncated to 32 hex.
//!
//! It names owner-specific things that others can see (Kubernetes labels,
//! folders in shared sandboxes) without revealing, or letting a co-tenant
//! compute, whom they belong to.

use hmac::{Hmac, KeyInit, Mac};
use sha2::Sha256;

/// Computes owner scopes with the server's secret.
#[derive(Clone)]
pub struct OwnerScope {
    mac: Hmac<Sha256>,
}

impl std::fmt::Debug for OwnerScope {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("OwnerScope(..)")
    }
}

impl OwnerScope {
    /// Length of a scope in hex characters.
    pub const LEN: usize = 32;

    /// Uses `secret` as the HMAC key; it must not be empty.
    pub fn new(secret: &[u8]) -> Result<Self, hmac::digest::InvalidLength> {
        if secret.is_empty() {
            return Err(hmac::digest::InvalidLength);
        }
        Ok(Self {
            mac: <Hmac<Sha256> as KeyInit>::new_from_slice(secret)?,
        })
    }

    /// The 32-hex scope of `owner`.
    pub fn of(&self, owner: &str) -> String {
        let mut mac = self.mac.clone();
        mac.update(owner.as_bytes());
        let digest = mac.finalize().into_bytes();
        let mut out = hex::encode(digest);
        out.truncate(Self::LEN);
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scopes_are_stable_distinct_and_keyed() {
        let a = OwnerScope::new(b"secret-one").unwrap();
        let b = OwnerScope::new(b"secret-two").unwrap();
        assert!(OwnerScope::new(b"").is_err());
        assert_eq!(a.of("alice"), a.of("alice"));
        assert_eq!(a.of("alice").len(), OwnerScope::LEN);
        assert!(a
            .of("alice")
            .bytes()
            .all(|c| c.is_ascii_hexdigit() && !c.is_ascii_uppercase()));
        assert_ne!(a.of("alice"), a.of("bob"));
        assert_ne!(a.of("alice"), b.of("alice"));
    }
}
