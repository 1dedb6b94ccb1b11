//! The trusted ("Moca") API of upstream's later version: a platform service
//! acts for the subject named in `X-Context-Subject: <kind>:<name>`.
//!
//! - `POST /internal/v1/contexts`: create a Context;
//! - `POST /v1/namespaces/{ns}/contexts/{name}/upload-capabilities`: a
//!   one-time upload capability;
//! - `PUT /v1/uploads/{id}`: the client's upload with that capability (the
//!   route is shared with workload grants, see [`is_capability_id`]);
//! - `POST /internal/v1/namespaces/{ns}/contexts/{name}/freeze`;
//! - `GET /internal/v1/namespaces/{ns}/contexts/{name}/revisions/{rev}/bundle`;
//! - `DELETE /internal/v1/namespaces/{ns}/contexts/{name}` (`?force=true`).
//!
//! Every route but the upload authenticates the service first (`401
//! unauthorized` with `WWW-Authenticate: Bearer`), then the subject (`400
//! invalid_subject`). Successful answers say `Cache-Control: no-store`.
//! The domain side is [`crate::workload::contexts`].

use axum::body::Body;
use axum::extract::rejection::{PathRejection, QueryRejection};
use axum::extract::{Path, Query, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use futures::TryStreamExt;
use serde::Deserialize;
use utoipa::ToSchema;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::body::{self, path_param};
use super::error::{ApiError, ApiResult, Code};
use super::extract::{api_token, bearer_token, BundleHeaders, SUBJECT_HEADER};
use super::json::{GoField, GoKind, GoStruct};
use super::openapi::{
    error_set, BundleBytes, Errors, TrustedSubject, BASE, BODY, GO_JSON_BODY, INTERNAL, NOT_FOUND,
    PATH, TRUSTED_AUTH,
};
use crate::app::AppState;
use crate::auth::{Owner, ServiceCaller};
use crate::workload::trusted::{
    CapabilityView, CreateTrustedContext, TrustedContextError, TrustedContextView, TrustedKey,
};
use crate::workload::{WorkloadService, BUNDLE_MEDIA_TYPE};

pub(super) use crate::workload::trusted::is_capability_id;

pub(super) fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(create))
        .routes(routes!(capability))
        .routes(routes!(freeze))
        .routes(routes!(export))
        .routes(routes!(remove))
}

error_set!(
    /// Errors of `POST /internal/v1/contexts`.
    CreateErrors = [
        TRUSTED_AUTH,
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
    /// Errors of `POST /v1/namespaces/{namespace}/contexts/{name}/upload-capabilities`.
    CapabilityErrors = [
        TRUSTED_AUTH,
        BASE,
        PATH,
        NOT_FOUND,
        &[Code::ContextFrozen],
    ]
);
error_set!(
    /// Errors of `POST /internal/v1/namespaces/{namespace}/contexts/{name}/freeze`.
    FreezeErrors = [
        TRUSTED_AUTH,
        BASE,
        BODY,
        PATH,
        GO_JSON_BODY,
        NOT_FOUND,
        &[
            Code::UploadInProgress,
            Code::RevisionMismatch,
            Code::WorkloadNotReady,
        ],
    ]
);
error_set!(
    /// Errors of `GET /internal/v1/namespaces/{namespace}/contexts/{name}/revisions/{revision}/bundle`
    /// (streaming: no deadline).
    ExportErrors = [TRUSTED_AUTH, INTERNAL, PATH, NOT_FOUND]
);
error_set!(
    /// Errors of `DELETE /internal/v1/namespaces/{namespace}/contexts/{name}`.
    RemoveErrors = [TRUSTED_AUTH, BASE, PATH, NOT_FOUND]
);

/// `401 unauthorized`: the caller is not a platform service.
fn unauthorized() -> ApiError {
    ApiError::new(
        Code::Unauthorized,
        "valid control-plane bearer token required",
    )
    .with_bearer_challenge()
}

/// Authenticates the platform service, then the subject it acts for.
fn trusted_subject(state: &AppState, headers: &HeaderMap) -> ApiResult<Owner> {
    let bearer = api_token(headers).map_err(|_| unauthorized())?;
    let caller = state
        .auth
        .authenticate_service(state.service_token.as_deref(), bearer)
        .map_err(|_| unauthorized())?;
    let subject = headers
        .get(SUBJECT_HEADER)
        .and_then(|v| v.to_str().ok())
        .and_then(Owner::delegated)
        .ok_or_else(|| {
            ApiError::new(
                Code::InvalidSubject,
                "X-Context-Subject must contain a valid delegated kind:name",
            )
        })?;
    match &caller {
        ServiceCaller::Token => {
            tracing::debug!(subject = %subject, "trusted call by service token");
        }
        ServiceCaller::Jwt(sub) => {
            tracing::debug!(subject = %subject, service = %sub, "trusted call by delegate token");
        }
    }
    Ok(subject)
}

/// `resp` with `Cache-Control: no-store`.
fn no_store(mut resp: Response) -> Response {
    resp.headers_mut()
        .insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    resp
}

/// The Context named by the path, for `subject`.
fn context_key(
    subject: Owner,
    path: Result<Path<(String, String)>, PathRejection>,
) -> ApiResult<TrustedKey> {
    let (namespace, name) = path_param(path)?;
    Ok(TrustedKey {
        namespace,
        name,
        subject,
    })
}

/// Creates a Context owned by the subject.
///
/// The body is upstream's create request; its storage is checked, never
/// shown. Answers `Cache-Control: no-store`.
#[utoipa::path(
    post,
    path = "/internal/v1/contexts",
    operation_id = "trustedCreateContext",
    tag = "trusted",
    params(TrustedSubject),
    request_body = crate::pool::view::CreateContextVolume,
    responses((status = CREATED, description = "The Context.", body = TrustedContextView), Errors<CreateErrors>),
    security(("service" = []), ("serviceShAuth" = []))
)]
async fn create(
    State(state): State<AppState>,
    headers: HeaderMap,
    body: Body,
) -> ApiResult<Response> {
    let subject = trusted_subject(&state, &headers)?;
    let (body, overflow) = body::decode_body(body, &super::volumes::CREATE_REQUEST).await?;
    let req = super::volumes::create_request(&body);
    let req = CreateTrustedContext {
        name: req.name,
        namespace: req.namespace,
        kind: req.context_type,
        backend: req.storage.backend,
        size: req.storage.size,
        access_mode: req.storage.access_mode,
        storage_class: req.storage.storage_class,
    };
    let view = state
        .workloads
        .create_trusted_context(&subject, &req)
        .await
        .map_err(|e| overflow.error(e.into()))?;
    let resp = body::respond(StatusCode::CREATED, &view);
    Ok(overflow.response(no_store(resp)))
}

/// Issues a one-time upload capability for the subject's Context.
///
/// The client then sends the bundle with `PUT` to `uploadUrl`
/// (`/v1/uploads/{grant}`) with `Authorization: Bearer <token>`. Refused
/// once the Context is frozen. Answers `Cache-Control: no-store`.
#[utoipa::path(
    post,
    path = "/v1/namespaces/{namespace}/contexts/{name}/upload-capabilities",
    operation_id = "trustedUploadCapability",
    tag = "trusted",
    params(
        ("namespace" = String, Path, description = "Namespace"),
        ("name" = String, Path, description = "Context name"),
        TrustedSubject
    ),
    responses((status = CREATED, description = "The capability.", body = CapabilityView), Errors<CapabilityErrors>),
    security(("service" = []), ("serviceShAuth" = []))
)]
async fn capability(
    State(state): State<AppState>,
    headers: HeaderMap,
    path: Result<Path<(String, String)>, PathRejection>,
) -> ApiResult<Response> {
    let key = context_key(trusted_subject(&state, &headers)?, path)?;
    let view = state.workloads.trusted_capability(&key).await?;
    Ok(no_store(body::respond(StatusCode::CREATED, &view)))
}

/// `POST …/freeze` body (upstream's `freezeContextRequest`).
#[derive(Debug, Deserialize, ToSchema)]
#[allow(dead_code)]
struct FreezeBody {
    /// The Context's current revision (a lowercase SHA-256 digest).
    revision: String,
}

/// Upstream's `freezeContextRequest`.
pub(super) static FREEZE_REQUEST: GoStruct = GoStruct {
    go_type: "api.freezeContextRequest",
    fields: &[GoField {
        json: "revision",
        kind: GoKind::String,
    }],
};

/// Freezes the subject's Context at its current revision.
///
/// Idempotent for the frozen revision; a frozen Context takes no more
/// uploads. Answers `Cache-Control: no-store`.
#[utoipa::path(
    post,
    path = "/internal/v1/namespaces/{namespace}/contexts/{name}/freeze",
    operation_id = "trustedFreezeContext",
    tag = "trusted",
    params(
        ("namespace" = String, Path, description = "Namespace"),
        ("name" = String, Path, description = "Context name"),
        TrustedSubject
    ),
    request_body = FreezeBody,
    responses((status = OK, description = "The frozen Context.", body = TrustedContextView), Errors<FreezeErrors>),
    security(("service" = []), ("serviceShAuth" = []))
)]
async fn freeze(
    State(state): State<AppState>,
    headers: HeaderMap,
    path: Result<Path<(String, String)>, PathRejection>,
    body: Body,
) -> ApiResult<Response> {
    let subject = trusted_subject(&state, &headers)?;
    let (body, overflow) = body::decode_body(body, &FREEZE_REQUEST).await?;
    let key = context_key(subject, path).map_err(|e| overflow.error(e))?;
    let view = state
        .workloads
        .freeze_trusted_context(&key, &body.string("revision"))
        .await
        .map_err(|e| overflow.error(e.into()))?;
    Ok(overflow.response(no_store(body::respond(StatusCode::OK, &view))))
}

/// Downloads the bundle of the subject's frozen Context.
///
/// Found only while the Context is frozen at exactly `revision`. Answers
/// `Cache-Control: no-store` and `Content-Disposition: attachment`.
#[utoipa::path(
    get,
    path = "/internal/v1/namespaces/{namespace}/contexts/{name}/revisions/{revision}/bundle",
    operation_id = "trustedExportContext",
    tag = "trusted",
    params(
        ("namespace" = String, Path, description = "Namespace"),
        ("name" = String, Path, description = "Context name"),
        ("revision" = String, Path, description = "The frozen revision"),
        TrustedSubject
    ),
    responses((status = OK, description = "The bundle (a gzip-compressed tar).", body = BundleBytes, content_type = "application/vnd.rossoctl.context"), Errors<ExportErrors>),
    security(("service" = []), ("serviceShAuth" = []))
)]
async fn export(
    State(state): State<AppState>,
    headers: HeaderMap,
    path: Result<Path<(String, String, String)>, PathRejection>,
) -> ApiResult<Response> {
    let subject = trusted_subject(&state, &headers)?;
    let (namespace, name, revision) = path_param(path)?;
    let key = TrustedKey {
        namespace,
        name,
        subject,
    };
    let svc = &state.workloads;
    let rev = svc.locate_trusted_context(&key, &revision).await?;
    let bundle = svc.open_trusted_bundle(&key, &rev).await?;
    let stream = bundle
        .stream(0, rev.bytes)
        .await
        .map_err(|e| ApiError::internal(format!("streaming bundle {}: {e}", rev.bundle_digest)))?;
    let disposition = format!("attachment; filename=\"context-{}.context\"", rev.revision);
    let mut out = HeaderMap::new();
    out.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    out.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static(BUNDLE_MEDIA_TYPE),
    );
    out.insert(
        header::CONTENT_DISPOSITION,
        HeaderValue::from_str(&disposition).map_err(ApiError::internal)?,
    );
    out.insert(header::CONTENT_LENGTH, HeaderValue::from(rev.bytes));
    // A read error mid-stream ends the body early: hyper then aborts the
    // connection, so a truncated bundle never looks like a clean 200.
    Ok((StatusCode::OK, out, Body::from_stream(stream)).into_response())
}

/// Deletes the subject's Context and its revisions.
#[utoipa::path(
    delete,
    path = "/internal/v1/namespaces/{namespace}/contexts/{name}",
    operation_id = "trustedDeleteContext",
    tag = "trusted",
    params(
        ("namespace" = String, Path, description = "Namespace"),
        ("name" = String, Path, description = "Context name"),
        ("force" = Option<String>, Query, description = "`true`: upstream's forced delete; accepted (nothing attaches to a Context here, so a delete never waits)"),
        TrustedSubject
    ),
    responses((status = NO_CONTENT, description = "Deleted."), Errors<RemoveErrors>),
    security(("service" = []), ("serviceShAuth" = []))
)]
async fn remove(
    State(state): State<AppState>,
    headers: HeaderMap,
    path: Result<Path<(String, String)>, PathRejection>,
    query: Result<Query<Vec<(String, String)>>, QueryRejection>,
) -> ApiResult<StatusCode> {
    let key = context_key(trusted_subject(&state, &headers)?, path)?;
    // Go's `Query().Get("force") == "true"`: the first value counts, and a
    // query that does not parse forces nothing.
    let force = query.is_ok_and(|Query(pairs)| {
        pairs
            .iter()
            .find(|(k, _)| k == "force")
            .map(|(_, v)| v.as_str())
            == Some("true")
    });
    state.workloads.delete_trusted_context(&key, force).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// `PUT /v1/uploads/{id}` with a trusted upload capability, in upstream's
/// order: media type (`415`), declared size (`413`), capability (`401`),
/// then the body.
pub(super) async fn upload(
    svc: &WorkloadService,
    id: &str,
    headers: &HeaderMap,
    body: Body,
) -> ApiResult<Response> {
    let upload = BundleHeaders::check(headers)?;
    let max = svc.settings().limits.compressed_bytes;
    if upload.declared_over(max).is_some() {
        return Err(TrustedContextError::UploadTooLarge(max).into());
    }
    let token = bearer_token(headers, "upload token")
        .map_err(|_| ApiError::from(TrustedContextError::CapabilityInvalid))?;
    let ticket = svc.trusted_upload_ticket(id, token).await?;
    let stream = body.into_data_stream().map_err(std::io::Error::other);
    let view = svc.trusted_upload(ticket, Box::pin(stream)).await?;
    Ok(no_store(body::respond(StatusCode::CREATED, &view)))
}
