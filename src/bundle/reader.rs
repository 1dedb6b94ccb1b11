//! The tar member walker of the input side (the byte counters in front of
//! it are in [`super::counters`]).
//!
//! The walker frames the tar stream itself (512-byte blocks) and uses
//! [`tar::Header`] and [`tar::PaxExtensions`] to decode fields. It does not
//! use `tar::Archive` because that reads GNU long-name and PAX extension
//! bodies of attacker-chosen size into memory without a cap, and cannot tell
//! an end-of-archive marker from a stream that simply stops.
//!
//! A failure is recorded in the shared [`Trap`] before an `io::Error`
//! unwinds, like the counters' failures.

use std::io::{self, Read};

use super::counters::{trip, untrap, Trap};
use super::error::BundleError;
use super::limits::Limits;
use super::path::{display_name, normalize, CanonPath};

/// Tar block size.
pub(crate) const BLOCK: u64 = 512;

/// Largest PAX extended header body accepted. Real ones carry a path and
/// a few attributes; 1 MiB leaves room for xattrs without letting a header
/// claim gigabytes of memory.
const MAX_PAX_BYTES: u64 = 1024 * 1024;

/// What a member is, once extension headers are folded in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum MemberKind {
    /// A regular file; `exec` when the owner-executable bit is set.
    File {
        /// Owner-executable.
        exec: bool,
    },
    /// A directory.
    Dir,
}

/// One accepted member header. Its data (for files) is read with
/// [`TarWalker::data`] before the next call to [`TarWalker::next_member`].
#[derive(Debug)]
pub(crate) struct Member {
    /// Normalised path; `None` for the archive root (`./`), a directory.
    pub path: Option<CanonPath>,
    /// File or directory.
    pub kind: MemberKind,
    /// Data size (0 for directories).
    pub size: u64,
}

/// Extension state collected from `x`, `L` and `K` headers for the next
/// member.
#[derive(Default)]
struct Pending {
    pax: bool,
    pax_path: Option<Vec<u8>>,
    pax_size: Option<u64>,
    sparse: bool,
    long_name: Option<Vec<u8>>,
    long_link: bool,
}

impl Pending {
    fn is_empty(&self) -> bool {
        !self.pax && self.long_name.is_none() && !self.long_link
    }
}

/// Walks tar members over an inflated stream, enforcing the per-member
/// rules. Reads exactly the bytes the framing says, so it cannot desync.
pub(crate) struct TarWalker<R> {
    src: R,
    trap: Trap,
    limits: Limits,
    /// Bytes consumed from `src`.
    pos: u64,
    /// Data bytes of the current member not yet read.
    remaining: u64,
    /// Padding after the current member's data.
    padding: u64,
    /// The current member's name as written; its display form is made
    /// only for an error message (most members never need one).
    current: Option<Vec<u8>>,
}

fn invalid(entry: Option<&str>, detail: impl Into<String>) -> BundleError {
    BundleError::InvalidTar {
        entry: entry.map(str::to_owned),
        detail: detail.into(),
    }
}

/// How errors name a member: its normalised `path`, or for the archive
/// root (no path) the name as written.
fn entry_name(raw: &[u8], path: Option<&CanonPath>) -> String {
    path.map_or_else(|| display_name(raw), |p| p.as_str().to_owned())
}

fn padded(size: u64) -> u64 {
    size.div_ceil(BLOCK).saturating_mul(BLOCK)
}

/// The header checksum: the unsigned byte sum with the checksum field read
/// as spaces (POSIX). tar-rs computes the same thing but does not export it.
fn header_checksum(block: &[u8; 512]) -> u32 {
    // Two plain sums (which vectorise) rather than a per-byte test.
    let sum = |bytes: &[u8]| bytes.iter().map(|b| u32::from(*b)).sum::<u32>();
    sum(block) - sum(&block[148..156]) + 8 * u32::from(b' ')
}

/// A numeric header field that is plain octal digits up to its first NUL,
/// read without the tar crate's string handling (most fields of most
/// archives). `None` for anything else (spaces, base-256, empty): the
/// caller then asks the tar crate, whose answer this equals where it is
/// `Some`.
fn plain_octal(field: &[u8]) -> Option<u64> {
    let end = field.iter().position(|b| *b == 0).unwrap_or(field.len());
    let digits = &field[..end];
    if digits.is_empty() || digits.len() > 21 {
        return None;
    }
    digits.iter().try_fold(0u64, |n, d| match d {
        b'0'..=b'7' => Some(n << 3 | u64::from(d - b'0')),
        _ => None,
    })
}

impl<R: Read> TarWalker<R> {
    pub(crate) fn new(src: R, limits: &Limits, trap: Trap) -> Self {
        Self {
            src,
            trap,
            limits: limits.clone(),
            pos: 0,
            remaining: 0,
            padding: 0,
            current: None,
        }
    }

    /// The inflated stream, once the walk is over.
    pub(crate) fn into_inner(self) -> R {
        self.src
    }

    /// Turns an error from the input chain into its cause, naming the
    /// current member where the cause has room for it.
    pub(crate) fn cause(&self, e: io::Error) -> BundleError {
        let mut err = untrap(&self.trap, e);
        if let BundleError::InflatedTooLarge { entry, .. } = &mut err {
            if entry.is_none() {
                *entry = self.current_entry();
            }
        }
        err
    }

    /// How errors name the current member: its normalised path, or the
    /// name as written for the archive root.
    pub(crate) fn current_entry(&self) -> Option<String> {
        let raw = self.current.as_deref()?;
        let path = normalize(raw, &self.limits).ok().flatten();
        Some(entry_name(raw, path.as_ref()))
    }

    /// Reads until `buf` is full or the stream ends; returns bytes read.
    fn read_full(&mut self, buf: &mut [u8]) -> Result<usize, BundleError> {
        let mut done = 0;
        while done < buf.len() {
            match self.src.read(&mut buf[done..]) {
                Ok(0) => break,
                Ok(n) => done += n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(self.cause(e)),
            }
        }
        self.pos += done as u64;
        Ok(done)
    }

    /// Reads one whole block; a short block means the tar stream is cut.
    fn read_block(&mut self) -> Result<[u8; 512], BundleError> {
        let mut block = [0u8; 512];
        let n = self.read_full(&mut block)?;
        if n < block.len() {
            return Err(BundleError::TruncatedTar {
                entry: self.current_entry(),
            });
        }
        Ok(block)
    }

    /// Discards `n` bytes that must be present.
    fn skip(&mut self, mut n: u64) -> Result<(), BundleError> {
        // Most members end on a block boundary: no scratch to zero.
        if n == 0 {
            return Ok(());
        }
        let mut scratch = [0u8; 8192];
        while n > 0 {
            let want = scratch.len().min(usize::try_from(n).unwrap_or(usize::MAX));
            let got = self.read_full(&mut scratch[..want])?;
            if got < want {
                return Err(BundleError::TruncatedTar {
                    entry: self.current_entry(),
                });
            }
            n -= got as u64;
        }
        Ok(())
    }

    /// Reads an extension header body of `size` bytes plus padding.
    fn read_extension(&mut self, size: u64) -> Result<Vec<u8>, BundleError> {
        let len = usize::try_from(size).map_err(|_| invalid(None, "extension header too large"))?;
        let mut data = vec![0u8; len];
        if self.read_full(&mut data)? < len {
            return Err(BundleError::TruncatedTar { entry: None });
        }
        self.skip(padded(size) - size)?;
        Ok(data)
    }

    /// Finishes the current member (unread data and padding).
    fn finish_member(&mut self) -> Result<(), BundleError> {
        let rest = self.remaining + self.padding;
        self.remaining = 0;
        self.padding = 0;
        self.skip(rest)
    }

    /// A reader over the current member's data; it fails with
    /// `truncated_tar` if the stream ends before the declared size.
    pub(crate) fn data(&mut self) -> MemberData<'_, R> {
        MemberData { walker: self }
    }

    /// Advances to the next member. `Ok(None)` after a valid
    /// end-of-archive marker followed only by zero padding.
    pub(crate) fn next_member(&mut self) -> Result<Option<Member>, BundleError> {
        self.finish_member()?;
        self.current = None;
        let mut pending = Pending::default();
        loop {
            let block = self.read_block()?;
            if block.iter().all(|b| *b == 0) {
                if !pending.is_empty() {
                    return Err(invalid(None, "extension header without a following entry"));
                }
                self.end_of_archive()?;
                return Ok(None);
            }
            let header = tar::Header::from_byte_slice(&block);
            let stored = match plain_octal(&block[148..156]) {
                Some(v) => u32::try_from(v).unwrap_or(u32::MAX),
                None => header
                    .cksum()
                    .map_err(|e| invalid(None, format!("bad header checksum field: {e}")))?,
            };
            if stored != header_checksum(&block) {
                return Err(invalid(
                    Some(&display_name(&header.path_bytes())),
                    "header checksum mismatch",
                ));
            }
            let type_flag = block[156];
            let header_size = match plain_octal(&block[124..136]) {
                Some(v) => v,
                None => header.entry_size().map_err(|e| {
                    invalid(Some(&display_name(&header.path_bytes())), e.to_string())
                })?,
            };
            match type_flag {
                b'x' => {
                    if pending.pax {
                        return Err(invalid(None, "two PAX headers for one entry"));
                    }
                    if header_size > MAX_PAX_BYTES {
                        return Err(invalid(None, "PAX header too large"));
                    }
                    let data = self.read_extension(header_size)?;
                    pending.pax = true;
                    for record in tar::PaxExtensions::new(&data) {
                        let record =
                            record.map_err(|e| invalid(None, format!("bad PAX record: {e}")))?;
                        let key = record
                            .key()
                            .map_err(|_| invalid(None, "PAX key is not UTF-8"))?;
                        match key {
                            "path" => pending.pax_path = Some(record.value_bytes().to_vec()),
                            "size" => {
                                let size = record
                                    .value()
                                    .ok()
                                    .and_then(|v| v.parse::<u64>().ok())
                                    .ok_or_else(|| invalid(None, "bad PAX size record"))?;
                                pending.pax_size = Some(size);
                            }
                            k if k.starts_with("GNU.sparse.") => pending.sparse = true,
                            // Times, owners, xattrs, comments: dropped by
                            // the canonical archive anyway.
                            _ => {}
                        }
                    }
                }
                b'L' | b'K' => {
                    // A long name is bounded by the path limit (+ its NUL).
                    let cap = self.limits.path_bytes as u64 + 1;
                    if header_size > cap {
                        return Err(BundleError::PathTooLong {
                            entry: "(GNU long name)".to_owned(),
                            len: usize::try_from(header_size).unwrap_or(usize::MAX),
                            limit: self.limits.path_bytes,
                        });
                    }
                    let mut data = self.read_extension(header_size)?;
                    if type_flag == b'L' {
                        if pending.long_name.is_some() {
                            return Err(invalid(None, "two GNU long names for one entry"));
                        }
                        while data.last() == Some(&0) {
                            data.pop();
                        }
                        pending.long_name = Some(data);
                    } else {
                        if pending.long_link {
                            return Err(invalid(None, "two GNU long link names for one entry"));
                        }
                        pending.long_link = true;
                    }
                }
                b'g' => {
                    if header_size > MAX_PAX_BYTES {
                        return Err(invalid(None, "PAX global header too large"));
                    }
                    let data = self.read_extension(header_size)?;
                    // `git archive` writes a global header with only a
                    // comment; anything else would change how later entries
                    // are read by some tools and not others.
                    for record in tar::PaxExtensions::new(&data) {
                        let record =
                            record.map_err(|e| invalid(None, format!("bad PAX record: {e}")))?;
                        let key = String::from_utf8_lossy(record.key_bytes()).into_owned();
                        if key != "comment" {
                            return Err(BundleError::PaxGlobalHeader { key });
                        }
                    }
                }
                _ => {
                    return self
                        .member(header, type_flag, header_size, pending)
                        .map(Some)
                }
            }
        }
    }

    /// Applies the member rules to a non-extension header.
    fn member(
        &mut self,
        header: &tar::Header,
        type_flag: u8,
        header_size: u64,
        pending: Pending,
    ) -> Result<Member, BundleError> {
        let raw = match (pending.pax_path, pending.long_name) {
            (Some(p), _) => p,
            (None, Some(l)) => l,
            (None, None) => header.path_bytes().into_owned(),
        };
        let size = pending.pax_size.unwrap_or(header_size);
        let path = normalize(&raw, &self.limits)?;
        // The name for error messages, made only when one is needed.
        let shown = || entry_name(&raw, path.as_ref());
        let kind = match type_flag {
            b'0' | b'\0' | b'7' => {
                if pending.sparse {
                    return Err(BundleError::SparseNotAllowed { entry: shown() });
                }
                // Old-style archives mark directories by a trailing slash on
                // a regular entry; refuse the ambiguity outright.
                if raw.ends_with(b"/") {
                    return Err(invalid(Some(&shown()), "regular file name ends with '/'"));
                }
                if path.is_none() {
                    return Err(BundleError::EmptyPath { entry: shown() });
                }
                let mode = match plain_octal(&header.as_old().mode) {
                    Some(m) => u32::try_from(m).unwrap_or(u32::MAX),
                    None => header
                        .mode()
                        .map_err(|e| invalid(Some(&shown()), e.to_string()))?,
                };
                MemberKind::File {
                    exec: mode & 0o100 != 0,
                }
            }
            b'5' => {
                if size != 0 {
                    return Err(invalid(Some(&shown()), "directory entry with data"));
                }
                MemberKind::Dir
            }
            b'1' => {
                return Err(BundleError::LinkNotAllowed {
                    entry: shown(),
                    kind: super::error::LinkKind::Hard,
                })
            }
            b'2' => {
                return Err(BundleError::LinkNotAllowed {
                    entry: shown(),
                    kind: super::error::LinkKind::Symbolic,
                })
            }
            b'3' => {
                return Err(BundleError::DeviceNotAllowed {
                    entry: shown(),
                    kind: super::error::DeviceKind::Char,
                })
            }
            b'4' => {
                return Err(BundleError::DeviceNotAllowed {
                    entry: shown(),
                    kind: super::error::DeviceKind::Block,
                })
            }
            b'6' => return Err(BundleError::FifoNotAllowed { entry: shown() }),
            b'S' => return Err(BundleError::SparseNotAllowed { entry: shown() }),
            other => {
                return Err(BundleError::UnknownEntryType {
                    entry: shown(),
                    kind: format!("type flag {:?}", char::from(other)),
                })
            }
        };
        if pending.long_link {
            return Err(invalid(
                Some(&shown()),
                "GNU long link name on a non-link entry",
            ));
        }
        if size > self.limits.file_bytes {
            return Err(BundleError::FileTooLarge {
                entry: shown(),
                size,
                limit: self.limits.file_bytes,
            });
        }
        // The header already claims more than the inflated budget: stop now
        // rather than inflate up to the limit.
        if self.pos.saturating_add(padded(size)) > self.limits.inflated_bytes {
            return Err(BundleError::InflatedTooLarge {
                limit: self.limits.inflated_bytes,
                entry: Some(shown()),
            });
        }
        self.remaining = size;
        self.padding = padded(size) - size;
        self.current = Some(raw);
        Ok(Member { path, kind, size })
    }

    /// After the first zero block: a second one must follow, then only
    /// zero padding until the stream ends.
    fn end_of_archive(&mut self) -> Result<(), BundleError> {
        let mut second = [0u8; 512];
        if self.read_full(&mut second)? < second.len() {
            return Err(BundleError::TruncatedTar { entry: None });
        }
        if second.iter().any(|b| *b != 0) {
            return Err(BundleError::TarTrailingData);
        }
        let mut scratch = vec![0u8; 64 * 1024];
        loop {
            let n = self.read_full(&mut scratch)?;
            if scratch[..n].iter().any(|b| *b != 0) {
                return Err(BundleError::TarTrailingData);
            }
            if n < scratch.len() {
                return Ok(());
            }
        }
    }
}

/// Reader over one member's data; see [`TarWalker::data`].
pub(crate) struct MemberData<'a, R> {
    walker: &'a mut TarWalker<R>,
}

impl<R: Read> Read for MemberData<'_, R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let w = &mut *self.walker;
        if w.remaining == 0 || buf.is_empty() {
            return Ok(0);
        }
        let want = buf
            .len()
            .min(usize::try_from(w.remaining).unwrap_or(usize::MAX));
        let n = w.src.read(&mut buf[..want])?;
        if n == 0 {
            let entry = w.current_entry();
            return Err(trip(&w.trap, BundleError::TruncatedTar { entry }));
        }
        w.pos += n as u64;
        w.remaining -= n as u64;
        Ok(n)
    }
}
