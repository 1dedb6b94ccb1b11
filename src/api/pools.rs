//! `/v1/sandbox-pools`: create, read (optionally waiting for readiness),
//! list, suspend, resume and delete the caller's pools.

use std::time::Duration;

use axum::body::Body;
use axum::extract::rejection::{PathRejection, QueryRejection};
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::Response;
use serde::Deserialize;
use utoipa::IntoParams;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::body::{self, path_param};
use super::error::{ApiError, ApiResult, Code};
use super::json::{self, GoField, GoKind, GoStruct};
use super::openapi::{
    error_set, Delegation, Errors, AUTH, BASE, BODY, GO_JSON_BODY, NOT_FOUND, PATH,
};
use crate::app::AppState;
use crate::auth::{Principal, Scope};
use crate::pool::validate::{CreatePoolRequest, WorkspaceRequest};
use crate::pool::view::{CreatePool, Pool, PoolList};

/// Default of `timeout` for `?wait=ready`.
pub(super) const DEFAULT_WAIT: Duration = Duration::from_secs(60);

pub(super) fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(create, list))
        .routes(routes!(read, remove))
        .routes(routes!(suspend))
        .routes(routes!(resume))
}

error_set!(
    /// Errors of `POST /v1/sandbox-pools`.
    CreateErrors = [
        AUTH,
        BASE,
        BODY,
        GO_JSON_BODY,
        &[
            Code::AlreadyExists,
            Code::PoolQuotaExceeded,
        ],
    ]
);
error_set!(
    /// Errors of `GET /v1/sandbox-pools`.
    ListErrors = [AUTH, BASE]
);
error_set!(
    /// Errors of `GET /v1/sandbox-pools/{name}` (`wait` and `timeout` are
    /// checked: `400 invalid_request`).
    ReadErrors = [AUTH, BASE, PATH, NOT_FOUND]
);
error_set!(
    /// Errors of `POST /v1/sandbox-pools/{name}/suspend` and `/resume`.
    SuspendErrors = [
        AUTH,
        BASE,
        PATH,
        NOT_FOUND,
        &[Code::PoolNotSuspendable],
    ]
);
error_set!(
    /// Errors of `DELETE /v1/sandbox-pools/{name}`.
    RemoveErrors = [AUTH, BASE, PATH, NOT_FOUND]
);

/// Creates a sandbox pool of the caller (scope `pools:write`).
#[utoipa::path(
    post,
    path = "/v1/sandbox-pools",
    operation_id = "createPool",
    tag = "pools",
    params(Delegation),
    request_body = CreatePool,
    responses((status = CREATED, description = "The pool, provisioning.", body = Pool), Errors<CreateErrors>),
    security(("bearer" = []), ("shAuth" = []))
)]
async fn create(
    State(state): State<AppState>,
    principal: Principal,
    body: Body,
) -> ApiResult<Response> {
    principal.require(Scope::PoolsWrite)?;
    let (body, overflow) = body::decode_body(body, &CREATE_REQUEST).await?;
    let req = create_request(&body);
    let owner = state.owner_scope.of(principal.owner());
    let status = state
        .pools
        .create(&req, &owner)
        .await
        .map_err(|e| overflow.error(e.into()))?;
    Ok(overflow.response(body::respond(StatusCode::CREATED, &Pool::from(&status))))
}

/// Query of `GET /v1/sandbox-pools/{name}`.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
struct ReadQuery {
    /// `ready`: hold the request until the pool is ready or failed.
    wait: Option<String>,
    /// How long to hold it, e.g. `60s`.
    timeout: Option<String>,
}

/// Reads one of the caller's pools.
///
/// Scope `pools:read`. With `?wait=ready`, holds the answer until the pool
/// is ready or failed.
#[utoipa::path(
    get,
    path = "/v1/sandbox-pools/{name}",
    operation_id = "getPool",
    tag = "pools",
    params(("name" = String, Path, description = "Pool name"), ReadQuery, Delegation),
    responses((status = OK, description = "The pool.", body = Pool), Errors<ReadErrors>),
    security(("bearer" = []), ("shAuth" = []))
)]
async fn read(
    State(state): State<AppState>,
    principal: Principal,
    path: Result<Path<String>, PathRejection>,
    query: Result<Query<ReadQuery>, QueryRejection>,
) -> ApiResult<Response> {
    principal.require(Scope::PoolsRead)?;
    let name = path_param(path)?;
    let Query(query) = query.map_err(|e| ApiError::invalid_request(e.body_text()))?;
    let owner = state.owner_scope.of(principal.owner());
    let status = match parse_wait(&query)? {
        Some(timeout) => state.pools.wait(&name, &owner, timeout).await?,
        None => state.pools.get(&name, &owner).await?,
    };
    Ok(body::respond(StatusCode::OK, &Pool::from(&status)))
}

fn parse_wait(query: &ReadQuery) -> ApiResult<Option<Duration>> {
    match query.wait.as_deref() {
        None | Some("") => {
            if query.timeout.is_some() {
                return Err(ApiError::invalid_request("timeout requires wait=ready"));
            }
            Ok(None)
        }
        Some("ready") => match query.timeout.as_deref() {
            None | Some("") => Ok(Some(DEFAULT_WAIT)),
            Some(t) => humantime::parse_duration(t)
                .map(Some)
                .map_err(|_| ApiError::invalid_request("timeout must be a duration such as 60s")),
        },
        Some(_) => Err(ApiError::invalid_request("wait must be \"ready\"")),
    }
}

/// Lists the caller's pools (scope `pools:read`).
#[utoipa::path(
    get,
    path = "/v1/sandbox-pools",
    operation_id = "listPools",
    tag = "pools",
    params(Delegation),
    responses((status = OK, description = "The caller's pools, by name.", body = PoolList), Errors<ListErrors>),
    security(("bearer" = []), ("shAuth" = []))
)]
async fn list(State(state): State<AppState>, principal: Principal) -> ApiResult<Response> {
    principal.require(Scope::PoolsRead)?;
    let owner = state.owner_scope.of(principal.owner());
    let pools = state.pools.list(&owner).await?;
    let list = PoolList {
        items: pools.iter().map(Pool::from).collect(),
    };
    Ok(body::respond(StatusCode::OK, &list))
}

/// Deletes one of the caller's pools and its sandboxes.
///
/// Scope `pools:write`.
#[utoipa::path(
    delete,
    path = "/v1/sandbox-pools/{name}",
    operation_id = "deletePool",
    tag = "pools",
    params(("name" = String, Path, description = "Pool name"), Delegation),
    responses((status = NO_CONTENT, description = "Deleted."), Errors<RemoveErrors>),
    security(("bearer" = []), ("shAuth" = []))
)]
async fn remove(
    State(state): State<AppState>,
    principal: Principal,
    path: Result<Path<String>, PathRejection>,
) -> ApiResult<StatusCode> {
    principal.require(Scope::PoolsWrite)?;
    let name = path_param(path)?;
    let owner = state.owner_scope.of(principal.owner());
    state.pools.delete(&name, &owner).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// Suspends one of the caller's pools (scope `pools:write`).
///
/// Every sandbox stops its pod but keeps its name and volumes; the pool
/// reads `suspended` and refuses deliveries (`409 sandbox_suspended`) until
/// resumed. Idempotent: a suspended pool answers `200` as it is. Warm-pool
/// pools answer `409 pool_not_suspendable`.
#[utoipa::path(
    post,
    path = "/v1/sandbox-pools/{name}/suspend",
    operation_id = "suspendPool",
    tag = "pools",
    params(("name" = String, Path, description = "Pool name"), Delegation),
    responses((status = OK, description = "The pool, suspended.", body = Pool), Errors<SuspendErrors>),
    security(("bearer" = []), ("shAuth" = []))
)]
async fn suspend(
    State(state): State<AppState>,
    principal: Principal,
    path: Result<Path<String>, PathRejection>,
) -> ApiResult<Response> {
    set_suspended(state, principal, path, true).await
}

/// Resumes one of the caller's suspended pools (scope `pools:write`).
///
/// Every sandbox gets a new pod on its kept volumes; the pool goes back to
/// `ready` (through `provisioning` on `kube`). Idempotent: a running pool
/// answers `200` as it is. Warm-pool pools answer
/// `409 pool_not_suspendable`.
#[utoipa::path(
    post,
    path = "/v1/sandbox-pools/{name}/resume",
    operation_id = "resumePool",
    tag = "pools",
    params(("name" = String, Path, description = "Pool name"), Delegation),
    responses((status = OK, description = "The pool, resuming.", body = Pool), Errors<SuspendErrors>),
    security(("bearer" = []), ("shAuth" = []))
)]
async fn resume(
    State(state): State<AppState>,
    principal: Principal,
    path: Result<Path<String>, PathRejection>,
) -> ApiResult<Response> {
    set_suspended(state, principal, path, false).await
}

async fn set_suspended(
    state: AppState,
    principal: Principal,
    path: Result<Path<String>, PathRejection>,
    suspended: bool,
) -> ApiResult<Response> {
    principal.require(Scope::PoolsWrite)?;
    let name = path_param(path)?;
    let owner = state.owner_scope.of(principal.owner());
    let status = state.pools.set_suspended(&name, &owner, suspended).await?;
    Ok(body::respond(StatusCode::OK, &Pool::from(&status)))
}

/// Upstream's `pool.Workspace`.
static WORKSPACE: GoStruct = GoStruct {
    go_type: "pool.Workspace",
    fields: &[
        GoField {
            json: "size",
            kind: GoKind::String,
        },
        GoField {
            json: "accessMode",
            kind: GoKind::String,
        },
        GoField {
            json: "storageClass",
            kind: GoKind::String,
        },
        GoField {
            json: "claimName",
            kind: GoKind::String,
        },
        GoField {
            json: "readOnly",
            kind: GoKind::BoolPtr,
        },
    ],
};

/// Upstream's `pool.CreateRequest`.
pub(super) static CREATE_REQUEST: GoStruct = GoStruct {
    go_type: "pool.CreateRequest",
    fields: &[
        GoField {
            json: "name",
            kind: GoKind::String,
        },
        GoField {
            json: "replicas",
            kind: GoKind::Int,
        },
        GoField {
            json: "warmPoolRef",
            kind: GoKind::String,
        },
        GoField {
            json: "workspace",
            kind: GoKind::Struct(&WORKSPACE),
        },
        // Not upstream: the pool's lifetime (`"2h"`).
        GoField {
            json: "ttl",
            kind: GoKind::String,
        },
    ],
};

/// The request a decoded `pool.CreateRequest` holds.
pub(super) fn create_request(body: &json::Decoded) -> CreatePoolRequest {
    let ws = body.nested("workspace");
    CreatePoolRequest {
        name: body.string("name"),
        replicas: body.int("replicas"),
        warm_pool_ref: body.string("warmPoolRef"),
        workspace: WorkspaceRequest {
            size: ws.string("size"),
            access_mode: ws.string("accessMode"),
            storage_class: ws.string("storageClass"),
            claim_name: ws.string("claimName"),
            read_only: ws.opt_bool("readOnly"),
        },
        ttl: body.string("ttl"),
    }
}
