//! Named contexts (context volumes; not the trusted Contexts of `trusted`):
//! `POST /v1/contexts` and
//! `/v1/namespaces/{namespace}/contexts[/{name}]`.

use axum::body::Body;
use axum::extract::rejection::PathRejection;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::Response;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::body::{self, path_param};
use super::error::{ApiResult, Code};
use super::json::{self, GoField, GoKind, GoStruct};
use super::openapi::{
    error_set, Delegation, Errors, AUTH, BASE, BODY, GO_JSON_BODY, NOT_FOUND, PATH,
};
use crate::app::AppState;
use crate::auth::{Principal, Scope};
use crate::pool::validate::{CreateContextVolumeRequest, StorageRequest};
use crate::pool::view::{ContextVolume, ContextVolumeList, CreateContextVolume};

pub(super) fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(create))
        .routes(routes!(list))
        .routes(routes!(read, remove))
}

error_set!(
    /// Errors of `POST /v1/contexts`.
    CreateErrors = [
        AUTH,
        BASE,
        BODY,
        GO_JSON_BODY,
        &[
            Code::AlreadyExists,
            Code::ContextQuotaExceeded,
        ],
    ]
);
error_set!(
    /// Errors of `GET /v1/namespaces/{namespace}/contexts`.
    ListErrors = [AUTH, BASE, PATH]
);
error_set!(
    /// Errors of `GET` and `DELETE /v1/namespaces/{namespace}/contexts/{name}`.
    OneErrors = [AUTH, BASE, PATH, NOT_FOUND]
);

/// Creates a named context of the caller (scope `contexts:write`).
#[utoipa::path(
    post,
    path = "/v1/contexts",
    operation_id = "createContext",
    tag = "contexts",
    params(Delegation),
    request_body = CreateContextVolume,
    responses((status = CREATED, description = "The context, provisioning.", body = ContextVolume), Errors<CreateErrors>),
    security(("bearer" = []), ("shAuth" = []))
)]
async fn create(
    State(state): State<AppState>,
    principal: Principal,
    body: Body,
) -> ApiResult<Response> {
    principal.require(Scope::ContextsWrite)?;
    let (body, overflow) = body::decode_body(body, &CREATE_REQUEST).await?;
    let req = create_request(&body);
    let owner = state.owner_scope.of(principal.owner());
    let status = state
        .pools
        .create_volume(&req, &owner)
        .await
        .map_err(|e| overflow.error(e.into()))?;
    Ok(overflow.response(body::respond(
        StatusCode::CREATED,
        &ContextVolume::from(&status),
    )))
}

/// Lists the caller's contexts in a namespace (scope `contexts:read`).
#[utoipa::path(
    get,
    path = "/v1/namespaces/{namespace}/contexts",
    operation_id = "listContexts",
    tag = "contexts",
    params(("namespace" = String, Path, description = "Namespace"), Delegation),
    responses((status = OK, description = "The caller's contexts, by name.", body = ContextVolumeList), Errors<ListErrors>),
    security(("bearer" = []), ("shAuth" = []))
)]
async fn list(
    State(state): State<AppState>,
    principal: Principal,
    path: Result<Path<String>, PathRejection>,
) -> ApiResult<Response> {
    principal.require(Scope::ContextsRead)?;
    let namespace = path_param(path)?;
    let owner = state.owner_scope.of(principal.owner());
    let items = state.pools.list_volumes(&namespace, &owner).await?;
    let list = ContextVolumeList {
        items: items.iter().map(ContextVolume::from).collect(),
    };
    Ok(body::respond(StatusCode::OK, &list))
}

/// Reads one of the caller's contexts.
///
/// Scope `contexts:read`.
#[utoipa::path(
    get,
    path = "/v1/namespaces/{namespace}/contexts/{name}",
    operation_id = "getContext",
    tag = "contexts",
    params(
        ("namespace" = String, Path, description = "Namespace"),
        ("name" = String, Path, description = "Context name"),
        Delegation
    ),
    responses((status = OK, description = "The context.", body = ContextVolume), Errors<OneErrors>),
    security(("bearer" = []), ("shAuth" = []))
)]
async fn read(
    State(state): State<AppState>,
    principal: Principal,
    path: Result<Path<(String, String)>, PathRejection>,
) -> ApiResult<Response> {
    principal.require(Scope::ContextsRead)?;
    let (namespace, name) = path_param(path)?;
    let owner = state.owner_scope.of(principal.owner());
    let status = state.pools.get_volume(&namespace, &name, &owner).await?;
    Ok(body::respond(StatusCode::OK, &ContextVolume::from(&status)))
}

/// Deletes one of the caller's contexts and its volume.
///
/// Scope `contexts:write`.
#[utoipa::path(
    delete,
    path = "/v1/namespaces/{namespace}/contexts/{name}",
    operation_id = "deleteContext",
    tag = "contexts",
    params(
        ("namespace" = String, Path, description = "Namespace"),
        ("name" = String, Path, description = "Context name"),
        Delegation
    ),
    responses((status = NO_CONTENT, description = "Deleted."), Errors<OneErrors>),
    security(("bearer" = []), ("shAuth" = []))
)]
async fn remove(
    State(state): State<AppState>,
    principal: Principal,
    path: Result<Path<(String, String)>, PathRejection>,
) -> ApiResult<StatusCode> {
    principal.require(Scope::ContextsWrite)?;
    let (namespace, name) = path_param(path)?;
    let owner = state.owner_scope.of(principal.owner());
    state.pools.delete_volume(&namespace, &name, &owner).await?;
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
pub(super) fn create_request(body: &json::Decoded) -> CreateContextVolumeRequest {
    let st = body.nested("storage");
    CreateContextVolumeRequest {
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
