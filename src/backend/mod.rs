//! Sandbox backends of the allocation engine.

pub mod kube;
