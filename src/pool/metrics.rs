//! Prometheus metrics of sandbox pools, sampled from the backend every few
//! seconds (every owner's pools): how many are in each phase, and how long
//! the oldest pool still provisioning has been so, which is what an
//! operator alerts on when sandboxes never become ready.

use std::collections::HashMap;
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use std::sync::atomic::AtomicU64;

use super::model::{PoolPhase, PoolStatus};
use super::service::PoolService;

/// How often the sampler lists the pools.
pub const SAMPLE_EVERY: Duration = Duration::from_secs(15);

/// Label of the per-phase gauge.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PhaseLabels {
    /// `provisioning`, `ready` or `failed`.
    pub phase: String,
}

/// The pool metrics. Cheap to clone (shared handles).
#[derive(Debug, Clone, Default)]
pub struct PoolMetrics {
    pools: Family<PhaseLabels, Gauge>,
    provisioning_max: Gauge<f64, AtomicU64>,
    sample_errors: Counter,
}

impl PoolMetrics {
    /// Registers every metric on `registry`.
    pub fn register(&self, registry: &mut Registry) {
        registry.register(
            "pools",
            "Sandbox pools of every owner by phase (sampled)",
            self.pools.clone(),
        );
        registry.register(
            "pool_provisioning_seconds_max",
            "How long the oldest pool still provisioning has been so, as this process saw it (0: none)",
            self.provisioning_max.clone(),
        );
        registry.register(
            "pool_sample_errors",
            "Failed listings of the pools by the metrics sampler (backend unreachable)",
            self.sample_errors.clone(),
        );
    }
}

/// Tracks since when each pool has been provisioning, between samples.
#[derive(Debug, Default)]
struct Sampler {
    metrics: PoolMetrics,
    provisioning_since: HashMap<String, Instant>,
}

impl Sampler {
    fn record(&mut self, pools: &[PoolStatus], now: Instant) {
        for phase in PoolPhase::ALL {
            let count = pools.iter().filter(|p| p.phase == phase).count();
            self.metrics
                .pools
                .get_or_create(&PhaseLabels {
                    phase: phase.as_str().to_owned(),
                })
                .set(i64::try_from(count).unwrap_or(i64::MAX));
        }
        let provisioning: HashMap<&str, ()> = pools
            .iter()
            .filter(|p| p.phase == PoolPhase::Provisioning)
            .map(|p| (p.name.as_str(), ()))
            .collect();
        self.provisioning_since
            .retain(|name, _| provisioning.contains_key(name.as_str()));
        for name in provisioning.keys() {
            self.provisioning_since
                .entry((*name).to_owned())
                .or_insert(now);
        }
        let oldest = self
            .provisioning_since
            .values()
            .map(|since| now.saturating_duration_since(*since))
            .max()
            .unwrap_or_default();
        self.metrics.provisioning_max.set(oldest.as_secs_f64());
    }
}

/// Samples `pools` every `every` until the service is dropped (the task
/// holds it weakly, so it ends with the server).
pub fn spawn_sampler(
    pools: &Arc<PoolService>,
    metrics: PoolMetrics,
    every: Duration,
) -> tokio::task::JoinHandle<()> {
    let service: Weak<PoolService> = Arc::downgrade(pools);
    let mut sampler = Sampler {
        metrics,
        provisioning_since: HashMap::new(),
    };
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            let Some(service) = service.upgrade() else {
                return;
            };
            match service.list_all().await {
                Ok(pools) => sampler.record(&pools, Instant::now()),
                Err(e) => {
                    sampler.metrics.sample_errors.inc();
                    tracing::debug!(error = %e, "sampling pools for metrics");
                }
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pool::model::{Strategy, WorkspaceView};

    fn pool(name: &str, phase: PoolPhase) -> PoolStatus {
        PoolStatus {
            name: name.to_owned(),
            replicas: 1,
            strategy: Strategy::Dedicated {
                size: "1Gi".to_owned(),
                storage_class: None,
            },
            workspace: WorkspaceView::default(),
            phase,
            ready_replicas: 0,
            reason: None,
            message: None,
            members: Vec::new(),
            owner_scope: String::new(),
            expires_at: None,
        }
    }

    fn text(metrics: &PoolMetrics) -> String {
        let mut registry = Registry::with_prefix("context_service");
        metrics.register(&mut registry);
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &registry).unwrap();
        out
    }

    #[test]
    fn counts_phases_and_ages_the_oldest_provisioning_pool() {
        let mut sampler = Sampler::default();
        let t0 = Instant::now();
        sampler.record(
            &[
                pool("a", PoolPhase::Provisioning),
                pool("b", PoolPhase::Ready),
            ],
            t0,
        );
        assert_eq!(sampler.metrics.provisioning_max.get(), 0.0);
        // `a` is still provisioning 100 s later, `c` just started.
        sampler.record(
            &[
                pool("a", PoolPhase::Provisioning),
                pool("c", PoolPhase::Provisioning),
                pool("b", PoolPhase::Failed),
            ],
            t0 + Duration::from_secs(100),
        );
        assert_eq!(sampler.metrics.provisioning_max.get(), 100.0);
        let out = text(&sampler.metrics);
        assert!(
            out.contains("context_service_pools{phase=\"provisioning\"} 2"),
            "{out}"
        );
        assert!(
            out.contains("context_service_pools{phase=\"ready\"} 0"),
            "{out}"
        );
        assert!(
            out.contains("context_service_pools{phase=\"failed\"} 1"),
            "{out}"
        );
        // `a` became ready: only `c` (50 s) is left.
        sampler.record(
            &[
                pool("a", PoolPhase::Ready),
                pool("c", PoolPhase::Provisioning),
            ],
            t0 + Duration::from_secs(150),
        );
        assert_eq!(sampler.metrics.provisioning_max.get(), 50.0);
        sampler.record(&[], t0 + Duration::from_secs(200));
        assert_eq!(sampler.metrics.provisioning_max.get(), 0.0);
        assert!(sampler.provisioning_since.is_empty());
    }
}
