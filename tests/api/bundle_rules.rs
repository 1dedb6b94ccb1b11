//! Every rejection rule answers its own error, naming the entry; valid
//! archives are accepted.

use std::io::{self, Read};

use crate::common::*;
use context_service::bundle::{self, BundleError, CanonicalOptions, DeviceKind, Limits, LinkKind};
use sha2::{Digest, Sha256};

fn ok_tar(tar: Vec<u8>) -> bundle::Report {
    check(&gz(&tar), &Limits::default()).expect("accepted")
}

#[test]
fn accepts_a_plain_archive() {
    let r = ok_tar(
        TarBuf::new()
            .dir("./")
            .dir("./docs/")
            .file("./docs/a.md", b"hello")
            .file("top.txt", b"x")
            .finish(),
    );
    assert_eq!((r.files, r.dirs, r.entries, r.input_entries), (2, 1, 3, 4));
    assert_eq!(r.revision.len(), 64);
    assert!(r
        .revision
        .bytes()
        .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)));
}

#[test]
fn absolute_path() {
    let e = reject_tar(TarBuf::new().file("/etc/passwd", b"x").finish());
    assert_rejected(&e, "absolute_path", Some("/etc/passwd"));
}

#[test]
fn dot_dot() {
    let e = reject_tar(TarBuf::new().file("a/../../evil", b"x").finish());
    assert_rejected(&e, "path_traversal", Some("a/../../evil"));
}

#[test]
fn backslash() {
    let e = reject_tar(TarBuf::new().file("a\\b", b"x").finish());
    assert_rejected(&e, "backslash_in_path", Some("a\\b"));
}

#[test]
fn nul_in_pax_path() {
    let e = reject_tar(
        TarBuf::new()
            .pax(&[("path", b"a\0b")])
            .file("placeholder", b"x")
            .finish(),
    );
    assert_rejected(&e, "nul_in_path", Some("a\0b"));
}

#[test]
fn nul_in_gnu_long_name() {
    let name = b"long\0name";
    let h = raw_header(b"././@LongLink", b'L', name.len() as u64);
    let e = reject_tar(TarBuf::new().raw(&h, name).file("x", b"x").finish());
    assert_rejected(&e, "nul_in_path", Some("long\0name"));
}

#[test]
fn empty_name() {
    let e = reject_tar(TarBuf::new().file("", b"x").finish());
    assert_rejected(&e, "empty_path", Some(""));
    let e = reject_tar(TarBuf::new().file("./", b"").finish());
    // A regular file named "./" is ambiguous; refused as a malformed name.
    assert_rejected(&e, "invalid_tar", Some("./"));
    let e = reject_tar(TarBuf::new().file(".", b"").finish());
    assert_rejected(&e, "empty_path", Some("."));
}

#[test]
fn non_utf8_name() {
    let h = raw_header(b"caf\xe9.txt", b'0', 1);
    let e = reject_tar(TarBuf::new().raw(&h, b"x").finish());
    assert_rejected(&e, "non_utf8_path", Some("caf\u{fffd}.txt"));
}

#[test]
fn duplicate_file_after_normalising() {
    let e = reject_tar(
        TarBuf::new()
            .file("a.txt", b"1")
            .file("./a.txt", b"2")
            .finish(),
    );
    assert_rejected(&e, "duplicate_path", Some("a.txt"));
}

#[test]
fn duplicate_dir_after_normalising_trailing_slash() {
    let e = reject_tar(TarBuf::new().dir("d/").dir("./d").finish());
    assert_rejected(&e, "duplicate_path", Some("d"));
}

#[test]
fn file_and_directory_with_the_same_path() {
    let e = reject_tar(TarBuf::new().file("x", b"1").dir("x/").finish());
    assert_rejected(&e, "file_dir_conflict", Some("x"));
    let e = reject_tar(TarBuf::new().file("x", b"1").file("x/y", b"2").finish());
    assert_rejected(&e, "file_dir_conflict", Some("x"));
}

#[test]
fn symlink() {
    let mut h = raw_header(b"link", b'2', 0);
    h.set_link_name("/etc/shadow").unwrap();
    h.set_cksum();
    let e = reject_tar(TarBuf::new().raw(&h, &[]).finish());
    assert_rejected(&e, "link_not_allowed", Some("link"));
    assert!(matches!(
        e,
        BundleError::LinkNotAllowed {
            kind: LinkKind::Symbolic,
            ..
        }
    ));
}

#[test]
fn hard_link() {
    let mut h = raw_header(b"hard", b'1', 0);
    h.set_link_name("a.txt").unwrap();
    h.set_cksum();
    let e = reject_tar(TarBuf::new().file("a.txt", b"x").raw(&h, &[]).finish());
    assert_rejected(&e, "link_not_allowed", Some("hard"));
    assert!(matches!(
        e,
        BundleError::LinkNotAllowed {
            kind: LinkKind::Hard,
            ..
        }
    ));
}

#[test]
fn char_and_block_devices() {
    let e = reject_tar(TarBuf::new().typed("dev/null", b'3').finish());
    assert_rejected(&e, "device_not_allowed", Some("dev/null"));
    assert!(matches!(
        e,
        BundleError::DeviceNotAllowed {
            kind: DeviceKind::Char,
            ..
        }
    ));
    let e = reject_tar(TarBuf::new().typed("dev/sda", b'4').finish());
    assert_rejected(&e, "device_not_allowed", Some("dev/sda"));
    assert!(matches!(
        e,
        BundleError::DeviceNotAllowed {
            kind: DeviceKind::Block,
            ..
        }
    ));
}

#[test]
fn fifo() {
    let e = reject_tar(TarBuf::new().typed("pipe", b'6').finish());
    assert_rejected(&e, "fifo_not_allowed", Some("pipe"));
}

#[test]
fn gnu_sparse_old_and_pax() {
    let e = reject_tar(TarBuf::new().typed("sparse.img", b'S').finish());
    assert_rejected(&e, "sparse_not_allowed", Some("sparse.img"));
    let e = reject_tar(
        TarBuf::new()
            .pax(&[("GNU.sparse.major", b"1"), ("GNU.sparse.minor", b"0")])
            .file("disk.img", b"x")
            .finish(),
    );
    assert_rejected(&e, "sparse_not_allowed", Some("disk.img"));
}

#[test]
fn unknown_type_flag() {
    let e = reject_tar(TarBuf::new().typed("label", b'V').finish());
    assert_rejected(&e, "unknown_entry_type", Some("label"));
    let e = reject_tar(TarBuf::new().typed("weird", b'Z').finish());
    assert_rejected(&e, "unknown_entry_type", Some("weird"));
}

#[test]
fn pax_global_header_that_changes_paths() {
    let data = pax_records(&[("path", b"evil")]);
    let h = raw_header(b"pax_global_header", b'g', data.len() as u64);
    let e = reject_tar(TarBuf::new().raw(&h, &data).file("a", b"x").finish());
    assert_rejected(&e, "pax_global_header", None);
}

#[test]
fn git_archive_comment_header_is_accepted() {
    let data = pax_records(&[("comment", b"0123456789abcdef")]);
    let h = raw_header(b"pax_global_header", b'g', data.len() as u64);
    let r = ok_tar(TarBuf::new().raw(&h, &data).file("a", b"x").finish());
    assert_eq!(r.files, 1);
}

#[test]
fn truncated_gzip() {
    let full = gz(&TarBuf::new().file("a", &[7u8; 10_000]).finish());
    for cut in [full.len() / 2, full.len() - 4, 5] {
        let e = check(&full[..cut], &Limits::default()).unwrap_err();
        assert_rejected(&e, "truncated_gzip", None);
    }
}

#[test]
fn not_gzip() {
    let e = check(b"PK\x03\x04 this is a zip", &Limits::default()).unwrap_err();
    assert_rejected(&e, "invalid_gzip", None);
    assert_eq!(
        e.to_string(),
        format!(
            "the upload is not gzip (it does not start with the bytes 1f 8b); {}",
            bundle::BUNDLE_EXPECTED
        )
    );
}

/// Hands out its bytes one per read.
struct OneByte<'a>(&'a [u8]);

impl Read for OneByte<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let Some((first, rest)) = self.0.split_first() else {
            return Ok(0);
        };
        match buf.first_mut() {
            Some(b) => *b = *first,
            None => return Ok(0),
        }
        self.0 = rest;
        Ok(1)
    }
}

#[test]
fn an_uncompressed_tar_is_named_as_such() {
    let tar = TarBuf::new().file("a", b"hello").finish();
    // Read whole, and a byte at a time (the magic is past the first read).
    let one_by_one = OneByte(&tar);
    for e in [
        check(&tar, &Limits::default()).unwrap_err(),
        bundle::inspect(one_by_one, &Limits::default()).unwrap_err(),
    ] {
        assert_rejected(&e, "invalid_gzip", None);
        assert_eq!(
            e.to_string(),
            format!(
                "the upload is a tar archive without gzip compression; {}",
                bundle::BUNDLE_EXPECTED
            )
        );
    }
}

#[test]
fn corrupt_gzip_crc() {
    let mut full = gz(&TarBuf::new().file("a", b"hello").finish());
    let n = full.len();
    full[n - 8] ^= 0xff; // CRC32 in the trailer
    let e = check(&full, &Limits::default()).unwrap_err();
    assert_rejected(&e, "invalid_gzip", None);
}

#[test]
fn trailing_garbage_after_gzip() {
    let mut full = gz(&TarBuf::new().file("a", b"hello").finish());
    full.extend_from_slice(b"garbage");
    let e = check(&full, &Limits::default()).unwrap_err();
    assert_rejected(&e, "trailing_garbage", None);
    // A second gzip member counts as trailing data too.
    let mut two = gz(&TarBuf::new().file("a", b"hello").finish());
    two.extend_from_slice(&gz(b"more"));
    let e = check(&two, &Limits::default()).unwrap_err();
    assert_rejected(&e, "trailing_garbage", None);
}

#[test]
fn tar_without_end_marker() {
    let tar = TarBuf::new().file("a", b"hello").0;
    let e = reject_tar(tar);
    assert_rejected(&e, "truncated_tar", None);
    // Only one of the two zero blocks.
    let mut one = TarBuf::new().file("a", b"hello").0;
    one.extend_from_slice(&[0u8; 512]);
    let e = reject_tar(one);
    assert_rejected(&e, "truncated_tar", None);
}

#[test]
fn tar_cut_inside_an_entry() {
    let tar = TarBuf::new().file("big.bin", &[1u8; 4096]).0;
    let e = reject_tar(tar[..512 + 1000].to_vec());
    assert_rejected(&e, "truncated_tar", Some("big.bin"));
    let e = reject_tar(tar[..300].to_vec());
    assert_rejected(&e, "truncated_tar", None);
}

#[test]
fn data_after_end_marker() {
    let mut tar = TarBuf::new().file("a", b"x").finish();
    tar.extend_from_slice(&TarBuf::new().file("smuggled", b"y").finish());
    let e = reject_tar(tar);
    assert_rejected(&e, "tar_trailing_data", None);
    // Zero padding after the marker (as tar's 10 KiB records) is fine.
    let mut padded = TarBuf::new().file("a", b"x").finish();
    padded.extend_from_slice(&[0u8; 8192]);
    assert_eq!(ok_tar(padded).files, 1);
}

#[test]
fn bad_header_checksum() {
    let mut h = raw_header(b"a", b'0', 1);
    h.as_mut_bytes()[0] = b'b'; // changes the name after the checksum
    let e = reject_tar(TarBuf::new().raw(&h, b"x").finish());
    assert_rejected(&e, "invalid_tar", Some("b"));
}

#[test]
fn orphan_extension_header() {
    let e = reject_tar(TarBuf::new().pax(&[("path", b"x")]).finish());
    assert_rejected(&e, "invalid_tar", None);
}

#[test]
fn compressed_too_large() {
    let gzipped = gz_level(
        &TarBuf::new().file("r", &pseudo_random(64 * 1024)).finish(),
        1,
    );
    let limits = Limits {
        compressed_bytes: 10_000,
        ..Limits::default()
    };
    let e = check(&gzipped, &limits).unwrap_err();
    assert_rejected(&e, "compressed_too_large", None);
    assert!(e.is_too_large());
}

#[test]
fn inflated_too_large() {
    let tar = TarBuf::new().file("a", &[0u8; 20_000]).finish();
    let limits = Limits {
        inflated_bytes: 10_000,
        ..Limits::default()
    };
    let e = check(&gz(&tar), &limits).unwrap_err();
    assert_rejected(&e, "inflated_too_large", Some("a"));
    assert!(e.is_too_large());
}

#[test]
fn inflated_limit_counts_the_stream_not_headers() {
    // Zero padding after the end marker is not described by any header:
    // only the byte counter can stop it.
    let mut tar = TarBuf::new().file("a", b"x").finish();
    tar.extend(std::iter::repeat_n(0u8, 100_000));
    let limits = Limits {
        inflated_bytes: 50_000,
        ..Limits::default()
    };
    let e = check(&gz(&tar), &limits).unwrap_err();
    assert_rejected(&e, "inflated_too_large", None);
}

#[test]
fn file_too_large() {
    let tar = TarBuf::new()
        .file("small", b"x")
        .file("big", &[0u8; 5000])
        .finish();
    let limits = Limits {
        file_bytes: 4096,
        ..Limits::default()
    };
    let e = check(&gz(&tar), &limits).unwrap_err();
    assert_rejected(&e, "file_too_large", Some("big"));
    assert!(e.is_too_large());
}

#[test]
fn path_too_long() {
    let long = "d/".repeat(40) + "f";
    let tar = TarBuf::new()
        .pax(&[("path", long.as_bytes())])
        .file("placeholder", b"x")
        .finish();
    let limits = Limits {
        path_bytes: 50,
        ..Limits::default()
    };
    let e = check(&gz(&tar), &limits).unwrap_err();
    assert_rejected(&e, "path_too_long", Some(long.as_str()));
    assert!(!e.is_too_large());
}

#[test]
fn name_too_long() {
    // 256 bytes in one component: no sandbox could create it (NAME_MAX).
    let long = "n".repeat(256);
    let tar = TarBuf::new()
        .pax(&[("path", long.as_bytes())])
        .file("placeholder", b"x")
        .finish();
    let e = reject_tar(tar);
    assert_rejected(&e, "name_too_long", Some(long.as_str()));
    assert!(!e.is_too_large());
    assert_eq!(
        e.to_string(),
        format!("path {long:?} has a 256-byte component, over the 255-byte limit")
    );
    // Exactly 255 bytes is fine, also for directory packing.
    let ok = format!("d/{}/f", "n".repeat(255));
    let tar = TarBuf::new()
        .pax(&[("path", ok.as_bytes())])
        .file("placeholder", b"x")
        .finish();
    assert_eq!(ok_tar(tar).files, 1);
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::write(dir.path().join("n".repeat(255)), b"x").expect("write");
    let r = bundle::pack_dir(
        dir.path(),
        &Limits::default(),
        &CanonicalOptions::default(),
        io::sink(),
    )
    .expect("packed");
    assert_eq!(r.files, 1);
}

#[test]
fn gnu_long_name_longer_than_the_path_limit() {
    let name = vec![b'a'; 5000];
    let h = raw_header(b"././@LongLink", b'L', name.len() as u64);
    let e = reject_tar(TarBuf::new().raw(&h, &name).file("x", b"x").finish());
    assert_eq!(e.code(), "path_too_long");
}

#[test]
fn path_too_deep() {
    let deep = "d/".repeat(65) + "f";
    let tar = TarBuf::new()
        .pax(&[("path", deep.as_bytes())])
        .file("placeholder", b"x")
        .finish();
    let e = reject_tar(tar);
    assert_rejected(&e, "path_too_deep", Some(deep.as_str()));
    // Exactly 64 levels is fine.
    let ok = "d/".repeat(63) + "f";
    let tar = TarBuf::new()
        .pax(&[("path", ok.as_bytes())])
        .file("placeholder", b"x")
        .finish();
    assert_eq!(ok_tar(tar).dirs, 63);
}

#[test]
fn ten_thousand_and_one_empty_files() {
    let mut b = TarBuf::new();
    for i in 0..10_001 {
        b = b.file(&format!("f{i:05}"), b"");
    }
    let tar = b.finish();
    let e = reject_tar(tar.clone());
    assert_rejected(&e, "too_many_entries", Some("f10000"));
    assert!(e.is_too_large());
    // The first 10,000 alone are accepted.
    let cut = tar.len() - 1024 - 512;
    let mut first = tar[..cut].to_vec();
    first.extend_from_slice(&[0u8; 1024]);
    assert_eq!(ok_tar(first).files, 10_000);
}

#[test]
fn a_directory_listed_after_its_files_counts_once() {
    // 9,999 files in m/, then the entry m/ itself: 10,000 distinct paths.
    let files = |n: usize| {
        let mut b = TarBuf::new();
        for i in 0..n {
            b = b.file(&format!("m/f{i:05}"), b"");
        }
        b.dir("m/").finish()
    };
    let r = ok_tar(files(9_999));
    assert_eq!(
        (r.files, r.dirs, r.entries, r.input_entries),
        (9_999, 1, 10_000, 10_000)
    );
    // One more file makes 10,001 distinct paths: refused at that file.
    let e = reject_tar(files(10_000));
    assert_rejected(&e, "too_many_entries", Some("m/f09999"));
}

#[test]
fn implied_directories_count_as_entries() {
    let limits = Limits {
        entries: 3,
        ..Limits::default()
    };
    let tar = TarBuf::new().file("a/b/c/file", b"x").finish();
    let e = check(&gz(&tar), &limits).unwrap_err();
    assert_rejected(&e, "too_many_entries", Some("a/b/c/file"));
}

struct FailingReader(usize);

impl Read for FailingReader {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if self.0 == 0 {
            return Err(io::Error::new(
                io::ErrorKind::ConnectionReset,
                "client went away",
            ));
        }
        let n = buf.len().min(self.0);
        buf[..n].copy_from_slice(&gz(b"")[..n.min(10)].repeat(n.div_ceil(10))[..n]);
        self.0 -= n;
        Ok(n)
    }
}

#[test]
fn input_io_error_is_not_a_format_error() {
    let e = bundle::inspect(FailingReader(10), &Limits::default()).unwrap_err();
    assert_rejected(&e, "io_error", None);
    assert!(!e.is_rejection());
    let full = gz(&TarBuf::new().file("a", &pseudo_random(100_000)).finish());
    let half = io::Cursor::new(full[..full.len() / 2].to_vec()).chain(FailingReader(0));
    let e = bundle::canonicalize(
        half,
        &Limits::default(),
        &CanonicalOptions::default(),
        io::sink(),
    )
    .unwrap_err();
    assert_rejected(&e, "io_error", None);
}

fn sha(data: &[u8]) -> String {
    hex::encode(Sha256::digest(data))
}

fn context_bundle(files: &[(&str, &[u8])], sums: &str) -> Vec<u8> {
    let mut b = TarBuf::new();
    for (name, data) in files {
        b = b.file(name, data);
    }
    b.file("checksums.json", sums.as_bytes()).finish()
}

fn sums_json(files: &[(&str, &[u8])]) -> String {
    let map: serde_json::Map<String, serde_json::Value> = files
        .iter()
        .map(|(n, d)| (n.to_string(), serde_json::Value::String(sha(d))))
        .collect();
    serde_json::json!({"formatVersion": 1, "algorithm": "sha256", "files": map}).to_string()
}

const CONTEXT_FILES: &[(&str, &[u8])] = &[
    (
        "manifest.json",
        b"{\"name\":\"demo\",\"type\":\"workspace\"}",
    ),
    ("knowledge/notes.md", b"# notes"),
    ("memory/m.txt", b"remember"),
];

#[test]
fn context_layout_verified() {
    let r = ok_tar(context_bundle(CONTEXT_FILES, &sums_json(CONTEXT_FILES)));
    assert_eq!(r.files, 4);
}

#[test]
fn context_checksum_mismatch() {
    let mut listed = CONTEXT_FILES.to_vec();
    listed[1] = ("knowledge/notes.md", b"something else");
    let e = reject_tar(context_bundle(CONTEXT_FILES, &sums_json(&listed)));
    assert_rejected(&e, "checksum_mismatch", Some("knowledge/notes.md"));
}

#[test]
fn context_inventory_must_match_exactly() {
    let e = reject_tar(context_bundle(
        CONTEXT_FILES,
        &sums_json(&CONTEXT_FILES[..2]),
    ));
    assert_rejected(&e, "checksum_file_unlisted", Some("memory/m.txt"));
    let mut extra = CONTEXT_FILES.to_vec();
    extra.push(("artifacts/gone.bin", b"?"));
    let e = reject_tar(context_bundle(CONTEXT_FILES, &sums_json(&extra)));
    assert_rejected(&e, "checksum_file_missing", Some("artifacts/gone.bin"));
}

#[test]
fn context_checksums_not_json() {
    let e = reject_tar(context_bundle(CONTEXT_FILES, "{not json"));
    assert_rejected(&e, "checksums_invalid", Some("checksums.json"));
    let wrong_algo = sums_json(CONTEXT_FILES).replace("sha256", "md5");
    let e = reject_tar(context_bundle(CONTEXT_FILES, &wrong_algo));
    assert_rejected(&e, "checksums_invalid", Some("checksums.json"));
}

/// Deterministic incompressible bytes.
pub(crate) fn pseudo_random(n: usize) -> Vec<u8> {
    let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 24) as u8
        })
        .collect()
}
