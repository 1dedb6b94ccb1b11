//! `/v1/workloads` and `/v1/uploads`: create, upload, activate, read, list,
//! download and delete owner-scoped workloads. `/v1/uploads` also serves
//! trusted upload capabilities (`super::trusted`). Handlers only extract,
//! authorise, call the [`WorkloadService`] and map its answer.

use axum::body::Body;
use axum::extract::State;
use axum::http::{header, HeaderMap, HeaderValue, Method, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post, put};
use axum::{Json, Router};
use futures::TryStreamExt;
use serde::Deserialize;
use serde_json::json;

use super::error::{ApiError, ApiResult};
use super::extract::{bearer_token, ApiJson};
use super::rejection::ApiPath;
use crate::app::AppState;
use crate::auth::{Principal, Scope};
use crate::workload::{CreateWorkload, UploadTicket, WorkloadService, BUNDLE_MEDIA_TYPE};

pub(super) fn router() -> Router<AppState> {
    Router::new()
        .route("/v1/workloads", post(create).get(list))
        .route("/v1/workloads/{id}", get(read).delete(remove))
        .route("/v1/workloads/{id}/uploads", post(new_grant))
        .route("/v1/workloads/{id}/bundle", put(upload_by_owner))
        .route("/v1/workloads/{id}/activate", post(activate))
        .route(
            "/v1/workloads/{id}/revisions/{revision}/bundle",
            get(download),
        )
        .route("/v1/uploads/{grant}", put(upload_by_grant))
}

/// `POST /v1/workloads` body.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CreateBody {
    /// Requested name.
    pub name: Option<String>,
    /// Context type.
    #[serde(rename = "type")]
    pub kind: Option<String>,
}

/// `POST /v1/workloads/{id}/activate` body.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ActivateBody {
    /// The revision to freeze.
    pub revision: String,
}

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

async fn list(State(svc): State<WorkloadService>, principal: Principal) -> ApiResult<Response> {
    principal.require(Scope::WorkloadsRead)?;
    let workloads = svc.list(&principal.owner().key()).await?;
    Ok(Json(json!({ "workloads": workloads })).into_response())
}

async fn read(
    State(svc): State<WorkloadService>,
    principal: Principal,
    ApiPath(id): ApiPath<String>,
) -> ApiResult<Response> {
    principal.require(Scope::WorkloadsRead)?;
    Ok(Json(svc.get(&principal.owner().key(), &id).await?).into_response())
}

async fn remove(
    State(svc): State<WorkloadService>,
    principal: Principal,
    ApiPath(id): ApiPath<String>,
) -> ApiResult<StatusCode> {
    principal.require(Scope::WorkloadsWrite)?;
    svc.delete(&principal.owner().key(), &id).await?;
    Ok(StatusCode::NO_CONTENT)
}

async fn new_grant(
    State(svc): State<WorkloadService>,
    principal: Principal,
    ApiPath(id): ApiPath<String>,
) -> ApiResult<Response> {
    principal.require(Scope::WorkloadsWrite)?;
    let grant = svc.grant(&principal.owner().key(), &id).await?;
    Ok((StatusCode::CREATED, Json(grant)).into_response())
}

async fn activate(
    State(svc): State<WorkloadService>,
    principal: Principal,
    ApiPath(id): ApiPath<String>,
    ApiJson(body): ApiJson<ActivateBody>,
) -> ApiResult<Response> {
    principal.require(Scope::WorkloadsWrite)?;
    let view = svc
        .activate(&principal.owner().key(), &id, &body.revision)
        .await?;
    Ok(Json(view).into_response())
}

async fn upload_by_owner(
    State(svc): State<WorkloadService>,
    principal: Principal,
    ApiPath(id): ApiPath<String>,
    headers: HeaderMap,
    body: Body,
) -> ApiResult<Response> {
    principal.require(Scope::WorkloadsWrite)?;
    let ticket = svc.owner_upload(&principal.owner().key(), &id).await?;
    upload(&svc, ticket, &headers, body).await
}

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
    let content_type = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .map(|v| {
            v.split(';')
                .next()
                .unwrap_or("")
                .trim()
                .to_ascii_lowercase()
        });
    match content_type.as_deref() {
        Some(BUNDLE_MEDIA_TYPE | "application/gzip") => {}
        other => {
            return Err(ApiError::new(
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                "unsupported_media_type",
                format!(
                    "bundles are sent as {BUNDLE_MEDIA_TYPE} or application/gzip, not {}",
                    other.unwrap_or("(no Content-Type)")
                ),
            ))
        }
    }
    let max = svc.settings().limits.compressed_bytes;
    let declared = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if let Some(n) = declared.filter(|n| *n > max) {
        // Refused before a byte of the body is read.
        return Err(ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "upload_too_large",
            format!("the upload is {n} bytes; the limit is {max} bytes"),
        ));
    }
    let stream = body.into_data_stream().map_err(std::io::Error::other);
    let view = svc.upload(ticket, Box::pin(stream)).await?;
    Ok((StatusCode::CREATED, Json(view)).into_response())
}

async fn download(
    State(svc): State<WorkloadService>,
    principal: Principal,
    ApiPath((id, revision)): ApiPath<(String, String)>,
    method: Method,
    headers: HeaderMap,
) -> ApiResult<Response> {
    principal.require(Scope::WorkloadsRead)?;
    let rev = svc.locate(&principal.owner().key(), &id, &revision).await?;
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
                StatusCode::RANGE_NOT_SATISFIABLE,
                "range_not_satisfiable",
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
    let bundle = svc.open_bundle(&id, &rev).await?;
    let stream = bundle
        .stream(start, end)
        .await
        .map_err(|e| ApiError::internal(format!("streaming bundle {}: {e}", rev.bundle_digest)))?;
    Ok((status, out, Body::from_stream(stream)).into_response())
}

fn header_value(s: &str) -> ApiResult<HeaderValue> {
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
fn requested_range(headers: &HeaderMap, etag: &str, len: u64) -> Result<Option<(u64, u64)>, ()> {
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
