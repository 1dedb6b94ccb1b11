//! What is stored: an upload that already is the canonical bundle's tar
//! (what `contextctl` sends) is stored byte for byte; anything else is
//! recompressed into the canonical gzip, the same bytes whatever the
//! input's order, and whatever path the engine took (in order, out of
//! order, large files compressed early). The revision never depends on it.

use std::fs;
use std::os::unix::fs::PermissionsExt;

use crate::common::gz_level;
use crate::common::workload_bundles::{noise, sha256, tgz, MEDIA};
use crate::common::{Caller, TestServer};
use context_service::bundle::{self, CanonicalOptions, Limits, Report, AS_UPLOADED};
use flate2::read::GzDecoder;
use std::io::Read;

fn canonicalize(upload: &[u8]) -> (Report, Vec<u8>) {
    let mut out = Vec::new();
    let r = bundle::canonicalize(
        upload,
        &Limits::default(),
        &CanonicalOptions::default(),
        &mut out,
    )
    .expect("accepted");
    (r, out)
}

fn gunzip(b: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    GzDecoder::new(b).read_to_end(&mut out).unwrap();
    out
}

/// Text that deflates well, for pieces that must not be stored.
fn text(len: usize, seed: u8) -> Vec<u8> {
    let line = format!("line {seed}: the canonical tar is cut into pieces\n");
    line.bytes().cycle().take(len).collect()
}

/// A directory with small files, an empty directory and large files (more
/// than one compression piece, random and text), written to disk.
fn sample_dir() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    fs::create_dir_all(root.join("docs/deep")).unwrap();
    fs::create_dir_all(root.join("empty")).unwrap();
    fs::write(root.join("docs/a.md"), b"# a\n").unwrap();
    fs::write(root.join("docs/deep/b.txt"), text(70_000, 1)).unwrap();
    fs::write(root.join("big-random.bin"), noise(700_000, 9)).unwrap();
    fs::write(root.join("big-text.txt"), text(600_000, 2)).unwrap();
    let mut mixed = noise(300_000, 3);
    mixed.extend(text(300_000, 4));
    fs::write(root.join("z-mixed.bin"), mixed).unwrap();
    fs::write(root.join("run.sh"), b"#!/bin/sh\n").unwrap();
    fs::set_permissions(root.join("run.sh"), fs::Permissions::from_mode(0o755)).unwrap();
    dir
}

fn pack(dir: &std::path::Path) -> (Report, Vec<u8>) {
    let mut out = Vec::new();
    let r = bundle::pack_dir(
        dir,
        &Limits::default(),
        &CanonicalOptions::default(),
        &mut out,
    )
    .expect("packed");
    (r, out)
}

/// The directory as a GNU-ish tar (owners, times, modes), members in the
/// order given, gzip level 6.
fn gnu_tar(dir: &std::path::Path, order: &[&str]) -> Vec<u8> {
    let mut b = tar::Builder::new(Vec::new());
    for name in order {
        let path = dir.join(name);
        let meta = fs::metadata(&path).unwrap();
        let mut h = tar::Header::new_gnu();
        h.set_mtime(1_700_000_123);
        h.set_uid(1000);
        h.set_username("dev").unwrap();
        if meta.is_dir() {
            h.set_entry_type(tar::EntryType::Directory);
            h.set_mode(0o775);
            h.set_size(0);
            b.append_data(&mut h, format!("./{name}/"), &[][..])
                .unwrap();
        } else {
            let data = fs::read(&path).unwrap();
            h.set_mode(meta.permissions().mode() & 0o777);
            h.set_size(data.len() as u64);
            b.append_data(&mut h, format!("./{name}"), &data[..])
                .unwrap();
        }
    }
    gz_level(&b.into_inner().unwrap(), 6)
}

const IN_ORDER: &[&str] = &[
    "big-random.bin",
    "big-text.txt",
    "docs",
    "docs/a.md",
    "docs/deep",
    "docs/deep/b.txt",
    "empty",
    "run.sh",
    "z-mixed.bin",
];

#[test]
fn a_canonical_upload_is_stored_byte_for_byte() {
    let dir = sample_dir();
    let (packed, bytes) = pack(dir.path());
    assert_ne!(packed.bundle_encoding, AS_UPLOADED);
    assert_eq!(packed.bundle_encoding, bundle::encoding(1));
    let (r, out) = canonicalize(&bytes);
    assert_eq!(out, bytes, "stored as uploaded");
    assert_eq!(r.bundle_encoding, AS_UPLOADED);
    assert_eq!(r.bundle_digest, sha256(&bytes));
    assert_eq!(r.bundle_bytes, bytes.len() as u64);
    assert_eq!(r.revision, packed.revision);

    // The same canonical tar compressed by anyone else (here: level 9, one
    // stream) is stored as it came too: same revision, its own digest.
    let other = gz_level(&gunzip(&bytes), 9);
    assert_ne!(other, bytes);
    let (r9, out9) = canonicalize(&other);
    assert_eq!(out9, other);
    assert_eq!(r9.bundle_encoding, AS_UPLOADED);
    assert_eq!(r9.bundle_digest, sha256(&other));
    assert_eq!(r9.revision, packed.revision);
    // inspect() agrees on the revision.
    let i = bundle::inspect(&other[..], &Limits::default()).unwrap();
    assert_eq!(i.revision, packed.revision);
}

#[test]
fn a_non_canonical_upload_is_recompressed_to_the_same_bytes_by_every_path() {
    let dir = sample_dir();
    let (packed, bytes) = pack(dir.path());
    let mut reversed = IN_ORDER.to_vec();
    reversed.reverse();
    let mut interleaved = IN_ORDER.to_vec();
    interleaved.swap(0, 5);
    for order in [IN_ORDER, &reversed[..], &interleaved[..]] {
        let upload = gnu_tar(dir.path(), order);
        let (r, out) = canonicalize(&upload);
        assert_eq!(r.bundle_encoding, bundle::encoding(1), "{order:?}");
        assert_eq!(r.revision, packed.revision, "{order:?}");
        assert_eq!(out, bytes, "{order:?}");
        assert_eq!(r.bundle_digest, sha256(&bytes));
        assert_eq!(sha256(&gunzip(&out)), r.revision);
    }
}

#[test]
fn canonical_tar_with_a_late_difference_is_recompressed() {
    let dir = sample_dir();
    let (packed, bytes) = pack(dir.path());
    let tar = gunzip(&bytes);
    // GNU tar pads the archive to 10 KiB records: same files, but the
    // inflated stream is no longer exactly the canonical tar. The
    // difference shows only at the very end.
    let mut padded = tar.clone();
    padded.resize(tar.len().div_ceil(10_240) * 10_240 + 10_240, 0);
    let (r, out) = canonicalize(&gz_level(&padded, 1));
    assert_eq!(r.bundle_encoding, bundle::encoding(1));
    assert_eq!(out, bytes);
    assert_eq!(r.revision, packed.revision);

    // A difference in the first header (mtime): recompressed from the start.
    let mut touched = tar.clone();
    touched[136] = b'1';
    let sum: u32 = touched[..512]
        .iter()
        .enumerate()
        .map(|(i, b)| {
            if (148..156).contains(&i) {
                32
            } else {
                u32::from(*b)
            }
        })
        .sum();
    touched[148..156].copy_from_slice(format!("{sum:06o}\0 ").as_bytes());
    let (r, out) = canonicalize(&gz_level(&touched, 1));
    assert_eq!(r.bundle_encoding, bundle::encoding(1));
    assert_eq!(out, bytes);
    assert_eq!(r.revision, packed.revision);
}

#[test]
fn recompression_is_deterministic_and_stores_incompressible_pieces() {
    let dir = sample_dir();
    let (a, first) = pack(dir.path());
    for _ in 0..3 {
        let (b, again) = pack(dir.path());
        assert_eq!(again, first);
        assert_eq!(b.bundle_digest, a.bundle_digest);
    }
    // 700 KB of random bytes and 300 KB in the mixed file are stored, not
    // deflated: the bundle is barely bigger than them; the text deflates.
    let random = 700_000 + 300_000;
    assert!(a.bundle_bytes > random, "{}", a.bundle_bytes);
    assert!(a.bundle_bytes < random + 60_000, "{}", a.bundle_bytes);
}

#[tokio::test]
async fn the_service_stores_what_contextctl_sends_and_canonicalises_the_rest() {
    let server = TestServer::start().await;
    let client = server.client("alice");
    let alice = Caller::user(&server, "alice");
    let dir = sample_dir();
    let (packed, canonical) = pack(dir.path());
    let download = |name: &'static str, rev: String| {
        let alice = alice.clone();
        async move {
            let resp = alice
                .get(&format!("/v1/workloads/{name}/revisions/{rev}/bundle"))
                .await;
            assert_eq!(resp.status(), 200);
            resp.bytes().await.unwrap().to_vec()
        }
    };

    // What `contextctl workload upload` sends: stored byte for byte.
    client.create_workload(Some("w"), None).await.unwrap();
    let rev = client.upload_bundle("w", canonical.clone()).await.unwrap();
    assert_eq!(rev.revision, packed.revision);
    assert_eq!(rev.bundle_digest, sha256(&canonical));
    assert_eq!(rev.bytes, canonical.len() as u64);
    client.activate_workload("w", &rev.revision).await.unwrap();
    assert_eq!(download("w", rev.revision.clone()).await, canonical);

    // The same files as another tool writes them: same revision, and the
    // canonical gzip is stored (the same bytes `contextctl` would send).
    client.create_workload(Some("v"), None).await.unwrap();
    let other = tgz(&[("docs/a.md", b"# a\n")]);
    let r = client.upload_bundle("v", other.clone()).await.unwrap();
    assert_ne!(r.bundle_digest, sha256(&other));
    let resp = alice
        .request(reqwest::Method::PUT, "/v1/workloads/v/bundle")
        .header("content-type", MEDIA)
        .body(gnu_tar(dir.path(), IN_ORDER))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 201);
    let body: serde_json::Value = resp.json().await.unwrap();
    assert_eq!(body["revision"], packed.revision.as_str());
    assert_eq!(body["bundleDigest"], packed.bundle_digest.as_str());
    client
        .activate_workload("v", &packed.revision)
        .await
        .unwrap();
    assert_eq!(download("v", packed.revision.clone()).await, canonical);
}
