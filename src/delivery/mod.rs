//! Delivery of frozen workload revisions into running sandboxes over exec
//! (DESIGN §6).
//!
//! - [`port`]: [`SandboxExec`], the exec port the sandbox backends implement.

pub mod port;

pub use port::{ExecError, ExecSession, ExecTarget, SandboxExec};
