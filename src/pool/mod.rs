//! Sandbox pools and named contexts: the allocation model, upstream-exact
//! validation, and the service that owner-scopes every call before it
//! reaches a [`crate::backend::SandboxBackend`].

pub mod model;
pub mod names;
pub mod quantity;
pub mod service;
pub mod validate;
pub mod wire;

pub use model::{
    AccessMode, ContextPhase, ContextSpec, ContextStatus, ContextType, Member, PoolPhase, PoolSpec,
    PoolStatus, Strategy, WorkspaceView,
};
pub use service::PoolService;
