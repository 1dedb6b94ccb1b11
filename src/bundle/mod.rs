//! Streaming inspection of gzip-compressed tar bundles, the canonical
//! archive, and revision digests. Knows nothing about HTTP.
//!
//! Every upload is hostile input. [`canonicalize`] validates it while
//! streaming (limits in [`Limits`], one [`BundleError`] variant per rule)
//! and re-emits the accepted tree as the *canonical archive*: a
//! deterministic tar whose sha256 is the **revision**. The stored bundle,
//! whose sha256 is the **bundleDigest**, is the upload itself when it
//! already inflates to exactly that tar, else its canonical gzip. [`inspect`]
//! validates and computes the revision only; [`pack_dir`] builds the same
//! canonical bundle from a directory on disk.

mod affinity;
mod budget;
mod canonical;
mod context_layout;
mod counters;
mod error;
mod inflate;
mod limits;
mod manifest;
mod pack;
mod path;
mod reader;
mod report;
mod spool;
mod threads;
mod tree;

pub use budget::TempBudget;
pub use canonical::{canonicalize, canonicalize_async, encoding, inspect, BundleOut, AS_UPLOADED};
pub use error::{BundleError, DeviceKind, LinkKind, BUNDLE_EXPECTED};
pub use limits::{CanonicalOptions, Limits};
pub use manifest::{manifest_of_bundle, ManifestError, TreeManifest};
pub use pack::pack_dir;
pub use report::{Inspection, Report};
#[doc(hidden)]
pub use threads::testing;

/// Chunk size for copies: large enough that per-call costs vanish. Here,
/// not in the canonical writer, because the spool and the context layout
/// copy with it too and sit below the writer.
pub(crate) const CHUNK: usize = 256 * 1024;

/// Incompressible bytes (xorshift), the same for a given length: test
/// input for the spool and the compressor.
#[cfg(test)]
pub(crate) fn noise(len: usize) -> Vec<u8> {
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 24) as u8
        })
        .collect()
}
