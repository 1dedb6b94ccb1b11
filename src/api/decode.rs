//! The decoders of HTTP request bodies, gathered in one place for the fuzz
//! targets (`fuzz/`): each is exactly what its handler runs.
//!
//! - pools and contexts: [`first_value`] of the body, then
//!   [`pool_create`] / [`context_create`] (upstream's decoding rules);
//! - workloads: [`parse_json`] into [`WorkloadCreateBody`] or
//!   [`ActivateBody`].

pub use super::contexts::decode_create as context_create;
pub use super::extract::parse_json;
pub use super::json::first_value;
pub use super::pools::decode_create as pool_create;
pub use super::workloads::{ActivateBody, CreateBody as WorkloadCreateBody};
