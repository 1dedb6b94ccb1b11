//! Owners, and the owner scope that names them where others can see.
//!
//! An [`Owner`] carries its kind: a token's own subject (a service, or a
//! user whose identity provider issues the token) or a subject a trusted
//! service acts for through `X-Context-Subject: <kind>:<name>`, with
//! upstream's kinds `user`, `agent`, `workload` and `service`. No two kinds
//! share a namespace: stored records use [`Owner::key`] (`sub:<sub>`,
//! `user:<id>`, `agent:<id>`, ...), and the scopes of the kinds are keyed
//! differently.
//!
//! The owner scope is `HMAC-SHA256(key, id)` truncated to 32 hex. It names
//! owner-specific things that others can see (Kubernetes labels, folders in
//! shared sandboxes) without revealing, or letting a co-tenant compute,
//! whom they belong to. A token subject's scope is keyed with the server
//! secret over the bare `sub`, exactly as before owners had kinds, so the
//! labels of existing pools and contexts stay valid; a delegated subject's
//! is keyed with a key derived from the secret for its kind, so no `sub`
//! (and no subject of another kind) can ever produce it.

use hmac::{Hmac, KeyInit, Mac};
use sha2::Sha256;

/// Whose resources a call acts on.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Owner {
    /// The `sub` of the token that authenticated the call.
    Subject(String),
    /// The user named by `X-Context-Subject: user:<id>`.
    User(String),
    /// The agent named by `X-Context-Subject: agent:<id>`.
    Agent(String),
    /// The workload named by `X-Context-Subject: workload:<id>`.
    Workload(String),
    /// The service named by `X-Context-Subject: service:<id>`.
    Service(String),
}

/// Longest delegated subject name.
pub const MAX_SUBJECT_NAME: usize = 256;

/// Delegated subjects no caller may act as: upstream's anonymous user and
/// its bootstrap administrator.
const RESERVED_SUBJECTS: [&str; 2] = ["user:anonymous", "service:context-service-admin"];

impl Owner {
    /// Prefix of a token subject's key.
    pub const SUBJECT_PREFIX: &'static str = "sub:";
    /// Prefix of a delegated user's key.
    pub const USER_PREFIX: &'static str = "user:";

    /// The kinds `X-Context-Subject` may name, as upstream spells them.
    pub const DELEGATED_KINDS: [&'static str; 4] = ["user", "agent", "workload", "service"];

    /// The subject named by an `X-Context-Subject` value `<kind>:<name>`:
    /// a kind of [`Owner::DELEGATED_KINDS`] and a name of 1 to
    /// [`MAX_SUBJECT_NAME`] visible ASCII characters (which may hold `:`, as
    /// in `user:github:alice`). Upstream's reserved `user:anonymous` and
    /// `service:context-service-admin` are refused. Never a token subject.
    pub fn delegated(value: &str) -> Option<Owner> {
        let (kind, name) = value.trim().split_once(':')?;
        let valid = !name.is_empty()
            && name.len() <= MAX_SUBJECT_NAME
            && name.bytes().all(|b| b.is_ascii_graphic());
        if !valid || RESERVED_SUBJECTS.contains(&value.trim()) {
            return None;
        }
        let name = name.to_owned();
        match kind {
            "user" => Some(Owner::User(name)),
            "agent" => Some(Owner::Agent(name)),
            "workload" => Some(Owner::Workload(name)),
            "service" => Some(Owner::Service(name)),
            _ => None,
        }
    }

    /// The kind's name: `sub` for a token subject, else the delegated kind.
    pub fn kind(&self) -> &'static str {
        match self {
            Owner::Subject(_) => "sub",
            Owner::User(_) => "user",
            Owner::Agent(_) => "agent",
            Owner::Workload(_) => "workload",
            Owner::Service(_) => "service",
        }
    }

    /// The form stored with records: `<kind>:<id>` (`sub:<sub>`,
    /// `user:<id>`, `agent:<id>`, `workload:<id>`, `service:<id>`).
    pub fn key(&self) -> String {
        format!("{}:{}", self.kind(), self.id())
    }

    /// The bare id (`sub` or delegated name), for messages and logs.
    pub fn id(&self) -> &str {
        match self {
            Owner::Subject(id)
            | Owner::User(id)
            | Owner::Agent(id)
            | Owner::Workload(id)
            | Owner::Service(id) => id,
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

/// Prefix of the labels that derive the keys of the other delegated kinds'
/// scopes (the kind follows).
const KIND_SCOPE_LABEL: &[u8] = b"context-service owner scope: delegated kind ";

/// Computes owner scopes with the server's secret.
#[derive(Clone)]
pub struct OwnerScope {
    subjects: Hmac<Sha256>,
    users: Hmac<Sha256>,
    agents: Hmac<Sha256>,
    workloads: Hmac<Sha256>,
    services: Hmac<Sha256>,
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
        // One key per delegated kind, derived from the secret.
        let derive = |label: &[&[u8]]| {
            let mut mac = subjects.clone();
            for part in label {
                mac.update(part);
            }
            <Hmac<Sha256> as KeyInit>::new_from_slice(&mac.finalize().into_bytes())
        };
        Ok(Self {
            users: derive(&[USER_SCOPE_LABEL])?,
            agents: derive(&[KIND_SCOPE_LABEL, b"agent"])?,
            workloads: derive(&[KIND_SCOPE_LABEL, b"workload"])?,
            services: derive(&[KIND_SCOPE_LABEL, b"service"])?,
            subjects,
        })
    }

    /// The 32-hex scope of `owner`.
    pub fn of(&self, owner: &Owner) -> String {
        let mut mac = match owner {
            Owner::Subject(_) => self.subjects.clone(),
            Owner::User(_) => self.users.clone(),
            Owner::Agent(_) => self.agents.clone(),
            Owner::Workload(_) => self.workloads.clone(),
            Owner::Service(_) => self.services.clone(),
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
    fn every_kind_has_its_own_scope() {
        let scopes = OwnerScope::new(b"server-secret").unwrap();
        let all = [
            sub("x"),
            user("x"),
            Owner::Agent("x".into()),
            Owner::Workload("x".into()),
            Owner::Service("x".into()),
        ];
        let distinct: std::collections::HashSet<String> =
            all.iter().map(|o| scopes.of(o)).collect();
        assert_eq!(distinct.len(), all.len());
        let keys: std::collections::HashSet<String> = all.iter().map(Owner::key).collect();
        assert_eq!(keys.len(), all.len());
    }

    #[test]
    fn delegated_subjects_parse_upstream_kinds() {
        assert_eq!(Owner::delegated("user:alice"), Some(user("alice")));
        // Moca's ids keep their provider prefix in the name.
        assert_eq!(
            Owner::delegated("user:github:alice"),
            Some(user("github:alice"))
        );
        assert_eq!(
            Owner::delegated("agent:planner"),
            Some(Owner::Agent("planner".into()))
        );
        assert_eq!(
            Owner::delegated("workload:w1").map(|o| o.key()),
            Some("workload:w1".into())
        );
        assert_eq!(
            Owner::delegated("service:team1/builder"),
            Some(Owner::Service("team1/builder".into()))
        );
        let long = format!("user:{}", "a".repeat(MAX_SUBJECT_NAME + 1));
        for bad in [
            "",
            "alice",
            "user:",
            ":alice",
            "group:x",
            "sub:alice",
            "User:alice",
            "user:a b",
            "user:anonymous",
            "service:context-service-admin",
            long.as_str(),
        ] {
            assert_eq!(Owner::delegated(bad), None, "{bad}");
        }
        // Another kind's reserved-looking name is fine.
        assert!(Owner::delegated("agent:anonymous").is_some());
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
