//! The spool: an unnamed temporary file holding accepted file contents
//! back to back, so the canonical archive can be emitted in sorted order
//! with bounded memory. The file has no name and disappears when dropped,
//! so nothing of a rejected upload stays on disk.
//!
//! Contents are stored as independent LZ4 blocks of [`BLOCK`] raw bytes
//! each (a block that does not shrink is stored as is), so the disk a
//! spool takes follows the *compressed* size of what was uploaded: a small
//! gzip bomb cannot spool its inflated size before a limit rejects it.
//! Offsets stay raw offsets; every block but the last is full, so the
//! block of an offset is `offset / BLOCK`. Every byte written is charged
//! to the run's temporary-space [`Charge`].

use std::cell::RefCell;
use std::fs::File;
use std::io::{self, BufWriter, Read, Write};
use std::os::unix::fs::FileExt;
use std::path::Path;

use lz4_flex::block::{self as lz4, CompressTable};

use super::budget::{Charge, Charged};
use super::CHUNK;

/// Raw bytes per block: small enough that reading one small file
/// decompresses little, large enough to compress well.
pub(crate) const BLOCK: usize = 32 * 1024;

/// Where one block lives in the file.
#[derive(Debug, Clone, Copy)]
struct BlockRef {
    offset: u64,
    stored: u32,
    compressed: bool,
}

/// Append-only spool of file contents.
pub(crate) struct Spool {
    writer: BufWriter<Charged<File>>,
    /// The block being filled: `raw[..filled]` (always `BLOCK` long, so a
    /// reader can fill it in place).
    raw: Vec<u8>,
    filled: usize,
    /// Compression output, reused.
    packed: Vec<u8>,
    table: CompressTable,
    index: Vec<BlockRef>,
    stored: u64,
    len: u64,
}

impl Spool {
    /// Creates a spool in `dir` (or the system temporary directory) whose
    /// writes are charged to `charge`.
    pub(crate) fn new(dir: Option<&Path>, charge: Charge) -> io::Result<Self> {
        let file = match dir {
            Some(d) => tempfile::tempfile_in(d)?,
            None => tempfile::tempfile()?,
        };
        Ok(Self {
            writer: BufWriter::with_capacity(CHUNK, Charged::new(file, charge)),
            raw: vec![0; BLOCK],
            filled: 0,
            packed: vec![0; lz4::get_maximum_output_size(BLOCK)],
            table: CompressTable::default(),
            index: Vec::new(),
            stored: 0,
            len: 0,
        })
    }

    /// Bytes appended so far (the offset of the next append).
    pub(crate) fn len(&self) -> u64 {
        self.len
    }

    /// Appends `buf`.
    pub(crate) fn append(&mut self, mut buf: &[u8]) -> io::Result<()> {
        while !buf.is_empty() {
            let n = buf.len().min(BLOCK - self.filled);
            self.spare()[..n].copy_from_slice(&buf[..n]);
            self.commit(n)?;
            buf = &buf[n..];
        }
        Ok(())
    }

    /// Room left in the block being filled (never empty): fill a prefix
    /// of it, then [`Spool::commit`] that many bytes. Saves a copy over
    /// [`Spool::append`] for a reader.
    pub(crate) fn spare(&mut self) -> &mut [u8] {
        &mut self.raw[self.filled..]
    }

    /// Appends the first `n` bytes of [`Spool::spare`] (at most all of it).
    pub(crate) fn commit(&mut self, n: usize) -> io::Result<()> {
        let n = n.min(BLOCK - self.filled);
        self.filled += n;
        self.len += n as u64;
        if self.filled == BLOCK {
            self.seal()?;
        }
        Ok(())
    }

    /// Writes the block being filled (compressed when that is smaller).
    fn seal(&mut self) -> io::Result<()> {
        if self.filled == 0 {
            return Ok(());
        }
        let raw = &self.raw[..self.filled];
        let n = lz4::compress_into_with_table(raw, &mut self.packed, &mut self.table)
            .map_err(io::Error::other)?;
        let (bytes, compressed) = if n < raw.len() {
            (&self.packed[..n], true)
        } else {
            (raw, false)
        };
        self.writer.write_all(bytes)?;
        self.index.push(BlockRef {
            offset: self.stored,
            stored: bytes.len() as u32,
            compressed,
        });
        self.stored += bytes.len() as u64;
        self.filled = 0;
        Ok(())
    }

    /// Writes the last block, flushes, and returns the spool for reading.
    pub(crate) fn finish(mut self) -> io::Result<SpoolFile> {
        self.seal()?;
        let file = self
            .writer
            .into_inner()
            .map_err(std::io::IntoInnerError::into_error)?
            .into_inner();
        Ok(SpoolFile {
            file,
            index: self.index,
            len: self.len,
            cache: RefCell::new(BlockCache {
                block: None,
                raw: vec![0; BLOCK],
                packed: Vec::new(),
            }),
        })
    }
}

/// The last block read, decompressed: readers of neighbouring small files
/// share it.
struct BlockCache {
    block: Option<usize>,
    raw: Vec<u8>,
    packed: Vec<u8>,
}

/// A finished spool, read by offset.
pub(crate) struct SpoolFile {
    file: File,
    index: Vec<BlockRef>,
    len: u64,
    cache: RefCell<BlockCache>,
}

impl SpoolFile {
    /// Copies raw bytes at `pos` into `buf`, within one block; returns how
    /// many.
    fn read_at(&self, buf: &mut [u8], pos: u64) -> io::Result<usize> {
        let block = usize::try_from(pos / BLOCK as u64).map_err(io::Error::other)?;
        let at = (pos % BLOCK as u64) as usize;
        let block_len = (self.len - block as u64 * BLOCK as u64).min(BLOCK as u64) as usize;
        let mut cache = self.cache.borrow_mut();
        if cache.block != Some(block) {
            let r = *self
                .index
                .get(block)
                .ok_or_else(|| io::Error::other("read past the end of the spool"))?;
            cache.block = None;
            let BlockCache { raw, packed, .. } = &mut *cache;
            if r.compressed {
                packed.resize(r.stored as usize, 0);
                self.file.read_exact_at(packed, r.offset)?;
                let n = lz4::decompress_into(packed, &mut raw[..]).map_err(io::Error::other)?;
                if n != block_len {
                    return Err(io::Error::other("a spool block decompressed short"));
                }
            } else {
                self.file.read_exact_at(&mut raw[..block_len], r.offset)?;
            }
            cache.block = Some(block);
        }
        let n = buf.len().min(block_len - at);
        buf[..n].copy_from_slice(&cache.raw[at..at + n]);
        Ok(n)
    }
}

/// Reads `len` raw bytes at `offset` of a spool.
pub(crate) struct RangeReader<'f> {
    spool: &'f SpoolFile,
    pos: u64,
    end: u64,
}

impl<'f> RangeReader<'f> {
    pub(crate) fn new(spool: &'f SpoolFile, offset: u64, len: u64) -> Self {
        Self {
            spool,
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
        let n = self.spool.read_at(&mut buf[..want], self.pos)?;
        self.pos += n as u64;
        Ok(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bundle::{noise, TempBudget};

    fn read(spool: &SpoolFile, offset: u64, len: u64) -> Vec<u8> {
        let mut out = Vec::new();
        RangeReader::new(spool, offset, len)
            .read_to_end(&mut out)
            .unwrap();
        out
    }

    #[test]
    fn ranges_read_back_across_blocks_in_any_order() {
        let mut spool = Spool::new(None, Charge::default()).unwrap();
        // Incompressible, compressible, and tiny pieces, across block edges.
        let noise = noise(100_000);
        let zeros = vec![0u8; 3 * BLOCK + 17];
        let pieces: Vec<&[u8]> = vec![b"a", &noise, b"", &zeros, b"tail"];
        let mut at = Vec::new();
        for p in &pieces {
            at.push(spool.len());
            spool.append(p).unwrap();
        }
        let file = spool.finish().unwrap();
        for i in (0..pieces.len()).rev() {
            assert_eq!(read(&file, at[i], pieces[i].len() as u64), pieces[i], "{i}");
        }
        assert_eq!(read(&file, at[1] + 40_000, 10), &noise[40_000..40_010]);
    }

    #[test]
    fn a_compressible_spool_takes_little_disk() {
        let budget = TempBudget::new(1 << 20);
        let mut spool = Spool::new(None, Charge::new(Some(&budget))).unwrap();
        let zeros = vec![0u8; 1 << 20];
        for _ in 0..64 {
            spool.append(&zeros).unwrap();
        }
        let file = spool.finish().unwrap();
        // 64 MiB of zeros fit in well under 1 MiB of budget.
        assert!(budget.used() < 512 * 1024, "{}", budget.used());
        assert_eq!(read(&file, (63 << 20) + 5, 3), vec![0, 0, 0]);
    }

    #[test]
    fn writes_past_the_budget_fail() {
        let budget = TempBudget::new(100_000);
        let charge = Charge::new(Some(&budget));
        let mut spool = Spool::new(None, charge.clone()).unwrap();
        let noise = noise(400_000);
        let err = spool
            .append(&noise)
            .and_then(|()| spool.finish().map(drop))
            .unwrap_err();
        assert!(err.to_string().contains("100000 bytes"), "{err}");
        assert_eq!(charge.refused(), Some(100_000));
    }
}
