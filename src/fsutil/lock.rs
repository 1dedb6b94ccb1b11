//! The data dir's lock: one `context-service` per data dir.
//!
//! `serve` takes it before writing anything under the data dir (a second
//! service on the same dir once rewrote the development token before redb
//! refused it), and holds it until the process ends; `migrate` holds it
//! while it reads. The lock is `flock(2)` on `<data-dir>/.lock`, which
//! holds the holder's pid for the refusal's message. The kernel drops the
//! lock with the process, so a crash leaves nothing to clean up; the file
//! itself stays (removing it would let two processes lock two files).

use std::fs::{File, OpenOptions};
use std::io::{self, Read as _, Seek as _, Write as _};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use rustix::fs::{flock, FlockOperation};

/// The lock file under the data dir.
pub const LOCK_FILE: &str = ".lock";

/// Why the data dir could not be locked.
#[derive(Debug, thiserror::Error)]
pub enum LockError {
    /// Another process holds the lock.
    #[error("data dir {} in use by another context-service ({})", dir.display(), holder(*pid))]
    InUse {
        /// The data dir.
        dir: PathBuf,
        /// The holder's pid, when it has written it.
        pid: Option<u32>,
    },
    /// The lock file could not be opened, locked or written.
    #[error("locking the data dir {}: {source}", dir.display())]
    Io {
        /// The data dir.
        dir: PathBuf,
        /// The cause.
        source: io::Error,
    },
}

fn holder(pid: Option<u32>) -> String {
    match pid {
        Some(pid) => format!("pid {pid}"),
        None => "pid unknown".to_owned(),
    }
}

/// A held lock of a data dir; dropping it releases the lock.
#[derive(Debug)]
pub struct DataDirLock {
    _file: File,
}

impl DataDirLock {
    /// Locks `dir` (which must exist) for this process and records its pid,
    /// or says which process holds it.
    pub fn acquire(dir: &Path) -> Result<Self, LockError> {
        let io_err = |source| LockError::Io {
            dir: dir.to_owned(),
            source,
        };
        // Not truncated on open: the holder's pid is read from it.
        let mut file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o600)
            .open(dir.join(LOCK_FILE))
            .map_err(io_err)?;
        lock(&mut file, dir)?;
        file.set_len(0).map_err(io_err)?;
        file.rewind().map_err(io_err)?;
        writeln!(file, "{}", std::process::id()).map_err(io_err)?;
        Ok(Self { _file: file })
    }

    /// Locks `dir` without creating or writing anything (for readers such
    /// as `migrate`): `None` when the dir has no lock file (no service of
    /// this version ever ran there), else the held lock.
    pub fn acquire_existing(dir: &Path) -> Result<Option<Self>, LockError> {
        let mut file = match File::open(dir.join(LOCK_FILE)) {
            Ok(file) => file,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
            Err(source) => {
                return Err(LockError::Io {
                    dir: dir.to_owned(),
                    source,
                })
            }
        };
        lock(&mut file, dir)?;
        Ok(Some(Self { _file: file }))
    }
}

/// Takes the exclusive lock on `file` without waiting.
fn lock(file: &mut File, dir: &Path) -> Result<(), LockError> {
    match flock(&*file, FlockOperation::NonBlockingLockExclusive) {
        Ok(()) => Ok(()),
        Err(rustix::io::Errno::WOULDBLOCK) => {
            let mut text = String::new();
            // The holder may not have written its pid yet.
            let pid = file
                .read_to_string(&mut text)
                .ok()
                .and_then(|_| text.trim().parse().ok());
            Err(LockError::InUse {
                dir: dir.to_owned(),
                pid,
            })
        }
        Err(e) => Err(LockError::Io {
            dir: dir.to_owned(),
            source: e.into(),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_second_lock_names_the_holder_until_the_first_is_dropped() {
        let dir = tempfile::tempdir().unwrap();
        let held = DataDirLock::acquire(dir.path()).unwrap();
        let me = std::process::id();
        let refused = DataDirLock::acquire(dir.path()).unwrap_err();
        assert_eq!(
            refused.to_string(),
            format!(
                "data dir {} in use by another context-service (pid {me})",
                dir.path().display()
            )
        );
        // The refusal left the holder's pid in place.
        let text = std::fs::read_to_string(dir.path().join(LOCK_FILE)).unwrap();
        assert_eq!(text, format!("{me}\n"));
        assert!(matches!(
            DataDirLock::acquire_existing(dir.path()),
            Err(LockError::InUse { pid: Some(p), .. }) if p == me
        ));
        drop(held);
        let again = DataDirLock::acquire_existing(dir.path()).unwrap();
        assert!(again.is_some());
        drop(again);
        DataDirLock::acquire(dir.path()).unwrap();
    }

    #[test]
    fn readers_lock_nothing_where_no_service_ran() {
        let dir = tempfile::tempdir().unwrap();
        assert!(DataDirLock::acquire_existing(dir.path()).unwrap().is_none());
        assert!(!dir.path().join(LOCK_FILE).exists());
        let unknown = LockError::InUse {
            dir: dir.path().to_owned(),
            pid: None,
        };
        assert!(unknown.to_string().ends_with("(pid unknown)"), "{unknown}");
    }
}
