//! The decoders of HTTP request bodies, gathered in one place for the fuzz
//! targets (`fuzz/`): each is exactly what its handler runs.
//!
//! - pools and contexts: upstream's decoding rules ([`pool_create`],
//!   [`context_create`]) over the body read so far;
//! - workloads: [`parse_json`] into [`WorkloadCreateBody`] or
//!   [`ActivateBody`].

use super::json;
use crate::pool::validate::{CreateContextRequest, CreatePoolRequest};

pub use super::extract::parse_json;
pub use super::workloads::{ActivateBody, CreateBody as WorkloadCreateBody};

/// Decodes a create-pool body like upstream's `pool.CreateRequest`;
/// `complete` is false when the body went on past `buf`. `Err` is Go's
/// message, answered as `400 invalid_request`.
pub fn pool_create(buf: &[u8], complete: bool) -> Result<CreatePoolRequest, String> {
    json::decode_bytes(buf, complete, &super::pools::CREATE_REQUEST)
        .map(|body| super::pools::create_request(&body))
}

/// Decodes a create-context body like upstream's
/// `contextresource.CreateRequest`; see [`pool_create`].
pub fn context_create(buf: &[u8], complete: bool) -> Result<CreateContextRequest, String> {
    json::decode_bytes(buf, complete, &super::contexts::CREATE_REQUEST)
        .map(|body| super::contexts::create_request(&body))
}
