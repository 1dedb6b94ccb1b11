//! Liveness and readiness.

use axum::extract::State;
use axum::routing::get;
use axum::{Json, Router};
use serde_json::{json, Value};

use super::error::ApiResult;
use crate::app::AppState;

pub(super) fn router() -> Router<AppState> {
    Router::new()
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
}

async fn healthz() -> Json<Value> {
    Json(json!({"status": "ok"}))
}

/// Ready when the sandbox backend answers (the embedded store is opened at
/// start-up, so a running process has it).
async fn readyz(State(state): State<AppState>) -> ApiResult<Json<Value>> {
    state.pools.check_ready().await?;
    Ok(Json(json!({"status": "ready"})))
}
