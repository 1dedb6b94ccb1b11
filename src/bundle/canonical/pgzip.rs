//! The canonical gzip encoding: deterministic, and compressed in parallel.
//!
//! The canonical tar is cut into *pieces* (see `cutter`); each piece is
//! compressed on its own as raw deflate ending in a sync flush (so pieces
//! are byte-aligned and concatenate, as pigz does), with the last 32 KiB of
//! the piece before it in the same chain as the dictionary. A piece whose
//! bytes look incompressible (an integer chi-squared test on a fixed sample)
//! is written as stored blocks instead of being deflated: level-1 deflate of
//! random data runs at ~100 MB/s for nothing.
//!
//! The member is: a fixed 10-byte gzip header (mtime 0, no name, OS 255),
//! the pieces in order, an empty final block, the CRC-32 and the size. Its
//! bytes depend only on the canonical tar, the level and the deflate
//! implementation, which [`encoding`] names; that name is recorded with
//! every stored bundle, because the bundleDigest is the sha256 of these
//! bytes.
//!
//! So a piece's deflate output must be a function of its bytes, its
//! dictionary and the level alone, whichever worker compresses it and
//! whatever that worker did before. Two things once leaked scheduling into
//! it (format `pgzip1`, whose bundles differed from run to run):
//! - a *reset* zlib-rs stream keeps its old window, and inserting the
//!   dictionary (and later input) into the hash reads one byte past the
//!   data, so matches depended on the piece the worker had compressed
//!   before. Every piece now gets a fresh stream, whose window starts
//!   zeroed;
//! - a sync flush that ends exactly at the end of the output room is
//!   repeated by the next call (zlib's rule), so the bytes depended on the
//!   capacity of the recycled output buffer. The room offered now always
//!   exceeds the largest possible output, so a piece is one call.

use flate2::{Compress, Compression, Crc, FlushCompress};

/// Largest piece: big enough that per-piece costs (sync flush, lost
/// context, hand-offs) vanish, small enough for both cores to share a
/// 1 MiB file.
pub(crate) const PIECE: usize = 256 * 1024;

/// The deflate window: how much of the previous piece primes the next.
const DICT: usize = 32 * 1024;

/// The zlib-rs release whose deflate output the encoding pins (checked
/// against Cargo.lock by a test: bumping zlib-rs must bump this).
pub(crate) const ZLIB_RS: &str = "0.6.8";

/// Name of the encoding written at `level`, recorded with each stored
/// bundle. Changing anything that changes the bytes changes this name.
pub(crate) fn encoding(level: u32) -> String {
    format!("{FORMAT}+zlib-rs-{ZLIB_RS}+level-{}", level.min(9))
}

/// The version of this encoding: bumped whenever the same canonical tar,
/// level and zlib-rs would give other bytes. `pgzip1` (before) could give
/// different bytes from one run to the next (see the module docs).
pub(crate) const FORMAT: &str = "pgzip2";

/// The gzip member header (RFC 1952): deflate, no flags, mtime 0, no extra
/// flags, OS "unknown".
pub(crate) const HEADER: [u8; 10] = [0x1f, 0x8b, 8, 0, 0, 0, 0, 0, 0, 255];

/// Sample for the compressibility test: `WINDOWS` windows of `WINDOW`
/// bytes spread evenly over the piece.
const WINDOW: usize = 1024;
const WINDOWS: usize = 16;

/// Whether `data` looks incompressible: its byte histogram (on a fixed
/// sample) is close to uniform. With `n` sampled bytes and counts `c`, the
/// chi-squared statistic against uniform is `256·Σc²/n − n`; below `n/16`
/// the order-0 entropy is within ~0.05 bit/byte of 8, so deflate could gain
/// well under 1%. Integer arithmetic only: the choice (and so the bytes)
/// is the same on every machine.
pub(crate) fn looks_incompressible(data: &[u8]) -> bool {
    if data.len() < WINDOW * WINDOWS {
        return false;
    }
    let mut counts = [0u64; 256];
    let stride = (data.len() - WINDOW) / (WINDOWS - 1);
    for w in 0..WINDOWS {
        for b in &data[w * stride..w * stride + WINDOW] {
            counts[usize::from(*b)] += 1;
        }
    }
    let n = (WINDOW * WINDOWS) as u64;
    let sum_sq: u64 = counts.iter().map(|c| c * c).sum();
    // chi2 = 256·Σc²/n − n ≤ n/16  ⇔  256·Σc² ≤ n² + n²/16
    256 * sum_sq <= n * n + n * n / 16
}

/// How a piece is encoded.
#[derive(Debug)]
pub(crate) enum Body {
    /// Raw deflate blocks, ending byte-aligned (sync flush).
    Deflated(Vec<u8>),
    /// Stored blocks framing the piece's own bytes (see [`stored_blocks`]),
    /// written without copying them.
    Stored,
}

/// One compressed piece and the CRC-32 of its raw bytes.
#[derive(Debug)]
pub(crate) struct Compressed {
    /// The encoding.
    pub body: Body,
    /// CRC-32 and length of the raw piece.
    pub crc: Crc,
}

/// Largest stored block (RFC 1951 §3.2.4).
const MAX_STORED: usize = 65_535;

/// Writes `data` as stored blocks, starting byte-aligned and ending
/// byte-aligned, none of them final. Framed here rather than by zlib's
/// level 0 because zlib sizes stored blocks by the output room it is
/// given, which would make the bytes depend on buffer sizes.
pub(crate) fn stored_blocks<E>(
    data: &[u8],
    mut emit: impl FnMut(&[u8]) -> Result<(), E>,
) -> Result<(), E> {
    for block in data.chunks(MAX_STORED) {
        // BFINAL 0, BTYPE 00, padding to the byte; LEN and its complement.
        let len = u16::try_from(block.len()).unwrap_or(u16::MAX);
        let [l0, l1] = len.to_le_bytes();
        let [n0, n1] = (!len).to_le_bytes();
        emit(&[0, l0, l1, n0, n1])?;
        emit(block)?;
    }
    Ok(())
}

/// A worker's piece compressor.
pub(crate) struct PieceCompressor {
    level: u32,
}

impl PieceCompressor {
    /// Compressor for `level` (0–9; 0 stores everything).
    pub(crate) fn new(level: u32) -> Self {
        Self {
            level: level.min(9),
        }
    }

    /// Compresses `data`, primed with the tail of `prev` (the piece before
    /// it in its chain, if any), into `out` (a recycled buffer; its
    /// capacity does not change the bytes).
    pub(crate) fn compress(
        &mut self,
        data: &[u8],
        prev: Option<&[u8]>,
        mut out: Vec<u8>,
    ) -> Result<Compressed, flate2::CompressError> {
        let mut crc = Crc::new();
        crc.update(data);
        if self.level == 0 || looks_incompressible(data) {
            return Ok(Compressed {
                body: Body::Stored,
                crc,
            });
        }
        // A fresh stream, not a reset one: a reset stream's stale window
        // changes the output (see the module docs). Its allocation is
        // small next to deflating a piece.
        let mut deflate = Compress::new(Compression::new(self.level), false);
        if let Some(p) = prev {
            deflate.set_dictionary(&p[p.len().saturating_sub(DICT)..])?;
        }
        out.clear();
        run(&mut deflate, data, FlushCompress::Sync, &mut out)?;
        Ok(Compressed {
            body: Body::Deflated(out),
            crc,
        })
    }
}

/// More than deflate can write for `len` bytes and a sync flush: a static
/// block spends at most 9 bits a byte, a stored one 5 bytes per 64 KiB
/// (zlib-rs' `compress_bound` is `len + len/8` and a few bytes).
fn deflate_bound(len: usize) -> usize {
    len + len / 8 + len / 64 + 64
}

/// Feeds all of `input` to `c` with `flush` into `out`, until the flush is
/// complete. The room offered exceeds [`deflate_bound`], so it takes one
/// call and the bytes do not depend on `out`'s capacity: a sync flush
/// that filled the room exactly would be repeated by a second call.
fn run(
    c: &mut Compress,
    input: &[u8],
    flush: FlushCompress,
    out: &mut Vec<u8>,
) -> Result<(), flate2::CompressError> {
    let start = c.total_in();
    out.reserve(deflate_bound(input.len()));
    loop {
        let done = usize::try_from(c.total_in() - start).unwrap_or(usize::MAX);
        c.compress_vec(&input[done..], out, flush)?;
        let done = usize::try_from(c.total_in() - start).unwrap_or(usize::MAX);
        // zlib's rule: the flush is complete when output room is left.
        if done >= input.len() && out.len() < out.capacity() {
            return Ok(());
        }
        out.reserve(out.capacity() / 2 + 64);
    }
}

/// The end of the member: an empty final deflate block, then the CRC-32
/// and the size (mod 2^32) of everything compressed.
pub(crate) fn trailer(crc: &Crc) -> Result<Vec<u8>, flate2::CompressError> {
    let mut c = Compress::new(Compression::fast(), false);
    let mut out = Vec::new();
    run(&mut c, &[], FlushCompress::Finish, &mut out)?;
    out.extend_from_slice(&crc.sum().to_le_bytes());
    out.extend_from_slice(&crc.amount().to_le_bytes());
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read;

    use crate::bundle::noise;

    #[test]
    fn the_pinned_zlib_rs_is_the_locked_one() {
        let lock = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/Cargo.lock"))
            .expect("Cargo.lock");
        let locked = lock
            .split("[[package]]")
            .find(|p| p.contains("name = \"zlib-rs\""))
            .and_then(|p| p.lines().find_map(|l| l.strip_prefix("version = ")))
            .map(|v| v.trim_matches('"').to_owned());
        // A new zlib-rs may deflate differently: name the new encoding.
        assert_eq!(locked.as_deref(), Some(ZLIB_RS));
        assert_eq!(encoding(1), format!("pgzip2+zlib-rs-{ZLIB_RS}+level-1"));
    }

    #[test]
    fn random_looks_incompressible_and_text_does_not() {
        assert!(looks_incompressible(&noise(PIECE)));
        let text: Vec<u8> = b"context files for agents\n"
            .iter()
            .copied()
            .cycle()
            .take(PIECE)
            .collect();
        assert!(!looks_incompressible(&text));
        // Mostly random with a text tail is still deflated.
        let mut mixed = noise(PIECE / 2);
        mixed.extend_from_slice(&text[..PIECE / 2]);
        assert!(!looks_incompressible(&mixed));
        // Too short to judge: deflated.
        assert!(!looks_incompressible(&noise(1000)));
    }

    /// Text-like bytes: words of a small vocabulary, numbers, lines.
    fn text(seed: u64, len: usize) -> Vec<u8> {
        let words: Vec<&str> = "fn let mut self pub struct impl use crate io Result Ok Err \
            match Some None return the a of to bundle piece deflate worker writer hasher \
            canonical tar gzip stream bytes"
            .split_whitespace()
            .collect();
        let mut x = seed | 1;
        let mut out = Vec::with_capacity(len + 16);
        while out.len() < len {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            match x % 16 {
                0 => out.extend_from_slice(b"\n    "),
                1 => out.extend_from_slice((x % 100_000).to_string().as_bytes()),
                _ => {
                    let w = usize::try_from(x >> 8).unwrap() % words.len();
                    out.extend_from_slice(words[w].as_bytes());
                    out.push(b' ');
                }
            }
        }
        out.truncate(len);
        out
    }

    fn deflated(c: Compressed) -> Vec<u8> {
        match c.body {
            Body::Deflated(b) => b,
            Body::Stored => panic!("text is deflated"),
        }
    }

    /// Format `pgzip1` reused a reset zlib-rs stream, whose stale window
    /// changed a piece's bytes after some other pieces (seeds 38 and 39
    /// here; a worker's previous piece in real runs). The bytes are now
    /// those of a fresh stream whatever the compressor did before, and
    /// whatever buffer it is given.
    #[test]
    fn a_piece_does_not_depend_on_what_was_compressed_before() {
        for seed in [38, 39] {
            let data = text(seed, 4 * PIECE);
            let other = text(seed + 1000, PIECE);
            let pieces: Vec<&[u8]> = data.chunks(PIECE).collect();
            for i in 1..pieces.len() {
                let (piece, prev) = (pieces[i], Some(pieces[i - 1]));
                let fresh = deflated(
                    PieceCompressor::new(1)
                        .compress(piece, prev, Vec::new())
                        .unwrap(),
                );
                let mut used = PieceCompressor::new(1);
                used.compress(&other, None, Vec::new()).unwrap();
                let after = used.compress(piece, prev, Vec::new()).unwrap();
                assert!(deflated(after) == fresh, "seed {seed}, piece {i}");
                // A recycled buffer of any capacity: the same bytes.
                for cap in [fresh.len(), fresh.len() + 1, fresh.len() + 5, 3 * PIECE] {
                    let again = used.compress(piece, prev, Vec::with_capacity(cap)).unwrap();
                    assert!(
                        deflated(again) == fresh,
                        "seed {seed}, piece {i}, capacity {cap}"
                    );
                }
            }
        }
    }

    #[test]
    fn pieces_concatenate_into_one_valid_member() {
        let mut data = noise(PIECE + 1000);
        data.extend(b"abc".iter().copied().cycle().take(PIECE * 2 + 17));
        let mut c = PieceCompressor::new(1);
        let mut member = HEADER.to_vec();
        let mut crc = Crc::new();
        let mut prev: Option<&[u8]> = None;
        let mut sizes = Vec::new();
        for piece in data.chunks(PIECE) {
            let out = c.compress(piece, prev, Vec::new()).unwrap();
            crc.combine(&out.crc);
            let before = member.len();
            match out.body {
                Body::Deflated(b) => member.extend_from_slice(&b),
                Body::Stored => stored_blocks(piece, |b: &[u8]| -> Result<(), ()> {
                    member.extend_from_slice(b);
                    Ok(())
                })
                .unwrap(),
            }
            sizes.push(member.len() - before);
            prev = Some(piece);
        }
        member.extend(trailer(&crc).unwrap());
        // The random piece is stored (5 bytes per 64 KiB block), the text
        // pieces shrink to almost nothing.
        assert_eq!(sizes[0], PIECE + 5 * 5, "{sizes:?}");
        assert!(sizes[2] < PIECE / 64, "{sizes:?}");
        let mut back = Vec::new();
        flate2::read::GzDecoder::new(&member[..])
            .read_to_end(&mut back)
            .unwrap();
        assert_eq!(back, data);
        // Same input, same bytes, whatever buffer it is given.
        let a = c
            .compress(&data[PIECE..2 * PIECE], None, Vec::new())
            .unwrap();
        let b = c
            .compress(&data[PIECE..2 * PIECE], None, Vec::with_capacity(3))
            .unwrap();
        match (a.body, b.body) {
            (Body::Deflated(a), Body::Deflated(b)) => assert_eq!(a, b),
            other => panic!("{other:?}"),
        }
    }
}
