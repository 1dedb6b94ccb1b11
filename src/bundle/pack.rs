//! Packing a directory on disk into the canonical bundle, with the same
//! rules as an upload (no links, devices, FIFOs or sockets; the same path
//! and size limits; `checksums.json` verified when present).

use std::ffi::OsString;
use std::fs::{self, File};
use std::io::{self, Read, Write};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::path::{Path, PathBuf};

use super::canonical::writer::hex;
use super::canonical::{encoding, pack_tree};
use super::context_layout;
use super::error::{BundleError, DeviceKind, LinkKind};
use super::limits::{CanonicalOptions, Limits};
use super::path::{display_name, normalize};
use super::reader::BLOCK;
use super::report::{Inspection, Report};
use super::tree::{FileNode, Tree};

/// Packs `dir` into the canonical bundle written to `out`. Files are read
/// once to check `checksums.json` (if present) and once to emit; a file
/// that shrinks meanwhile fails with `io_error`.
pub fn pack_dir<W: Write + Send>(
    dir: &Path,
    limits: &Limits,
    opts: &CanonicalOptions,
    out: W,
) -> Result<Report, BundleError> {
    let meta = fs::metadata(dir).map_err(|source| BundleError::Io {
        source,
        entry: None,
    })?;
    if !meta.is_dir() {
        return Err(BundleError::Io {
            source: io::Error::new(io::ErrorKind::InvalidInput, "not a directory"),
            entry: None,
        });
    }
    let mut walk = Walk {
        limits,
        tree: Tree::default(),
        sources: Vec::new(),
        entries: 0,
        tar_estimate: 2 * BLOCK,
    };
    walk.dir(dir, &[])?;
    let Walk { tree, sources, .. } = walk;

    let mut open = |path: &str, f: &FileNode| -> Result<Box<dyn Read>, BundleError> {
        let source = usize::try_from(f.offset)
            .ok()
            .and_then(|i| sources.get(i))
            .ok_or_else(|| BundleError::Internal {
                detail: format!("no source for {path}"),
            })?;
        let file = File::open(source).map_err(|source| BundleError::Io {
            source,
            entry: Some(path.to_owned()),
        })?;
        Ok(Box::new(file.take(f.size)))
    };
    let read_err = |path: &str, source: io::Error| BundleError::Io {
        source,
        entry: Some(path.to_owned()),
    };
    context_layout::verify(&tree, &mut open, &read_err)?;
    let (files, dirs) = (tree.files(), tree.dirs());
    let (emitted, written) = pack_tree(
        tree,
        &mut open,
        &read_err,
        opts.gzip_level,
        opts.deflate_threads,
        out,
    )?;
    Ok(Report {
        inspection: Inspection {
            revision: hex(&emitted.revision),
            files,
            dirs,
            entries: emitted.entries,
            inflated_bytes: emitted.tar_bytes,
            compressed_bytes: 0,
            input_inflated_bytes: emitted.tar_bytes,
            input_entries: emitted.entries,
        },
        bundle_digest: hex(&written.digest),
        bundle_bytes: written.bytes,
        bundle_encoding: encoding(opts.gzip_level),
    })
}

/// Directory walk state.
struct Walk<'l> {
    limits: &'l Limits,
    tree: Tree,
    /// Disk path of each file; `FileNode::offset` indexes this.
    sources: Vec<PathBuf>,
    entries: u64,
    /// Upper estimate of the canonical tar size, for the inflated limit.
    tar_estimate: u64,
}

impl Walk<'_> {
    /// Adds the children of `fs_dir` (archive path `rel`), sorted by name.
    fn dir(&mut self, fs_dir: &Path, rel: &[u8]) -> Result<(), BundleError> {
        let shown = || (!rel.is_empty()).then(|| display_name(rel));
        let io_err = |source: io::Error| BundleError::Io {
            source,
            entry: shown(),
        };
        let mut children: Vec<(OsString, PathBuf)> = Vec::new();
        for child in fs::read_dir(fs_dir).map_err(io_err)? {
            let child = child.map_err(io_err)?;
            children.push((child.file_name(), child.path()));
        }
        children.sort_by(|a, b| a.0.as_bytes().cmp(b.0.as_bytes()));
        for (name, fs_path) in children {
            let mut raw = rel.to_vec();
            if !raw.is_empty() {
                raw.push(b'/');
            }
            raw.extend_from_slice(name.as_bytes());
            // normalize() also rejects non-UTF-8 names and backslashes.
            let Some(path) = normalize(&raw, self.limits)? else {
                continue;
            };
            let entry = path.as_str().to_owned();
            self.entries += 1;
            if self.entries > self.limits.entries {
                return Err(BundleError::TooManyEntries {
                    limit: self.limits.entries,
                    entry,
                });
            }
            let meta = fs::symlink_metadata(&fs_path).map_err(|source| BundleError::Io {
                source,
                entry: Some(entry.clone()),
            })?;
            let ft = meta.file_type();
            // Headers, plus a PAX header when the path may not fit ustar.
            let header_cost = if raw.len() > 100 { 3 * BLOCK } else { BLOCK }
                + (raw.len() as u64).div_ceil(BLOCK) * BLOCK;
            if ft.is_symlink() {
                return Err(BundleError::LinkNotAllowed {
                    entry,
                    kind: LinkKind::Symbolic,
                });
            } else if ft.is_dir() {
                self.tree.add_dir(path)?;
                self.add_estimate(header_cost, &entry)?;
                self.dir(&fs_path, &raw)?;
            } else if ft.is_file() {
                let size = meta.len();
                if size > self.limits.file_bytes {
                    return Err(BundleError::FileTooLarge {
                        entry,
                        size,
                        limit: self.limits.file_bytes,
                    });
                }
                let node = FileNode {
                    size,
                    exec: meta.permissions().mode() & 0o100 != 0,
                    offset: self.sources.len() as u64,
                };
                self.tree.add_file(path, node)?;
                self.sources.push(fs_path);
                self.add_estimate(header_cost + size.div_ceil(BLOCK) * BLOCK, &entry)?;
            } else if ft.is_fifo() {
                return Err(BundleError::FifoNotAllowed { entry });
            } else if ft.is_char_device() || ft.is_block_device() {
                let kind = if ft.is_char_device() {
                    DeviceKind::Char
                } else {
                    DeviceKind::Block
                };
                return Err(BundleError::DeviceNotAllowed { entry, kind });
            } else {
                return Err(BundleError::UnknownEntryType {
                    entry,
                    kind: "socket or other special file".into(),
                });
            }
        }
        Ok(())
    }

    fn add_estimate(&mut self, bytes: u64, entry: &str) -> Result<(), BundleError> {
        self.tar_estimate = self.tar_estimate.saturating_add(bytes);
        if self.tar_estimate > self.limits.inflated_bytes {
            return Err(BundleError::InflatedTooLarge {
                limit: self.limits.inflated_bytes,
                entry: Some(entry.to_owned()),
            });
        }
        Ok(())
    }
}
