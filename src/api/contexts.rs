//! Named contexts: `POST /v1/contexts` and
//! `/v1/namespaces/{namespace}/contexts[/{name}]`.

use axum::body::Body;
use axum::extract::rejection::PathRejection;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::Response;
use axum::routing::{get, post};
use axum::Router;

use super::error::ApiResult;
use super::json::{self, path_param, GoField, GoKind, GoStruct};
use crate::app::AppState;
use crate::auth::{Principal, Scope};
use crate::pool::validate::{CreateContextRequest, StorageRequest};
use crate::pool::view::{Context, ContextList};

pub(super) fn router() -> Router<AppState> {
    Router::new()
        .route("/v1/contexts", post(create))
        .route("/v1/namespaces/{namespace}/contexts", get(list))
        .route(
            "/v1/namespaces/{namespace}/contexts/{name}",
            get(read).delete(remove),
        )
}

async fn create(
    State(state): State<AppState>,
    principal: Principal,
    body: Body,
) -> ApiResult<Response> {
    principal.require(Scope::ContextsWrite)?;
    let (body, overflow) = json::decode_body(body, &CREATE_REQUEST).await?;
    let req = create_request(&body);
    let owner = state.owner_scope.of(principal.owner());
    let status = state
        .pools
        .create_context(&req, &owner)
        .await
        .map_err(|e| overflow.error(e.into()))?;
    Ok(overflow.response(json::respond(StatusCode::CREATED, &Context::from(&status))))
}

async fn list(
    State(state): State<AppState>,
    principal: Principal,
    path: Result<Path<String>, PathRejection>,
) -> ApiResult<Response> {
    principal.require(Scope::ContextsRead)?;
    let namespace = path_param(path)?;
    let owner = state.owner_scope.of(principal.owner());
    let items = state.pools.list_contexts(&namespace, &owner).await?;
    let list = ContextList {
        items: items.iter().map(Context::from).collect(),
    };
    Ok(json::respond(StatusCode::OK, &list))
}

async fn read(
    State(state): State<AppState>,
    principal: Principal,
    path: Result<Path<(String, String)>, PathRejection>,
) -> ApiResult<Response> {
    principal.require(Scope::ContextsRead)?;
    let (namespace, name) = path_param(path)?;
    let owner = state.owner_scope.of(principal.owner());
    let status = state.pools.get_context(&namespace, &name, &owner).await?;
    Ok(json::respond(StatusCode::OK, &Context::from(&status)))
}

async fn remove(
    State(state): State<AppState>,
    principal: Principal,
    path: Result<Path<(String, String)>, PathRejection>,
) -> ApiResult<StatusCode> {
    principal.require(Scope::ContextsWrite)?;
    let (namespace, name) = path_param(path)?;
    let owner = state.owner_scope.of(principal.owner());
    state
        .pools
        .delete_context(&namespace, &name, &owner)
        .await?;
    Ok(StatusCode::NO_CONTENT)
}

/// Upstream's `contextresource.Storage`.
static STORAGE: GoStruct = GoStruct {
    go_type: "contextresource.Storage",
    fields: &[
        GoField {
            json: "backend",
            kind: GoKind::String,
        },
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
    ],
};

/// Upstream's `contextresource.CreateRequest`.
pub(super) static CREATE_REQUEST: GoStruct = GoStruct {
    go_type: "contextresource.CreateRequest",
    fields: &[
        GoField {
            json: "name",
            kind: GoKind::String,
        },
        GoField {
            json: "namespace",
            kind: GoKind::String,
        },
        GoField {
            json: "type",
            kind: GoKind::String,
        },
        GoField {
            json: "storage",
            kind: GoKind::Struct(&STORAGE),
        },
    ],
};

/// The request a decoded `contextresource.CreateRequest` holds.
pub(super) fn create_request(body: &json::Decoded) -> CreateContextRequest {
    let st = body.nested("storage");
    CreateContextRequest {
        name: body.string("name"),
        namespace: body.string("namespace"),
        context_type: body.string("type"),
        storage: StorageRequest {
            backend: st.string("backend"),
            size: st.string("size"),
            access_mode: st.string("accessMode"),
            storage_class: st.string("storageClass"),
        },
    }
}
