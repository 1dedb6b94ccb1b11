//! `contextctl bundle inspect|pack`, run as the built binary.

use std::fs;
use std::process::{Command, Output};

use crate::common::{gz, TarBuf};

fn contextctl(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_contextctl"))
        .args(args)
        .output()
        .unwrap()
}

fn json(out: &Output) -> serde_json::Value {
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "stdout is not JSON ({e}): {}",
            String::from_utf8_lossy(&out.stdout)
        )
    })
}

#[test]
fn pack_then_inspect_agree() {
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("src");
    fs::create_dir_all(src.join("docs")).unwrap();
    fs::write(src.join("docs/a.md"), "hello").unwrap();
    fs::write(src.join("manifest.json"), "{}").unwrap();
    let bundle = tmp.path().join("out.tar.gz");
    let (src_s, bundle_s) = (src.to_str().unwrap(), bundle.to_str().unwrap());

    let packed = contextctl(&["bundle", "pack", src_s, "-f", bundle_s, "-o", "json"]);
    assert!(packed.status.success(), "{packed:?}");
    let packed = json(&packed);
    assert_eq!(packed["files"], 2);
    assert_eq!(packed["dirs"], 1);
    let revision = packed["revision"].as_str().unwrap().to_owned();
    assert_eq!(revision.len(), 64);

    // By default the inspection alone: no bundle is made, none is printed.
    let of_file = contextctl(&["--output", "json", "bundle", "inspect", bundle_s]);
    assert_eq!(of_file.status.code(), Some(0));
    let of_file = json(&of_file);
    assert_eq!(of_file["revision"], revision.as_str());
    for key in ["entries", "inflatedBytes", "files", "dirs"] {
        assert_eq!(of_file[key], packed[key], "{key}");
    }
    for key in ["bundleDigest", "bundleBytes", "bundleEncoding"] {
        assert!(of_file.get(key).is_none(), "{key} in {of_file}");
    }
    assert_eq!(
        of_file["compressedBytes"],
        fs::metadata(&bundle).unwrap().len()
    );
    // With --bundle-digest, what the service would store: the packed file
    // itself (it is canonical).
    let with_digest = json(&contextctl(&[
        "--output",
        "json",
        "bundle",
        "inspect",
        bundle_s,
        "--bundle-digest",
    ]));
    assert_eq!(with_digest["revision"], revision.as_str());
    assert_eq!(with_digest["bundleDigest"], packed["bundleDigest"]);
    assert_eq!(
        with_digest["bundleBytes"],
        fs::metadata(&bundle).unwrap().len()
    );
    assert_eq!(with_digest["bundleEncoding"], "as-uploaded");
    // --gzip-level only means something for the bundle.
    let usage = contextctl(&["bundle", "inspect", bundle_s, "--gzip-level", "6"]);
    assert_eq!(usage.status.code(), Some(2));
    assert!(
        String::from_utf8_lossy(&usage.stderr).contains("--bundle-digest"),
        "{usage:?}"
    );

    let of_dir = json(&contextctl(&[
        "bundle", "inspect", src_s, "--output", "json",
    ]));
    assert_eq!(of_dir["revision"], revision.as_str());

    let text = contextctl(&["bundle", "inspect", src_s]);
    assert!(text.status.success());
    let text = String::from_utf8(text.stdout).unwrap();
    assert!(
        text.contains(&format!("revision       {revision}")),
        "{text}"
    );
    assert!(!text.contains("bundleDigest"), "{text}");
    let text = contextctl(&["bundle", "inspect", src_s, "--bundle-digest"]);
    let text = String::from_utf8(text.stdout).unwrap();
    let digest = packed["bundleDigest"].as_str().unwrap();
    assert!(text.contains(&format!("bundleDigest   {digest}")), "{text}");
}

#[test]
fn rejection_is_reported_with_code_and_entry() {
    let tmp = tempfile::tempdir().unwrap();
    let bad = tmp.path().join("bad.tar.gz");
    fs::write(
        &bad,
        gz(&TarBuf::new()
            .file("ok", b"x")
            .file("../escape", b"y")
            .finish()),
    )
    .unwrap();
    let out = contextctl(&[
        "--output",
        "json",
        "bundle",
        "inspect",
        bad.to_str().unwrap(),
    ]);
    assert_eq!(out.status.code(), Some(1));
    let doc = json(&out);
    assert_eq!(doc["error"], "path_traversal");
    assert_eq!(doc["entry"], "../escape");
    assert!(doc["message"].as_str().unwrap().contains(".."));

    let out = contextctl(&["bundle", "inspect", bad.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("path_traversal"));
}

#[test]
fn pack_refuses_symlinks_and_leaves_nothing_behind() {
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("src");
    fs::create_dir(&src).unwrap();
    fs::write(src.join("a"), "x").unwrap();
    std::os::unix::fs::symlink("/etc/passwd", src.join("link")).unwrap();
    let bundle = tmp.path().join("out.tar.gz");
    let out = contextctl(&[
        "--output",
        "json",
        "bundle",
        "pack",
        src.to_str().unwrap(),
        // The old spelling of -f/--file still works.
        "--out",
        bundle.to_str().unwrap(),
    ]);
    assert_eq!(out.status.code(), Some(1));
    let doc = json(&out);
    assert_eq!(doc["error"], "link_not_allowed");
    assert_eq!(doc["entry"], "link");
    assert!(!bundle.exists());
    assert_eq!(
        fs::read_dir(tmp.path()).unwrap().count(),
        1,
        "no temp file left"
    );
}

#[test]
fn missing_input_is_an_io_error() {
    let out = contextctl(&[
        "--output",
        "json",
        "bundle",
        "inspect",
        "/nonexistent/x.tgz",
    ]);
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(json(&out)["error"], "io_error");
}
