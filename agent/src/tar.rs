//! A strict, streaming reader of canonical tar archives (what the bundle
//! engine writes, `src/bundle/canonical/writer.rs`): ustar headers with a
//! verified checksum, directories and regular files only, a PAX `x` header
//! holding only `path` for names that do not fit ustar, and the two zero
//! blocks at the end. Anything else is refused: the bytes are parsed
//! before their digests are known, so nothing here may trust them.

use std::io::{self, Read};

const BLOCK: usize = 512;

/// Longest PAX header accepted: one `path` record of at most 4 KiB and
/// change.
const MAX_PAX: u64 = 8 * 1024;

/// Longest member path accepted (the bundle engine's default limit is
/// 4096 bytes).
pub(crate) const MAX_PATH: usize = 4096;

/// One member.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Member {
    /// A directory (path without the trailing `/`).
    Dir(String),
    /// A regular file with its permission bits (0644 or 0755) and size;
    /// its data follows ([`TarReader::data`]).
    File { path: String, mode: u32, size: u64 },
}

/// Why the archive could not be read.
#[derive(Debug)]
pub(crate) enum TarError {
    /// The underlying stream failed or ended early.
    Io(io::Error),
    /// The archive holds something a canonical one never does.
    NotCanonical(String),
}

impl From<io::Error> for TarError {
    fn from(e: io::Error) -> Self {
        TarError::Io(e)
    }
}

fn refuse(why: impl Into<String>) -> TarError {
    TarError::NotCanonical(why.into())
}

/// Reads members from `r` one after another.
pub(crate) struct TarReader<R> {
    r: R,
    /// Data bytes (plus padding) of the current file not yet read.
    pending: u64,
}

fn octal(field: &[u8], what: &str) -> Result<u64, TarError> {
    if field.first().is_some_and(|b| b & 0x80 != 0) {
        // base-256, big-endian, for sizes past 8 GiB
        let mut v: u64 = u64::from(field[0] & 0x7f);
        for b in &field[1..] {
            v = v
                .checked_mul(256)
                .and_then(|v| v.checked_add(u64::from(*b)))
                .ok_or_else(|| refuse(format!("the {what} field overflows")))?;
        }
        return Ok(v);
    }
    let text: Vec<u8> = field
        .iter()
        .copied()
        .take_while(|b| *b != 0)
        .filter(|b| *b != b' ')
        .collect();
    let text = std::str::from_utf8(&text).map_err(|_| refuse(format!("a bad {what} field")))?;
    if text.is_empty() {
        return Ok(0);
    }
    u64::from_str_radix(text, 8).map_err(|_| refuse(format!("a bad {what} field")))
}

fn cstr(field: &[u8]) -> &[u8] {
    let end = field.iter().position(|b| *b == 0).unwrap_or(field.len());
    &field[..end]
}

/// Padding after `size` data bytes.
fn padded(size: u64) -> u64 {
    size.div_ceil(BLOCK as u64) * BLOCK as u64
}

impl<R: Read> TarReader<R> {
    /// A reader over the archive `r`.
    pub(crate) fn new(r: R) -> Self {
        Self { r, pending: 0 }
    }

    fn block(&mut self) -> Result<[u8; BLOCK], TarError> {
        let mut b = [0u8; BLOCK];
        self.r.read_exact(&mut b)?;
        Ok(b)
    }

    /// The next member, or `None` after the end-of-archive blocks. The
    /// previous file's data must have been read.
    pub(crate) fn next(&mut self) -> Result<Option<Member>, TarError> {
        if self.pending != 0 {
            return Err(refuse("a file's data was not read"));
        }
        let mut pax_path: Option<String> = None;
        loop {
            let h = self.block()?;
            if h.iter().all(|b| *b == 0) {
                let h2 = self.block()?;
                if h2.iter().all(|b| *b == 0) && pax_path.is_none() {
                    return Ok(None);
                }
                return Err(refuse("a lone zero block"));
            }
            let want = octal(&h[148..156], "checksum")?;
            let sum: u64 = h
                .iter()
                .enumerate()
                .map(|(i, b)| {
                    if (148..156).contains(&i) {
                        32
                    } else {
                        u64::from(*b)
                    }
                })
                .sum();
            if sum != want {
                return Err(refuse("a header checksum does not match"));
            }
            if &h[257..263] != b"ustar\0" || &h[263..265] != b"00" {
                return Err(refuse("a header that is not ustar"));
            }
            let size = octal(&h[124..136], "size")?;
            let mode = octal(&h[100..108], "mode")? as u32 & 0o7777;
            let typeflag = h[156];
            if typeflag == b'x' {
                if pax_path.is_some() {
                    return Err(refuse("two PAX headers for one member"));
                }
                if size > MAX_PAX {
                    return Err(refuse("a PAX header that is too large"));
                }
                let mut data = vec![0u8; padded(size) as usize];
                self.r.read_exact(&mut data)?;
                data.truncate(size as usize);
                pax_path = Some(pax_path_of(&data)?);
                continue;
            }
            let name = match pax_path.take() {
                Some(p) => p,
                None => {
                    let (name, prefix) = (cstr(&h[0..100]), cstr(&h[345..500]));
                    let mut full = Vec::with_capacity(name.len() + prefix.len() + 1);
                    if !prefix.is_empty() {
                        full.extend_from_slice(prefix);
                        full.push(b'/');
                    }
                    full.extend_from_slice(name);
                    String::from_utf8(full).map_err(|_| refuse("a path that is not UTF-8"))?
                }
            };
            if !cstr(&h[157..257]).is_empty() {
                return Err(refuse("a member with a link name"));
            }
            return match typeflag {
                b'5' => {
                    let path = name
                        .strip_suffix('/')
                        .ok_or_else(|| refuse("a directory name without a trailing '/'"))?;
                    if size != 0 || mode != 0o755 {
                        return Err(refuse(format!(
                            "directory {path:?} has data or mode {mode:o}"
                        )));
                    }
                    Ok(Some(Member::Dir(check_path(path)?)))
                }
                b'0' | 0 => {
                    if mode != 0o644 && mode != 0o755 {
                        return Err(refuse(format!("file {name:?} has mode {mode:o}")));
                    }
                    self.pending = padded(size);
                    Ok(Some(Member::File {
                        path: check_path(&name)?,
                        mode,
                        size,
                    }))
                }
                other => Err(refuse(format!(
                    "member {name:?} has type {:?} (links, devices and fifos are refused)",
                    char::from(other)
                ))),
            };
        }
    }

    /// Reads the current file's data, handing it to `sink` in pieces, then
    /// skips its padding. `sink` may fail; the data is still consumed
    /// (`sink` is not called again after its first error).
    pub(crate) fn data(
        &mut self,
        size: u64,
        buf: &mut [u8],
        mut sink: impl FnMut(&[u8]) -> io::Result<()>,
    ) -> Result<Option<io::Error>, TarError> {
        let mut left = size;
        let mut failed = None;
        while left > 0 {
            let want = (buf.len() as u64).min(left) as usize;
            let n = self.r.read(&mut buf[..want])?;
            if n == 0 {
                return Err(TarError::Io(io::ErrorKind::UnexpectedEof.into()));
            }
            if failed.is_none() {
                if let Err(e) = sink(&buf[..n]) {
                    failed = Some(e);
                }
            }
            left -= n as u64;
        }
        let pad = (padded(size) - size) as usize;
        let mut zeros = [0u8; BLOCK];
        self.r.read_exact(&mut zeros[..pad])?;
        self.pending = 0;
        Ok(failed)
    }
}

fn check_path(path: &str) -> Result<String, TarError> {
    match crate::rules::member_path_problem(path, MAX_PATH) {
        None => Ok(path.to_owned()),
        Some(problem) => Err(refuse(format!("the archive holds {problem}"))),
    }
}

/// The `path` of a PAX header holding only that record.
fn pax_path_of(data: &[u8]) -> Result<String, TarError> {
    let text = std::str::from_utf8(data).map_err(|_| refuse("a PAX header that is not UTF-8"))?;
    let (len, rest) = text
        .split_once(' ')
        .ok_or_else(|| refuse("a malformed PAX record"))?;
    let len: usize = len.parse().map_err(|_| refuse("a malformed PAX record"))?;
    if len != text.len() {
        return Err(refuse("a PAX header with other records than path"));
    }
    let value = rest
        .strip_prefix("path=")
        .and_then(|v| v.strip_suffix('\n'))
        .ok_or_else(|| refuse("a PAX header with other records than path"))?;
    Ok(value.to_owned())
}
