//! Bundles and helpers shared by the workload tests.

use std::io::Read;

use flate2::write::GzEncoder;
use flate2::Compression;
use sha2::{Digest, Sha256};

/// Media type of bundles.
pub(crate) const MEDIA: &str = "application/vnd.rossoctl.context";

/// A gzip-compressed tar of `files` (path, contents), mode 0644.
pub(crate) fn tgz(files: &[(&str, &[u8])]) -> Vec<u8> {
    let mut builder = tar::Builder::new(GzEncoder::new(Vec::new(), Compression::fast()));
    for (path, data) in files {
        let mut header = tar::Header::new_gnu();
        header.set_size(data.len() as u64);
        header.set_mode(0o644);
        header.set_entry_type(tar::EntryType::Regular);
        header.set_mtime(1_700_000_000);
        builder.append_data(&mut header, path, *data).unwrap();
    }
    builder.into_inner().unwrap().finish().unwrap()
}

/// A gzip-compressed tar with one member whose raw name is `name` (the tar
/// crate refuses `..` in `append_data`, so the header is written by hand).
pub(crate) fn tgz_raw_name(name: &str, data: &[u8]) -> Vec<u8> {
    super::archive::gz(&super::archive::TarBuf::new().file(name, data).finish())
}

/// Deterministic pseudo-random bytes (incompressible enough for size tests).
pub(crate) fn noise(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 24) as u8
        })
        .collect()
}

/// sha256 hex.
pub(crate) fn sha256(data: &[u8]) -> String {
    hex::encode(Sha256::digest(data))
}

/// The files of a gzip tar bundle, sorted by path (regular files only).
pub(crate) fn unpack(bundle: &[u8]) -> Vec<(String, Vec<u8>)> {
    let mut archive = tar::Archive::new(flate2::read::GzDecoder::new(bundle));
    let mut out = Vec::new();
    for entry in archive.entries().unwrap() {
        let mut entry = entry.unwrap();
        if entry.header().entry_type() != tar::EntryType::Regular {
            continue;
        }
        let path = entry.path().unwrap().to_string_lossy().into_owned();
        let mut data = Vec::new();
        entry.read_to_end(&mut data).unwrap();
        out.push((path, data));
    }
    out.sort();
    out
}

/// The decompressed tar of a gzip bundle.
pub(crate) fn gunzip(bundle: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    flate2::read::GzDecoder::new(bundle)
        .read_to_end(&mut out)
        .unwrap();
    out
}
