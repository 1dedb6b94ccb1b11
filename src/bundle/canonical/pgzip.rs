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
    format!("pgzip1+zlib-rs-{ZLIB_RS}+level-{}", level.min(9))
}

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

/// A worker's reusable deflate state.
pub(crate) struct PieceCompressor {
    level: u32,
    deflate: Compress,
}

impl PieceCompressor {
    /// Compressor for `level` (0–9; 0 stores everything).
    pub(crate) fn new(level: u32) -> Self {
        let level = level.min(9);
        Self {
            level,
            deflate: Compress::new(Compression::new(level), false),
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
        // The dictionary goes after the reset, before any input.
        self.deflate.reset();
        if let Some(p) = prev {
            self.deflate
                .set_dictionary(&p[p.len().saturating_sub(DICT)..])?;
        }
        out.clear();
        run(&mut self.deflate, data, FlushCompress::Sync, &mut out)?;
        Ok(Compressed {
            body: Body::Deflated(out),
            crc,
        })
    }
}

/// Feeds all of `input` to `c` with `flush` into `out`, until the flush is
/// complete. (Deflate at level 1 and up does not depend on the output
/// room offered.)
fn run(
    c: &mut Compress,
    input: &[u8],
    flush: FlushCompress,
    out: &mut Vec<u8>,
) -> Result<(), flate2::CompressError> {
    let start = c.total_in();
    out.reserve(input.len() / 2 + 64);
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
        assert_eq!(encoding(1), format!("pgzip1+zlib-rs-{ZLIB_RS}+level-1"));
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
