//! Owners, and the owner scope that names them where others can see.
//!
//! An [`Owner`] carries its kind: a token's own subject (a service, or a
//! user whose identity provider issues the token) or a user a trusted
//! service acts for through `X-Context-Subject`. The two never share a
//! namespace: stored records use [`Owner::key`] (`sub:<sub>` or
//! `user:<id>`), and the scopes of the two kinds are keyed differently.
//!
//! The owner scope is `HMAC-SHA256(key, id)` truncated to 32 hex. It names
//! owner-specific things that others can see (Kubernetes labels, folders in
//! shared sandboxes) without revealing, or letting a co-tenant compute,
//! whom they belong to. A token subject's scope is keyed with the server
//! secret over the bare `sub`, exactly as before owners had kinds, so the
//! labels of existing pools and contexts stay valid; a delegated user's is
//! keyed with a key derived from the secret, so no `sub` can ever produce
//! it.

use hmac::{Hmac, KeyInit, Mac};
use sha2::Sha256;

/// Whose resources a call acts on.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Owner {
    /// The `sub` of the token that authenticated the call.
    Subject(String),
    /// The user named by `X-Context-Subject: user:<id>`.
    User(String),
}

impl Owner {
    /// Prefix of a token subject's key.
    pub const SUBJECT_PREFIX: &'static str = "sub:";
    /// Prefix of a delegated user's key.
    pub const USER_PREFIX: &'static str = "user:";

    /// The form stored with records: `sub:<sub>` or `user:<id>`.
    pub fn key(&self) -> String {
        match self {
            Owner::Subject(sub) => format!("{}{sub}", Self::SUBJECT_PREFIX),
            Owner::User(id) => format!("{}{id}", Self::USER_PREFIX),
        }
    }

    /// The bare id (`sub` or user id), for messages and logs.
    pub fn id(&self) -> &str {
        match self {
            Owner::Subject(id) | Owner::User(id) => id,
        }
    }

    /// The key of an owner recorded before owners had kinds: such an owner
    /// was a bare token `sub` (or a delegated id, which shared that
    /// namespace), and is migrated to the token subject.
    pub fn legacy_key(bare: &str) -> String {
        Owner::Subject(bare.to_owned()).key()
    }
}

impl std::fmt::Display for Owner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.key())
    }
}

/// Derives the key of delegated users' scopes from the server secret.
const USER_SCOPE_LABEL: &[u8] = b"context-service owner scope: delegated users";

/// Computes owner scopes with the server's secret.
#[derive(Clone)]
pub struct OwnerScope {
    subjects: Hmac<Sha256>,
    users: Hmac<Sha256>,
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
        let subjects = <Hmac<Sha256> as KeyInit>::new_from_slice(secret)?;
        let mut derive = subjects.clone();
        derive.update(USER_SCOPE_LABEL);
        let user_key = derive.finalize().into_bytes();
        Ok(Self {
            subjects,
            users: <Hmac<Sha256> as KeyInit>::new_from_slice(&user_key)?,
        })
    }

    /// The 32-hex scope of `owner`.
    pub fn of(&self, owner: &Owner) -> String {
        let mut mac = match owner {
            Owner::Subject(_) => self.subjects.clone(),
            Owner::User(_) => self.users.clone(),
        };
        mac.update(owner.id().as_bytes());
        let digest = mac.finalize().into_bytes();
        let mut out = hex::encode(digest);
        out.truncate(Self::LEN);
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sub(id: &str) -> Owner {
        Owner::Subject(id.into())
    }

    fn user(id: &str) -> Owner {
        Owner::User(id.into())
    }

    #[test]
    fn scopes_are_stable_distinct_and_keyed() {
        let a = OwnerScope::new(b"secret-one").unwrap();
        let b = OwnerScope::new(b"secret-two").unwrap();
        assert!(OwnerScope::new(b"").is_err());
        assert_eq!(a.of(&sub("alice")), a.of(&sub("alice")));
        assert_eq!(a.of(&sub("alice")).len(), OwnerScope::LEN);
        assert!(a
            .of(&sub("alice"))
            .bytes()
            .all(|c| c.is_ascii_hexdigit() && !c.is_ascii_uppercase()));
        assert_ne!(a.of(&sub("alice")), a.of(&sub("bob")));
        assert_ne!(a.of(&sub("alice")), b.of(&sub("alice")));
    }

    #[test]
    fn subject_scopes_are_unchanged_and_users_never_collide_with_them() {
        let secret = b"server-secret";
        let scopes = OwnerScope::new(secret).unwrap();
        // A subject's scope is what every owner's scope was before owners
        // had kinds: existing pool and context labels stay valid.
        let mut legacy = <Hmac<Sha256> as KeyInit>::new_from_slice(secret).unwrap();
        legacy.update(b"alice");
        let legacy = hex::encode(legacy.finalize().into_bytes());
        assert_eq!(scopes.of(&sub("alice")), legacy[..OwnerScope::LEN]);
        // The user alice is someone else, whatever the subject is called.
        assert_ne!(scopes.of(&user("alice")), scopes.of(&sub("alice")));
        assert_ne!(scopes.of(&user("alice")), scopes.of(&sub("user:alice")));
        assert_eq!(scopes.of(&user("alice")).len(), OwnerScope::LEN);
    }

    #[test]
    fn keys_carry_the_kind() {
        assert_eq!(sub("dev").key(), "sub:dev");
        assert_eq!(user("dev").key(), "user:dev");
        assert_ne!(sub("user:x").key(), user("x").key());
        assert_eq!(Owner::legacy_key("svc-billing"), "sub:svc-billing");
        assert_eq!(user("a").id(), "a");
    }
}
