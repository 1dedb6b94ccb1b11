//! `pack_dir` applies the upload rules to a directory on disk, and the
//! async face gives the same report as the blocking one.

use std::ffi::OsStr;
use std::fs;
use std::io::{Read, Seek};
use std::os::unix::ffi::OsStrExt;
use std::process::Command;

use crate::common::{assert_rejected, gz, TarBuf};
use context_service::bundle::{self, CanonicalOptions, Limits};

fn pack(dir: &std::path::Path) -> Result<bundle::Report, bundle::BundleError> {
    bundle::pack_dir(
        dir,
        &Limits::default(),
        &CanonicalOptions::default(),
        std::io::sink(),
    )
}

#[test]
fn pack_refuses_fifos_and_non_utf8_names() {
    let tmp = tempfile::tempdir().unwrap();
    fs::write(tmp.path().join("ok"), "x").unwrap();
    let status = Command::new("mkfifo")
        .arg(tmp.path().join("pipe"))
        .status()
        .unwrap();
    assert!(status.success());
    assert_rejected(
        &pack(tmp.path()).unwrap_err(),
        "fifo_not_allowed",
        Some("pipe"),
    );

    let tmp = tempfile::tempdir().unwrap();
    fs::write(tmp.path().join(OsStr::from_bytes(b"caf\xe9")), "x").unwrap();
    assert_rejected(
        &pack(tmp.path()).unwrap_err(),
        "non_utf8_path",
        Some("caf\u{fffd}"),
    );

    let tmp = tempfile::tempdir().unwrap();
    fs::write(tmp.path().join("a\\b"), "x").unwrap();
    assert_rejected(
        &pack(tmp.path()).unwrap_err(),
        "backslash_in_path",
        Some("a\\b"),
    );
}

#[test]
fn pack_applies_limits() {
    let tmp = tempfile::tempdir().unwrap();
    for i in 0..5 {
        fs::write(tmp.path().join(format!("f{i}")), "x").unwrap();
    }
    let limits = Limits {
        entries: 4,
        ..Limits::default()
    };
    let e = bundle::pack_dir(
        tmp.path(),
        &limits,
        &CanonicalOptions::default(),
        std::io::sink(),
    )
    .unwrap_err();
    assert_rejected(&e, "too_many_entries", Some("f4"));
    let limits = Limits {
        file_bytes: 0,
        ..Limits::default()
    };
    let e = bundle::pack_dir(
        tmp.path(),
        &limits,
        &CanonicalOptions::default(),
        std::io::sink(),
    )
    .unwrap_err();
    assert_rejected(&e, "file_too_large", Some("f0"));
}

#[test]
fn pack_verifies_checksums_json() {
    let tmp = tempfile::tempdir().unwrap();
    fs::write(tmp.path().join("manifest.json"), "{}").unwrap();
    fs::write(
        tmp.path().join("checksums.json"),
        r#"{"formatVersion":1,"algorithm":"sha256","files":{"manifest.json":"00"}}"#,
    )
    .unwrap();
    assert_rejected(
        &pack(tmp.path()).unwrap_err(),
        "checksum_mismatch",
        Some("manifest.json"),
    );
}

#[test]
fn async_face_matches_blocking() {
    let tar = gz(&TarBuf::new()
        .dir("d/")
        .file("d/x", b"data")
        .file("a", b"1")
        .finish());
    let mut blocking_out = Vec::new();
    let blocking = bundle::canonicalize(
        &tar[..],
        &Limits::default(),
        &CanonicalOptions::default(),
        &mut blocking_out,
    )
    .unwrap();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let mut file = tempfile::tempfile().unwrap();
    let out = file.try_clone().unwrap();
    let report = rt
        .block_on(bundle::canonicalize_async(
            std::io::Cursor::new(tar.clone()),
            Limits::default(),
            CanonicalOptions::default(),
            out,
        ))
        .unwrap();
    assert_eq!(report, blocking);
    let mut written = Vec::new();
    file.rewind().unwrap();
    file.read_to_end(&mut written).unwrap();
    assert_eq!(written, blocking_out);

    let bad = gz(&TarBuf::new().file("/abs", b"x").finish());
    let err = rt
        .block_on(bundle::canonicalize_async(
            std::io::Cursor::new(bad),
            Limits::default(),
            CanonicalOptions::default(),
            tempfile::tempfile().unwrap(),
        ))
        .unwrap_err();
    assert_rejected(&err, "absolute_path", Some("/abs"));
}
