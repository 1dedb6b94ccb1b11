//! `/v1/workloads/{name}/deliveries`: deliver a workload's active revision
//! into sandboxes, list live runs, release a run. Handlers only extract,
//! authorise, call the [`crate::delivery::DeliveryService`] and map its
//! answer; every route needs the scope `workloads:deliver`.

use axum::extract::rejection::PathRejection;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{delete, post};
use axum::{Json, Router};
use serde::Deserialize;

use super::error::{ApiError, DeliveryApiError};
use super::extract::ApiJson;
use super::json::path_param;
use crate::app::AppState;
use crate::auth::{Principal, Scope};
use crate::delivery::{DeliverInput, DeliveryService, DeliveryTarget, RunList, Verify};

pub(super) fn router() -> Router<AppState> {
    Router::new()
        .route("/v1/workloads/{id}/deliveries", post(deliver).get(list))
        .route("/v1/workloads/{id}/deliveries/{run}", delete(release))
}

/// `POST /v1/workloads/{id}/deliveries` body.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct DeliverBody {
    run_id: String,
    sandbox: Option<String>,
    pool: Option<String>,
    verify: Option<Verify>,
}

type DeliveryResult<T> = Result<T, DeliveryApiError>;

/// The service, or `501` on a backend without an exec port.
fn service(state: &AppState) -> Result<&DeliveryService, ApiError> {
    state.deliveries.as_ref().ok_or_else(|| {
        ApiError::new(
            StatusCode::NOT_IMPLEMENTED,
            "not_implemented",
            "deliveries are not available on this sandbox backend",
        )
    })
}

async fn deliver(
    State(state): State<AppState>,
    principal: Principal,
    path: Result<Path<String>, PathRejection>,
    ApiJson(body): ApiJson<DeliverBody>,
) -> DeliveryResult<Response> {
    principal.require(Scope::WorkloadsDeliver)?;
    let id = path_param(path)?;
    let target = match (body.sandbox, body.pool) {
        (Some(s), None) => DeliveryTarget::Sandbox(s),
        (None, Some(p)) => DeliveryTarget::Pool(p),
        _ => {
            return Err(ApiError::invalid_request(
                "exactly one of \"sandbox\" and \"pool\" is required",
            )
            .into())
        }
    };
    let input = DeliverInput {
        run_id: body.run_id,
        target,
        verify: body.verify.unwrap_or_default(),
    };
    let delivered = service(&state)?
        .deliver(principal.owner(), &id, &input)
        .await?;
    Ok((StatusCode::CREATED, Json(delivered)).into_response())
}

async fn list(
    State(state): State<AppState>,
    principal: Principal,
    path: Result<Path<String>, PathRejection>,
) -> DeliveryResult<Response> {
    principal.require(Scope::WorkloadsDeliver)?;
    let id = path_param(path)?;
    let deliveries = service(&state)?.list(principal.owner(), &id).await?;
    Ok(Json(RunList { deliveries }).into_response())
}

async fn release(
    State(state): State<AppState>,
    principal: Principal,
    path: Result<Path<(String, String)>, PathRejection>,
) -> DeliveryResult<StatusCode> {
    principal.require(Scope::WorkloadsDeliver)?;
    let (id, run) = path_param(path)?;
    service(&state)?
        .release(principal.owner(), &id, &run)
        .await?;
    Ok(StatusCode::NO_CONTENT)
}
