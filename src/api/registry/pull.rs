//! The pull category of the distribution spec over a caller's workloads:
//! manifests (by the tag `active`, the tag `<revision>`, or
//! `sha256:<manifest digest>`), blobs (the config, and the layer: the
//! stored bundle, served through the same cache and file path as
//! downloads), and the tag list.

use axum::body::Body;
use axum::http::{header, HeaderMap, HeaderValue, Method, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::json;

use super::access::PullRight;
use super::error::{RegistryCode, RegistryError};
use crate::api::workloads::{header_value, requested_range};
use crate::store::RevisionRecord;
use crate::workload::oci::{OciImage, MANIFEST_MEDIA_TYPE};
use crate::workload::{Revision, WorkloadError, WorkloadName, WorkloadService};

/// The tag of a workload's active revision.
pub const ACTIVE_TAG: &str = "active";

/// One repository (`workloads/<name>`) as one caller sees it.
pub(super) struct Repo<'a> {
    /// `workloads/<name>`.
    pub(super) repo: &'a str,
    /// The workload's name.
    pub(super) name: &'a str,
    /// What the caller may pull of it.
    pub(super) right: PullRight,
}

/// The image of the workload's frozen revision, if it has one the caller
/// may see; `NAME_UNKNOWN` when the workload is not the caller's.
async fn image(
    svc: &WorkloadService,
    r: &Repo<'_>,
) -> Result<Option<(OciImage, RevisionRecord)>, RegistryError> {
    // An invalid name can never exist.
    let name = WorkloadName::try_from(r.name.to_owned())
        .map_err(|_| RegistryError::name_unknown(r.repo))?;
    let view = svc
        .get(&r.right.owner, &name)
        .await
        .map_err(|e| RegistryError::of_workload(r.repo, e))?;
    let Some(revision) = view.revision.filter(|_| view.status == "ready") else {
        return Ok(None);
    };
    if r.right
        .revision
        .as_deref()
        .is_some_and(|pin| pin != revision)
    {
        return Ok(None);
    }
    let revision = Revision::try_from(revision).map_err(|e| {
        RegistryError::new(
            RegistryCode::Unknown(StatusCode::INTERNAL_SERVER_ERROR),
            e.0,
        )
    })?;
    match svc.locate(&r.right.owner, &name, &revision).await {
        Ok(rec) => Ok(Some((OciImage::of(r.name, &rec), rec))),
        // Changed between the two reads: as if not there.
        Err(WorkloadError::RevisionNotFound(_) | WorkloadError::NotReady(_)) => Ok(None),
        Err(e) => Err(RegistryError::of_workload(r.repo, e)),
    }
}

fn manifest_unknown(r: &Repo<'_>, reference: &str) -> RegistryError {
    RegistryError::new(
        RegistryCode::ManifestUnknown,
        format!("manifest {reference} is not in {}", r.repo),
    )
    .detail(json!({ "name": r.repo, "reference": reference }))
}

/// `GET|HEAD /v2/<repo>/manifests/<reference>`.
pub(super) async fn manifest(
    svc: &WorkloadService,
    r: &Repo<'_>,
    reference: &str,
    method: &Method,
) -> Result<Response, RegistryError> {
    let Some((image, _)) = image(svc, r).await? else {
        return Err(manifest_unknown(r, reference));
    };
    let by_digest = reference
        .strip_prefix("sha256:")
        .is_some_and(|d| d == image.manifest_digest);
    if !(reference == ACTIVE_TAG || reference == image.revision || by_digest) {
        return Err(manifest_unknown(r, reference));
    }
    let digest = format!("sha256:{}", image.manifest_digest);
    let mut out = HeaderMap::new();
    out.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static(MANIFEST_MEDIA_TYPE),
    );
    out.insert(
        header::CONTENT_LENGTH,
        HeaderValue::from(image.manifest.len()),
    );
    out.insert(
        "docker-content-digest",
        header_value(&digest).map_err(api_internal)?,
    );
    out.insert(
        header::ETAG,
        header_value(&format!("\"{digest}\"")).map_err(api_internal)?,
    );
    if method == Method::HEAD {
        return Ok((StatusCode::OK, out).into_response());
    }
    Ok((StatusCode::OK, out, image.manifest).into_response())
}

fn api_internal(e: crate::api::ApiError) -> RegistryError {
    RegistryError::new(
        RegistryCode::Unknown(StatusCode::INTERNAL_SERVER_ERROR),
        e.message().to_owned(),
    )
}

/// `sha256:<64 lowercase hex>`, else `DIGEST_INVALID`.
fn parse_digest(digest: &str) -> Result<&str, RegistryError> {
    match digest.strip_prefix("sha256:") {
        Some(hex)
            if hex.len() == 64
                && hex
                    .bytes()
                    .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)) =>
        {
            Ok(hex)
        }
        _ => Err(RegistryError::new(
            RegistryCode::DigestInvalid,
            format!("invalid digest {digest:?}: expected sha256:<64 lowercase hex>"),
        )
        .detail(json!({ "digest": digest }))),
    }
}

/// `GET|HEAD /v2/<repo>/blobs/<digest>`: the config, or the layer (the
/// stored bundle). A single `Range` answers `206`.
pub(super) async fn blob(
    svc: &WorkloadService,
    r: &Repo<'_>,
    digest: &str,
    method: &Method,
    headers: &HeaderMap,
) -> Result<Response, RegistryError> {
    let hex = parse_digest(digest)?;
    let unknown = || {
        RegistryError::new(
            RegistryCode::BlobUnknown,
            format!("blob {digest} is not in {}", r.repo),
        )
        .detail(json!({ "name": r.repo, "digest": digest }))
    };
    let Some((image, rec)) = image(svc, r).await? else {
        return Err(unknown());
    };
    let len = if hex == image.config_digest {
        image.config.len() as u64
    } else if hex == image.layer_digest {
        image.layer_bytes
    } else {
        return Err(unknown());
    };
    let etag = format!("\"{digest}\"");
    let mut out = HeaderMap::new();
    out.insert(
        "docker-content-digest",
        header_value(digest).map_err(api_internal)?,
    );
    out.insert(header::ETAG, header_value(&etag).map_err(api_internal)?);
    out.insert(header::ACCEPT_RANGES, HeaderValue::from_static("bytes"));
    out.insert(
        header::CACHE_CONTROL,
        HeaderValue::from_static("private, max-age=31536000, immutable"),
    );
    let (status, start, end) = match requested_range(headers, &etag, len) {
        Ok(Some((start, end))) => {
            let range = format!("bytes {start}-{}/{len}", end - 1);
            out.insert(
                header::CONTENT_RANGE,
                header_value(&range).map_err(api_internal)?,
            );
            (StatusCode::PARTIAL_CONTENT, start, end)
        }
        Ok(None) => (StatusCode::OK, 0, len),
        Err(()) => {
            return Err(RegistryError::new(
                RegistryCode::SizeInvalid,
                format!("the blob is {len} bytes; the requested range is outside it"),
            )
            .header(header::CONTENT_RANGE, &format!("bytes */{len}")));
        }
    };
    out.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/octet-stream"),
    );
    out.insert(header::CONTENT_LENGTH, HeaderValue::from(end - start));
    // HEAD answers from the record: no cache load, no download counted.
    if method == Method::HEAD {
        return Ok((status, out).into_response());
    }
    if hex == image.config_digest {
        let part = image.config[start as usize..end as usize].to_vec();
        return Ok((status, out, part).into_response());
    }
    let bundle = svc
        .open_bundle(r.name, &rec)
        .await
        .map_err(|e| RegistryError::of_workload(r.repo, e))?;
    let stream = bundle.stream(start, end).await.map_err(|e| {
        RegistryError::new(
            RegistryCode::Unknown(StatusCode::INTERNAL_SERVER_ERROR),
            format!("streaming blob {digest}: {e}"),
        )
    })?;
    Ok((status, out, Body::from_stream(stream)).into_response())
}

/// `GET /v2/<repo>/tags/list[?n=<n>&last=<tag>]`: `active` and the
/// revision, in lexical order; with `n`, a `Link` to the next page.
pub(super) async fn tags(
    svc: &WorkloadService,
    r: &Repo<'_>,
    query: Option<&str>,
) -> Result<Response, RegistryError> {
    let mut tags: Vec<String> = match image(svc, r).await? {
        Some((image, _)) => vec![ACTIVE_TAG.to_owned(), image.revision],
        None => Vec::new(),
    };
    tags.sort();
    let mut n: Option<usize> = None;
    let mut last: Option<String> = None;
    for (k, v) in url::form_urlencoded::parse(query.unwrap_or("").as_bytes()) {
        match k.as_ref() {
            "n" => n = v.parse().ok(),
            "last" => last = Some(v.into_owned()),
            _ => {}
        }
    }
    if let Some(last) = &last {
        tags.retain(|t| t > last);
    }
    let mut out = HeaderMap::new();
    if let Some(n) = n {
        if tags.len() > n {
            tags.truncate(n);
            if let Some(end) = tags.last() {
                let link = format!("</v2/{}/tags/list?n={n}&last={end}>; rel=\"next\"", r.repo);
                out.insert(header::LINK, header_value(&link).map_err(api_internal)?);
            }
        }
    }
    let body = json!({ "name": r.repo, "tags": tags });
    Ok((StatusCode::OK, out, axum::Json(body)).into_response())
}

/// The answer of `GET /v2/` to an authenticated caller.
pub(super) fn base_answer() -> Response {
    (
        StatusCode::OK,
        [(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        )],
        "{}",
    )
        .into_response()
}
