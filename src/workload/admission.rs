//! Admission of uploads: how many run at once in the whole service and per
//! owner, and one upload at a time per grant; and which workloads have an
//! upload running (a trusted freeze refuses those).
//!
//! An upload holds one thread of tokio's blocking pool while it reads its
//! body (and the bundle engine's threads while it runs). Admission caps both, so
//! stalled uploads can never take the threads that store calls and
//! downloads run on: the service-wide cap is at most
//! [`MAX_CONCURRENT_UPLOADS`], half of tokio's default blocking pool.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, MutexGuard};

use prometheus_client::metrics::gauge::Gauge;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use super::WorkloadError;

/// Who may upload, as established before the body is read.
#[derive(Debug, Clone)]
pub struct UploadTicket {
    pub(super) owner: String,
    pub(super) name: String,
    pub(super) uid: String,
    pub(super) grant_id: Option<String>,
}

/// Highest `--upload-max-concurrent`: half of tokio's default blocking
/// pool (512), leaving the rest to store calls and downloads.
pub const MAX_CONCURRENT_UPLOADS: u32 = 256;

/// Seconds a refused upload is told to wait (`Retry-After`).
pub const UPLOAD_RETRY_AFTER_SECS: u32 = 5;

/// How many uploads may run at once.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UploadLimits {
    /// In the whole service (1 to [`MAX_CONCURRENT_UPLOADS`]).
    pub max_concurrent: u32,
    /// Per owner (grant uploads count for the workload's owner).
    pub max_per_owner: u32,
}

impl Default for UploadLimits {
    fn default() -> Self {
        Self {
            max_concurrent: 16,
            max_per_owner: 4,
        }
    }
}

/// Counts running uploads; hands out [`UploadPermit`]s.
#[derive(Debug)]
pub(super) struct UploadGate {
    limits: UploadLimits,
    global: Arc<Semaphore>,
    running: Mutex<Running>,
    gauge: Gauge,
}

#[derive(Debug, Default)]
struct Running {
    per_owner: HashMap<String, u32>,
    grants: HashSet<String>,
    /// Running uploads per workload incarnation (uid).
    workloads: HashMap<String, u32>,
}

/// An admitted upload. Dropping it (when the upload's thread is done, not
/// merely when the request is dropped) frees its places.
#[derive(Debug)]
pub(super) struct UploadPermit {
    gate: Arc<UploadGate>,
    owner: String,
    uid: String,
    grant: Option<String>,
    _global: OwnedSemaphorePermit,
}

impl UploadGate {
    /// A gate enforcing `limits` (clamped to at least 1 and at most
    /// [`MAX_CONCURRENT_UPLOADS`]) that reports running uploads on `gauge`.
    pub(super) fn new(limits: UploadLimits, gauge: Gauge) -> Self {
        let limits = UploadLimits {
            max_concurrent: limits.max_concurrent.clamp(1, MAX_CONCURRENT_UPLOADS),
            max_per_owner: limits.max_per_owner.max(1),
        };
        Self {
            limits,
            global: Arc::new(Semaphore::new(limits.max_concurrent as usize)),
            running: Mutex::new(Running::default()),
            gauge,
        }
    }

    fn running(&self) -> MutexGuard<'_, Running> {
        // The counts stay consistent even if a holder panicked.
        self.running
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Admits the upload of `ticket`, or says why not: its grant is in use
    /// by another upload, its owner or the service is at the limit.
    pub(super) fn admit(
        self: &Arc<Self>,
        ticket: &UploadTicket,
    ) -> Result<UploadPermit, WorkloadError> {
        let mut running = self.running();
        if let Some(grant) = &ticket.grant_id {
            if running.grants.contains(grant) {
                return Err(WorkloadError::UploadInProgress);
            }
        }
        let mine = running.per_owner.get(&ticket.owner).copied().unwrap_or(0);
        if mine >= self.limits.max_per_owner {
            return Err(WorkloadError::TooManyUploads(format!(
                "the owner already has {mine} uploads in progress (the limit is {}); retry later",
                self.limits.max_per_owner
            )));
        }
        let global = self.global.clone().try_acquire_owned().map_err(|_| {
            WorkloadError::TooManyUploads(format!(
                "the service is processing its limit of {} uploads; retry later",
                self.limits.max_concurrent
            ))
        })?;
        *running.per_owner.entry(ticket.owner.clone()).or_default() += 1;
        *running.workloads.entry(ticket.uid.clone()).or_default() += 1;
        if let Some(grant) = &ticket.grant_id {
            running.grants.insert(grant.clone());
        }
        self.gauge.inc();
        Ok(UploadPermit {
            gate: self.clone(),
            owner: ticket.owner.clone(),
            uid: ticket.uid.clone(),
            grant: ticket.grant_id.clone(),
            _global: global,
        })
    }
}

impl UploadGate {
    /// Whether an upload to the workload incarnation `uid` is running.
    pub(super) fn is_uploading(&self, uid: &str) -> bool {
        self.running().workloads.contains_key(uid)
    }
}

impl Drop for UploadPermit {
    fn drop(&mut self) {
        let mut running = self.gate.running();
        if let Some(n) = running.workloads.get_mut(&self.uid) {
            *n -= 1;
            if *n == 0 {
                running.workloads.remove(&self.uid);
            }
        }
        if let Some(n) = running.per_owner.get_mut(&self.owner) {
            *n -= 1;
            if *n == 0 {
                running.per_owner.remove(&self.owner);
            }
        }
        if let Some(grant) = &self.grant {
            running.grants.remove(grant);
        }
        self.gate.gauge.dec();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ticket(owner: &str, grant: Option<&str>) -> UploadTicket {
        UploadTicket {
            owner: owner.into(),
            name: "w".into(),
            uid: "u".into(),
            grant_id: grant.map(Into::into),
        }
    }

    #[test]
    fn limits_per_owner_globally_and_per_grant() {
        let gauge = Gauge::default();
        let gate = Arc::new(UploadGate::new(
            UploadLimits {
                max_concurrent: 3,
                max_per_owner: 2,
            },
            gauge.clone(),
        ));
        let a1 = gate.admit(&ticket("a", Some("g1"))).unwrap();
        assert!(gate.is_uploading("u"));
        assert!(!gate.is_uploading("other"));
        let err = gate.admit(&ticket("a", Some("g1"))).unwrap_err();
        assert!(matches!(err, WorkloadError::UploadInProgress), "{err}");
        let a2 = gate.admit(&ticket("a", None)).unwrap();
        let err = gate.admit(&ticket("a", None)).unwrap_err();
        assert!(err.to_string().contains("owner already has 2"), "{err}");
        let b1 = gate.admit(&ticket("b", None)).unwrap();
        assert_eq!(gauge.get(), 3);
        let err = gate.admit(&ticket("c", None)).unwrap_err();
        assert!(err.to_string().contains("limit of 3 uploads"), "{err}");
        drop(a1);
        // The grant and both places are free again.
        let again = gate.admit(&ticket("a", Some("g1"))).unwrap();
        drop((again, a2, b1));
        assert!(gate.running().per_owner.is_empty());
        assert!(gate.running().grants.is_empty());
        assert!(!gate.is_uploading("u"));
        assert_eq!(gauge.get(), 0);
    }
}
