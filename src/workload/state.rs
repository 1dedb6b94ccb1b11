//! The shared state of the workload service and the small helpers every
//! file of `workload` uses. It sits below `service` and `recovery`, so
//! neither needs the other's internals.

use std::path::PathBuf;
use std::sync::Arc;

use rand::RngCore;
use sha2::{Digest, Sha256};

use super::admission::UploadGate;
use super::settings::WorkloadSettings;
use super::{WorkloadError, WorkloadMetrics};
use crate::bundle::TempBudget;
use crate::cache::BundleCache;
use crate::store::{Blobs, MetadataStore};

/// The shared state behind every clone; the other files of `workload` add
/// their methods to it.
#[derive(Debug)]
pub(super) struct Inner {
    pub(super) store: Arc<dyn MetadataStore>,
    /// The bundle bytes (local, or local copies of object storage); their
    /// collection lock orders persists and names against removals.
    pub(super) blobs: Blobs,
    pub(super) cache: Arc<BundleCache>,
    pub(super) settings: WorkloadSettings,
    pub(super) spool_dir: PathBuf,
    pub(super) metrics: WorkloadMetrics,
    /// Admits uploads.
    pub(super) uploads: Arc<UploadGate>,
    /// Temporary disk of running uploads.
    pub(super) temp_budget: TempBudget,
}

pub(super) use crate::clock::now_ms;

/// `N` bytes from the thread's CSPRNG.
pub(super) fn random_bytes<const N: usize>() -> [u8; N] {
    let mut b = [0u8; N];
    rand::rng().fill_bytes(&mut b);
    b
}

/// sha256 of `data` as 64 lowercase hex digits.
pub(super) fn sha256_hex(data: &[u8]) -> String {
    hex::encode(Sha256::digest(data))
}

/// Runs disk work on tokio's blocking pool.
pub(super) async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, WorkloadError> + Send + 'static,
) -> Result<T, WorkloadError> {
    // In the caller's span, so its log lines name the request.
    let span = tracing::Span::current();
    tokio::task::spawn_blocking(move || span.in_scope(f))
        .await
        .map_err(|e| WorkloadError::Internal(format!("blocking task failed: {e}")))?
}
