//! The workload service's settings (what the store holds and where is
//! [`crate::store::StorageSettings`]).

use std::time::Duration;

use super::admission::UploadLimits;
use crate::bundle::Limits;

/// Tunables of the workload service.
#[derive(Debug, Clone)]
pub struct WorkloadSettings {
    /// Most workloads per owner.
    pub quota: usize,
    /// Lifetime of an upload grant.
    pub grant_ttl: Duration,
    /// Bundle limits.
    pub limits: Limits,
    /// How many uploads run at once.
    pub uploads: UploadLimits,
    /// Temporary disk all running uploads may hold together, in bytes.
    pub upload_temp_bytes: u64,
    /// Deflate threads of an upload's canonical gzip (`0`: one per core).
    pub deflate_threads: usize,
}

/// Default of [`WorkloadSettings::upload_temp_bytes`]: 4 GiB.
pub const DEFAULT_UPLOAD_TEMP_BYTES: u64 = 4 << 30;

impl Default for WorkloadSettings {
    fn default() -> Self {
        Self {
            quota: 20,
            grant_ttl: Duration::from_secs(300),
            limits: Limits::default(),
            uploads: UploadLimits::default(),
            upload_temp_bytes: DEFAULT_UPLOAD_TEMP_BYTES,
            deflate_threads: 0,
        }
    }
}
