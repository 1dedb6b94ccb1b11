//! Properties of the canonical archive: the same files give the same
//! revision whatever the input's order, compression level, timestamps,
//! owners or `./` prefixes; and the canonical bundle extracts with GNU tar
//! to exactly the input tree.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::Command;

use crate::common::gz_level;
use context_service::bundle::{self, CanonicalOptions, Limits, Report};
use proptest::prelude::*;

/// A tree: files (content, executable) and empty directories.
#[derive(Debug, Clone)]
struct Tree {
    files: BTreeMap<String, (Vec<u8>, bool)>,
    empty_dirs: BTreeSet<String>,
}

impl Tree {
    /// Every directory: parents of files plus the empty ones.
    fn dirs(&self) -> BTreeSet<String> {
        let mut dirs = self.empty_dirs.clone();
        for p in self.files.keys().chain(self.empty_dirs.iter()) {
            let mut cur = p.as_str();
            while let Some(i) = cur.rfind('/') {
                cur = &cur[..i];
                dirs.insert(cur.to_owned());
            }
        }
        dirs
    }
}

fn component() -> impl Strategy<Value = String> {
    prop_oneof![
        "[a-c]{1,2}",
        "[a-z0-9._-]{1,12}".prop_filter("no dot names", |s| s != "." && s != ".."),
        Just("é文件".to_owned()),
        Just("x".repeat(120)),
    ]
}

fn path() -> impl Strategy<Value = String> {
    prop::collection::vec(component(), 1..4).prop_map(|c| c.join("/"))
}

fn tree_strategy() -> impl Strategy<Value = Tree> {
    let file = (prop::collection::vec(any::<u8>(), 0..3000), any::<bool>());
    (
        prop::collection::btree_map(path(), file, 1..12),
        prop::collection::btree_set(path(), 0..3),
    )
        .prop_map(|(mut files, dirs)| {
            // A path cannot be both a file and a directory: drop files that
            // sit at or under another file, and directories that are files.
            let names: Vec<String> = files.keys().cloned().collect();
            for n in &names {
                if names.iter().any(|m| n.starts_with(&format!("{m}/"))) {
                    files.remove(n);
                }
            }
            let empty_dirs = dirs
                .into_iter()
                .filter(|d| {
                    !files.keys().any(|f| {
                        f == d || f.starts_with(&format!("{d}/")) || d.starts_with(&format!("{f}/"))
                    })
                })
                .collect();
            Tree { files, empty_dirs }
        })
        .prop_filter("needs a file", |t| !t.files.is_empty())
}

/// How one archive of the tree is written.
#[derive(Debug, Clone)]
struct Variant {
    seed: u64,
    level: u32,
    dot_slash: bool,
    explicit_dirs: bool,
    gnu: bool,
    mtime: u64,
    uid: u64,
}

fn variant() -> impl Strategy<Value = Variant> {
    (
        any::<u64>(),
        0u32..=9,
        any::<bool>(),
        any::<bool>(),
        any::<bool>(),
        0u64..4_000_000_000,
        0u64..70_000,
    )
        .prop_map(
            |(seed, level, dot_slash, explicit_dirs, gnu, mtime, uid)| Variant {
                seed,
                level,
                dot_slash,
                explicit_dirs,
                gnu,
                mtime,
                uid,
            },
        )
}

fn shuffle<T>(v: &mut [T], mut seed: u64) {
    for i in (1..v.len()).rev() {
        seed = seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        let j = (seed >> 33) as usize % (i + 1);
        v.swap(i, j);
    }
}

/// Writes the tree as a gzip tar the way `v` says (the `tar` builder uses
/// GNU long names for paths over 100 bytes).
fn archive(tree: &Tree, v: &Variant) -> Vec<u8> {
    enum Item<'a> {
        Dir(&'a str),
        File(&'a str, &'a [u8], bool),
    }
    let dirs = tree.dirs();
    let mut items: Vec<Item> = tree
        .files
        .iter()
        .map(|(p, (d, x))| Item::File(p, d, *x))
        .collect();
    if v.explicit_dirs {
        items.extend(dirs.iter().map(|d| Item::Dir(d)));
    } else {
        items.extend(tree.empty_dirs.iter().map(|d| Item::Dir(d)));
    }
    shuffle(&mut items, v.seed);
    let mut b = tar::Builder::new(Vec::new());
    let prefix = if v.dot_slash { "./" } else { "" };
    for item in items {
        let mut h = if v.gnu {
            tar::Header::new_gnu()
        } else {
            tar::Header::new_ustar()
        };
        h.set_mtime(v.mtime);
        h.set_uid(v.uid);
        h.set_gid(v.uid / 2);
        h.set_username("someone").unwrap();
        match item {
            Item::Dir(d) => {
                h.set_entry_type(tar::EntryType::Directory);
                h.set_mode(0o700);
                h.set_size(0);
                b.append_data(&mut h, format!("{prefix}{d}/"), &[][..])
                    .unwrap();
            }
            Item::File(p, data, exec) => {
                h.set_entry_type(tar::EntryType::Regular);
                h.set_mode(if exec { 0o750 } else { 0o600 });
                h.set_size(data.len() as u64);
                b.append_data(&mut h, format!("{prefix}{p}"), data).unwrap();
            }
        }
    }
    gz_level(&b.into_inner().unwrap(), v.level)
}

fn canonical(gzipped: &[u8]) -> (Report, Vec<u8>) {
    let mut out = Vec::new();
    let r = bundle::canonicalize(
        gzipped,
        &Limits::default(),
        &CanonicalOptions::default(),
        &mut out,
    )
    .expect("valid archive accepted");
    (r, out)
}

/// Reads a directory back as a tree.
fn read_tree(root: &Path) -> Tree {
    fn walk(root: &Path, dir: &Path, t: &mut Tree) {
        for e in fs::read_dir(dir).unwrap() {
            let e = e.unwrap();
            let rel = e
                .path()
                .strip_prefix(root)
                .unwrap()
                .to_str()
                .unwrap()
                .to_owned();
            let meta = fs::symlink_metadata(e.path()).unwrap();
            if meta.is_dir() {
                t.empty_dirs.insert(rel);
                walk(root, &e.path(), t);
            } else {
                assert!(meta.is_file(), "{rel} is not a regular file");
                let exec = meta.permissions().mode() & 0o100 != 0;
                t.files.insert(rel, (fs::read(e.path()).unwrap(), exec));
            }
        }
    }
    let mut t = Tree {
        files: BTreeMap::new(),
        empty_dirs: BTreeSet::new(),
    };
    walk(root, root, &mut t);
    t
}

fn write_tree(tree: &Tree, root: &Path) {
    for d in tree.dirs() {
        fs::create_dir_all(root.join(d)).unwrap();
    }
    for (p, (data, exec)) in &tree.files {
        let path = root.join(p);
        fs::write(&path, data).unwrap();
        let mode = if *exec { 0o755 } else { 0o644 };
        fs::set_permissions(&path, fs::Permissions::from_mode(mode)).unwrap();
    }
}

/// Extracts a bundle with GNU tar into a fresh directory and checks the
/// result is exactly `tree`.
fn assert_gnu_extracts_to(bundle_bytes: &[u8], tree: &Tree) {
    let tmp = tempfile::tempdir().unwrap();
    let file = tmp.path().join("b.tar.gz");
    fs::write(&file, bundle_bytes).unwrap();
    let out = tmp.path().join("x");
    fs::create_dir(&out).unwrap();
    let status = Command::new("tar")
        .args(["-xzf"])
        .arg(&file)
        .arg("-C")
        .arg(&out)
        .args(["--no-same-owner"])
        .status()
        .unwrap();
    assert!(status.success());
    let got = read_tree(&out);
    assert_eq!(got.files, tree.files);
    assert_eq!(got.empty_dirs, tree.dirs());
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    #[test]
    fn same_files_same_revision(tree in tree_strategy(), variants in prop::collection::vec(variant(), 3)) {
        let (first, first_bytes) = canonical(&archive(&tree, &variants[0]));
        for v in &variants[1..] {
            let (r, bytes) = canonical(&archive(&tree, v));
            prop_assert_eq!(&r.revision, &first.revision, "variant {:?}", v);
            prop_assert_eq!(&r.bundle_digest, &first.bundle_digest);
            prop_assert_eq!(&bytes, &first_bytes);
        }
        // inspect() agrees, and packing the tree from disk gives the same.
        let i = bundle::inspect(&archive(&tree, &variants[0])[..], &Limits::default()).unwrap();
        prop_assert_eq!(&i.revision, &first.revision);
        let dir = tempfile::tempdir().unwrap();
        write_tree(&tree, dir.path());
        let mut packed = Vec::new();
        let p = bundle::pack_dir(dir.path(), &Limits::default(), &CanonicalOptions::default(), &mut packed).unwrap();
        prop_assert_eq!(&p.revision, &first.revision);
        prop_assert_eq!(&packed, &first_bytes);
        assert_gnu_extracts_to(&first_bytes, &tree);
    }
}

#[test]
fn canonical_bundle_is_a_fixed_point_and_verifies_with_coreutils() {
    let mut files = BTreeMap::new();
    files.insert(
        "run.sh".to_owned(),
        (b"#!/bin/sh\necho hi\n".to_vec(), true),
    );
    files.insert(
        format!(
            "{}/deep.txt",
            "long-directory-name/".repeat(14).trim_end_matches('/')
        ),
        (vec![b'z'; 70_000], false),
    );
    files.insert("ünïcode/名前.md".to_owned(), (b"text".to_vec(), false));
    let mut empty_dirs = BTreeSet::new();
    empty_dirs.insert("empty".to_owned());
    let tree = Tree { files, empty_dirs };
    let v = Variant {
        seed: 7,
        level: 9,
        dot_slash: true,
        explicit_dirs: false,
        gnu: true,
        mtime: 12345,
        uid: 1000,
    };
    let (r, bytes) = canonical(&archive(&tree, &v));
    // Canonicalising the canonical bundle changes nothing.
    let (again, again_bytes) = canonical(&bytes);
    assert_eq!(again.revision, r.revision);
    assert_eq!(again_bytes, bytes);
    assert_eq!(r.bundle_bytes, bytes.len() as u64);
    assert_gnu_extracts_to(&bytes, &tree);

    // A sandbox checks both digests with gzip and sha256sum alone.
    let tmp = tempfile::tempdir().unwrap();
    let file = tmp.path().join("b.tar.gz");
    fs::write(&file, &bytes).unwrap();
    let sh = |cmd: &str| {
        let out = Command::new("sh")
            .arg("-c")
            .arg(cmd)
            .arg("sh")
            .arg(&file)
            .output()
            .unwrap();
        assert!(out.status.success());
        String::from_utf8(out.stdout).unwrap()
    };
    assert!(sh("gzip -dc \"$1\" | sha256sum").starts_with(&r.revision));
    assert!(sh("sha256sum \"$1\"").starts_with(&r.bundle_digest));
    assert_eq!(
        sh("gzip -dc \"$1\" | wc -c").trim(),
        r.inflated_bytes.to_string()
    );
    // Owners, times and modes are normalised.
    let listing = sh("tar -tvzf \"$1\"");
    for line in listing.lines() {
        assert!(line.contains(" 0/0 "), "{line}");
        assert!(line.contains("1970-01-01 00:00"), "{line}");
        assert!(
            line.starts_with("-rw-r--r--")
                || line.starts_with("-rwxr-xr-x")
                || line.starts_with("drwxr-xr-x"),
            "{line}"
        );
    }
    assert_eq!(listing.lines().count() as u64, r.entries);
    // And field by field, from the raw headers.
    let tar = {
        let mut d = flate2::read::GzDecoder::new(&bytes[..]);
        let mut v = Vec::new();
        std::io::Read::read_to_end(&mut d, &mut v).unwrap();
        v
    };
    let mut archive = tar::Archive::new(&tar[..]);
    let mut paths = Vec::new();
    for entry in archive.entries().unwrap() {
        let entry = entry.unwrap();
        let h = entry.header();
        assert_eq!(
            (h.mtime().unwrap(), h.uid().unwrap(), h.gid().unwrap()),
            (0, 0, 0)
        );
        assert_eq!(h.username_bytes(), Some(&b""[..]));
        assert_eq!(h.groupname_bytes(), Some(&b""[..]));
        assert!(h.as_ustar().is_some(), "ustar format");
        let mode = h.mode().unwrap();
        assert!([0o644, 0o755].contains(&mode), "mode {mode:o}");
        paths.push(
            entry
                .path()
                .unwrap()
                .to_str()
                .unwrap()
                .trim_end_matches('/')
                .to_owned(),
        );
    }
    let mut sorted = paths.clone();
    sorted.sort_by(|a, b| a.split('/').cmp(b.split('/')));
    assert_eq!(paths, sorted, "entries in canonical order");
}
