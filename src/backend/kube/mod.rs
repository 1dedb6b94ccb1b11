//! The `kube` backend: pools and named contexts as agent-sandbox `Sandbox`,
//! `SandboxClaim` and `PersistentVolumeClaim` objects in a Kubernetes cluster.

pub mod crd;
pub mod objects;
pub mod settings;
pub mod status;
