//! Prometheus metrics of the gateway: uploads (accepted and running), bundle
//! rejections by reason, downloads by source, and the cache's memory.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use crate::cache::CacheStats;

/// Label of a rejected upload.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct ReasonLabels {
    /// The inspector's reason code, or `upload_too_large`.
    pub reason: String,
}

/// Label of a download.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct SourceLabels {
    /// `memory` (cache hit or load) or `disk` (streamed from the blob).
    pub source: String,
}

/// The workload service's metrics. Cheap to clone (shared handles).
#[derive(Debug, Clone, Default)]
pub struct WorkloadMetrics {
    uploads: Counter,
    rejections: Family<ReasonLabels, Counter>,
    downloads: Family<SourceLabels, Counter>,
    cache_resident_bytes: Gauge,
    cache_bytes: Gauge,
    cache_hits: Gauge,
    cache_loads: Gauge,
    uploads_running: Gauge,
}

impl WorkloadMetrics {
    /// Registers every metric on `registry`.
    pub fn register(&self, registry: &mut Registry) {
        registry.register(
            "bundle_uploads",
            "Accepted bundle uploads",
            self.uploads.clone(),
        );
        registry.register(
            "bundle_rejections",
            "Refused bundle uploads by reason",
            self.rejections.clone(),
        );
        registry.register(
            "bundle_downloads",
            "Bundle downloads by source (memory or disk)",
            self.downloads.clone(),
        );
        registry.register(
            "uploads_running",
            "Uploads admitted and not finished (each holds a blocking thread)",
            self.uploads_running.clone(),
        );
        registry.register(
            "bundle_cache_resident_bytes",
            "Bundle bytes in memory, including evicted bundles still streaming",
            self.cache_resident_bytes.clone(),
        );
        registry.register(
            "bundle_cache_bytes",
            "Bundle bytes held by the cache",
            self.cache_bytes.clone(),
        );
        registry.register(
            "bundle_cache_hits",
            "Downloads served from cached bytes (since start)",
            self.cache_hits.clone(),
        );
        registry.register(
            "bundle_cache_loads",
            "Bundles loaded from disk into the cache (since start)",
            self.cache_loads.clone(),
        );
    }

    /// The gauge of running uploads (shared handle).
    pub(super) fn uploads_running(&self) -> Gauge {
        self.uploads_running.clone()
    }

    pub(super) fn uploaded(&self) {
        self.uploads.inc();
    }

    pub(super) fn rejected(&self, reason: &str) {
        self.rejections
            .get_or_create(&ReasonLabels {
                reason: reason.to_owned(),
            })
            .inc();
    }

    pub(super) fn downloaded(&self, from_memory: bool) {
        let source = if from_memory { "memory" } else { "disk" };
        self.downloads
            .get_or_create(&SourceLabels {
                source: source.to_owned(),
            })
            .inc();
    }

    pub(super) fn cache(&self, stats: CacheStats) {
        let clamp = |v: u64| i64::try_from(v).unwrap_or(i64::MAX);
        self.cache_resident_bytes.set(clamp(stats.resident_bytes));
        self.cache_bytes.set(clamp(stats.cached_bytes));
        self.cache_hits.set(clamp(stats.hits));
        self.cache_loads.set(clamp(stats.loads));
    }
}
