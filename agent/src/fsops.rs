//! Filesystem steps the script does with `flock`, `stat -f`, `chmod -R
//! u+w; rm -rf` and `mkdir -p`.

use std::ffi::CString;
use std::fs::{self, File, OpenOptions};
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::Path;

/// An open `.lock` with an exclusive `flock`; released when dropped (and
/// by the kernel when the process dies, like the script's).
pub(crate) struct Lock(#[allow(dead_code)] File);

/// Opens (creating) `path` and takes an exclusive `flock` on it, waiting.
pub(crate) fn lock(path: &Path) -> io::Result<Lock> {
    let f = OpenOptions::new()
        .append(true)
        .create(true)
        .mode(0o644)
        .custom_flags(libc::O_CLOEXEC)
        .open(path)?;
    loop {
        // SAFETY: flock on a descriptor this function owns.
        let rc = unsafe { libc::flock(std::os::fd::AsRawFd::as_raw_fd(&f), libc::LOCK_EX) };
        if rc == 0 {
            return Ok(Lock(f));
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
}

/// Bytes available to this user on the filesystem of `path` (`stat -f -c
/// '%a %S'`).
pub(crate) fn free_bytes(path: &Path) -> Option<u64> {
    let c = CString::new(path.as_os_str().as_bytes()).ok()?;
    let mut st = std::mem::MaybeUninit::<libc::statvfs>::uninit();
    // SAFETY: a NUL-terminated path and a buffer of the right type.
    let rc = unsafe { libc::statvfs(c.as_ptr(), st.as_mut_ptr()) };
    if rc != 0 {
        return None;
    }
    // SAFETY: statvfs succeeded, so it filled the buffer.
    let st = unsafe { st.assume_init() };
    Some(st.f_bavail.saturating_mul(st.f_frsize))
}

/// Whether this process may write in `dir` (`[ -w dir ]`).
pub(crate) fn writable(dir: &Path) -> bool {
    let Ok(c) = CString::new(dir.as_os_str().as_bytes()) else {
        return false;
    };
    // SAFETY: a NUL-terminated path.
    unsafe { libc::access(c.as_ptr(), libc::W_OK) == 0 }
}

/// Removes `path`: a symlink (or file) itself, never followed; a directory
/// after making every directory in it writable again (published trees are
/// read-only). Missing is fine.
pub(crate) fn remove_tree(path: &Path) -> io::Result<()> {
    let meta = match fs::symlink_metadata(path) {
        Ok(m) => m,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(e),
    };
    if !meta.is_dir() {
        return fs::remove_file(path);
    }
    make_writable(path)?;
    fs::remove_dir_all(path)
}

/// `chmod -R u+w` on the directories under (and including) `dir`.
fn make_writable(dir: &Path) -> io::Result<()> {
    let meta = fs::symlink_metadata(dir)?;
    let mode = meta.permissions().mode();
    if mode & 0o200 == 0 {
        fs::set_permissions(dir, fs::Permissions::from_mode((mode | 0o700) & 0o7777))?;
    }
    for entry in fs::read_dir(dir)? {
        let entry = entry?;
        if entry.file_type()?.is_dir() {
            make_writable(&entry.path())?;
        }
    }
    Ok(())
}

/// `mkdir -p` with mode 0755 (under umask).
pub(crate) fn mkdir_p(path: &Path) -> io::Result<()> {
    fs::DirBuilder::new()
        .recursive(true)
        .mode(0o755)
        .create(path)
}

/// Sets `path`'s permission bits to `mode`.
pub(crate) fn chmod(path: &Path, mode: u32) -> io::Result<()> {
    fs::set_permissions(path, fs::Permissions::from_mode(mode))
}
