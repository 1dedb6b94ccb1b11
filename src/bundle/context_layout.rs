//! The upstream `.context` layout: when a root-level `checksums.json` is
//! present, every listed file's sha256 must match and the inventory must
//! match exactly (every regular file except `checksums.json` itself).
//! `manifest.json` is an ordinary file here; it is covered by the checksums
//! like any other.

use std::collections::BTreeMap;
use std::io::{self, Read};

use serde::Deserialize;
use sha2::{Digest, Sha256};

use super::error::BundleError;
use super::tree::{FileNode, Node, Tree};

/// Name of the checksum inventory at the bundle root.
pub(crate) const CHECKSUMS: &str = "checksums.json";

/// `checksums.json` above this size is refused: it is read into memory, and
/// 10,000 entries with paths of a few hundred bytes fit comfortably.
const MAX_CHECKSUMS_BYTES: u64 = 16 * 1024 * 1024;

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Checksums {
    format_version: u32,
    algorithm: String,
    files: BTreeMap<String, String>,
}

/// Opens a file's content for hashing.
pub(crate) type Opener<'a> =
    dyn FnMut(&str, &FileNode) -> Result<Box<dyn Read + 'a>, BundleError> + 'a;

fn invalid(detail: impl Into<String>) -> BundleError {
    BundleError::ChecksumsInvalid {
        detail: detail.into(),
    }
}

/// Verifies the tree against its `checksums.json`, if it has one.
/// `read_err` classifies a failure to read content (storage or I/O).
pub(crate) fn verify(
    tree: &Tree,
    open: &mut Opener<'_>,
    read_err: &dyn Fn(&str, io::Error) -> BundleError,
) -> Result<bool, BundleError> {
    let Some(Node::File(node)) = tree.get(CHECKSUMS) else {
        return Ok(false);
    };
    if node.size > MAX_CHECKSUMS_BYTES {
        return Err(invalid("file too large"));
    }
    let mut raw = Vec::new();
    open(CHECKSUMS, node)?
        .read_to_end(&mut raw)
        .map_err(|e| read_err(CHECKSUMS, e))?;
    let sums: Checksums =
        serde_json::from_slice(&raw).map_err(|e| invalid(format!("not valid JSON: {e}")))?;
    if sums.format_version != 1 {
        return Err(invalid(format!(
            "unknown formatVersion {}",
            sums.format_version
        )));
    }
    if sums.algorithm != "sha256" {
        return Err(invalid(format!("unknown algorithm {:?}", sums.algorithm)));
    }
    // Inventory first: it is cheap and names the problem precisely.
    for (path, node) in tree.iter() {
        if matches!(node, Node::File(_))
            && path.as_str() != CHECKSUMS
            && !sums.files.contains_key(path.as_str())
        {
            return Err(BundleError::ChecksumFileUnlisted {
                entry: path.as_str().to_owned(),
            });
        }
    }
    for listed in sums.files.keys() {
        if listed == CHECKSUMS || !matches!(tree.get(listed), Some(Node::File(_))) {
            return Err(BundleError::ChecksumFileMissing {
                entry: listed.clone(),
            });
        }
    }
    let mut buf = vec![0u8; super::CHUNK];
    for (path, node) in tree.iter() {
        let Node::File(file) = node else { continue };
        let Some(expected) = sums.files.get(path.as_str()) else {
            continue;
        };
        let mut reader = open(path.as_str(), file)?;
        let mut hasher = Sha256::new();
        loop {
            let n = match reader.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(read_err(path.as_str(), e)),
            };
            hasher.update(&buf[..n]);
        }
        if !hex::encode(hasher.finalize()).eq_ignore_ascii_case(expected) {
            return Err(BundleError::ChecksumMismatch {
                entry: path.as_str().to_owned(),
            });
        }
    }
    Ok(true)
}
