//! The byte-counting readers of the input side: they enforce the
//! compressed and inflated limits while streaming, name an input that is not
//! gzip at all, and record *why* a read failed in a shared [`Trap`] before
//! returning an `io::Error`, so the error that surfaces through flate2 and
//! `std::io` plumbing is turned back into the precise [`BundleError`].

use std::cell::RefCell;
use std::io::{self, Read};
use std::rc::Rc;

use super::error::BundleError;

/// Shared slot for the first failure cause (single-threaded: the whole
/// input side runs on one thread).
pub(crate) type Trap = Rc<RefCell<Option<BundleError>>>;

/// Records `err` (unless a cause is already recorded) and returns a
/// placeholder `io::Error` to unwind through `Read` plumbing.
pub(crate) fn trip(trap: &Trap, err: BundleError) -> io::Error {
    let mut slot = trap.borrow_mut();
    if slot.is_none() {
        *slot = Some(err);
    }
    io::Error::other("bundle rejected")
}

/// Turns an `io::Error` that surfaced from the input chain back into the
/// recorded cause.
pub(crate) fn untrap(trap: &Trap, e: io::Error) -> BundleError {
    trap.borrow_mut()
        .take()
        .unwrap_or_else(|| BundleError::Internal {
            detail: format!("untracked I/O error: {e}"),
        })
}

/// Sees every byte a counter passes on (on the calling thread).
pub(crate) type Tap = Box<dyn FnMut(&[u8]) -> io::Result<()>>;

/// Counts compressed input bytes, enforces the compressed limit and marks
/// source failures as I/O errors (not format errors).
pub(crate) struct CompressedCounter<R> {
    inner: R,
    count: u64,
    limit: u64,
    trap: Trap,
    tap: Option<Tap>,
}

impl<R: Read> CompressedCounter<R> {
    pub(crate) fn new(inner: R, limit: u64, trap: Trap) -> Self {
        Self {
            inner,
            count: 0,
            limit,
            trap,
            tap: None,
        }
    }

    /// Also hands every byte read to `tap` (a failure there is a storage
    /// error).
    pub(crate) fn with_tap(mut self, tap: Tap) -> Self {
        self.tap = Some(tap);
        self
    }

    /// Bytes read so far.
    pub(crate) fn count(&self) -> u64 {
        self.count
    }
}

impl<R: Read> CompressedCounter<R> {
    /// One read of the source; a failure is an I/O error, not the bundle's.
    fn read_source(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        loop {
            match self.inner.read(buf) {
                Ok(n) => return Ok(n),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(source) => {
                    return Err(trip(
                        &self.trap,
                        BundleError::Io {
                            source,
                            entry: None,
                        },
                    ))
                }
            }
        }
    }
}

/// Bytes of the input's start looked at before the decoder sees them:
/// enough for the magic of an uncompressed tar (`ustar` at offset 257).
const SNIFF: usize = 262;

/// [`BundleError::NotGzip`] when `start` (the input's first bytes) is not
/// gzip's magic, so that an uncompressed tar or a zip is named as such
/// rather than as a broken gzip header.
fn not_gzip(start: &[u8]) -> Option<BundleError> {
    if start.len() < 2 || start[..2] == [0x1f, 0x8b] {
        return None;
    }
    Some(BundleError::NotGzip {
        bare_tar: start.get(257..262) == Some(b"ustar".as_slice()),
    })
}

impl<R: Read> Read for CompressedCounter<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        // Never ask for more than one byte past the limit.
        let room = self.limit.saturating_sub(self.count).saturating_add(1);
        let want = buf.len().min(usize::try_from(room).unwrap_or(usize::MAX));
        let mut n = self.read_source(&mut buf[..want])?;
        if self.count == 0 && n > 0 {
            // The first bytes: read up to SNIFF of them before judging.
            let sniff = want.min(SNIFF);
            while n < sniff {
                match self.read_source(&mut buf[n..sniff])? {
                    0 => break,
                    more => n += more,
                }
            }
            if let Some(e) = not_gzip(&buf[..n]) {
                return Err(trip(&self.trap, e));
            }
        }
        self.count += n as u64;
        if self.count > self.limit {
            return Err(trip(
                &self.trap,
                BundleError::CompressedTooLarge { limit: self.limit },
            ));
        }
        if let Some(tap) = self.tap.as_mut() {
            tap(&buf[..n]).map_err(|source| trip(&self.trap, BundleError::Storage { source }))?;
        }
        Ok(n)
    }
}

/// Counts inflated bytes out of the gzip decoder, enforces the inflated
/// limit, and classifies decoder failures.
pub(crate) struct InflateCounter<D> {
    inner: D,
    count: u64,
    limit: u64,
    trap: Trap,
    tap: Option<Tap>,
}

impl<D: Read> InflateCounter<D> {
    pub(crate) fn new(inner: D, limit: u64, trap: Trap) -> Self {
        Self {
            inner,
            count: 0,
            limit,
            trap,
            tap: None,
        }
    }

    /// Also hands every inflated byte passed on to `tap`.
    pub(crate) fn with_tap(mut self, tap: Tap) -> Self {
        self.tap = Some(tap);
        self
    }

    /// Inflated bytes produced so far.
    pub(crate) fn count(&self) -> u64 {
        self.count
    }

    /// The decoder.
    pub(crate) fn into_inner(self) -> D {
        self.inner
    }
}

impl<D: Read> Read for InflateCounter<D> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if buf.is_empty() {
            return Ok(0);
        }
        // Hand out at most `limit` bytes; only when the consumer asks for
        // more and the decoder has more does the limit trip. So a bomb never
        // inflates past the limit, and the error surfaces at the entry that
        // actually needs the bytes (not during buffered read-ahead).
        let room = self.limit.saturating_sub(self.count);
        let mut probe = [0u8; 1];
        let target: &mut [u8] = if room == 0 {
            &mut probe
        } else {
            let want = buf.len().min(usize::try_from(room).unwrap_or(usize::MAX));
            &mut buf[..want]
        };
        let n = match self.inner.read(target) {
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => return Err(e),
            Err(e) => {
                if self.trap.borrow().is_some() {
                    return Err(e);
                }
                let cause = if e.kind() == io::ErrorKind::UnexpectedEof {
                    BundleError::TruncatedGzip
                } else {
                    BundleError::InvalidGzip {
                        detail: e.to_string(),
                    }
                };
                return Err(trip(&self.trap, cause));
            }
        };
        if room == 0 && n > 0 {
            return Err(trip(
                &self.trap,
                BundleError::InflatedTooLarge {
                    limit: self.limit,
                    entry: None,
                },
            ));
        }
        self.count += n as u64;
        if let Some(tap) = self.tap.as_mut() {
            tap(&buf[..n]).map_err(|source| trip(&self.trap, BundleError::Storage { source }))?;
        }
        Ok(n)
    }
}
