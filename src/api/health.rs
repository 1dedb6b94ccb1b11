//! Liveness and readiness.

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::Response;
use axum::routing::get;
use axum::Router;
use serde_json::json;

use super::error::{ApiError, ApiResult};
use super::json;
use crate::app::AppState;

pub(super) fn router() -> Router<AppState> {
    Router::new()
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
}

/// Upstream's `{"status":"ok"}\n`.
async fn healthz() -> Response {
    json::respond(StatusCode::OK, &json!({"status": "ok"}))
}

/// Ready when the sandbox backend answers (the embedded store is opened at
/// start-up, so a running process has it) and the process is not shutting
/// down: from the shutdown signal on, `503 shutting_down`, while the
/// listener still serves for `--shutdown-grace`.
async fn readyz(State(state): State<AppState>) -> ApiResult<Response> {
    if state.readiness.is_draining() {
        return Err(ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "shutting_down",
            "the service is shutting down",
        ));
    }
    state.pools.check_ready().await?;
    Ok(json::respond(StatusCode::OK, &json!({"status": "ready"})))
}
