//! Prometheus metrics of the gateway: uploads (accepted and running), bundle
//! rejections by reason, downloads and delivery reads by source, and the
//! cache's memory, hits and loads.

use std::sync::atomic::Ordering;

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

/// Label of a download or delivery read.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct SourceLabels {
    /// `memory` (cache hit or load) or `disk` (streamed from the blob).
    pub source: &'static str,
}

/// Who opened a bundle: counted apart, so downloads count only downloads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Reader {
    /// `GET …/bundle` (and the trusted API's download).
    Download,
    /// A delivery, reading the bytes it sends into sandboxes.
    Delivery,
}

/// The workload service's metrics. Cheap to clone (shared handles).
#[derive(Debug, Clone, Default)]
pub struct WorkloadMetrics {
    uploads: Counter,
    rejections: Family<ReasonLabels, Counter>,
    downloads: Family<SourceLabels, Counter>,
    delivery_reads: Family<SourceLabels, Counter>,
    cache_resident_bytes: Gauge,
    cache_bytes: Gauge,
    cache_hits: Counter,
    cache_loads: Counter,
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
            "Bundle downloads by source (memory or disk); deliveries are not counted",
            self.downloads.clone(),
        );
        registry.register(
            "bundle_delivery_reads",
            "Bundle reads of deliveries (at most one per request) by source (memory or disk)",
            self.delivery_reads.clone(),
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
            "Bundle opens (downloads and delivery reads) served from cached bytes",
            self.cache_hits.clone(),
        );
        registry.register(
            "bundle_cache_loads",
            "Bundles loaded from disk into the cache",
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

    /// `reader` opened a bundle, from memory or from disk.
    pub(super) fn opened(&self, reader: Reader, from_memory: bool) {
        let source = if from_memory { "memory" } else { "disk" };
        let family = match reader {
            Reader::Download => &self.downloads,
            Reader::Delivery => &self.delivery_reads,
        };
        family.get_or_create(&SourceLabels { source }).inc();
    }

    pub(super) fn cache(&self, stats: CacheStats) {
        let clamp = |v: u64| i64::try_from(v).unwrap_or(i64::MAX);
        self.cache_resident_bytes.set(clamp(stats.resident_bytes));
        self.cache_bytes.set(clamp(stats.cached_bytes));
        // The cache keeps the totals; concurrent updates may arrive out of
        // order, and fetch_max keeps the counters from ever going back.
        self.cache_hits
            .inner()
            .fetch_max(stats.hits, Ordering::Relaxed);
        self.cache_loads
            .inner()
            .fetch_max(stats.loads, Ordering::Relaxed);
    }
}
