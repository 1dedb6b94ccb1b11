//! The canonical tar: a deterministic archive of the accepted tree.
//!
//! Entries are sorted by path (component-wise, see `CanonPath`),
//! directories are `0755` and named with a trailing `/`, files are `0644`
//! or `0755`, uid/gid/mtime are 0, user and group names are empty, there
//! are no xattrs, and a PAX `path` record appears only when a path does not
//! fit the ustar name/prefix fields. The bytes go to a [`Pipeline`], told
//! where each large file's data begins and ends (it compresses those in
//! chains of their own).

use std::io::{self, Read, Write};

use super::pipeline::{is_big, Pipeline};
use crate::bundle::CHUNK;

/// A sha256 digest as 64 lowercase hex digits.
pub(crate) fn hex(digest: &[u8]) -> String {
    hex::encode(digest)
}

/// Where a failed append went wrong: reading the content or writing the
/// archive. Callers classify the two differently.
#[derive(Debug)]
pub(crate) enum AppendError {
    /// Reading the entry's content failed or came up short.
    Read(io::Error),
    /// Writing the archive failed.
    Write(io::Error),
}

/// Writes the canonical tar.
pub(crate) struct CanonicalTar {
    builder: tar::Builder<Pipeline>,
    buf: Vec<u8>,
    entries: u64,
    templates: Templates,
}

/// Longest name the ustar `name` field holds by itself.
const NAME_FIELD: usize = 100;

/// Sizes from here on are written in tar's binary extension, not octal
/// (the tar crate's rule for a 12-byte field).
const OCTAL_SIZE_END: u64 = 1 << 33;

/// Offsets of the ustar fields a canonical header varies in.
const SIZE_FIELD: std::ops::Range<usize> = 124..136;
const CKSUM_FIELD: std::ops::Range<usize> = 148..156;

/// The header of each canonical entry kind with an empty name and size 0,
/// made once by [`header_for`]. A header whose name fits the `name` field
/// is this template plus the name, the size and the checksum: byte for
/// byte what `header_for` builds (a test compares them), without the tar
/// crate's per-field string formatting, which was a tenth of the run for
/// archives of many small files.
struct Templates {
    dir: [u8; 512],
    file: [u8; 512],
    exec: [u8; 512],
}

impl Templates {
    fn new() -> Self {
        let make = |ty, mode| {
            let (header, _) = header_for("x", ty, mode, 0);
            let mut bytes = *header.as_bytes();
            bytes[..NAME_FIELD].fill(0);
            bytes
        };
        Self {
            dir: make(tar::EntryType::Directory, 0o755),
            file: make(tar::EntryType::Regular, 0o644),
            exec: make(tar::EntryType::Regular, 0o755),
        }
    }

    fn get(&self, ty: tar::EntryType, mode: u32) -> Option<&[u8; 512]> {
        match (ty, mode) {
            (tar::EntryType::Directory, 0o755) => Some(&self.dir),
            (tar::EntryType::Regular, 0o644) => Some(&self.file),
            (tar::EntryType::Regular, 0o755) => Some(&self.exec),
            _ => None,
        }
    }
}

/// Writes `value` as zero-padded octal digits followed by a NUL, filling
/// `field` (the tar crate's `octal_into`, for values that fit).
fn octal_field(field: &mut [u8], mut value: u64) {
    let Some((nul, digits)) = field.split_last_mut() else {
        return;
    };
    *nul = 0;
    for d in digits.iter_mut().rev() {
        *d = b'0' + (value & 7) as u8;
        value >>= 3;
    }
}

/// The header of `name` from its template, if the fast form applies: the
/// name fits the `name` field (no prefix split, no PAX record) and the
/// size is written in octal.
fn fast_header(template: &[u8; 512], name: &str, size: u64) -> Option<[u8; 512]> {
    let name = name.as_bytes();
    if name.len() > NAME_FIELD || size >= OCTAL_SIZE_END || name.contains(&0) {
        return None;
    }
    let mut block = *template;
    block[..name.len()].copy_from_slice(name);
    octal_field(&mut block[SIZE_FIELD], size);
    block[CKSUM_FIELD].fill(b' ');
    let sum: u32 = block.iter().map(|b| u32::from(*b)).sum();
    octal_field(&mut block[CKSUM_FIELD], u64::from(sum));
    Some(block)
}

/// Builds the ustar header for `name` (with trailing `/` for directories),
/// plus the PAX path record when the name does not fit ustar.
fn header_for(name: &str, entry_type: tar::EntryType, mode: u32, size: u64) -> (tar::Header, bool) {
    let mut header = tar::Header::new_ustar();
    let needs_pax = header.set_path(name).is_err();
    if needs_pax {
        // Readers that ignore PAX see a truncated (but deterministic) name.
        let field = &mut header.as_old_mut().name;
        let mut cut = name.len().min(field.len());
        while !name.is_char_boundary(cut) {
            cut -= 1;
        }
        field.fill(0);
        field[..cut].copy_from_slice(&name.as_bytes()[..cut]);
    }
    header.set_entry_type(entry_type);
    header.set_mode(mode);
    header.set_uid(0);
    header.set_gid(0);
    header.set_mtime(0);
    header.set_size(size);
    header.set_cksum();
    (header, needs_pax)
}

/// Name of the PAX extended header. The tar crate's
/// `append_pax_extensions` leaves it empty, and busybox tar takes a header
/// with an empty name for an end-of-archive block (then fails on the
/// records); Python's fixed name is short and understood everywhere.
const PAX_HEADER_NAME: &str = "././@PaxHeader";

/// The PAX extended header and its one `path` record for `name`.
fn pax_path_header(name: &str) -> (tar::Header, Vec<u8>) {
    // A record is "<len> path=<name>\n" where <len> counts its own digits.
    let rest = " path=".len() + name.len() + 1;
    let mut len = rest + 1;
    while len != rest + len.to_string().len() {
        len = rest + len.to_string().len();
    }
    let mut records = format!("{len} path=").into_bytes();
    records.extend_from_slice(name.as_bytes());
    records.push(b'\n');
    let mut header = tar::Header::new_ustar();
    let fixed = header.set_path(PAX_HEADER_NAME);
    debug_assert!(fixed.is_ok(), "the PAX header name fits ustar");
    header.set_entry_type(tar::EntryType::XHeader);
    header.set_mode(0o644);
    header.set_uid(0);
    header.set_gid(0);
    header.set_mtime(0);
    header.set_size(records.len() as u64);
    header.set_cksum();
    (header, records)
}

impl CanonicalTar {
    pub(crate) fn new(w: Pipeline) -> Self {
        Self {
            builder: tar::Builder::new(w),
            buf: vec![0u8; CHUNK],
            entries: 0,
            templates: Templates::new(),
        }
    }

    /// Entries written so far.
    pub(crate) fn entries(&self) -> u64 {
        self.entries
    }

    /// The pipeline the bytes go to.
    pub(crate) fn pipeline(&mut self) -> &mut Pipeline {
        self.builder.get_mut()
    }

    fn append_header(
        &mut self,
        name: &str,
        ty: tar::EntryType,
        mode: u32,
        size: u64,
    ) -> io::Result<()> {
        let fast = self
            .templates
            .get(ty, mode)
            .and_then(|t| fast_header(t, name, size));
        if let Some(block) = fast {
            self.builder.get_mut().write_all(&block)?;
            self.entries += 1;
            return Ok(());
        }
        let (header, needs_pax) = header_for(name, ty, mode, size);
        if needs_pax {
            let (pax, records) = pax_path_header(name);
            self.builder.append(&pax, records.as_slice())?;
        }
        self.builder.get_mut().write_all(header.as_bytes())?;
        self.entries += 1;
        Ok(())
    }

    /// Appends a directory.
    pub(crate) fn append_dir(&mut self, path: &str) -> io::Result<()> {
        self.append_header(&format!("{path}/"), tar::EntryType::Directory, 0o755, 0)
    }

    /// Appends a regular file whose content (exactly `size` bytes) comes
    /// from `data`. `key` names a large file's packed pieces; `prepacked`
    /// when they are already compressed.
    pub(crate) fn append_file<R: Read>(
        &mut self,
        path: &str,
        size: u64,
        exec: bool,
        mut data: R,
        key: u64,
        prepacked: bool,
    ) -> Result<(), AppendError> {
        let mode = if exec { 0o755 } else { 0o644 };
        self.append_header(path, tar::EntryType::Regular, mode, size)
            .map_err(AppendError::Write)?;
        let big = is_big(size);
        if big {
            self.pipeline()
                .begin_big(key, prepacked)
                .map_err(AppendError::Write)?;
        }
        let mut left = size;
        while left > 0 {
            let want = self
                .buf
                .len()
                .min(usize::try_from(left).unwrap_or(usize::MAX));
            let n = match data.read(&mut self.buf[..want]) {
                Ok(0) => {
                    return Err(AppendError::Read(io::Error::new(
                        io::ErrorKind::UnexpectedEof,
                        "content shorter than its declared size",
                    )))
                }
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(AppendError::Read(e)),
            };
            self.builder
                .get_mut()
                .write_all(&self.buf[..n])
                .map_err(AppendError::Write)?;
            left -= n as u64;
        }
        if big {
            self.pipeline().end_big().map_err(AppendError::Write)?;
        }
        let pad = (512 - (size % 512)) % 512;
        if pad > 0 {
            let zeros = [0u8; 512];
            self.builder
                .get_mut()
                .write_all(&zeros[..pad as usize])
                .map_err(AppendError::Write)?;
        }
        Ok(())
    }

    /// Writes the end-of-archive marker and returns the pipeline.
    pub(crate) fn finish(self) -> io::Result<Pipeline> {
        self.builder.into_inner()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fast_headers_are_the_tar_crate_headers() {
        let templates = Templates::new();
        let long = "d/".repeat(49) + "ab"; // exactly 100 bytes
        let names = [
            "a".to_owned(),
            "dir/".to_owned(),
            "d000/f00001.txt".to_owned(),
            "été/ünïcode/ファイル".to_owned(),
            long.clone(),
            format!("{}/", &long[..99]),
            long[..99].to_owned(),
        ];
        let sizes = [0, 1, 511, 512, 1024, 0o7777_7777, OCTAL_SIZE_END - 1];
        let kinds = [
            (tar::EntryType::Directory, 0o755),
            (tar::EntryType::Regular, 0o644),
            (tar::EntryType::Regular, 0o755),
        ];
        for name in &names {
            for &size in &sizes {
                for &(ty, mode) in &kinds {
                    let t = templates.get(ty, mode).unwrap();
                    let fast = fast_header(t, name, size).expect("fast form applies");
                    let (slow, pax) = header_for(name, ty, mode, size);
                    assert!(!pax);
                    assert_eq!(
                        fast[..],
                        slow.as_bytes()[..],
                        "{name:?} {size} {ty:?} {mode:o}"
                    );
                }
            }
        }
        // Beyond the name field or the octal sizes, the tar crate writes it.
        let t = templates.get(tar::EntryType::Regular, 0o644).unwrap();
        assert!(fast_header(t, &format!("{long}x"), 1).is_none());
        assert!(fast_header(t, "a", OCTAL_SIZE_END).is_none());
        assert!(templates.get(tar::EntryType::Regular, 0o600).is_none());
    }
}
