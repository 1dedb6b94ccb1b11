//! Prometheus metrics: one registry for the process, an HTTP middleware that
//! counts requests by route and status, and the `/metrics` text endpoint.
//!
//! Services register their own metrics (cache, bundles, allocations) on the
//! same registry through [`Metrics::with_registry`]. Besides them,
//! `/metrics` carries `context_service_build_info` and the standard process
//! metrics ([`process`]), which have no prefix.

pub mod process;

use std::sync::{Arc, Mutex};
use std::time::Instant;

use axum::extract::{MatchedPath, Request, State};
use axum::http::{header, Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;

/// Labels of the HTTP metrics. Every value comes from a fixed set, so no
/// client can create new series: see [`method_label`] and [`track`].
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct HttpLabels {
    /// HTTP method: a standard one, or `other`.
    pub method: &'static str,
    /// The matched route template (never the raw path), or `unmatched`.
    pub route: String,
    /// Response status code.
    pub status: u16,
}

/// Labels of refused connections.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RefusalLabels {
    /// `max_connections` or `max_connections_per_ip`.
    pub limit: &'static str,
}

/// Labels of `context_service_build_info`.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct BuildLabels {
    /// The crate version.
    pub version: &'static str,
    /// The commit built, or `unknown` (see [`git_commit`]).
    pub git_commit: &'static str,
}

/// The environment variable naming the commit being built (the Dockerfile
/// passes its `REVISION` build argument); read at compile time.
pub const GIT_COMMIT_ENV: &str = "CONTEXT_SERVICE_GIT_COMMIT";

/// The commit this binary was built from, or `unknown` when the build did
/// not say (see [`GIT_COMMIT_ENV`]).
pub fn git_commit() -> &'static str {
    match option_env!("CONTEXT_SERVICE_GIT_COMMIT") {
        Some(c) if !c.trim().is_empty() => c.trim(),
        _ => "unknown",
    }
}

/// The process's metrics.
#[derive(Clone)]
pub struct Metrics {
    registry: Arc<Mutex<Registry>>,
    /// Metrics under their standard names (no `context_service_` prefix).
    standard: Arc<Registry>,
    requests: Family<HttpLabels, Counter>,
    latency: Family<HttpLabels, Histogram>,
    connections_open: Gauge,
    connections_refused: Family<RefusalLabels, Counter>,
    sendfile_bytes: Counter,
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Metrics")
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    /// A registry with the HTTP metrics registered.
    pub fn new() -> Self {
        let mut registry = Registry::with_prefix("context_service");
        let requests = Family::<HttpLabels, Counter>::default();
        let latency = Family::<HttpLabels, Histogram>::new_with_constructor(|| {
            // 1 ms … ~16 s.
            Histogram::new(exponential_buckets(0.001, 2.0, 15))
        });
        registry.register(
            "http_requests",
            "HTTP requests by method, route and status",
            requests.clone(),
        );
        registry.register(
            "http_request_duration_seconds",
            "HTTP request latency until the response head, by method, route and status",
            latency.clone(),
        );
        let connections_open = Gauge::default();
        registry.register(
            "http_connections_open",
            "Client connections being served",
            connections_open.clone(),
        );
        let connections_refused = Family::<RefusalLabels, Counter>::default();
        // Both caps' series exist from the start, so that `rate()` and the
        // alerts see 0 rather than no series at all.
        for limit in ["max_connections", "max_connections_per_ip"] {
            let _ = connections_refused.get_or_create(&RefusalLabels { limit });
        }
        registry.register(
            "http_connections_refused",
            "Client connections refused by a connection cap, by cap",
            connections_refused.clone(),
        );
        let sendfile_bytes = Counter::default();
        registry.register(
            "http_sendfile_bytes",
            "Response bytes sent by sendfile(2) from cached bundles, without a copy",
            sendfile_bytes.clone(),
        );
        let build_info = Family::<BuildLabels, Gauge>::default();
        build_info
            .get_or_create(&BuildLabels {
                version: env!("CARGO_PKG_VERSION"),
                git_commit: git_commit(),
            })
            .set(1);
        registry.register(
            "build_info",
            "The version and commit of this build; always 1",
            build_info,
        );
        let mut standard = Registry::default();
        standard.register_collector(Box::new(process::ProcessCollector));
        Self {
            registry: Arc::new(Mutex::new(registry)),
            standard: Arc::new(standard),
            requests,
            latency,
            connections_open,
            connections_refused,
            sendfile_bytes,
        }
    }

    /// Runs `f` with the registry, to register more metrics.
    pub fn with_registry<T>(&self, f: impl FnOnce(&mut Registry) -> T) -> T {
        let mut guard = self
            .registry
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        f(&mut guard)
    }

    /// The registry in the Prometheus text format.
    pub fn render(&self) -> Result<String, std::fmt::Error> {
        use prometheus_client::encoding::text::{encode_eof, encode_registry};
        let mut out = String::new();
        self.with_registry(|r| encode_registry(&mut out, r))?;
        encode_registry(&mut out, &self.standard)?;
        encode_eof(&mut out)?;
        Ok(out)
    }

    /// The gauge of open client connections.
    pub fn connections_open(&self) -> &Gauge {
        &self.connections_open
    }

    /// The counter of response bytes sent by `sendfile(2)`.
    pub fn sendfile_bytes(&self) -> &Counter {
        &self.sendfile_bytes
    }

    /// Counts a connection refused by the cap `limit`.
    pub fn connection_refused(&self, limit: &'static str) {
        self.connections_refused
            .get_or_create(&RefusalLabels { limit })
            .inc();
    }

    fn observe(&self, labels: HttpLabels, started: Instant) {
        self.requests.get_or_create(&labels).inc();
        self.latency
            .get_or_create(&labels)
            .observe(started.elapsed().as_secs_f64());
    }
}

/// The method label: the standard methods by name, any other (clients may
/// send any token, of any length) as `other`.
pub fn method_label(method: &Method) -> &'static str {
    match method.as_str() {
        "GET" => "GET",
        "HEAD" => "HEAD",
        "POST" => "POST",
        "PUT" => "PUT",
        "DELETE" => "DELETE",
        "PATCH" => "PATCH",
        "OPTIONS" => "OPTIONS",
        _ => "other",
    }
}

/// The route label of requests no route matched.
pub const UNMATCHED: &str = "unmatched";

/// Middleware recording every request's method, route, status and latency.
/// On a route it sees the route's template; on the fallback, [`UNMATCHED`].
pub async fn track(State(metrics): State<Metrics>, request: Request, next: Next) -> Response {
    let started = Instant::now();
    let method = method_label(request.method());
    let route = request
        .extensions()
        .get::<MatchedPath>()
        .map(|p| p.as_str().to_owned())
        .unwrap_or_else(|| UNMATCHED.to_owned());
    let response = next.run(request).await;
    metrics.observe(
        HttpLabels {
            method,
            route,
            status: response.status().as_u16(),
        },
        started,
    );
    response
}

/// `GET /metrics`.
pub async fn render(State(metrics): State<Metrics>) -> Response {
    match metrics.render() {
        Ok(text) => (
            [(
                header::CONTENT_TYPE,
                "application/openmetrics-text; version=1.0.0; charset=utf-8",
            )],
            text,
        )
            .into_response(),
        Err(e) => (StatusCode::INTERNAL_SERVER_ERROR, e.to_string()).into_response(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_standard_methods_are_labelled_by_name() {
        for m in ["GET", "HEAD", "POST", "PUT", "DELETE", "PATCH", "OPTIONS"] {
            assert_eq!(method_label(&Method::from_bytes(m.as_bytes()).unwrap()), m);
        }
        for m in ["TRACE", "CONNECT", "get", "XQ0001", &"A".repeat(16 * 1024)] {
            assert_eq!(
                method_label(&Method::from_bytes(m.as_bytes()).unwrap()),
                "other"
            );
        }
    }

    #[test]
    fn build_info_and_process_metrics_are_rendered_once_before_eof() {
        let text = Metrics::new().render().unwrap();
        let want = format!(
            "context_service_build_info{{version=\"{}\",git_commit=\"{}\"}} 1\n",
            env!("CARGO_PKG_VERSION"),
            git_commit()
        );
        assert!(text.contains(&want), "{text}");
        for name in [
            "process_cpu_seconds_total",
            "process_open_fds",
            "process_max_fds",
            "process_virtual_memory_bytes",
            "process_resident_memory_bytes",
            "process_start_time_seconds",
        ] {
            let line = text
                .lines()
                .find(|l| l.split(' ').next() == Some(name))
                .unwrap_or_else(|| panic!("no {name}: {text}"));
            let value: f64 = line[name.len() + 1..].parse().unwrap();
            // CPU time moves in clock ticks (10 ms): it may still be 0.
            let least = if name == "process_cpu_seconds_total" {
                0.0
            } else {
                1.0
            };
            assert!(value >= least, "{line}");
            assert!(
                text.contains(&format!("# TYPE {} ", name.trim_end_matches("_total"))),
                "{text}"
            );
        }
        assert_eq!(text.matches("# EOF").count(), 1);
        assert!(text.ends_with("# EOF\n"));
    }
}
