//! What the delivery service answers when a call fails, in domain terms.
//! The API turns each variant into a status, an error code and a message in
//! one place (`crate::api::error`); nothing here knows HTTP.

use super::view::SandboxOutcome;

/// A delivery, release or listing failure.
#[derive(Debug, thiserror::Error)]
pub enum DeliveryError {
    /// A value breaks its rule; nothing was executed.
    #[error("{0}")]
    InvalidRequest(String),
    /// No such workload for this owner (also: another owner's).
    #[error("workload {0:?} not found")]
    WorkloadNotFound(String),
    /// No such sandbox this owner may target (also: another owner's).
    #[error("sandbox {0:?} not found")]
    SandboxNotFound(String),
    /// No such pool for this owner (also: another owner's).
    #[error("sandbox pool {0:?} not found")]
    PoolNotFound(String),
    /// The target sandbox (or pool) is suspended: it runs no pod until the
    /// pool is resumed. The text says which.
    #[error("{0}")]
    SandboxSuspended(String),
    /// No such run for this owner and workload.
    #[error("run {0:?} not found")]
    RunNotFound(String),
    /// The workload has no active revision.
    #[error("{0}")]
    WorkloadNotReady(String),
    /// The run id is registered with another revision.
    #[error("run {run:?} is registered with revision {revision}; release it first or use another run id")]
    RunConflict {
        /// The run id.
        run: String,
        /// The revision it holds.
        revision: String,
    },
    /// At least one sandbox failed. `reason` is the first failure's one-line
    /// reason; `outcomes` has every sandbox's result (successes stay
    /// registered under the run).
    #[error("{reason}")]
    Failed {
        /// One line: why (the first failed sandbox, named for pools).
        reason: String,
        /// Every sandbox's outcome, in target order.
        outcomes: Vec<SandboxOutcome>,
    },
    /// The metadata database (run registry, workloads) cannot be reached
    /// for now; logged, the client is told to retry.
    #[error("{0}")]
    StoreUnavailable(String),
    /// A store, bundle or task failure; logged, answered generically.
    #[error("{0}")]
    Internal(String),
}

impl From<crate::store::StoreError> for DeliveryError {
    fn from(e: crate::store::StoreError) -> Self {
        match e {
            crate::store::StoreError::Unavailable(_) => {
                DeliveryError::StoreUnavailable(format!("run registry: {e}"))
            }
            _ => DeliveryError::Internal(format!("run registry: {e}")),
        }
    }
}
