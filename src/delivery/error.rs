//! What the delivery service answers when a call fails, in domain terms.
//! The API turns each variant into a status, an error code and a message in
//! one place (`crate::api::error`); nothing here knows HTTP.
//!
//! A failure inside a sandbox stays typed ([`SandboxFailure`]) from where it
//! happens to the answer: its one-line text (`disk_full: no space …`) is
//! only ever rendered from it, never parsed back.

use std::time::Duration;

use super::view::SandboxOutcome;

/// Why a delivery or release failed in one sandbox: what a client sees in
/// that sandbox's outcome. Each variant renders one line, `<code>: <reason>`
/// (the wire's `error` of the outcome); causes that may name hosts or paths
/// are logged where they happen and never carried here.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SandboxFailure {
    /// The script refused or failed: its `ERROR <code> <reason>` line. The
    /// code is the sandbox's (any `[a-z_]+`, see `ERROR_CODES`), so a newer
    /// script's codes pass through an older gateway.
    #[error("{code}: {reason}")]
    Script {
        /// e.g. `disk_full`.
        code: String,
        /// Its one-line reason.
        reason: String,
    },
    /// The sandbox (or its pod) does not exist (any more).
    #[error("sandbox {0} not found")]
    NotFound(String),
    /// The sandbox is suspended.
    #[error("sandbox_suspended: sandbox {0} is suspended; resume its pool first")]
    Suspended(String),
    /// The sandbox (a pool member) is not ready.
    #[error("sandbox_not_ready: the sandbox is not ready")]
    NotReady,
    /// The exec could not be run or observed (the cause is logged).
    #[error("exec_failed: could not run the delivery script in the sandbox")]
    ExecFailed,
    /// The script broke the protocol (or died without a final line).
    #[error("protocol_error: {0}")]
    Protocol(String),
    /// The gateway could not read the bundle (the cause is logged).
    #[error("internal_error: the bundle could not be read")]
    BundleUnreadable,
    /// The object storage holding the bundle is unavailable.
    #[error("storage_unavailable: {0}")]
    StorageUnavailable(String),
    /// The object storage holds other bytes (or none) for the bundle.
    #[error("bundle_corrupt: {0}")]
    BundleCorrupt(String),
    /// Writing the bundle failed and the script said nothing about it.
    #[error("transfer_failed: the sandbox stopped reading the bundle")]
    TransferFailed,
    /// The exec did not finish in time.
    #[error("timeout: the {what} did not finish within {}", humantime::format_duration(*limit))]
    TimedOut {
        /// `delivery` or `release`.
        what: &'static str,
        /// The limit.
        limit: Duration,
    },
    /// The run's record cannot be rendered into a release script.
    #[error("internal_error: the run's record is unusable")]
    RecordUnusable,
}

/// Why a delivery or release failed as a whole. Renders the answer's
/// one-line message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DeliveryFailure {
    /// At least one sandbox failed: the first, why, and how many of how
    /// many failed.
    Sandboxes {
        /// The first failed sandbox.
        sandbox: String,
        /// Why it failed.
        failure: SandboxFailure,
        /// How many sandboxes failed.
        failed: usize,
        /// How many sandboxes were tried.
        of: usize,
    },
    /// The target pool has no ready sandbox; nothing was tried.
    NoReadySandbox {
        /// The pool.
        pool: String,
    },
}

impl std::fmt::Display for DeliveryFailure {
    /// The first failure's line, prefixed with its sandbox and the count
    /// when there were several sandboxes.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            DeliveryFailure::Sandboxes { failure, of: 1, .. } => failure.fmt(f),
            DeliveryFailure::Sandboxes {
                sandbox,
                failure,
                failed,
                of,
            } => write!(f, "{failed} of {of} sandboxes failed; {sandbox}: {failure}"),
            DeliveryFailure::NoReadySandbox { pool } => {
                write!(f, "sandbox pool {pool:?} has no ready sandbox")
            }
        }
    }
}

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
    /// At least one sandbox failed. `failure` names the first one and why;
    /// `outcomes` has every sandbox's result (successes stay registered
    /// under the run).
    #[error("{failure}")]
    Failed {
        /// The first failure, and the count.
        failure: DeliveryFailure,
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn failures_render_the_wire_lines() {
        let script = SandboxFailure::Script {
            code: "disk_full".into(),
            reason: "no space".into(),
        };
        assert_eq!(script.to_string(), "disk_full: no space");
        assert_eq!(
            SandboxFailure::NotFound("s".into()).to_string(),
            "sandbox s not found"
        );
        let timed_out = SandboxFailure::TimedOut {
            what: "delivery",
            limit: Duration::from_secs(90),
        };
        assert_eq!(
            timed_out.to_string(),
            "timeout: the delivery did not finish within 1m 30s"
        );
        let failed = |of| DeliveryFailure::Sandboxes {
            sandbox: "a".into(),
            failure: script.clone(),
            failed: 1,
            of,
        };
        assert_eq!(failed(1).to_string(), "disk_full: no space");
        assert_eq!(
            failed(3).to_string(),
            "1 of 3 sandboxes failed; a: disk_full: no space"
        );
        let pool = DeliveryFailure::NoReadySandbox { pool: "p".into() };
        assert_eq!(pool.to_string(), "sandbox pool \"p\" has no ready sandbox");
    }
}
