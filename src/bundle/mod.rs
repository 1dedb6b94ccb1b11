//! Streaming inspection of gzip-compressed tar bundles, the canonical
//! archive, and revision digests. Knows nothing about HTTP.
//!
//! TEMPORARY placeholder with the bundle engine's public signatures, so the
//! gateway compiles before the real engine lands on main. The lead takes
//! main's `src/bundle/` over this file at merge.

use std::path::PathBuf;

/// Bounds enforced while streaming.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Limits {
    /// Most compressed bytes.
    pub compressed_bytes: u64,
    /// Most inflated bytes.
    pub inflated_bytes: u64,
    /// Most entries.
    pub entries: u64,
    /// Largest file.
    pub file_bytes: u64,
    /// Longest path.
    pub path_bytes: usize,
    /// Deepest path.
    pub depth: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            compressed_bytes: 256 << 20,
            inflated_bytes: 1280 << 20,
            entries: 10_000,
            file_bytes: 256 << 20,
            path_bytes: 4096,
            depth: 64,
        }
    }
}

/// How the canonical bundle is written.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct CanonicalOptions {
    /// gzip level.
    pub gzip_level: u32,
    /// Spool directory.
    pub temp_dir: Option<PathBuf>,
}

/// The result of the upload path.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Report {
    /// Revision.
    pub revision: String,
    /// Bundle digest.
    pub bundle_digest: String,
    /// Files.
    pub files: u64,
    /// Dirs.
    pub dirs: u64,
    /// Entries.
    pub entries: u64,
    /// Inflated bytes.
    pub inflated_bytes: u64,
    /// Compressed bytes.
    pub compressed_bytes: u64,
    /// Bundle bytes.
    pub bundle_bytes: u64,
    /// Input inflated bytes.
    pub input_inflated_bytes: u64,
    /// Input entries.
    pub input_entries: u64,
}

/// Why a bundle was refused.
#[derive(Debug, thiserror::Error)]
pub enum BundleError {
    /// Reading the input failed.
    #[error("reading the bundle: {source}")]
    Io {
        /// The cause.
        source: std::io::Error,
        /// The entry being read.
        entry: Option<String>,
    },
    /// Placeholder.
    #[error("internal: {detail}")]
    Internal {
        /// Detail.
        detail: String,
    },
}

impl BundleError {
    /// Reason code.
    pub fn code(&self) -> &'static str {
        "internal_error"
    }
    /// Offending entry.
    pub fn entry(&self) -> Option<&str> {
        None
    }
    /// 413 class.
    pub fn is_too_large(&self) -> bool {
        false
    }
    /// The bundle is at fault.
    pub fn is_rejection(&self) -> bool {
        false
    }
}

fn missing() -> BundleError {
    BundleError::Internal {
        detail: "bundle engine not merged yet".into(),
    }
}

/// Validates and canonicalises.
pub fn canonicalize<R: std::io::Read, W: std::io::Write>(
    _input: R,
    _limits: &Limits,
    _opts: &CanonicalOptions,
    _out: W,
) -> Result<Report, BundleError> {
    Err(missing())
}

/// Async face of [`canonicalize`].
pub async fn canonicalize_async<R: tokio::io::AsyncRead + Unpin + Send + 'static>(
    _input: R,
    _limits: Limits,
    _opts: CanonicalOptions,
    _out: std::fs::File,
) -> Result<Report, BundleError> {
    Err(missing())
}

/// Packs a directory.
pub fn pack_dir<W: std::io::Write>(
    _dir: &std::path::Path,
    _limits: &Limits,
    _opts: &CanonicalOptions,
    _out: W,
) -> Result<Report, BundleError> {
    Err(missing())
}
