//! The `kube` backend: pools and named contexts as agent-sandbox `Sandbox`,
//! `SandboxClaim` and `PersistentVolumeClaim` objects in a Kubernetes cluster.
//!
//! - [`crd`]: typed `v1beta1` custom resources;
//! - [`objects`]: names, labels and manifests (pure builders);
//! - [`status`]: pool status from objects (pure);
//! - [`watch`]: reflector caches and change notifications, and
//!   `watch_health`: whether their watches run (for readiness);
//! - [`backend`]: [`KubeBackend`], the [`crate::pool::SandboxBackend`];
//!   `create`, `lifecycle` and `volumes` add pool creation, suspend and
//!   resume, and named contexts to it; `abandoned` deletes what a create
//!   left when its process died half-way (for the reaper); `binding` makes
//!   a create wait for its volumes to bind before their sandboxes;
//!   `delete` removes a whole pool.

mod abandoned;
pub mod backend;
mod binding;
pub mod crd;
mod create;
mod delete;
pub mod exec;
mod lifecycle;
pub mod objects;
pub mod settings;
pub mod status;
mod volumes;
pub mod watch;
mod watch_health;

#[cfg(test)]
mod tests;

pub use backend::{KubeBackend, KubeBackendError};
pub use settings::KubeSettings;
