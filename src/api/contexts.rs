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
use super::json::{self, path_param, Fields};
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
    let value = json::read_first_value(body).await?;
    let req = decode_create(&value)?;
    let owner = state.owner_scope.of(principal.owner());
    let status = state.pools.create_context(&req, &owner).await?;
    Ok(json::respond(StatusCode::CREATED, &Context::from(&status)))
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

/// Decodes a create-context body like upstream's
/// `contextresource.CreateRequest`.
pub fn decode_create(value: &serde_json::Value) -> ApiResult<CreateContextRequest> {
    let top = Fields::top(value, "contextresource.CreateRequest", "CreateRequest")?;
    top.deny_unknown(&["name", "namespace", "type", "storage"])?;
    let mut req = CreateContextRequest {
        name: top.string("name")?,
        namespace: top.string("namespace")?,
        context_type: top.string("type")?,
        storage: StorageRequest::default(),
    };
    if let Some(st) = top.get("storage") {
        let st = Fields::nested(st, "CreateRequest", "storage", "Storage", "storage.")?;
        st.deny_unknown(&["backend", "size", "accessMode", "storageClass"])?;
        req.storage = StorageRequest {
            backend: st.string("backend")?,
            size: st.string("size")?,
            access_mode: st.string("accessMode")?,
            storage_class: st.string("storageClass")?,
        };
    }
    Ok(req)
}
