//! Size and shape limits for uploaded bundles, and options for the canonical
//! archive.

use std::path::PathBuf;

use super::TempBudget;

/// One MiB, for readable defaults.
const MIB: u64 = 1024 * 1024;

/// Every bound the inspector enforces while it streams. All of them are
/// checked *during* the read, never after buffering the input.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Limits {
    /// Most compressed (gzip) bytes read from the input.
    pub compressed_bytes: u64,
    /// Most bytes the gzip stream may inflate to (the whole tar stream,
    /// headers and padding included).
    pub inflated_bytes: u64,
    /// Most tree entries: each distinct path counts once, whether a member
    /// lists it or the archive only implies it (a parent directory), and
    /// whatever the order (an explicit directory after its files adds
    /// nothing). The archive root (`./`) counts once if listed.
    pub entries: u64,
    /// Largest single regular file.
    pub file_bytes: u64,
    /// Longest path, in bytes, as written in the archive.
    pub path_bytes: usize,
    /// Deepest path, in components.
    pub depth: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            compressed_bytes: 256 * MIB,
            // 1.25 GiB: 1 GiB of content plus headroom for headers.
            inflated_bytes: 1280 * MIB,
            entries: 10_000,
            file_bytes: 256 * MIB,
            path_bytes: 4096,
            depth: 64,
        }
    }
}

/// How the canonical bundle is written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CanonicalOptions {
    /// gzip level (0–9) of the canonical bundle. The bundleDigest depends on
    /// it, so a deployment should keep it fixed.
    pub gzip_level: u32,
    /// Directory for the temporary spool of file contents; `None` uses the
    /// system temporary directory. Spool files are unnamed and vanish when
    /// the call returns, whatever its outcome.
    pub temp_dir: Option<PathBuf>,
    /// Budget the temporary files (spool, speculative gzip) are charged
    /// to, shared with concurrent calls; `None` is unlimited.
    pub temp_budget: Option<TempBudget>,
    /// Deflate threads of the canonical gzip, 1 to 4 (more are clamped to
    /// 4); `0`: one per core, at most 4. The bundle's bytes never depend on
    /// it.
    pub deflate_threads: usize,
}

impl Default for CanonicalOptions {
    fn default() -> Self {
        // Level 1: the upload path is CPU-bound on deflate; higher levels
        // cost 3-4x the time for a few percent of size.
        Self {
            gzip_level: 1,
            temp_dir: None,
            temp_budget: None,
            deflate_threads: 0,
        }
    }
}
