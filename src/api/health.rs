//! Liveness, readiness and metrics.

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::Response;
use serde::Serialize;
use utoipa::ToSchema;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::body;
use super::error::{ApiError, ApiResult, Code};
use super::openapi::{error_set, Errors, BASE};
use crate::app::AppState;
use crate::metrics::{self, Metrics};

pub(super) fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(healthz))
        .routes(routes!(readyz))
}

/// The body of `/healthz` and `/readyz`.
#[derive(Debug, Serialize, ToSchema)]
struct Health {
    /// `ok` (live) or `ready`.
    status: &'static str,
}

error_set!(
    /// Errors of `GET /healthz`.
    HealthzErrors = [BASE]
);
error_set!(
    /// Errors of `GET /readyz`.
    ReadyzErrors = [
        BASE,
        &[
            Code::NotReady,
            Code::ShuttingDown,
        ]
    ]
);
error_set!(
    /// Errors of `GET /metrics`.
    MetricsErrors = [BASE]
);

/// Liveness: upstream's `{"status":"ok"}\n`.
#[utoipa::path(
    get,
    path = "/healthz",
    operation_id = "healthz",
    tag = "service",
    responses((status = OK, description = "The process is live.", body = Health), Errors<HealthzErrors>)
)]
async fn healthz() -> Response {
    body::respond(StatusCode::OK, &Health { status: "ok" })
}

/// Readiness.
///
/// Ready when the sandbox backend answers (the embedded store is opened at
/// start-up, so a running process has it; a cluster backend's API answers
/// and each of its watch caches can list and watch) and the process is not shutting
/// down: from the shutdown signal on, `503 shutting_down`, while the
/// listener still serves for `--shutdown-grace`.
#[utoipa::path(
    get,
    path = "/readyz",
    operation_id = "readyz",
    tag = "service",
    responses((status = OK, description = "The service can serve requests.", body = Health), Errors<ReadyzErrors>)
)]
async fn readyz(State(state): State<AppState>) -> ApiResult<Response> {
    if state.readiness.is_draining() {
        return Err(ApiError::new(
            Code::ShuttingDown,
            "the service is shutting down",
        ));
    }
    state.pools.check_ready().await?;
    Ok(body::respond(StatusCode::OK, &Health { status: "ready" }))
}

/// Prometheus metrics (OpenMetrics text).
///
/// Served here unless the service runs with `--metrics-addr`, which serves
/// them on their own address.
#[utoipa::path(
    get,
    path = "/metrics",
    operation_id = "metrics",
    tag = "service",
    responses(
        (
            status = OK,
            description = "The metrics.",
            body = String,
            content_type = "application/openmetrics-text; version=1.0.0; charset=utf-8"
        ),
        Errors<MetricsErrors>
    )
)]
pub(super) async fn metrics(state: State<Metrics>) -> Response {
    metrics::render(state).await
}
