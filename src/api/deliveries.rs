//! `/v1/workloads/{name}/deliveries`: deliver a workload's active revision
//! into sandboxes, list live runs, release a run. Handlers only extract,
//! authorise, call the [`crate::delivery::DeliveryService`] and map its
//! answer; every route needs the scope `workloads:deliver`.

use axum::extract::rejection::PathRejection;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Deserialize;
use utoipa::openapi::path::{Parameter, ParameterBuilder, ParameterIn};
use utoipa::openapi::schema::{Object, ObjectBuilder, Type};
use utoipa::openapi::Required;
use utoipa::{IntoParams, ToSchema};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::body::path_param;
use super::error::{ApiError, ApiResult, Code};
use super::extract::ApiJson;
use super::openapi::{
    error_set, Delegation, Errors, AUTH, BASE, BODY, DELIVERIES_OFF, JSON_BODY, PATH,
    WORKLOAD_NOT_FOUND,
};
use crate::app::AppState;
use crate::auth::{Principal, Scope};
use crate::delivery::{
    DeliverInput, Delivered, DeliveryService, DeliveryTarget, RunList, Verify, RUN_ID_PATTERN,
    RUN_ID_RULE, WORKLOAD_NAME_RULE,
};

pub(super) fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(deliver, list))
        .routes(routes!(release))
}

/// `POST /v1/workloads/{name}/deliveries` body: exactly one of `sandbox` and
/// `pool`.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct DeliverBody {
    /// The caller's id of the run: the same id delivers idempotently.
    #[schema(schema_with = run_id_schema)]
    run_id: String,
    /// Deliver into this sandbox.
    sandbox: Option<String>,
    /// Deliver into every sandbox of this pool.
    pool: Option<String>,
    /// How thoroughly a revision already in a sandbox is checked.
    verify: Option<Verify>,
}

/// The schema of a run id: a string with the validator's own pattern (a
/// field's doc comment is not used with `schema_with`).
fn run_id_schema() -> Object {
    ObjectBuilder::new()
        .schema_type(Type::String)
        .pattern(Some(RUN_ID_PATTERN))
        .description(Some(
            "The caller's id of the run: the same id delivers idempotently.",
        ))
        .build()
}

/// The path of a run: the workload's name and the run id. Written out, as
/// the derive drops `required` and the description of a parameter whose
/// schema is built by a function.
struct RunPath;

impl IntoParams for RunPath {
    fn into_params(_: impl Fn() -> Option<ParameterIn>) -> Vec<Parameter> {
        let param = |name: &str, description: &str, schema: Object| {
            ParameterBuilder::new()
                .name(name)
                .parameter_in(ParameterIn::Path)
                .required(Required::True)
                .description(Some(description))
                .schema(Some(schema))
                .build()
        };
        vec![
            param(
                "name",
                "Workload name",
                ObjectBuilder::new().schema_type(Type::String).build(),
            ),
            param("run", "Run id", run_id_schema()),
        ]
    }
}

/// A delivery or release that failed in a sandbox (`502`, with every
/// sandbox's outcome).
const FAILED: &[Code] = &[Code::DeliveryFailed];

error_set!(
    /// Errors of `POST /v1/workloads/{name}/deliveries`.
    DeliverErrors = [
        AUTH,
        BASE,
        BODY,
        PATH,
        JSON_BODY,
        DELIVERIES_OFF,
        WORKLOAD_NOT_FOUND,
        FAILED,
        &[
            Code::SandboxNotFound,
            Code::PoolNotFound,
            Code::WorkloadNotReady,
            Code::RunConflict,
            Code::SandboxSuspended,
        ],
    ]
);
error_set!(
    /// Errors of `GET /v1/workloads/{name}/deliveries`.
    ListErrors = [AUTH, BASE, PATH, DELIVERIES_OFF, WORKLOAD_NOT_FOUND]
);
error_set!(
    /// Errors of `DELETE /v1/workloads/{name}/deliveries/{run}`.
    ReleaseErrors = [
        AUTH,
        BASE,
        PATH,
        DELIVERIES_OFF,
        WORKLOAD_NOT_FOUND,
        FAILED,
        &[Code::RunNotFound],
    ]
);

/// The service, or `501` on a backend without an exec port.
fn service(state: &AppState) -> Result<&DeliveryService, ApiError> {
    state.deliveries.as_ref().ok_or_else(|| {
        ApiError::new(
            Code::NotImplemented,
            "deliveries are not available on this sandbox backend",
        )
    })
}

/// `value` as the checked type `T` (a workload name, a run id), or `400
/// invalid_request` stating the rule it breaks.
fn parse<T: TryFrom<String>>(value: String, rule: &str) -> Result<T, ApiError> {
    T::try_from(value).map_err(|_| ApiError::invalid_request(rule))
}

/// Delivers the workload's active revision.
///
/// Scope `workloads:deliver`. Into a sandbox or every sandbox of a pool, as
/// run `runId`.
#[utoipa::path(
    post,
    path = "/v1/workloads/{name}/deliveries",
    operation_id = "deliverWorkload",
    tag = "deliveries",
    params(("name" = String, Path, description = "Workload name"), Delegation),
    request_body = DeliverBody,
    responses((status = CREATED, description = "Delivered into every sandbox.", body = Delivered), Errors<DeliverErrors>),
    security(("bearer" = []), ("shAuth" = []))
)]
async fn deliver(
    State(state): State<AppState>,
    principal: Principal,
    path: Result<Path<String>, PathRejection>,
    ApiJson(body): ApiJson<DeliverBody>,
) -> ApiResult<Response> {
    principal.require(Scope::WorkloadsDeliver)?;
    let id = path_param(path)?;
    let target = match (body.sandbox, body.pool) {
        (Some(s), None) => DeliveryTarget::Sandbox(s),
        (None, Some(p)) => DeliveryTarget::Pool(p),
        _ => {
            return Err(ApiError::invalid_request(
                "exactly one of \"sandbox\" and \"pool\" is required",
            ))
        }
    };
    let svc = service(&state)?;
    let workload = parse(id, WORKLOAD_NAME_RULE)?;
    let input = DeliverInput {
        run_id: parse(body.run_id, RUN_ID_RULE)?,
        target,
        verify: body.verify.unwrap_or_default(),
    };
    let delivered = svc.deliver(principal.owner(), &workload, &input).await?;
    Ok((StatusCode::CREATED, Json(delivered)).into_response())
}

/// Lists the workload's live runs (scope `workloads:deliver`).
#[utoipa::path(
    get,
    path = "/v1/workloads/{name}/deliveries",
    operation_id = "listDeliveries",
    tag = "deliveries",
    params(("name" = String, Path, description = "Workload name"), Delegation),
    responses((status = OK, description = "The live runs, by run id.", body = RunList), Errors<ListErrors>),
    security(("bearer" = []), ("shAuth" = []))
)]
async fn list(
    State(state): State<AppState>,
    principal: Principal,
    path: Result<Path<String>, PathRejection>,
) -> ApiResult<Response> {
    principal.require(Scope::WorkloadsDeliver)?;
    let id = path_param(path)?;
    let svc = service(&state)?;
    let deliveries = svc
        .list(principal.owner(), &parse(id, WORKLOAD_NAME_RULE)?)
        .await?;
    Ok(Json(RunList { deliveries }).into_response())
}

/// Releases a run.
///
/// Scope `workloads:deliver`. Removes the run's view from every sandbox it
/// reached.
#[utoipa::path(
    delete,
    path = "/v1/workloads/{name}/deliveries/{run}",
    operation_id = "releaseDelivery",
    tag = "deliveries",
    params(RunPath, Delegation),
    responses((status = NO_CONTENT, description = "Released."), Errors<ReleaseErrors>),
    security(("bearer" = []), ("shAuth" = []))
)]
async fn release(
    State(state): State<AppState>,
    principal: Principal,
    path: Result<Path<(String, String)>, PathRejection>,
) -> ApiResult<StatusCode> {
    principal.require(Scope::WorkloadsDeliver)?;
    let (id, run) = path_param(path)?;
    let svc = service(&state)?;
    let workload = parse(id, WORKLOAD_NAME_RULE)?;
    let run = parse(run, RUN_ID_RULE)?;
    svc.release(principal.owner(), &workload, &run).await?;
    Ok(StatusCode::NO_CONTENT)
}
