//! Crash-safe file writes (a temp file in the same directory, fsync, rename,
//! then fsync of the directory so the rename itself is durable), and
//! private files: everything the service creates under its data dir is
//! `0600` (files) or `0700` (directories) whatever the umask, and
//! [`make_private`] tightens a data dir made by older versions or by hand.
//! The data dir's lock is in [`lock`].

pub mod lock;

use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

/// Prefix of temp files, so start-up recovery can find and remove leftovers.
pub const TEMP_PREFIX: &str = ".tmp-";

/// Writes `bytes` to `path` atomically with Unix permissions `mode`.
pub fn write_atomic(path: &Path, bytes: &[u8], mode: u32) -> io::Result<()> {
    let dir = path
        .parent()
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "path has no parent"))?;
    ensure_dir(dir, 0o700)?;
    let mut tmp = tempfile::Builder::new()
        .prefix(TEMP_PREFIX)
        .permissions(fs::Permissions::from_mode(mode))
        .tempfile_in(dir)?;
    // The umask may have removed bits at creation; `mode` is exact.
    tmp.as_file()
        .set_permissions(fs::Permissions::from_mode(mode))?;
    tmp.write_all(bytes)?;
    tmp.as_file().sync_all()?;
    tmp.persist(path).map_err(|e| e.error)?;
    sync_dir(dir)
}

/// Fsyncs a directory so that renames and creations in it survive a crash.
pub fn sync_dir(dir: &Path) -> io::Result<()> {
    File::open(dir)?.sync_all()
}

/// Creates `dir` and its missing parents with exactly the permissions
/// `mode` (whatever the umask); existing directories are left as they are.
pub fn ensure_dir(dir: &Path, mode: u32) -> io::Result<()> {
    use std::os::unix::fs::DirBuilderExt;
    if dir.is_dir() {
        return Ok(());
    }
    if let Some(parent) = dir.parent().filter(|p| !p.as_os_str().is_empty()) {
        ensure_dir(parent, mode)?;
    }
    match fs::DirBuilder::new().mode(mode).create(dir) {
        Ok(()) => fs::set_permissions(dir, fs::Permissions::from_mode(mode)),
        // Created meanwhile by someone else: theirs to keep.
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists && dir.is_dir() => Ok(()),
        Err(e) => Err(e),
    }
}

/// Opens `path` for reading and writing, creating it `0600` (whatever the
/// umask) when missing; an existing file is made `0600` too. For files that
/// a library would otherwise create with the umask's permissions (redb).
pub fn open_private(path: &Path) -> io::Result<File> {
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .mode(0o600)
        .open(path)?;
    file.set_permissions(fs::Permissions::from_mode(0o600))?;
    Ok(file)
}

/// What [`make_private`] did.
#[derive(Debug, Default)]
pub struct Tightened {
    /// Files and directories whose permissions were narrowed.
    pub changed: usize,
    /// The first few of them.
    pub first: Vec<PathBuf>,
    /// Paths that could not be read or changed, with why (the first few).
    pub failed: Vec<String>,
    /// How many failed in all.
    pub failures: usize,
}

/// How many paths [`Tightened`] lists.
const LISTED: usize = 5;

/// Removes every group and other permission (and setuid, setgid, sticky)
/// from `root` and everything under it, so that directories left `0755`
/// and files left `0644` become `0700` and `0600`; owner bits are kept.
/// Symbolic links are neither followed nor changed. The contents of the
/// top-level directories named in `keep_contents` are left alone (their own
/// permissions are narrowed). Failures are collected, not fatal: a data dir
/// that is a volume root owned by another user cannot be changed, and that
/// should not stop the service.
pub fn make_private(root: &Path, keep_contents: &[&str]) -> Tightened {
    let mut done = Tightened::default();
    let mut stack = vec![root.to_owned()];
    while let Some(path) = stack.pop() {
        let meta = match fs::symlink_metadata(&path) {
            Ok(meta) => meta,
            Err(e) => {
                done.failed_at(&path, &e);
                continue;
            }
        };
        if meta.file_type().is_symlink() {
            continue;
        }
        let mode = meta.permissions().mode() & 0o7777;
        let private = mode & 0o700;
        if private != mode {
            match fs::set_permissions(&path, fs::Permissions::from_mode(private)) {
                Ok(()) => {
                    done.changed += 1;
                    if done.first.len() < LISTED {
                        done.first.push(path.clone());
                    }
                }
                Err(e) => done.failed_at(&path, &e),
            }
        }
        let kept = path.parent() == Some(root)
            && path
                .file_name()
                .is_some_and(|name| keep_contents.iter().any(|k| name == *k));
        if meta.is_dir() && !kept {
            match fs::read_dir(&path) {
                Ok(entries) => stack.extend(
                    entries
                        .filter_map(std::result::Result::ok)
                        .map(|e| e.path()),
                ),
                Err(e) => done.failed_at(&path, &e),
            }
        }
    }
    done
}

impl Tightened {
    fn failed_at(&mut self, path: &Path, e: &io::Error) {
        self.failures += 1;
        if self.failed.len() < LISTED {
            self.failed.push(format!("{}: {e}", path.display()));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mode(path: &Path) -> u32 {
        fs::symlink_metadata(path).unwrap().permissions().mode() & 0o7777
    }

    fn chmod(path: &Path, mode: u32) {
        fs::set_permissions(path, fs::Permissions::from_mode(mode)).unwrap();
    }

    #[test]
    fn make_private_narrows_everything_but_kept_contents_and_links() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("data");
        fs::create_dir_all(root.join("store/sub")).unwrap();
        fs::create_dir_all(root.join("local/sandbox")).unwrap();
        fs::write(root.join("store/meta"), b"m").unwrap();
        fs::write(root.join("store/sub/tool"), b"#!").unwrap();
        fs::write(root.join("local/sandbox/file"), b"f").unwrap();
        let outside = dir.path().join("outside");
        fs::write(&outside, b"o").unwrap();
        std::os::unix::fs::symlink(&outside, root.join("store/link")).unwrap();
        for (path, m) in [
            ("", 0o755),
            ("store", 0o2775),
            ("store/sub", 0o755),
            ("store/meta", 0o644),
            ("store/sub/tool", 0o755),
            ("local", 0o755),
            ("local/sandbox", 0o755),
            ("local/sandbox/file", 0o644),
        ] {
            chmod(&root.join(path), m);
        }
        chmod(&outside, 0o644);

        let done = make_private(&root, &["local"]);
        assert_eq!(done.changed, 6, "{done:?}");
        assert_eq!(done.first.len(), 5);
        assert_eq!(done.failures, 0, "{done:?}");
        for (path, m) in [
            ("", 0o700),
            ("store", 0o700),
            ("store/sub", 0o700),
            ("store/meta", 0o600),
            ("store/sub/tool", 0o700),
            ("local", 0o700),
            // Kept: the local backend's sandboxes.
            ("local/sandbox", 0o755),
            ("local/sandbox/file", 0o644),
        ] {
            assert_eq!(mode(&root.join(path)), m, "{path}");
        }
        assert_eq!(mode(&outside), 0o644, "a link's target is not changed");
        // Nothing left to do the second time.
        assert_eq!(make_private(&root, &["local"]).changed, 0);
    }

    #[test]
    fn ensure_dir_and_open_private_set_exact_modes() {
        let dir = tempfile::tempdir().unwrap();
        let deep = dir.path().join("a/b/c");
        ensure_dir(&deep, 0o700).unwrap();
        for p in ["a", "a/b", "a/b/c"] {
            assert_eq!(mode(&dir.path().join(p)), 0o700, "{p}");
        }
        let file = deep.join("f");
        fs::write(&file, b"x").unwrap();
        chmod(&file, 0o666);
        drop(open_private(&file).unwrap());
        assert_eq!(mode(&file), 0o600);
        assert_eq!(fs::read(&file).unwrap(), b"x", "opening keeps the contents");
        drop(open_private(&deep.join("new")).unwrap());
        assert_eq!(mode(&deep.join("new")), 0o600);
    }

    #[test]
    fn write_atomic_replaces_and_sets_mode() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("sub/file");
        write_atomic(&path, b"one", 0o600).unwrap();
        write_atomic(&path, b"two", 0o600).unwrap();
        assert_eq!(fs::read(&path).unwrap(), b"two");
        assert_eq!(
            fs::metadata(&path).unwrap().permissions().mode() & 0o777,
            0o600
        );
        let leftovers: Vec<_> = fs::read_dir(dir.path().join("sub"))
            .unwrap()
            .filter_map(std::result::Result::ok)
            .filter(|e| e.file_name().to_string_lossy().starts_with(TEMP_PREFIX))
            .collect();
        assert!(leftovers.is_empty());
    }
}
