//! `/v1/workloads` and `/v1/uploads`: create, upload, activate, read, list,
//! download and delete owner-scoped workloads. `/v1/uploads` also serves
//! trusted upload capabilities (`super::trusted`). Handlers only extract,
//! authorise, call the [`WorkloadService`] and map its answer.

use axum::body::Body;
use axum::extract::State;
use axum::http::{header, HeaderMap, HeaderValue, Method, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use futures::TryStreamExt;
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::error::{ApiError, ApiResult, Code};
use super::extract::{bearer_token, ApiJson, BundleHeaders};
use super::openapi::{
    error_set, BundleBytes, Delegation, Errors, AUTH, BASE, BODY, BUNDLE_UPLOAD, INTERNAL,
    JSON_BODY, OBJECT_STORAGE, PATH, UPLOADABLE, WORKLOAD_NOT_FOUND,
};
use super::rejection::ApiPath;
use crate::app::AppState;
use crate::auth::{Principal, Scope};
use crate::workload::trusted::UploadResultView;
use crate::workload::{
    CreateWorkload, Revision, RevisionView, UploadGrantView, UploadTicket, WorkloadError,
    WorkloadName, WorkloadService, WorkloadView, BUNDLE_MEDIA_TYPE,
};

pub(super) fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(create, list))
        .routes(routes!(read, remove))
        .routes(routes!(new_grant))
        .routes(routes!(upload_by_owner))
        .routes(routes!(activate))
        .routes(routes!(download))
        .routes(routes!(upload_by_grant))
}

/// `POST /v1/workloads` body.
#[derive(Debug, Default, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateBody {
    /// Requested name.
    pub name: Option<String>,
    /// Context type.
    #[serde(rename = "type")]
    pub kind: Option<String>,
}

/// `POST /v1/workloads/{name}/activate` body.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ActivateBody {
    /// The revision to freeze.
    pub revision: String,
}

/// `GET /v1/workloads`.
#[derive(Debug, Serialize, ToSchema)]
struct WorkloadList {
    /// The caller's workloads, by name.
    workloads: Vec<WorkloadView>,
}

error_set!(
    /// Errors of `POST /v1/workloads`.
    CreateErrors = [
        AUTH,
        BASE,
        BODY,
        JSON_BODY,
        &[
            Code::WorkloadNameInvalid,
            Code::ContextTypeInvalid,
            Code::WorkloadNameTaken,
            Code::WorkloadQuotaExceeded,
        ],
    ]
);
error_set!(
    /// Errors of `GET /v1/workloads`.
    ListErrors = [AUTH, BASE]
);
error_set!(
    /// Errors of `GET` and `DELETE /v1/workloads/{name}`.
    OneErrors = [AUTH, BASE, PATH, WORKLOAD_NOT_FOUND]
);
error_set!(
    /// Errors of `POST /v1/workloads/{name}/uploads`.
    GrantErrors = [AUTH, BASE, PATH, WORKLOAD_NOT_FOUND, UPLOADABLE]
);
error_set!(
    /// Errors of `POST /v1/workloads/{name}/activate`.
    ActivateErrors = [
        AUTH,
        BASE,
        BODY,
        PATH,
        JSON_BODY,
        WORKLOAD_NOT_FOUND,
        UPLOADABLE,
        OBJECT_STORAGE,
        &[
            Code::RevisionInvalid,
            Code::RevisionMismatch,
        ],
    ]
);
error_set!(
    /// Errors of `PUT /v1/workloads/{name}/bundle` (streaming: no deadline).
    OwnerUploadErrors = [AUTH, BODY, PATH, WORKLOAD_NOT_FOUND, UPLOADABLE, BUNDLE_UPLOAD, OBJECT_STORAGE]
);
error_set!(
    /// Errors of `PUT /v1/uploads/{grant}`: the grant token instead of an
    /// API token (streaming: no deadline); with a trusted capability,
    /// upstream's codes (`super::trusted::upload`).
    GrantUploadErrors = [
        BODY,
        PATH,
        WORKLOAD_NOT_FOUND,
        UPLOADABLE,
        BUNDLE_UPLOAD,
        OBJECT_STORAGE,
        &[
            Code::TokenRequired,
            Code::TokenInvalid,
            Code::TokenExpired,
        ],
        // Trusted capabilities.
        &[
            Code::Unauthorized,
            Code::NotFound,
            Code::ContextFrozen,
        ],
    ]
);
error_set!(
    /// Errors of `GET /v1/workloads/{name}/revisions/{revision}/bundle`
    /// (streaming: no deadline).
    DownloadErrors = [
        AUTH,
        INTERNAL,
        PATH,
        WORKLOAD_NOT_FOUND,
        OBJECT_STORAGE,
        &[
            Code::RevisionInvalid,
            Code::RevisionNotFound,
            Code::WorkloadNotReady,
            Code::RangeNotSatisfiable,
        ],
    ]
);

/// The workload `{name}` names. An invalid name can never exist, so it is
/// answered like a missing one (`404 workload_not_found`).
fn workload_name(id: String) -> ApiResult<WorkloadName> {
    WorkloadName::try_from(id).map_err(|e| WorkloadError::NotFound(e.0).into())
}

/// A revision named by the caller, or `400 revision_invalid`.
fn parse_revision(value: String) -> Result<Revision, WorkloadError> {
    Revision::try_from(value).map_err(|e| WorkloadError::RevisionInvalid(e.0))
}

/// Creates a workload of the caller.
///
/// Scope `workloads:write`. The answer carries a one-time upload grant for
/// its first bundle.
#[utoipa::path(
    post,
    path = "/v1/workloads",
    operation_id = "createWorkload",
    tag = "workloads",
    params(Delegation),
    request_body = CreateBody,
    responses((status = CREATED, description = "The workload, awaiting its upload, with `upload`.", body = WorkloadView), Errors<CreateErrors>),
    security(("bearer" = []), ("shAuth" = []))
)]
async fn create(
    State(svc): State<WorkloadService>,
    principal: Principal,
    ApiJson(body): ApiJson<CreateBody>,
) -> ApiResult<Response> {
    principal.require(Scope::WorkloadsWrite)?;
    let req = CreateWorkload {
        name: body.name,
        kind: body.kind,
    };
    let view = svc.create(&principal.owner().key(), req).await?;
    tracing::info!(workload = %view.name, kind = %view.kind, "workload created");
    Ok((StatusCode::CREATED, Json(view)).into_response())
}

/// Lists the caller's workloads (scope `workloads:read`).
#[utoipa::path(
    get,
    path = "/v1/workloads",
    operation_id = "listWorkloads",
    tag = "workloads",
    params(Delegation),
    responses((status = OK, description = "The caller's workloads, by name.", body = WorkloadList), Errors<ListErrors>),
    security(("bearer" = []), ("shAuth" = []))
)]
async fn list(State(svc): State<WorkloadService>, principal: Principal) -> ApiResult<Response> {
    principal.require(Scope::WorkloadsRead)?;
    let workloads = svc.list(&principal.owner().key()).await?;
    Ok(Json(WorkloadList { workloads }).into_response())
}

/// Reads one of the caller's workloads (scope `workloads:read`).
#[utoipa::path(
    get,
    path = "/v1/workloads/{name}",
    operation_id = "getWorkload",
    tag = "workloads",
    params(("name" = String, Path, description = "Workload name"), Delegation),
    responses((status = OK, description = "The workload.", body = WorkloadView), Errors<OneErrors>),
    security(("bearer" = []), ("shAuth" = []))
)]
async fn read(
    State(svc): State<WorkloadService>,
    principal: Principal,
    ApiPath(id): ApiPath<String>,
) -> ApiResult<Response> {
    principal.require(Scope::WorkloadsRead)?;
    let name = workload_name(id)?;
    Ok(Json(svc.get(&principal.owner().key(), &name).await?).into_response())
}

/// Deletes one of the caller's workloads and its bundles.
///
/// Scope `workloads:write`.
#[utoipa::path(
    delete,
    path = "/v1/workloads/{name}",
    operation_id = "deleteWorkload",
    tag = "workloads",
    params(("name" = String, Path, description = "Workload name"), Delegation),
    responses((status = NO_CONTENT, description = "Deleted."), Errors<OneErrors>),
    security(("bearer" = []), ("shAuth" = []))
)]
async fn remove(
    State(svc): State<WorkloadService>,
    principal: Principal,
    ApiPath(id): ApiPath<String>,
) -> ApiResult<StatusCode> {
    principal.require(Scope::WorkloadsWrite)?;
    svc.delete(&principal.owner().key(), &workload_name(id)?)
        .await?;
    Ok(StatusCode::NO_CONTENT)
}

/// Issues a new one-time upload grant.
///
/// Scope `workloads:write`; the workload must be awaiting its bundle.
#[utoipa::path(
    post,
    path = "/v1/workloads/{name}/uploads",
    operation_id = "createUploadGrant",
    tag = "workloads",
    params(("name" = String, Path, description = "Workload name"), Delegation),
    responses((status = CREATED, description = "The grant.", body = UploadGrantView), Errors<GrantErrors>),
    security(("bearer" = []), ("shAuth" = []))
)]
async fn new_grant(
    State(svc): State<WorkloadService>,
    principal: Principal,
    ApiPath(id): ApiPath<String>,
) -> ApiResult<Response> {
    principal.require(Scope::WorkloadsWrite)?;
    let grant = svc
        .grant(&principal.owner().key(), &workload_name(id)?)
        .await?;
    Ok((StatusCode::CREATED, Json(grant)).into_response())
}

/// Freezes an uploaded revision as the workload's active one.
///
/// Scope `workloads:write`.
#[utoipa::path(
    post,
    path = "/v1/workloads/{name}/activate",
    operation_id = "activateWorkload",
    tag = "workloads",
    params(("name" = String, Path, description = "Workload name"), Delegation),
    request_body = ActivateBody,
    responses((status = OK, description = "The workload, ready.", body = WorkloadView), Errors<ActivateErrors>),
    security(("bearer" = []), ("shAuth" = []))
)]
async fn activate(
    State(svc): State<WorkloadService>,
    principal: Principal,
    ApiPath(id): ApiPath<String>,
    ApiJson(body): ApiJson<ActivateBody>,
) -> ApiResult<Response> {
    principal.require(Scope::WorkloadsWrite)?;
    // The revision first: a malformed one is always 400.
    let revision = parse_revision(body.revision)?;
    let view = svc
        .activate(&principal.owner().key(), &workload_name(id)?, &revision)
        .await?;
    Ok(Json(view).into_response())
}

/// Uploads a bundle as the workload's owner (scope `workloads:write`).
#[utoipa::path(
    put,
    path = "/v1/workloads/{name}/bundle",
    operation_id = "uploadBundle",
    tag = "workloads",
    params(("name" = String, Path, description = "Workload name"), Delegation),
    request_body(
        description = "The bundle (a gzip-compressed tar), streamed.",
        content(
            (BundleBytes = "application/vnd.rossoctl.context"),
            (BundleBytes = "application/gzip")
        )
    ),
    responses((status = CREATED, description = "The uploaded revision, waiting for activation.", body = RevisionView), Errors<OwnerUploadErrors>),
    security(("bearer" = []), ("shAuth" = []))
)]
async fn upload_by_owner(
    State(svc): State<WorkloadService>,
    principal: Principal,
    ApiPath(id): ApiPath<String>,
    headers: HeaderMap,
    body: Body,
) -> ApiResult<Response> {
    principal.require(Scope::WorkloadsWrite)?;
    let ticket = svc
        .owner_upload(&principal.owner().key(), &workload_name(id)?)
        .await?;
    upload(&svc, ticket, &headers, body).await
}

/// The answer of `PUT /v1/uploads/{grant}`, by the kind of id.
#[derive(Debug, Serialize, ToSchema)]
#[serde(untagged)]
#[allow(dead_code)] // Only documents the two answers.
enum GrantUploadAnswer {
    /// A workload upload grant: the uploaded revision.
    Revision(RevisionView),
    /// A trusted upload capability: the Context's new current revision.
    Capability(UploadResultView),
}

/// Uploads a bundle with a one-time upload grant or capability.
///
/// The token goes in `Authorization: Bearer`, e.g. from a build job
/// without an API token. Two kinds of id share the route: a workload upload
/// grant (32 hex characters, from `upload.url` of the workload API), and a
/// trusted upload capability (24 base64url characters, from `uploadUrl` of
/// `POST …/upload-capabilities`), which answers upstream's error codes
/// (`401 unauthorized`, `409 context_frozen`, `404 not_found`) and
/// `Cache-Control: no-store`. Both take the media types of the owner's
/// upload.
#[utoipa::path(
    put,
    path = "/v1/uploads/{grant}",
    operation_id = "uploadBundleWithGrant",
    tag = "workloads",
    params(("grant" = String, Path, description = "Grant id (32 hex, from `upload.url`) or trusted capability id (24 base64url, from `uploadUrl`)")),
    request_body(
        description = "The bundle (a gzip-compressed tar), streamed.",
        content(
            (BundleBytes = "application/vnd.rossoctl.context"),
            (BundleBytes = "application/gzip")
        )
    ),
    responses((status = CREATED, description = "The uploaded revision, waiting for activation (a grant), or the Context's new current revision (a capability).", body = GrantUploadAnswer), Errors<GrantUploadErrors>),
    security(("uploadGrant" = []))
)]
async fn upload_by_grant(
    State(svc): State<WorkloadService>,
    ApiPath(grant): ApiPath<String>,
    headers: HeaderMap,
    body: Body,
) -> ApiResult<Response> {
    // Trusted upload capabilities share the route; their ids have their
    // own shape.
    if super::trusted::is_capability_id(&grant) {
        return super::trusted::upload(&svc, &grant, &headers, body).await;
    }
    let token = bearer_token(&headers, "upload token")?;
    let ticket = svc.grant_upload(&grant, token).await?;
    upload(&svc, ticket, &headers, body).await
}

/// Checks the media type and declared size, then streams the body into the
/// service.
async fn upload(
    svc: &WorkloadService,
    ticket: UploadTicket,
    headers: &HeaderMap,
    body: Body,
) -> ApiResult<Response> {
    let upload = BundleHeaders::check(headers)?;
    let max = svc.settings().limits.compressed_bytes;
    if let Some(n) = upload.declared_over(max) {
        // Refused before a byte of the body is read.
        return Err(ApiError::new(
            Code::UploadTooLarge,
            format!("the upload is {n} bytes; the limit is {max} bytes"),
        ));
    }
    let stream = body.into_data_stream().map_err(std::io::Error::other);
    let view = svc.upload(ticket, Box::pin(stream)).await?;
    Ok((StatusCode::CREATED, Json(view)).into_response())
}

/// Downloads a revision's bundle.
///
/// Scope `workloads:read`. `HEAD` answers the same headers without the
/// body. Honours `If-None-Match` (`304`) and a single `Range` (`206`), with
/// `If-Range`.
#[utoipa::path(
    get,
    path = "/v1/workloads/{name}/revisions/{revision}/bundle",
    operation_id = "downloadBundle",
    tag = "workloads",
    params(
        ("name" = String, Path, description = "Workload name"),
        ("revision" = String, Path, description = "The revision, as the upload answered it"),
        Delegation
    ),
    responses(
        (
            status = OK,
            description = "The bundle.",
            body = BundleBytes,
            content_type = "application/vnd.rossoctl.context",
            headers(
                ("ETag" = String, description = "`\"sha256:<digest of the stored bundle>\"`"),
                ("X-Context-Revision" = String, description = "The revision")
            )
        ),
        (
            status = PARTIAL_CONTENT,
            description = "The requested range of the bundle.",
            body = BundleBytes,
            content_type = "application/vnd.rossoctl.context"
        ),
        (status = NOT_MODIFIED, description = "`If-None-Match` names the bundle's `ETag`."),
        Errors<DownloadErrors>
    ),
    security(("bearer" = []), ("shAuth" = []))
)]
async fn download(
    State(svc): State<WorkloadService>,
    principal: Principal,
    ApiPath((id, revision)): ApiPath<(String, String)>,
    method: Method,
    headers: HeaderMap,
) -> ApiResult<Response> {
    principal.require(Scope::WorkloadsRead)?;
    let owner = principal.owner().key();
    let name = workload_name(id)?;
    let revision = match parse_revision(revision) {
        Ok(r) => r,
        Err(invalid) => {
            // A missing workload answers 404 before a malformed revision.
            svc.get(&owner, &name).await?;
            return Err(invalid.into());
        }
    };
    let rev = svc.locate(&owner, &name, &revision).await?;
    let etag = format!("\"sha256:{}\"", rev.bundle_digest);
    let mut out = HeaderMap::new();
    out.insert(header::ETAG, header_value(&etag)?);
    out.insert(
        header::CACHE_CONTROL,
        HeaderValue::from_static("private, max-age=31536000, immutable"),
    );
    out.insert("x-context-revision", header_value(&rev.revision)?);
    out.insert(header::ACCEPT_RANGES, HeaderValue::from_static("bytes"));

    if etag_matches(headers.get(header::IF_NONE_MATCH), &etag) {
        return Ok((StatusCode::NOT_MODIFIED, out).into_response());
    }
    let len = rev.bytes;
    let range = match requested_range(&headers, &etag, len) {
        Ok(r) => r,
        Err(()) => {
            out.insert(
                header::CONTENT_RANGE,
                header_value(&format!("bytes */{len}"))?,
            );
            let err = ApiError::new(
                Code::RangeNotSatisfiable,
                format!("the bundle is {len} bytes; the requested range is outside it"),
            );
            return Ok((out, err).into_response());
        }
    };
    out.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static(BUNDLE_MEDIA_TYPE),
    );
    let (status, start, end) = match range {
        Some((start, end)) => {
            out.insert(
                header::CONTENT_RANGE,
                header_value(&format!("bytes {start}-{}/{len}", end - 1))?,
            );
            (StatusCode::PARTIAL_CONTENT, start, end)
        }
        None => (StatusCode::OK, 0, len),
    };
    out.insert(header::CONTENT_LENGTH, HeaderValue::from(end - start));
    // HEAD answers from the record alone: it must neither load the bundle
    // into the cache (evicting what GETs use) nor count as a download.
    if method == Method::HEAD {
        return Ok((status, out).into_response());
    }
    let bundle = svc.open_bundle(&name, &rev).await?;
    let stream = bundle
        .stream(start, end)
        .await
        .map_err(|e| ApiError::internal(format!("streaming bundle {}: {e}", rev.bundle_digest)))?;
    Ok((status, out, Body::from_stream(stream)).into_response())
}

pub(super) fn header_value(s: &str) -> ApiResult<HeaderValue> {
    HeaderValue::from_str(s).map_err(ApiError::internal)
}

/// Whether `If-None-Match` (a list, or `*`) names `etag` (weak compare).
fn etag_matches(value: Option<&HeaderValue>, etag: &str) -> bool {
    let Some(v) = value.and_then(|v| v.to_str().ok()) else {
        return false;
    };
    v.split(',')
        .map(str::trim)
        .any(|tag| tag == "*" || tag.strip_prefix("W/").unwrap_or(tag) == etag)
}

/// The single byte range to serve, as `start..end`: `Ok(None)` serves the
/// whole bundle (no, ignorable or multiple ranges, or a stale `If-Range`);
/// `Err` is unsatisfiable (416).
pub(super) fn requested_range(
    headers: &HeaderMap,
    etag: &str,
    len: u64,
) -> Result<Option<(u64, u64)>, ()> {
    let Some(value) = headers.get(header::RANGE).and_then(|v| v.to_str().ok()) else {
        return Ok(None);
    };
    if let Some(if_range) = headers.get(header::IF_RANGE) {
        if if_range.to_str().ok() != Some(etag) {
            return Ok(None);
        }
    }
    use http_range_header::RangeUnsatisfiableError as E;
    let parsed = match http_range_header::parse_range_header(value) {
        Ok(p) => p,
        Err(E::Unsatisfiable) => return Err(()),
        // Malformed ranges may be ignored (RFC 9110 §14.2).
        Err(_) => return Ok(None),
    };
    match parsed.validate(len) {
        Ok(ranges) if ranges.len() == 1 => {
            let r = &ranges[0];
            Ok(Some((*r.start(), r.end() + 1)))
        }
        // Several ranges: serve the whole bundle rather than multipart.
        Ok(_) => Ok(None),
        Err(E::Unsatisfiable) => Err(()),
        Err(_) => Ok(None),
    }
}
