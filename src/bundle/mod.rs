//! Streaming inspection of gzip-compressed tar bundles, the canonical
//! archive, and revision digests. Knows nothing about HTTP.
//!
//! Every upload is hostile input. [`canonicalize`] validates it while
//! streaming (limits in [`Limits`], one [`BundleError`] variant per rule)
//! and re-emits the accepted tree as the *canonical archive*: a
//! deterministic tar whose sha256 is the **revision**, gzip-compressed into
//! the stored bundle whose sha256 is the **bundleDigest**. [`inspect`]
//! validates and computes the revision only; [`pack_dir`] builds the same
//! canonical bundle from a directory on disk.

mod budget;
mod canonical;
mod context_layout;
mod error;
mod limits;
mod pack;
mod path;
mod reader;
mod report;
mod spool;
mod tree;

pub use budget::TempBudget;
pub use canonical::{canonicalize, canonicalize_async, inspect};
pub use error::{BundleError, DeviceKind, LinkKind};
pub use limits::{CanonicalOptions, Limits};
pub use pack::pack_dir;
pub use report::{Inspection, Report};
