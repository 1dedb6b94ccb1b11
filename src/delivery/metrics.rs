//! Prometheus metrics of deliveries: outcomes per sandbox, bytes sent,
//! cache hits, duration, and releases.

use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;

/// Label of a delivery or release into one sandbox.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OutcomeLabels {
    /// `sent` (bytes transferred), `cached` (a verified hit) or `failed`.
    pub outcome: String,
}

/// The delivery service's metrics. Cheap to clone (shared handles).
#[derive(Debug, Clone)]
pub struct DeliveryMetrics {
    deliveries: Family<OutcomeLabels, Counter>,
    bytes_sent: Counter,
    cache_hits: Counter,
    duration: Histogram,
    releases: Family<OutcomeLabels, Counter>,
    agent_injections: Counter,
}

impl Default for DeliveryMetrics {
    fn default() -> Self {
        Self {
            deliveries: Family::default(),
            bytes_sent: Counter::default(),
            cache_hits: Counter::default(),
            // 5 ms … ~5.5 min.
            duration: Histogram::new(exponential_buckets(0.005, 2.0, 17)),
            releases: Family::default(),
            agent_injections: Counter::default(),
        }
    }
}

impl DeliveryMetrics {
    /// Registers every metric on `registry`.
    pub fn register(&self, registry: &mut Registry) {
        registry.register(
            "deliveries",
            "Deliveries into one sandbox by outcome (sent, cached, failed)",
            self.deliveries.clone(),
        );
        registry.register(
            "delivery_bytes_sent",
            "Bundle bytes written into sandboxes",
            self.bytes_sent.clone(),
        );
        registry.register(
            "delivery_cache_hits",
            "Deliveries answered by a verified cache dir in the sandbox (no bytes sent)",
            self.cache_hits.clone(),
        );
        registry.register(
            "delivery_duration_seconds",
            "Duration of a delivery into one sandbox",
            self.duration.clone(),
        );
        registry.register(
            "delivery_releases",
            "Releases of a run in one sandbox by outcome (released, failed)",
            self.releases.clone(),
        );
        registry.register(
            "delivery_agent_injections",
            "Delivery agents sent into sandboxes (once per sandbox, again when missing or tampered)",
            self.agent_injections.clone(),
        );
    }

    /// An agent was sent into a sandbox.
    pub(super) fn agent_injected(&self) {
        self.agent_injections.inc();
    }

    /// One sandbox's delivery ended.
    pub(super) fn delivered(&self, outcome: &str, bytes: u64, took: Duration) {
        self.deliveries
            .get_or_create(&OutcomeLabels {
                outcome: outcome.to_owned(),
            })
            .inc();
        self.bytes_sent.inc_by(bytes);
        if outcome == "cached" {
            self.cache_hits.inc();
        }
        self.duration.observe(took.as_secs_f64());
    }

    /// One sandbox's release ended.
    pub(super) fn released(&self, ok: bool) {
        let outcome = if ok { "released" } else { "failed" };
        self.releases
            .get_or_create(&OutcomeLabels {
                outcome: outcome.to_owned(),
            })
            .inc();
    }
}
