//! Who is calling, and what they may do.

use std::collections::HashSet;

use super::{AuthError, Owner, Scope};

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

    /// Switches to the subject named by `X-Context-Subject`
    /// (`<kind>:<name>`, see [`Owner::delegated`]), which only a token with
    /// scope `delegate` may do. The token's other scopes then apply to that
    /// subject, which is never a token subject of the same name.
    pub fn delegate(self, header_value: &str) -> Result<Principal, AuthError> {
        if !self.has(Scope::Delegate) {
            return Err(AuthError::DelegateMissing);
        }
        let owner = Owner::delegated(header_value).ok_or(AuthError::SubjectInvalid)?;
        let delegated_by = self.owner.id().to_owned();
        Ok(Principal {
            owner,
            scopes: self.scopes,
            delegated_by: Some(delegated_by),
        })
    }
}
