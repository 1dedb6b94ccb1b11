//! The tree manifest of a canonical bundle: what its extracted, read-only
//! tree looks like to the delivery script's scan (`src/delivery/deliver.sh`,
//! "the cache-dir scan"), computed by the gateway from the bundle itself.
//!
//! The scan walks a tree the way POSIX `sh` globbing lists it under
//! `LC_ALL=C`: in each directory first the names that do not start with
//! `.` (`*`), then those that start with `.` but not `..` (`.[!.]*`), then
//! those that start with `..` (`..?*`), each group in byte order; a
//! directory's entries follow the directory itself. It hashes three
//! streams, each with one `sha256sum`:
//!
//! - **names**: for every entry, `<kind> <len>:<path>\n`, kind `d`, `f` or
//!   `l`, `len` the path's length in bytes (so no name can mimic a line);
//! - **modes**: for every regular file, `stat -c '%f %s'`: the raw mode in
//!   lowercase hex and the size (`8124 12\n` for a read-only file of 12
//!   bytes);
//! - **content**: for every regular file, its sha256 in hex and `\n`.
//!
//! A cache hit is checked against the gateway's copy of these digests, so a
//! tenant that edits a published tree *and* whatever the sandbox keeps
//! next to it still cannot make it pass.

use std::collections::HashMap;
use std::io::{self, Read};

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use super::canonical::writer::hex;

/// Extracted file modes: the canonical tar stores 0644 and 0755; `tar
/// --no-same-permissions` under umask 022 keeps them and `chmod -R a-w`
/// takes the write bits.
const READ_ONLY_FILE: u32 = 0o100_444;
const READ_ONLY_EXEC: u32 = 0o100_555;

/// The digests of a canonical bundle's extracted tree, as the delivery
/// scan computes them (module docs).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TreeManifest {
    /// sha256 of the names stream (every entry's kind and path).
    pub names: String,
    /// sha256 of the modes stream (every file's mode and size).
    pub modes: String,
    /// sha256 of the content stream (every file's sha256).
    pub content: String,
}

/// Why a manifest could not be computed.
#[derive(Debug, thiserror::Error)]
pub enum ManifestError {
    /// The bundle could not be read or inflated, or its tar is malformed.
    #[error("reading the bundle: {0}")]
    Io(#[from] io::Error),
    /// The tar holds something a canonical archive never does.
    #[error("not a canonical archive: {0}")]
    NotCanonical(String),
}

/// One entry of the extracted tree.
enum Kind {
    Dir,
    File { mode: u32, size: u64, sha: [u8; 32] },
}

/// Computes the manifest of the gzip bundle read from `bundle`.
pub fn manifest_of_bundle(bundle: impl Read) -> Result<TreeManifest, ManifestError> {
    let gz = flate2::read::MultiGzDecoder::new(io::BufReader::with_capacity(1 << 20, bundle));
    manifest_of_tar(io::BufReader::with_capacity(1 << 20, gz))
}

/// Computes the manifest of the canonical tar read from `tar`.
fn manifest_of_tar(tar: impl Read) -> Result<TreeManifest, ManifestError> {
    // Children of every directory ("" is the root), by name.
    let mut dirs: HashMap<String, Vec<(String, Kind)>> = HashMap::new();
    dirs.insert(String::new(), Vec::new());
    let mut archive = tar::Archive::new(tar);
    let mut buf = vec![0u8; 256 * 1024];
    for entry in archive.entries()? {
        let mut entry = entry?;
        let raw = entry.path_bytes().into_owned();
        let path = std::str::from_utf8(&raw)
            .map_err(|_| ManifestError::NotCanonical("a path is not UTF-8".into()))?
            .trim_end_matches('/')
            .to_owned();
        if path.is_empty() {
            return Err(ManifestError::NotCanonical(
                "an entry has an empty path".into(),
            ));
        }
        let mode = entry.header().mode()?;
        let kind = match entry.header().entry_type() {
            tar::EntryType::Directory => {
                dirs.entry(path.clone()).or_default();
                Kind::Dir
            }
            tar::EntryType::Regular => {
                let mode = match mode & 0o7777 {
                    0o644 => READ_ONLY_FILE,
                    0o755 => READ_ONLY_EXEC,
                    other => {
                        return Err(ManifestError::NotCanonical(format!(
                            "file {path:?} has mode {other:o}"
                        )))
                    }
                };
                let mut hasher = Sha256::new();
                let mut size = 0u64;
                loop {
                    let n = entry.read(&mut buf)?;
                    if n == 0 {
                        break;
                    }
                    hasher.update(&buf[..n]);
                    size += n as u64;
                }
                Kind::File {
                    mode,
                    size,
                    sha: hasher.finalize().into(),
                }
            }
            other => {
                return Err(ManifestError::NotCanonical(format!(
                    "entry {path:?} has type {other:?}"
                )))
            }
        };
        let (parent, name) = path.rsplit_once('/').unwrap_or(("", &path));
        let siblings = dirs.get_mut(parent).ok_or_else(|| {
            ManifestError::NotCanonical(format!("{path:?} comes before its directory"))
        })?;
        siblings.push((name.to_owned(), kind));
    }
    let mut streams = Streams::default();
    walk(&mut dirs, "", &mut streams);
    Ok(TreeManifest {
        names: hex(&streams.names.finalize()),
        modes: hex(&streams.modes.finalize()),
        content: hex(&streams.content.finalize()),
    })
}

#[derive(Default)]
struct Streams {
    names: Sha256,
    modes: Sha256,
    content: Sha256,
}

/// The glob group of a name: `*`, `.[!.]*`, `..?*`.
fn glob_group(name: &str) -> u8 {
    match name.as_bytes() {
        [b'.', b'.', ..] => 2,
        [b'.', ..] => 1,
        _ => 0,
    }
}

/// Feeds the entries under `dir` (`""` or a path without a trailing `/`)
/// in the scan's order. Depth is bounded by the bundle limits.
fn walk(dirs: &mut HashMap<String, Vec<(String, Kind)>>, dir: &str, out: &mut Streams) {
    let Some(mut children) = dirs.remove(dir) else {
        return;
    };
    children.sort_by(|(a, _), (b, _)| {
        glob_group(a)
            .cmp(&glob_group(b))
            .then_with(|| a.as_bytes().cmp(b.as_bytes()))
    });
    for (name, kind) in children {
        let path = if dir.is_empty() {
            name
        } else {
            format!("{dir}/{name}")
        };
        let letter = if matches!(kind, Kind::Dir) { 'd' } else { 'f' };
        out.names
            .update(format!("{letter} {}:{path}\n", path.len()).as_bytes());
        match kind {
            Kind::Dir => walk(dirs, &path, out),
            Kind::File { mode, size, sha } => {
                out.modes.update(format!("{mode:x} {size}\n").as_bytes());
                out.content.update(format!("{}\n", hex(&sha)).as_bytes());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A file's content and mode; `None` is a directory.
    type Content<'a> = Option<(&'a [u8], u32)>;

    fn tar_of(entries: &[(&str, Content<'_>)]) -> Vec<u8> {
        let mut b = tar::Builder::new(Vec::new());
        for (path, file) in entries {
            let mut h = tar::Header::new_ustar();
            match file {
                None => {
                    h.set_entry_type(tar::EntryType::Directory);
                    h.set_mode(0o755);
                    h.set_size(0);
                    h.set_cksum();
                    b.append_data(&mut h, format!("{path}/"), &[][..]).unwrap();
                }
                Some((data, mode)) => {
                    h.set_entry_type(tar::EntryType::Regular);
                    h.set_mode(*mode);
                    h.set_size(data.len() as u64);
                    h.set_cksum();
                    b.append_data(&mut h, path, *data).unwrap();
                }
            }
        }
        b.into_inner().unwrap()
    }

    fn sha(s: &str) -> String {
        hex(&Sha256::digest(s.as_bytes()))
    }

    #[test]
    fn streams_follow_the_glob_order_of_sh() {
        let tar = tar_of(&[
            ("-a", Some((b"x", 0o644))),
            (".b", Some((b"yy", 0o755))),
            ("..c", Some((b"", 0o644))),
            ("d", None),
            ("d/e", Some((b"z", 0o644))),
            ("d.f", Some((b"w", 0o644))),
        ]);
        let m = manifest_of_tar(&tar[..]).unwrap();
        assert_eq!(
            m.names,
            sha("f 2:-a\nd 1:d\nf 3:d/e\nf 3:d.f\nf 2:.b\nf 3:..c\n")
        );
        assert_eq!(m.modes, sha("8124 1\n8124 1\n8124 1\n816d 2\n8124 0\n"));
        let file = |s: &str| hex(&Sha256::digest(s.as_bytes()));
        assert_eq!(
            m.content,
            sha(&format!(
                "{}\n{}\n{}\n{}\n{}\n",
                file("x"),
                file("z"),
                file("w"),
                file("yy"),
                file("")
            ))
        );
    }

    #[test]
    fn non_canonical_modes_and_types_are_refused() {
        let tar = tar_of(&[("a", Some((b"x", 0o600)))]);
        assert!(matches!(
            manifest_of_tar(&tar[..]),
            Err(ManifestError::NotCanonical(_))
        ));
        let mut b = tar::Builder::new(Vec::new());
        let mut h = tar::Header::new_ustar();
        h.set_entry_type(tar::EntryType::Symlink);
        h.set_mode(0o777);
        h.set_size(0);
        b.append_link(&mut h, "l", "target").unwrap();
        let tar = b.into_inner().unwrap();
        assert!(matches!(
            manifest_of_tar(&tar[..]),
            Err(ManifestError::NotCanonical(_))
        ));
    }

    #[test]
    fn a_file_before_its_directory_is_refused() {
        let tar = tar_of(&[("d/e", Some((b"z", 0o644)))]);
        assert!(manifest_of_tar(&tar[..]).is_err());
    }
}
