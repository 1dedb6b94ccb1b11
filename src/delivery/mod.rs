//! Delivery of frozen workload revisions into running sandboxes over exec
//! (DESIGN §6).
//!
//! - [`port`]: [`SandboxExec`], the exec port the sandbox backends implement;
//! - `script`: the in-sandbox POSIX `sh` scripts, their renderer and the
//!   parser of what they print (protocol and layout in its docs);
//! - [`service`]: [`DeliveryService`] — validation, targets (`targets`),
//!   single-flight per sandbox and revision (`flight`), the bundle bytes
//!   under the in-flight budget (`payload`), the exec protocol (`session`)
//!   and the run registry (`crate::store::RunStore`);
//! - [`error`], [`view`], [`metrics`]: failures, wire shapes, metrics.
//!
//! Nothing here knows HTTP or Kubernetes objects.

pub mod error;
mod flight;
pub mod metrics;
mod payload;
pub mod port;
mod script;
pub mod service;
mod session;
mod targets;
pub mod view;

pub use error::DeliveryError;
pub use metrics::DeliveryMetrics;
pub use port::{ExecError, ExecSession, ExecTarget, SandboxExec};
pub use script::{
    is_valid_root, is_valid_run_id, is_valid_scope, parse_line, render_deliver, render_release,
    DeliverRequest, LineError, ReleaseRequest, ScriptError, ScriptLine, Verify, DEFAULT_ROOT,
    ERROR_CODES,
};
pub use service::{
    DeliverInput, DeliveryDeps, DeliveryService, DeliverySettings, DeliveryTarget, SettingsError,
};
pub use view::{Delivered, FailedBody, RunList, RunPlace, RunView, SandboxOutcome};
