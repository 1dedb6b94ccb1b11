//! The decoders of HTTP request bodies, gathered in one place for the fuzz
//! targets (`fuzz/`): each is exactly what its handler runs.
//!
//! - pools and contexts: upstream's decoding rules ([`pool_create`],
//!   [`context_create`], which the trusted create shares, and
//!   [`context_freeze`]) over the body read so far;
//! - workloads: [`parse_json`] into [`WorkloadCreateBody`] or
//!   [`ActivateBody`].

use super::json;
use crate::pool::validate::{CreateContextVolumeRequest, CreatePoolRequest};

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
pub fn context_create(buf: &[u8], complete: bool) -> Result<CreateContextVolumeRequest, String> {
    json::decode_bytes(buf, complete, &super::volumes::CREATE_REQUEST)
        .map(|body| super::volumes::create_request(&body))
}

/// Decodes a trusted freeze body like upstream's `freezeContextRequest`
/// into its `revision`; see [`pool_create`].
pub fn context_freeze(buf: &[u8], complete: bool) -> Result<String, String> {
    json::decode_bytes(buf, complete, &super::trusted::FREEZE_REQUEST)
        .map(|body| body.string("revision"))
}
