//! Request bodies decoded the way the upstream Go service decodes them, and
//! JSON answers written the way it writes them.
//!
//! Upstream uses `encoding/json`'s `Decoder` with unknown fields disallowed
//! behind a 1 MiB `http.MaxBytesReader`: only the first JSON value is read
//! (trailing data ignored), keys match case-insensitively, `null` leaves a
//! field at its zero value, and every error has Go's wording (`json:
//! unknown field "x"`, `invalid character 'x' looking for beginning of
//! value`, `unexpected EOF`, type errors naming Go's types). Clients see
//! those messages, so they are reproduced byte for byte:
//! [`scan`] finds the first value with Go's syntax errors, [`decode`] maps
//! it onto a struct description with Go's type and unknown-field errors,
//! [`encode`] writes answers like Go's encoder.

pub mod decode;
pub mod encode;
mod quote;
pub mod scan;
#[cfg(test)]
mod tests;

pub use decode::{Decoded, GoField, GoKind, GoStruct};

/// Largest body read, as upstream's `http.MaxBytesReader`.
pub const MAX_BODY: usize = 1 << 20;

/// Go's `MaxBytesError` text.
const TOO_LARGE: &str = "http: request body too large";

/// Decodes the first JSON value of `buf` into `schema`; `complete` is
/// false when the body went on past `buf` (the limit). `Err` is Go's
/// message.
pub fn decode_bytes(
    buf: &[u8],
    complete: bool,
    schema: &'static GoStruct,
) -> Result<Decoded, String> {
    match scan::first_value(buf, complete) {
        Ok(Some(end)) => decode::decode(&buf[..end], schema),
        // The first value did not end within the limit.
        Ok(None) => Err(TOO_LARGE.to_owned()),
        Err(e) => Err(e.message().to_owned()),
    }
}
