//! Why a caller is not let in. The API maps each variant to one status and
//! error code; the messages here are what the client reads.

use super::Scope;

/// An authentication or authorisation failure.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AuthError {
    /// No bearer token was presented.
    #[error("an Authorization: Bearer token is required")]
    TokenRequired,
    /// The token is malformed or does not verify; the text says why.
    #[error("{0}")]
    TokenInvalid(String),
    /// The token's `exp` has passed.
    #[error("the token has expired")]
    TokenExpired,
    /// The token lacks a scope the operation needs.
    #[error("the token lacks the scope {:?}", .0.as_str())]
    ScopeMissing(Scope),
    /// A delegated subject was named by a token without scope `delegate`.
    #[error("X-Context-Subject needs a token with the scope \"delegate\"")]
    DelegateMissing,
    /// The delegated subject is not `<kind>:<name>` of a delegated kind.
    #[error("X-Context-Subject must be \"<kind>:<id>\" (kind user, agent, workload or service, e.g. \"user:<id>\") with a non-empty id of visible characters")]
    SubjectInvalid,
}

impl AuthError {
    /// A [`AuthError::TokenInvalid`] with `message`.
    pub fn token_invalid(message: impl Into<String>) -> Self {
        Self::TokenInvalid(message.into())
    }
}
