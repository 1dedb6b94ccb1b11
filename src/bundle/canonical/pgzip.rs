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

/// One compressed piece and the CRC-32 of its raw bytes.
#[derive(Debug)]
pub(crate) struct Compressed {
    /// Raw deflate blocks, ending byte-aligned (sync flush).
    pub bytes: Vec<u8>,
    /// CRC-32 and length of the raw piece.
    pub crc: Crc,
}

/// A worker's reusable deflate states.
pub(crate) struct PieceCompressor {
    level: u32,
    deflate: Compress,
    stored: Compress,
}

impl PieceCompressor {
    /// Compressor for `level` (0–9).
    pub(crate) fn new(level: u32) -> Self {
        let level = level.min(9);
        Self {
            level,
            deflate: Compress::new(Compression::new(level), false),
            stored: Compress::new(Compression::none(), false),
        }
    }

    /// Compresses `data`, primed with the tail of `prev` (the piece before
    /// it in its chain, if any).
    pub(crate) fn compress(
        &mut self,
        data: &[u8],
        prev: Option<&[u8]>,
    ) -> Result<Compressed, flate2::CompressError> {
        let mut crc = Crc::new();
        crc.update(data);
        let bytes = if self.level == 0 || looks_incompressible(data) {
            self.stored.reset();
            run(&mut self.stored, data, FlushCompress::Sync)?
        } else {
            // The dictionary goes after the reset, before any input.
            self.deflate.reset();
            if let Some(p) = prev {
                self.deflate
                    .set_dictionary(&p[p.len().saturating_sub(DICT)..])?;
            }
            run(&mut self.deflate, data, FlushCompress::Sync)?
        };
        Ok(Compressed { bytes, crc })
    }
}

/// Feeds all of `input` to `c` with `flush`, until the flush is complete.
///
/// The output room offered is a fixed function of the input length, never
/// of allocator behaviour: how zlib cuts stored blocks depends on it.
fn run(
    c: &mut Compress,
    input: &[u8],
    flush: FlushCompress,
) -> Result<Vec<u8>, flate2::CompressError> {
    // Stored blocks cost 5 bytes per 64 KiB and deflate expands random
    // data by less than that: one call normally finishes.
    let room = input.len() + input.len() / 64 + 64;
    let mut out = vec![0u8; room];
    let (start_in, start_out) = (c.total_in(), c.total_out());
    loop {
        let done_in = usize::try_from(c.total_in() - start_in).unwrap_or(usize::MAX);
        let done_out = usize::try_from(c.total_out() - start_out).unwrap_or(usize::MAX);
        c.compress(&input[done_in..], &mut out[done_out..], flush)?;
        let done_in = usize::try_from(c.total_in() - start_in).unwrap_or(usize::MAX);
        let done_out = usize::try_from(c.total_out() - start_out).unwrap_or(usize::MAX);
        // zlib's rule: the flush is complete when output room is left.
        if done_in >= input.len() && done_out < out.len() {
            out.truncate(done_out);
            return Ok(out);
        }
        if done_out == out.len() {
            out.resize(out.len() + room, 0);
        }
    }
}

/// The end of the member: an empty final deflate block, then the CRC-32
/// and the size (mod 2^32) of everything compressed.
pub(crate) fn trailer(crc: &Crc) -> Result<Vec<u8>, flate2::CompressError> {
    let mut c = Compress::new(Compression::fast(), false);
    let mut out = run(&mut c, &[], FlushCompress::Finish)?;
    out.extend_from_slice(&crc.sum().to_le_bytes());
    out.extend_from_slice(&crc.amount().to_le_bytes());
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read;

    fn noise(n: usize) -> Vec<u8> {
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        (0..n)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                (x >> 24) as u8
            })
            .collect()
    }

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
            let out = c.compress(piece, prev).unwrap();
            crc.combine(&out.crc);
            sizes.push(out.bytes.len());
            member.extend_from_slice(&out.bytes);
            prev = Some(piece);
        }
        member.extend(trailer(&crc).unwrap());
        // The random piece is stored (a little over its size), the text
        // pieces shrink to almost nothing.
        assert!(sizes[0] > PIECE && sizes[0] < PIECE + 64, "{sizes:?}");
        assert!(sizes[2] < PIECE / 64, "{sizes:?}");
        let mut back = Vec::new();
        flate2::read::GzDecoder::new(&member[..])
            .read_to_end(&mut back)
            .unwrap();
        assert_eq!(back, data);
        // Same input, same bytes.
        let again = c.compress(&data[..PIECE], None).unwrap();
        assert_eq!(again.bytes.len(), sizes[0]);
    }
}
