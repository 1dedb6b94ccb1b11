//! The client-connection budget, planned from the open-file limit.
//!
//! Every client connection holds a file descriptor, and so does everything
//! else the service opens; a connection cap the limit cannot hold makes
//! `accept` (and the store, and uploads) fail with `EMFILE` instead of the
//! cap answering. The plan:
//!
//! ```text
//! files       = mappings + uploads × 4 + blocking threads + 32 + refusals
//! connections = limit − open at start − files
//! ```
//!
//! * *open at start*: the descriptors already open once the state is built
//!   and the listeners bound (store, listeners, runtime, logs), counted in
//!   `/proc/self/fd`;
//! * *mappings*: cached bundles mapped for `sendfile(2)`, each holding its
//!   blob's descriptor: [`MAX_MAPPINGS`], or fewer when `--cache-bytes`
//!   cannot hold that many mappable bundles;
//! * *uploads × 4*: each running upload's spool, canonical gzip, stored
//!   blob and the directory synced after it;
//! * *blocking threads*: each may hold one file open (store reads, blob
//!   loads);
//! * *32*: outbound clients (Kubernetes, object storage, PostgreSQL);
//! * *refusals*: connections being answered `503` ([`MAX_PENDING_REFUSALS`]).
//!
//! When the limit cannot hold the files beside a quarter of what is left
//! after the start, connections still get that quarter: the files' reserve
//! is then an estimate of the worst case that the service will rarely
//! reach, and the drain (see `drain`) frees idle connections when `accept`
//! meets `EMFILE` anyway.
//!
//! [`MAX_MAPPINGS`]: crate::zerocopy::MAX_MAPPINGS
//! [`MAX_PENDING_REFUSALS`]: super::conn::MAX_PENDING_REFUSALS

use crate::config::ServeConfig;
use crate::zerocopy::{MAX_MAPPINGS, MIN_MAPPED_BYTES};

/// Descriptors one running upload holds at most.
const FDS_PER_UPLOAD: u64 = 4;

/// Descriptors kept for outbound clients' connections.
const OUTBOUND_FDS: u64 = 32;

/// Descriptors assumed open at start where `/proc/self/fd` cannot be read.
const DEFAULT_OPEN_AT_START: u64 = 32;

/// The share of the descriptors left after the start that connections get
/// at least, whatever the files' reserve (one in this many).
const MIN_CONNECTION_SHARE: u64 = 4;

/// What the service opens besides client connections, from its settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct FileDemand {
    /// `--cache-bytes`.
    pub(super) cache_bytes: u64,
    /// `--upload-max-concurrent`.
    pub(super) uploads: u64,
    /// `--max-blocking-threads`.
    pub(super) blocking_threads: u64,
    /// Connections being answered `503` at once.
    pub(super) refusals: u64,
}

impl FileDemand {
    /// The demand of `config`.
    pub(super) fn of(config: &ServeConfig) -> Self {
        Self {
            cache_bytes: config.cache_bytes,
            uploads: u64::from(config.upload_max_concurrent),
            blocking_threads: u64::from(config.max_blocking_threads),
            refusals: super::conn::MAX_PENDING_REFUSALS as u64,
        }
    }

    /// Descriptors kept for files and everything but client connections
    /// and what is open at start.
    pub(super) fn reserve(&self) -> u64 {
        let mappings = (MAX_MAPPINGS as u64).min(self.cache_bytes / MIN_MAPPED_BYTES);
        mappings
            .saturating_add(self.uploads.saturating_mul(FDS_PER_UPLOAD))
            .saturating_add(self.blocking_threads)
            .saturating_add(OUTBOUND_FDS)
            .saturating_add(self.refusals)
    }
}

/// The planned split of the open-file limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct FdPlan {
    /// The soft open-file limit.
    pub(super) limit: u64,
    /// Descriptors open at start.
    pub(super) open_at_start: u64,
    /// Descriptors kept for files ([`FileDemand::reserve`]), or what is
    /// left of them beside the connections' minimum share.
    pub(super) files: u64,
    /// Client connections the limit holds.
    pub(super) connections: u64,
    /// Whether `files` is less than the demand's full reserve.
    pub(super) squeezed: bool,
}

impl FdPlan {
    /// Splits `limit` between what is open at start, the files of `demand`
    /// and client connections (see the module docs).
    pub(super) fn new(limit: u64, open_at_start: u64, demand: &FileDemand) -> Self {
        let after_start = limit.saturating_sub(open_at_start);
        let reserve = demand.reserve();
        let share = (after_start / MIN_CONNECTION_SHARE).max(1);
        let (connections, squeezed) = match after_start.checked_sub(reserve) {
            Some(left) if left >= share => (left, false),
            _ => (share, true),
        };
        Self {
            limit,
            open_at_start,
            files: after_start.saturating_sub(connections),
            connections,
            squeezed,
        }
    }
}

/// Raises the soft open-file limit to the hard one (as Go's runtime does)
/// and returns `max_connections` lowered to what the limit holds beside
/// the files of `demand`, so that a flood meets the connection cap, never
/// a failing `accept` or a store that cannot open a file.
pub(super) fn fit_connections(max_connections: usize, demand: &FileDemand) -> usize {
    let Some(limit) = raise_open_file_limit() else {
        return max_connections;
    };
    let plan = FdPlan::new(limit, open_fds().unwrap_or(DEFAULT_OPEN_AT_START), demand);
    if plan.squeezed {
        tracing::warn!(
            open_file_limit = plan.limit,
            open_at_start = plan.open_at_start,
            files_wanted = demand.reserve(),
            files_kept = plan.files,
            connections = plan.connections,
            "the open-file limit cannot hold the files' reserve beside client connections; \
             idle connections are closed when descriptors run short"
        );
    }
    let room = usize::try_from(plan.connections).unwrap_or(usize::MAX);
    if max_connections > room {
        tracing::warn!(
            max_connections,
            lowered_to = room,
            open_file_limit = plan.limit,
            open_at_start = plan.open_at_start,
            files = plan.files,
            "--max-connections exceeds what the open-file limit holds; lowered"
        );
        return room;
    }
    max_connections
}

/// Raises the soft open-file limit to the hard one; the soft limit now, or
/// `None` when unlimited.
fn raise_open_file_limit() -> Option<u64> {
    use rustix::process::{getrlimit, setrlimit, Resource, Rlimit};
    let limit = getrlimit(Resource::Nofile);
    if let (Some(current), Some(hard)) = (limit.current, limit.maximum) {
        if hard > current {
            let raised = Rlimit {
                current: Some(hard),
                maximum: Some(hard),
            };
            match setrlimit(Resource::Nofile, raised) {
                Ok(()) => return Some(hard),
                Err(e) => tracing::warn!(error = %e, "cannot raise the open-file limit"),
            }
        }
    }
    limit.current
}

/// Descriptors open in this process now.
fn open_fds() -> Option<u64> {
    // The directory's own descriptor is among the entries.
    let entries = std::fs::read_dir("/proc/self/fd").ok()?;
    Some((entries.count() as u64).saturating_sub(1))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn demand() -> FileDemand {
        FileDemand {
            cache_bytes: 512 * 1024 * 1024,
            uploads: 16,
            blocking_threads: 64,
            refusals: 64,
        }
    }

    #[test]
    fn the_reserve_adds_up_the_files_of_the_settings() {
        // 128 mappings + 16 × 4 + 64 + 32 + 64.
        assert_eq!(demand().reserve(), 352);
        // A small cache holds fewer mappable bundles.
        let small = FileDemand {
            cache_bytes: 4 * MIN_MAPPED_BYTES,
            ..demand()
        };
        assert_eq!(small.reserve(), 4 + 64 + 64 + 32 + 64);
    }

    #[test]
    fn connections_get_what_the_files_leave() {
        let plan = FdPlan::new(4096, 20, &demand());
        assert_eq!(plan.connections, 4096 - 20 - 352);
        assert_eq!(plan.files, 352);
        assert!(!plan.squeezed);
    }

    #[test]
    fn a_small_limit_keeps_a_quarter_for_connections() {
        // 256 − 20 = 236 cannot hold the 352 files: a quarter of it.
        let plan = FdPlan::new(256, 20, &demand());
        assert_eq!(plan.connections, 59);
        assert_eq!(plan.files, 236 - 59);
        assert!(plan.squeezed);
        // 400 − 20 − 352 = 28 is under a quarter of 380.
        let plan = FdPlan::new(400, 20, &demand());
        assert_eq!(plan.connections, 95);
        assert!(plan.squeezed);
        // 600 − 20 − 352 = 228 is over a quarter of 580.
        let plan = FdPlan::new(600, 20, &demand());
        assert_eq!((plan.connections, plan.files), (228, 352));
        assert!(!plan.squeezed);
        // A limit below what is open at start still admits one.
        assert_eq!(FdPlan::new(10, 20, &demand()).connections, 1);
    }

    #[test]
    fn the_cap_fits_the_open_file_limit() {
        assert_eq!(fit_connections(16, &demand()), 16);
        let fitted = fit_connections(usize::MAX, &demand());
        match rustix::process::getrlimit(rustix::process::Resource::Nofile).current {
            Some(soft) => {
                assert!((fitted as u64) < soft, "{fitted} connections, limit {soft}");
                assert!(fitted as u64 >= (soft / 8).max(1));
            }
            None => assert_eq!(fitted, usize::MAX),
        }
    }
}
