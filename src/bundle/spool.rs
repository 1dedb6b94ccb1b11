//! The spool: an unnamed temporary file holding accepted file contents
//! back to back, so the canonical archive can be emitted in sorted order
//! with bounded memory. The file has no name and disappears when dropped,
//! so nothing of a rejected upload stays on disk.

use std::fs::File;
use std::io::{self, BufWriter, Read, Write};
use std::os::unix::fs::FileExt;
use std::path::Path;

use super::canonical::writer::CHUNK;

/// Append-only spool of file contents.
pub(crate) struct Spool {
    writer: BufWriter<File>,
    len: u64,
}

impl Spool {
    /// Creates a spool in `dir` (or the system temporary directory).
    pub(crate) fn new(dir: Option<&Path>) -> io::Result<Self> {
        let file = match dir {
            Some(d) => tempfile::tempfile_in(d)?,
            None => tempfile::tempfile()?,
        };
        Ok(Self {
            writer: BufWriter::with_capacity(CHUNK, file),
            len: 0,
        })
    }

    /// Bytes appended so far (the offset of the next append).
    pub(crate) fn len(&self) -> u64 {
        self.len
    }

    /// Appends `buf`.
    pub(crate) fn append(&mut self, buf: &[u8]) -> io::Result<()> {
        self.writer.write_all(buf)?;
        self.len += buf.len() as u64;
        Ok(())
    }

    /// Flushes and returns the file for positional reads.
    pub(crate) fn into_file(self) -> io::Result<File> {
        self.writer.into_inner().map_err(|e| e.into_error())
    }
}

/// Reads `len` bytes at `offset` of a file without moving a shared cursor.
pub(crate) struct RangeReader<'f> {
    file: &'f File,
    pos: u64,
    end: u64,
}

impl<'f> RangeReader<'f> {
    pub(crate) fn new(file: &'f File, offset: u64, len: u64) -> Self {
        Self {
            file,
            pos: offset,
            end: offset + len,
        }
    }
}

impl Read for RangeReader<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let left = self.end - self.pos;
        let want = buf.len().min(usize::try_from(left).unwrap_or(usize::MAX));
        if want == 0 {
            return Ok(0);
        }
        let n = self.file.read_at(&mut buf[..want], self.pos)?;
        self.pos += n as u64;
        Ok(n)
    }
}
