//! The tree scan of the deliver script ("the tree scan" in
//! `src/delivery/deliver.sh`; the gateway's side is
//! `src/bundle/manifest.rs`): three sha256 streams over a tree walked in
//! `sh`'s glob order under `LC_ALL=C` — names (`<kind> <len>:<path>`),
//! modes (`<st_mode hex> <size>` per file) and content (one sha256 per
//! file, only when asked) — so a tree the agent checks passes exactly when
//! the script's check would pass.

use std::fs::{self, File};
use std::io::{self, Read};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::Path;

use sha2::{Digest, Sha256};

use crate::args::Verify;

/// What a scan found.
pub(crate) struct Scanned {
    /// Entries seen (files, directories, links, others).
    pub(crate) count: u64,
    pub(crate) names: String,
    pub(crate) modes: String,
    /// Only meaningful after a [`Verify::Full`] scan.
    pub(crate) content: String,
}

/// The glob group of a name: `*`, `.[!.]*`, `..?*`.
fn glob_group(name: &[u8]) -> u8 {
    match name {
        [b'.', b'.', ..] => 2,
        [b'.', ..] => 1,
        _ => 0,
    }
}

struct Streams {
    names: Sha256,
    modes: Sha256,
    content: Sha256,
    count: u64,
    full: bool,
    buf: Vec<u8>,
}

/// Scans `dir` (the tree itself is not an entry).
pub(crate) fn scan(dir: &Path, verify: Verify) -> io::Result<Scanned> {
    let mut s = Streams {
        names: Sha256::new(),
        modes: Sha256::new(),
        content: Sha256::new(),
        count: 0,
        full: verify == Verify::Full,
        buf: Vec::new(),
    };
    walk(dir, b"", &mut s)?;
    Ok(Scanned {
        count: s.count,
        names: hex(&s.names.finalize()),
        modes: hex(&s.modes.finalize()),
        content: hex(&s.content.finalize()),
    })
}

fn walk(dir: &Path, prefix: &[u8], s: &mut Streams) -> io::Result<()> {
    let mut children: Vec<Vec<u8>> = fs::read_dir(dir)?
        .map(|e| e.map(|e| e.file_name().as_bytes().to_vec()))
        .collect::<io::Result<_>>()?;
    children.sort_by(|a, b| glob_group(a).cmp(&glob_group(b)).then_with(|| a.cmp(b)));
    for name in children {
        let full = dir.join(std::ffi::OsStr::from_bytes(&name));
        let mut rel = prefix.to_vec();
        rel.extend_from_slice(&name);
        let meta = fs::symlink_metadata(&full)?;
        s.count += 1;
        let kind = if meta.file_type().is_symlink() {
            'l'
        } else if meta.is_dir() {
            'd'
        } else {
            'f'
        };
        s.names.update(format!("{kind} {}:", rel.len()).as_bytes());
        s.names.update(&rel);
        s.names.update(b"\n");
        match kind {
            'd' => {
                let mut sub = rel;
                sub.push(b'/');
                walk(&full, &sub, s)?;
            }
            'f' => {
                s.modes
                    .update(format!("{:x} {}\n", meta.mode(), meta.size()).as_bytes());
                if s.full {
                    let sum = if meta.file_type().is_file() {
                        hash_file(&full, &mut s.buf)?
                    } else {
                        // A fifo or device is never a delivered file.
                        "-".repeat(64)
                    };
                    s.content.update(sum.as_bytes());
                    s.content.update(b"\n");
                }
            }
            _ => {}
        }
    }
    Ok(())
}

fn hash_file(path: &Path, buf: &mut Vec<u8>) -> io::Result<String> {
    buf.resize(256 * 1024, 0);
    let mut f = File::open(path)?;
    let mut h = Sha256::new();
    loop {
        let n = f.read(buf)?;
        if n == 0 {
            break;
        }
        h.update(&buf[..n]);
    }
    Ok(hex(&h.finalize()))
}

/// Lowercase hex of `bytes`.
pub(crate) fn hex(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut s = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        s.push(DIGITS[(b >> 4) as usize] as char);
        s.push(DIGITS[(b & 15) as usize] as char);
    }
    s
}
