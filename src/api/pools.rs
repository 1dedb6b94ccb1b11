//! `/v1/sandbox-pools`: create, read (optionally waiting for readiness),
//! list and delete the caller's pools.

use std::time::Duration;

use axum::body::Body;
use axum::extract::rejection::{PathRejection, QueryRejection};
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::Response;
use axum::routing::{get, post};
use axum::Router;
use serde::Deserialize;

use super::error::{ApiError, ApiResult};
use super::json::{self, path_param, GoField, GoKind, GoStruct};
use crate::app::AppState;
use crate::auth::{Principal, Scope};
use crate::pool::validate::{CreatePoolRequest, WorkspaceRequest};
use crate::pool::view::{Pool, PoolList};

/// Default of `timeout` for `?wait=ready`.
pub(super) const DEFAULT_WAIT: Duration = Duration::from_secs(60);

pub(super) fn router() -> Router<AppState> {
    Router::new()
        .route("/v1/sandbox-pools", post(create).get(list))
        .route("/v1/sandbox-pools/{name}", get(read).delete(remove))
}

async fn create(
    State(state): State<AppState>,
    principal: Principal,
    body: Body,
) -> ApiResult<Response> {
    principal.require(Scope::PoolsWrite)?;
    let (body, overflow) = json::decode_body(body, &CREATE_REQUEST).await?;
    let req = create_request(&body);
    let owner = state.owner_scope.of(principal.owner());
    let status = state
        .pools
        .create(&req, &owner)
        .await
        .map_err(|e| overflow.error(e.into()))?;
    Ok(overflow.response(json::respond(StatusCode::CREATED, &Pool::from(&status))))
}

/// Query of `GET /v1/sandbox-pools/{name}`.
#[derive(Debug, Deserialize)]
struct ReadQuery {
    /// `ready`: hold the request until the pool is ready or failed.
    wait: Option<String>,
    /// How long to hold it, e.g. `60s`.
    timeout: Option<String>,
}

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
    Ok(json::respond(StatusCode::OK, &Pool::from(&status)))
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

async fn list(State(state): State<AppState>, principal: Principal) -> ApiResult<Response> {
    principal.require(Scope::PoolsRead)?;
    let owner = state.owner_scope.of(principal.owner());
    let pools = state.pools.list(&owner).await?;
    let list = PoolList {
        items: pools.iter().map(Pool::from).collect(),
    };
    Ok(json::respond(StatusCode::OK, &list))
}

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
    }
}
