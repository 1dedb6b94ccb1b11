//! Workload calls of the typed client.

use std::io::Write;
use std::path::{Path, PathBuf};

use futures::{StreamExt, TryStreamExt};
use reqwest::{header, Body, Method};
use serde_json::json;
use sha2::{Digest, Sha256};

use super::{Client, ClientError};
use crate::workload::{RevisionView, UploadGrantView, WorkloadView, BUNDLE_MEDIA_TYPE};

/// What a verified download wrote.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct DownloadReport {
    /// Where the bundle was written.
    pub path: PathBuf,
    /// Bytes written.
    pub bytes: u64,
    /// sha256 of the bundle, verified against the `ETag`.
    pub bundle_digest: String,
    /// sha256 of the decompressed tar, verified against the revision.
    pub revision: String,
}

fn path_segment(s: &str) -> String {
    // Names are DNS labels and revisions hex; escape anything else so a
    // typo cannot address another route.
    s.bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() || b == b'-' || b == b'_' || b == b'.' {
                (b as char).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect()
}

fn io_err(path: &Path) -> impl FnOnce(std::io::Error) -> ClientError + '_ {
    move |source| ClientError::Io {
        path: path.to_owned(),
        source,
    }
}

/// A streaming request body from a file, reporting progress in bytes.
async fn file_body(
    path: &Path,
    progress: impl Fn(u64) + Send + Sync + 'static,
) -> Result<(Body, u64), ClientError> {
    let file = tokio::fs::File::open(path).await.map_err(io_err(path))?;
    let len = file.metadata().await.map_err(io_err(path))?.len();
    let mut sent = 0u64;
    let stream =
        tokio_util::io::ReaderStream::with_capacity(file, 256 * 1024).inspect_ok(move |chunk| {
            sent += chunk.len() as u64;
            progress(sent);
        });
    Ok((Body::wrap_stream(stream), len))
}

impl Client {
    /// `POST /v1/workloads`: creates a workload (with its upload grant).
    pub async fn create_workload(
        &self,
        name: Option<&str>,
        kind: Option<&str>,
    ) -> Result<WorkloadView, ClientError> {
        let mut body = serde_json::Map::new();
        if let Some(n) = name {
            body.insert("name".into(), json!(n));
        }
        if let Some(k) = kind {
            body.insert("type".into(), json!(k));
        }
        self.send_json(self.request(Method::POST, "/v1/workloads").json(&body))
            .await
    }

    /// `GET /v1/workloads/{name}`.
    pub async fn workload(&self, name: &str) -> Result<WorkloadView, ClientError> {
        let path = format!("/v1/workloads/{}", path_segment(name));
        self.send_json(self.request(Method::GET, &path)).await
    }

    /// `GET /v1/workloads`: the caller's workloads.
    pub async fn workloads(&self) -> Result<Vec<WorkloadView>, ClientError> {
        #[derive(serde::Deserialize)]
        struct List {
            workloads: Vec<WorkloadView>,
        }
        let list: List = self
            .send_json(self.request(Method::GET, "/v1/workloads"))
            .await?;
        Ok(list.workloads)
    }

    /// `DELETE /v1/workloads/{name}`.
    pub async fn delete_workload(&self, name: &str) -> Result<(), ClientError> {
        let path = format!("/v1/workloads/{}", path_segment(name));
        self.send(self.request(Method::DELETE, &path)).await?;
        Ok(())
    }

    /// `POST /v1/workloads/{name}/activate`.
    pub async fn activate_workload(
        &self,
        name: &str,
        revision: &str,
    ) -> Result<WorkloadView, ClientError> {
        let path = format!("/v1/workloads/{}/activate", path_segment(name));
        self.send_json(
            self.request(Method::POST, &path)
                .json(&json!({ "revision": revision })),
        )
        .await
    }

    /// `POST /v1/workloads/{name}/uploads`: a fresh one-time upload grant.
    pub async fn upload_grant(&self, name: &str) -> Result<UploadGrantView, ClientError> {
        let path = format!("/v1/workloads/{}/uploads", path_segment(name));
        self.send_json(self.request(Method::POST, &path)).await
    }

    /// `PUT /v1/workloads/{name}/bundle` with the owner's token.
    pub async fn upload_bundle(
        &self,
        name: &str,
        body: impl Into<Body>,
    ) -> Result<RevisionView, ClientError> {
        let path = format!("/v1/workloads/{}/bundle", path_segment(name));
        self.send_json(
            self.request(Method::PUT, &path)
                .header(header::CONTENT_TYPE, BUNDLE_MEDIA_TYPE)
                .body(body),
        )
        .await
    }

    /// Uploads the bundle file at `path`, calling `progress` with the bytes
    /// sent so far.
    pub async fn upload_bundle_file(
        &self,
        name: &str,
        path: &Path,
        progress: impl Fn(u64) + Send + Sync + 'static,
    ) -> Result<RevisionView, ClientError> {
        let (body, len) = file_body(path, progress).await?;
        let url = format!("/v1/workloads/{}/bundle", path_segment(name));
        self.send_json(
            self.request(Method::PUT, &url)
                .header(header::CONTENT_TYPE, BUNDLE_MEDIA_TYPE)
                .header(header::CONTENT_LENGTH, len)
                .body(body),
        )
        .await
    }

    /// `PUT` to a grant's URL with the grant's secret (no user token).
    pub async fn upload_with_grant(
        &self,
        grant: &UploadGrantView,
        body: impl Into<Body>,
    ) -> Result<RevisionView, ClientError> {
        let url = format!("{}{}", self.base, grant.url);
        let req = self
            .http
            .put(url)
            .bearer_auth(&grant.token)
            .header(header::CONTENT_TYPE, &grant.content_type)
            .body(body);
        self.send_json(req).await
    }

    /// `GET /v1/workloads/{name}/revisions/{revision}/bundle` into `out`
    /// (written to a temp file beside it, renamed when verified). The bundle
    /// digest is checked against the `ETag` and the decompressed tar's
    /// digest against the revision while writing; a mismatch leaves no file.
    pub async fn download_bundle(
        &self,
        name: &str,
        revision: &str,
        out: &Path,
        progress: impl Fn(u64, Option<u64>),
    ) -> Result<DownloadReport, ClientError> {
        let path = format!(
            "/v1/workloads/{}/revisions/{}/bundle",
            path_segment(name),
            path_segment(revision)
        );
        let resp = self.send(self.request(Method::GET, &path)).await?;
        let etag = resp
            .headers()
            .get(header::ETAG)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.trim_matches('"').strip_prefix("sha256:"))
            .map(str::to_owned)
            .ok_or_else(|| ClientError::Protocol("the download has no sha256 ETag".into()))?;
        let total = resp.content_length();
        let dir = match out.parent() {
            Some(p) if !p.as_os_str().is_empty() => p.to_owned(),
            _ => PathBuf::from("."),
        };
        let mut temp = tempfile::Builder::new()
            .prefix(".contextctl-download-")
            .tempfile_in(&dir)
            .map_err(io_err(&dir))?;
        let mut bundle_hash = Sha256::new();
        // Inflate while writing to pin the revision end to end.
        let mut tar = flate2::write::GzDecoder::new(HashWriter(Sha256::new()));
        let mut written = 0u64;
        let mut stream = resp.bytes_stream();
        while let Some(chunk) = stream.next().await {
            let chunk = chunk.map_err(|cause| ClientError::Transport {
                url: self.base.clone(),
                cause,
            })?;
            bundle_hash.update(&chunk);
            tar.write_all(&chunk)
                .map_err(|e| ClientError::Protocol(format!("the bundle is not valid gzip: {e}")))?;
            temp.write_all(&chunk).map_err(io_err(temp.path()))?;
            written += chunk.len() as u64;
            progress(written, total);
        }
        let tar_hash = tar
            .finish()
            .map_err(|e| ClientError::Protocol(format!("the bundle is not valid gzip: {e}")))?;
        let digest = hex::encode(bundle_hash.finalize());
        if digest != etag {
            return Err(ClientError::Protocol(format!(
                "downloaded bytes have sha256 {digest}, the service announced {etag}"
            )));
        }
        let tar_digest = hex::encode(tar_hash.0.finalize());
        if tar_digest != revision {
            return Err(ClientError::Protocol(format!(
                "the bundle unpacks to revision {tar_digest}, not {revision}"
            )));
        }
        temp.as_file().sync_all().map_err(io_err(out))?;
        temp.persist(out).map_err(|e| ClientError::Io {
            path: out.to_owned(),
            source: e.error,
        })?;
        Ok(DownloadReport {
            path: out.to_owned(),
            bytes: written,
            bundle_digest: digest,
            revision: tar_digest,
        })
    }
}

/// A `Write` that only hashes.
struct HashWriter(Sha256);

impl Write for HashWriter {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.update(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}
