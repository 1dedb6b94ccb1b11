//! The workload service: lifecycle, states, names, quota, upload grants,
//! revisions, downloads and start-up recovery.
//!
//! States: `awaiting_upload → ready`; `deleting → deleted` (a deleted
//! workload is gone: reads answer 404 and the name is free again). `failed`
//! marks a workload whose bundle start-up recovery found missing.
//!
//! Every upload goes through the bundle engine into a temp blob; the blob is
//! made durable before the metadata that names it commits, and blobs no
//! record names are collected under one lock so a concurrent upload of the
//! same bytes is never collected between its rename and its commit.
//!
//! One concern per file: [`service`] holds the type and its CRUD, `grants`
//! who may upload, [`contexts`] the trusted (Moca) Contexts mapped onto
//! workloads, `admission` how many uploads run at once, `upload` the
//! upload path, `recovery` blob collection and
//! start-up recovery.

mod admission;
pub mod contexts;
mod error;
mod grants;
mod metrics;
pub mod names;
mod recovery;
mod service;
mod upload;
mod view;

pub use admission::{UploadLimits, MAX_CONCURRENT_UPLOADS, UPLOAD_RETRY_AFTER_SECS};
pub use error::WorkloadError;
pub use grants::UploadTicket;
pub use metrics::WorkloadMetrics;
pub use names::{Revision, WorkloadName};
pub use recovery::RecoveryReport;
pub use service::{
    ActiveBundle, BundleSource, CreateWorkload, WorkloadService, WorkloadSettings,
    DEFAULT_BLOB_GC_GRACE, DEFAULT_BLOB_LOCAL_BYTES, DEFAULT_UPLOAD_TEMP_BYTES,
};
pub use upload::BodyStream;
pub use view::{rfc3339, RevisionView, UploadGrantView, WorkloadView, BUNDLE_MEDIA_TYPE};

#[cfg(test)]
mod tests;
