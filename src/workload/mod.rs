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
//! who may upload, [`trusted`] the trusted (Moca) Contexts mapped onto
//! workloads, `admission` how many uploads run at once, `upload` the
//! upload path, `recovery` blob collection and
//! start-up recovery, `state` the shared state they all work on. The
//! storage itself (which database, which blob tiers) is
//! [`crate::store::Storage`]'s business.

mod admission;
mod error;
mod grants;
mod metrics;
pub mod names;
pub mod oci;
mod recovery;
mod service;
mod settings;
mod state;
pub mod trusted;
mod upload;
mod view;

pub use admission::{UploadLimits, UploadTicket, MAX_CONCURRENT_UPLOADS, UPLOAD_RETRY_AFTER_SECS};
pub use error::WorkloadError;
pub use metrics::WorkloadMetrics;
pub use names::{Revision, WorkloadName};
pub use recovery::RecoveryReport;
pub use service::{ActiveBundle, BundleSource, CreateWorkload, WorkloadService};
pub use settings::{WorkloadSettings, DEFAULT_UPLOAD_TEMP_BYTES};
pub use upload::BodyStream;
pub use view::{rfc3339, RevisionView, UploadGrantView, WorkloadView, BUNDLE_MEDIA_TYPE};

#[cfg(test)]
mod tests;
