//! Who is calling, and what they may do.

use std::collections::HashSet;
use std::fmt;

use super::{AuthError, Owner};

/// A permission a token can carry in its `scope` claim.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Scope {
    /// Read sandbox pools.
    PoolsRead,
    /// Create and delete sandbox pools.
    PoolsWrite,
    /// Read named contexts.
    ContextsRead,
    /// Create and delete named contexts.
    ContextsWrite,
    /// Read workloads and download frozen revisions.
    WorkloadsRead,
    /// Create, upload, activate and delete workloads.
    WorkloadsWrite,
    /// Deliver frozen revisions into sandboxes.
    WorkloadsDeliver,
    /// Act for a user through `X-Context-Subject`.
    Delegate,
}

impl Scope {
    /// Every scope, in the order the docs list them.
    pub const ALL: [Scope; 8] = [
        Scope::PoolsRead,
        Scope::PoolsWrite,
        Scope::ContextsRead,
        Scope::ContextsWrite,
        Scope::WorkloadsRead,
        Scope::WorkloadsWrite,
        Scope::WorkloadsDeliver,
        Scope::Delegate,
    ];

    /// The scope's name in a token.
    pub fn as_str(self) -> &'static str {
        match self {
            Scope::PoolsRead => "pools:read",
            Scope::PoolsWrite => "pools:write",
            Scope::ContextsRead => "contexts:read",
            Scope::ContextsWrite => "contexts:write",
            Scope::WorkloadsRead => "workloads:read",
            Scope::WorkloadsWrite => "workloads:write",
            Scope::WorkloadsDeliver => "workloads:deliver",
            Scope::Delegate => "delegate",
        }
    }

    /// Every scope a user needs (all but `delegate`), space-separated.
    pub fn user_scopes() -> String {
        Self::ALL
            .iter()
            .filter(|s| **s != Scope::Delegate)
            .map(|s| s.as_str())
            .collect::<Vec<_>>()
            .join(" ")
    }
}

impl fmt::Display for Scope {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// An authenticated caller: the owner everything is checked for, and the
/// scopes of the token that authenticated it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Principal {
    owner: Owner,
    scopes: HashSet<String>,
    delegated_by: Option<String>,
}

impl Principal {
    /// A principal for the token subject `subject` with `scopes`.
    pub fn new(subject: String, scopes: HashSet<String>) -> Self {
        Self {
            owner: Owner::Subject(subject),
            scopes,
            delegated_by: None,
        }
    }

    /// The owner: resources are recorded under and checked against it.
    pub fn owner(&self) -> &Owner {
        &self.owner
    }

    /// The owner's bare id (token `sub` or delegated user id).
    pub fn subject(&self) -> &str {
        self.owner.id()
    }

    /// The service that acts for the subject, when delegated.
    pub fn delegated_by(&self) -> Option<&str> {
        self.delegated_by.as_deref()
    }

    /// Whether the token carries `scope`.
    pub fn has(&self, scope: Scope) -> bool {
        self.scopes.contains(scope.as_str())
    }

    /// `Ok` when the token carries `scope`, else [`AuthError::ScopeMissing`].
    pub fn require(&self, scope: Scope) -> Result<(), AuthError> {
        if self.has(scope) {
            Ok(())
        } else {
            Err(AuthError::ScopeMissing(scope))
        }
    }

    /// Switches to the user named by `X-Context-Subject` (`user:<id>`),
    /// which only a token with scope `delegate` may do. The token's other
    /// scopes then apply to that user, who is always an [`Owner::User`]:
    /// never a token subject of the same name.
    pub fn delegate(self, header_value: &str) -> Result<Principal, AuthError> {
        if !self.has(Scope::Delegate) {
            return Err(AuthError::DelegateMissing);
        }
        let user = header_value
            .strip_prefix("user:")
            .filter(|id| valid_subject_id(id))
            .ok_or(AuthError::SubjectInvalid)?;
        let delegated_by = self.owner.id().to_owned();
        Ok(Principal {
            owner: Owner::User(user.to_owned()),
            scopes: self.scopes,
            delegated_by: Some(delegated_by),
        })
    }
}

fn valid_subject_id(id: &str) -> bool {
    !id.is_empty() && id.len() <= 256 && id.bytes().all(|b| b.is_ascii_graphic())
}
