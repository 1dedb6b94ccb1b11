//! Sandbox pools and named contexts: the allocation model, upstream-exact
//! validation, and the service that owner-scopes every call before it
//! reaches the [`SandboxBackend`] port.
//!
//! - [`model`]: specs and statuses; [`validate`]: requests → specs;
//! - [`names`]: object names and labels every backend uses;
//! - [`port`]: [`SandboxBackend`] and [`BackendError`], implemented by
//!   `crate::sandbox`;
//! - [`metrics`]: pools by phase and stuck provisioning, sampled;
//! - [`selector`]: equality-based label selectors ([`LabelSelector`]);
//! - [`service`]: [`PoolService`] (with per-owner quotas, `quota`);
//!   [`error`]: its [`PoolError`];
//! - [`reaper`]: deletes pools whose `ttl` ran out (also after a restart)
//!   and creates abandoned half-way by a replica that died;
//! - [`view`]: the JSON shapes on the wire.

pub mod error;
pub mod metrics;
pub mod model;
pub mod names;
pub mod port;
pub mod quantity;
mod quota;
pub mod reaper;
pub mod selector;
pub mod service;
pub mod validate;
pub mod view;

pub use error::{PoolError, PoolResult, Subject};
pub use model::{
    AccessMode, ContextVolumePhase, ContextVolumeSpec, ContextVolumeStatus, ContextVolumeType,
    Member, PoolPhase, PoolSpec, PoolStatus, Strategy, WorkspaceView,
};
pub use port::{BackendError, SandboxBackend};
pub use selector::LabelSelector;

pub use service::{PoolQuotas, PoolService};
