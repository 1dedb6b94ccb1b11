//! What the pool service answers when a call fails, in domain terms.
//!
//! The API turns each variant into a status, an error code and a message in
//! one place (`impl From<PoolError> for ApiError`); nothing here knows HTTP.

use super::port::BackendError;

/// Message of a missing pool (also another owner's pool).
pub const POOL_NOT_FOUND: &str = "sandbox pool not found";
/// Message of a pool name that is taken.
pub const POOL_EXISTS: &str = "sandbox pool already exists";
/// Message of a missing named context (also another owner's).
pub const CONTEXT_NOT_FOUND: &str = "context resource not found";
/// Message of a named context that exists already.
pub const CONTEXT_EXISTS: &str = "context resource already exists";

/// What a call is about: a sandbox pool or a named context.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Subject {
    /// A sandbox pool.
    Pool,
    /// A named context.
    Context,
}

impl Subject {
    /// The message saying that no such object exists.
    pub fn not_found_message(self) -> &'static str {
        match self {
            Subject::Pool => POOL_NOT_FOUND,
            Subject::Context => CONTEXT_NOT_FOUND,
        }
    }

    /// The message saying that the name is taken.
    pub fn exists_message(self) -> &'static str {
        match self {
            Subject::Pool => POOL_EXISTS,
            Subject::Context => CONTEXT_EXISTS,
        }
    }
}

/// Why a pool service call failed.
#[derive(Debug, thiserror::Error)]
pub enum PoolError {
    /// The request breaks a rule, or names something unusable (a missing
    /// claim or warm pool). The message is upstream's and is shown as is.
    #[error("{0}")]
    Invalid(String),
    /// No such object of the caller (another owner's counts as missing).
    #[error("{}", .0.not_found_message())]
    NotFound(Subject),
    /// The name is taken.
    #[error("{}", .0.exists_message())]
    AlreadyExists(Subject),
    /// The owner's pools would hold more sandbox replicas than the quota.
    #[error("the quota of {quota} sandbox replicas per owner is reached: your pools hold {held} and this one asks for {asked}; delete a pool first")]
    PoolQuotaExceeded {
        /// The quota.
        quota: u32,
        /// Replicas the owner's pools hold now.
        held: u64,
        /// Replicas the new pool asks for.
        asked: u32,
    },
    /// The owner has as many named contexts as the quota allows.
    #[error("the quota of {0} named contexts per owner is reached; delete one first")]
    ContextQuotaExceeded(u32),
    /// The pool cannot be suspended or resumed (warm-pool pools); the
    /// message says why.
    #[error("{0}")]
    NotSuspendable(String),
    /// The backend cannot serve requests now. The cause is for the log.
    #[error("the sandbox backend is not reachable; see the service log")]
    NotReady(#[source] BackendError),
    /// Anything else. The cause is for the log, never for the client.
    #[error("{doing}: {source}")]
    Internal {
        /// What the service was doing, e.g. `get sandbox pool p`.
        doing: String,
        /// The backend's error.
        #[source]
        source: BackendError,
    },
}

impl PoolError {
    /// The domain meaning of a backend failure while `doing` something to a
    /// `subject`.
    pub fn from_backend(err: BackendError, subject: Subject, doing: String) -> Self {
        match err {
            BackendError::AlreadyExists => PoolError::AlreadyExists(subject),
            // Contexts have no "invalid" path upstream; keep the text anyway.
            BackendError::Invalid(_) => PoolError::Invalid(err.to_string()),
            BackendError::Internal { .. } => PoolError::Internal { doing, source: err },
        }
    }
}

/// Result of pool service calls.
pub type PoolResult<T> = Result<T, PoolError>;
