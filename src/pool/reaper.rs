//! The reaper: deletes pools whose `ttl` ran out, of every owner, and (on
//! `kube`) what a create left when the replica running it died half-way.
//!
//! Expiry is recorded on the pool's objects (and in the local backend's
//! records), never only in memory, so the reaper finds every expired pool by
//! listing: once at start (pools that expired while the service was down),
//! then at the next recorded expiry, when a pool with an expiry is created,
//! and at least every `rescan` (a pool created by another replica).
//! On `kube` the agent-sandbox controller also deletes the Sandboxes and
//! claims at their `shutdownTime`; the reaper removes the rest (a shared
//! workspace PVC) and covers the `local` backend.
//!
//! A create's window (`creating-until`) and its completion mark are on its
//! objects too, so the same listing finds abandoned creates: a mark still
//! pending after the window means the creating replica died; the reaper
//! wakes at the earliest window end it saw and deletes such a create. It
//! runs on every replica and at every start, so the other replica or the
//! next start cleans up (see `crate::sandbox::kube::abandoned`).

use std::sync::{Arc, Weak};
use std::time::Duration;

use k8s_openapi::jiff::Timestamp;

use super::service::PoolService;

/// Default longest pause between two scans.
pub const RESCAN_EVERY: Duration = Duration::from_secs(60);

/// Pause after a failed listing before the next try.
const RETRY_AFTER: Duration = Duration::from_secs(5);

/// Starts the reaper over `pools`; it stops when the service is dropped.
pub fn spawn_reaper(pools: &Arc<PoolService>, rescan: Duration) -> tokio::task::JoinHandle<()> {
    let service: Weak<PoolService> = Arc::downgrade(pools);
    let expiries = pools.expiries().clone();
    tokio::spawn(async move {
        loop {
            let Some(pools) = service.upgrade() else {
                return;
            };
            // Registered before the scan, so a pool created during it wakes
            // the next sleep at once.
            let woken = expiries.notified();
            tokio::pin!(woken);
            woken.as_mut().enable();
            let pause = match pools.reap(Timestamp::now()).await {
                Ok(next) => next.map_or(rescan, |at| until(at).min(rescan)),
                Err(e) => {
                    tracing::warn!(error = %e, "listing sandbox pools for the reaper failed");
                    RETRY_AFTER.min(rescan)
                }
            };
            // Holding no strong reference while asleep.
            drop(pools);
            tokio::select! {
                _ = tokio::time::sleep(pause) => {}
                _ = woken => {}
            }
        }
    })
}

/// How long until `at` (zero if it passed).
fn until(at: Timestamp) -> Duration {
    let left = at.duration_since(Timestamp::now());
    // Past instants give a negative duration: reap at once.
    Duration::try_from(left).unwrap_or(Duration::ZERO)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn waits_until_the_instant_and_not_for_the_past() {
        let soon = Timestamp::now()
            .checked_add(k8s_openapi::jiff::SignedDuration::from_secs(30))
            .unwrap();
        let left = until(soon);
        assert!(left <= Duration::from_secs(30) && left > Duration::from_secs(28));
        let past = Timestamp::now()
            .checked_sub(k8s_openapi::jiff::SignedDuration::from_secs(30))
            .unwrap();
        assert_eq!(until(past), Duration::ZERO);
    }
}
