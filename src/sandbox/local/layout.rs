//! Where things live in the tree, and the file-system primitives every
//! mutation uses (atomic JSON writes, exclusive directory creation,
//! removals that tolerate a missing target).

use std::fs;
use std::io;
use std::path::{Path, PathBuf};

use serde::de::DeserializeOwned;
use serde::Serialize;

use super::Inner;
use crate::fsutil;
use crate::pool::BackendError;

/// Extension of pool record files.
pub(super) const POOL_FILE_EXT: &str = "json";
/// Metadata file of a volume directory.
pub(super) const VOLUME_FILE: &str = "volume.json";
/// Metadata file of a sandbox directory.
pub(super) const SANDBOX_FILE: &str = "sandbox.json";

impl Inner {
    /// `namespaces/<ns>`.
    pub(super) fn ns_dir(&self, ns: &str) -> PathBuf {
        self.namespaces_dir().join(ns)
    }

    /// The folder of every namespace.
    pub(super) fn namespaces_dir(&self) -> PathBuf {
        self.root.join("namespaces")
    }

    /// Pool records, in the service namespace.
    pub(super) fn pools_dir(&self) -> PathBuf {
        self.ns_dir(&self.namespace).join("pools")
    }

    /// The record of `pool`.
    pub(super) fn record_path(&self, pool: &str) -> PathBuf {
        self.pools_dir().join(format!("{pool}.{POOL_FILE_EXT}"))
    }

    /// Volume `name` in `ns`.
    pub(super) fn volume_dir(&self, ns: &str, name: &str) -> PathBuf {
        self.ns_dir(ns).join("volumes").join(name)
    }

    /// Sandbox `name`, in the service namespace.
    pub(super) fn sandbox_dir(&self, name: &str) -> PathBuf {
        self.ns_dir(&self.namespace).join("sandboxes").join(name)
    }

    /// Claim `name`, in the service namespace.
    pub(super) fn claim_path(&self, name: &str) -> PathBuf {
        self.ns_dir(&self.namespace)
            .join("claims")
            .join(format!("{name}.json"))
    }
}

/// Maps an I/O error to an internal backend error saying what was being done.
pub(super) fn internal(context: impl Into<String>) -> impl FnOnce(io::Error) -> BackendError {
    let context = context.into();
    move |e| BackendError::internal(context, e)
}

/// The JSON document at `path`; `None` when there is no file.
pub(super) fn read_json<T: DeserializeOwned>(path: &Path) -> io::Result<Option<T>> {
    match fs::read(path) {
        Ok(bytes) => serde_json::from_slice(&bytes).map(Some).map_err(|e| {
            io::Error::new(
                io::ErrorKind::InvalidData,
                format!("{}: {e}", path.display()),
            )
        }),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e),
    }
}

/// Writes `value` as JSON, atomically.
pub(super) fn write_json<T: Serialize>(path: &Path, value: &T) -> io::Result<()> {
    let bytes = serde_json::to_vec_pretty(value).map_err(io::Error::other)?;
    fsutil::write_atomic(path, &bytes, 0o600)
}

/// Creates `dir`, failing if it exists (its parents may).
pub(super) fn create_new_dir(dir: &Path) -> io::Result<()> {
    if let Some(parent) = dir.parent() {
        fsutil::ensure_dir(parent, 0o755)?;
    }
    // `create_dir` (not `create_dir_all`) fails on an existing directory.
    fs::create_dir(dir)
}

/// Removes `dir` and its contents; a missing one is fine.
pub(super) fn remove_dir(dir: &Path) -> io::Result<()> {
    match fs::remove_dir_all(dir) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(e),
    }
}

/// Removes `path`; a missing one is fine.
pub(super) fn remove_file(path: &Path) -> io::Result<()> {
    match fs::remove_file(path) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(e),
    }
}
