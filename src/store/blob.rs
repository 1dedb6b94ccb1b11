//! Content-addressed bundle files: `<root>/sha256/<2 hex>/<64 hex>`.
//!
//! A new blob is written to a temp file (prefix [`TEMP_PREFIX`]) in
//! `<root>/sha256/`, fsynced, renamed into place and the directory fsynced,
//! so a crash leaves either the whole blob or a temp file that startup
//! removes.
//!
//! When the blobs are only copies of object storage the store is opened
//! [bounded](BlobStore::open_bounded): it accounts for every copy it
//! persists or removes, and [`BlobStore::trim`] drops the least recently
//! used ones that exceed the byte budget.

use std::fs::{self, File};
use std::io;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::SystemTime;

use super::copies::LocalCopies;
use crate::fsutil::{self, TEMP_PREFIX};

/// The blob directory.
#[derive(Debug, Clone)]
pub struct BlobStore {
    dir: PathBuf,
    /// The byte budget of copies (bounded stores only).
    copies: Option<Arc<LocalCopies>>,
}

/// A blob being written. Dropping it without [`BlobStore::persist`] deletes
/// the file, so nothing of a failed upload stays on disk.
#[derive(Debug)]
pub struct TempBlob {
    file: tempfile::NamedTempFile,
}

impl TempBlob {
    /// A second handle to write through (e.g. on a blocking thread).
    pub fn writer(&self) -> io::Result<File> {
        self.file.as_file().try_clone()
    }

    /// The temp file's path.
    pub fn path(&self) -> &Path {
        self.file.path()
    }
}

/// Whether `digest` is 64 lowercase hex digits (and so a safe file name).
pub fn is_digest(digest: &str) -> bool {
    digest.len() == 64
        && digest
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

fn bad_digest(digest: &str) -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidInput,
        format!("not a sha256 digest: {digest:?}"),
    )
}

impl BlobStore {
    /// Opens (creating) the blob store under `root`.
    pub fn open(root: &Path) -> io::Result<Self> {
        let dir = root.join("sha256");
        fsutil::ensure_dir(&dir, 0o700)?;
        Ok(Self { dir, copies: None })
    }

    /// Opens (creating) a store of copies under `root` that keeps about
    /// `budget` bytes: the blobs already there are accounted for, least
    /// recently modified first out. Blocking.
    pub fn open_bounded(root: &Path, budget: u64) -> io::Result<Self> {
        let mut store = Self::open(root)?;
        let copies = LocalCopies::new(budget);
        let mut found = Vec::new();
        for digest in store.digests()? {
            let meta = fs::metadata(store.path(&digest)?)?;
            let modified = meta.modified().unwrap_or(SystemTime::UNIX_EPOCH);
            found.push((modified, digest, meta.len()));
        }
        found.sort();
        for (_, digest, len) in found {
            copies.add(&digest, len);
        }
        store.copies = Some(Arc::new(copies));
        Ok(store)
    }

    /// The copies' budget and the bytes they take now (bounded stores).
    pub fn usage(&self) -> Option<(u64, u64)> {
        let copies = self.copies.as_ref()?;
        Some((copies.budget(), copies.bytes()))
    }

    /// Marks the blob `digest` as just used, so the budget keeps it longer.
    pub fn touch(&self, digest: &str) {
        // Every copy is on record: opening scanned the disk, and persist and
        // remove keep the record.
        if let Some(copies) = &self.copies {
            copies.touch(digest);
        }
    }

    /// Removes the least recently used copies beyond the budget; returns
    /// their digests. The caller holds whatever lock orders removals with
    /// persists. Blocking; a no-op unless bounded.
    pub fn trim(&self) -> io::Result<Vec<String>> {
        let Some(copies) = &self.copies else {
            return Ok(Vec::new());
        };
        let victims = copies.over_budget();
        for digest in &victims {
            self.remove(digest)?;
        }
        Ok(victims)
    }

    /// Where the blob `digest` lives.
    pub fn path(&self, digest: &str) -> io::Result<PathBuf> {
        if !is_digest(digest) {
            return Err(bad_digest(digest));
        }
        Ok(self.dir.join(&digest[..2]).join(digest))
    }

    /// Whether the blob `digest` exists.
    pub fn exists(&self, digest: &str) -> bool {
        self.path(digest).map(|p| p.is_file()).unwrap_or(false)
    }

    /// A fresh temp file on the same filesystem as the blobs.
    pub fn temp(&self) -> io::Result<TempBlob> {
        let file = tempfile::Builder::new()
            .prefix(TEMP_PREFIX)
            .tempfile_in(&self.dir)?;
        Ok(TempBlob { file })
    }

    /// Makes `temp` durable and read-only as the blob `digest` (mode
    /// `0400`, fsync, rename, directory fsync). An existing blob with that
    /// digest has the same bytes and is kept. Blocking.
    pub fn persist(&self, temp: TempBlob, digest: &str) -> io::Result<PathBuf> {
        let target = self.path(digest)?;
        let parent = target.parent().ok_or_else(|| bad_digest(digest))?;
        // Read-only from here on: a stored blob is never written again, and
        // the cache maps it (see `crate::zerocopy`).
        temp.file
            .as_file()
            .set_permissions(fs::Permissions::from_mode(0o400))?;
        temp.file.as_file().sync_all()?;
        if !parent.is_dir() {
            fsutil::ensure_dir(parent, 0o700)?;
            fsutil::sync_dir(&self.dir)?;
        }
        if !target.is_file() {
            temp.file.persist(&target).map_err(|e| e.error)?;
            fsutil::sync_dir(parent)?;
        }
        // Else same digest, same bytes: the temp file is dropped (deleted).
        if let Some(copies) = &self.copies {
            copies.add(digest, fs::metadata(&target)?.len());
        }
        Ok(target)
    }

    /// Deletes the blob `digest` (absent is fine). Blocking.
    pub fn remove(&self, digest: &str) -> io::Result<()> {
        let path = self.path(digest)?;
        if let Some(copies) = &self.copies {
            copies.forget(digest);
        }
        match fs::remove_file(&path) {
            Ok(()) => {
                if let Some(parent) = path.parent() {
                    fsutil::sync_dir(parent)?;
                }
                Ok(())
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(e),
        }
    }

    /// Every stored blob's digest. Blocking.
    pub fn digests(&self) -> io::Result<Vec<String>> {
        let mut out = Vec::new();
        for shard in fs::read_dir(&self.dir)? {
            let shard = shard?;
            if !shard.file_type()?.is_dir() {
                continue;
            }
            for entry in fs::read_dir(shard.path())? {
                let name = entry?.file_name();
                if let Some(name) = name.to_str().filter(|n| is_digest(n)) {
                    out.push(name.to_owned());
                }
            }
        }
        Ok(out)
    }

    /// Removes temp files a crash left behind (at the top level and in the
    /// shards); returns their paths. Blocking; call before serving.
    pub fn remove_temp_files(&self) -> io::Result<Vec<PathBuf>> {
        let mut removed = Vec::new();
        let mut dirs = vec![self.dir.clone()];
        for shard in fs::read_dir(&self.dir)? {
            let shard = shard?;
            if shard.file_type()?.is_dir() {
                dirs.push(shard.path());
            }
        }
        for dir in dirs {
            for entry in fs::read_dir(&dir)? {
                let entry = entry?;
                if entry.file_name().to_string_lossy().starts_with(TEMP_PREFIX)
                    && entry.file_type()?.is_file()
                {
                    fs::remove_file(entry.path())?;
                    removed.push(entry.path());
                }
            }
            if !removed.is_empty() {
                fsutil::sync_dir(&dir)?;
            }
        }
        Ok(removed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    const D: &str = "ab00000000000000000000000000000000000000000000000000000000000001";

    #[test]
    fn persist_is_content_addressed_and_temps_are_cleaned() {
        let dir = tempfile::tempdir().unwrap();
        let blobs = BlobStore::open(dir.path()).unwrap();
        let temp = blobs.temp().unwrap();
        temp.writer().unwrap().write_all(b"bundle").unwrap();
        let path = blobs.persist(temp, D).unwrap();
        assert!(path.ends_with(format!("sha256/ab/{D}")));
        assert_eq!(fs::read(&path).unwrap(), b"bundle");
        // Stored read-only: the cache maps stored blobs.
        let mode = fs::metadata(&path).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o400);
        assert_eq!(blobs.digests().unwrap(), vec![D.to_owned()]);

        // A dropped temp blob leaves nothing; a crash's leftovers are removed.
        let dropped = blobs.temp().unwrap();
        let dropped_path = dropped.path().to_owned();
        drop(dropped);
        assert!(!dropped_path.exists());
        fs::write(dir.path().join("sha256").join(".tmp-crash"), b"x").unwrap();
        fs::write(dir.path().join("sha256/ab").join(".tmp-crash2"), b"x").unwrap();
        assert_eq!(blobs.remove_temp_files().unwrap().len(), 2);
        assert!(blobs.exists(D));
        blobs.remove(D).unwrap();
        blobs.remove(D).unwrap();
        assert!(!blobs.exists(D));
    }

    #[test]
    fn refuses_paths_that_are_not_digests() {
        let dir = tempfile::tempdir().unwrap();
        let blobs = BlobStore::open(dir.path()).unwrap();
        assert!(blobs.path("../../etc/passwd").is_err());
        assert!(blobs.path(&D.to_uppercase()).is_err());
        assert!(!blobs.exists("zz"));
    }

    fn put(blobs: &BlobStore, digest: &str, len: usize) {
        let temp = blobs.temp().unwrap();
        temp.writer().unwrap().write_all(&vec![7; len]).unwrap();
        blobs.persist(temp, digest).unwrap();
    }

    fn digest(n: u8) -> String {
        format!("{n:02x}{}", "0".repeat(62))
    }

    #[test]
    fn a_bounded_store_trims_the_least_recently_used_copies() {
        let dir = tempfile::tempdir().unwrap();
        let blobs = BlobStore::open_bounded(dir.path(), 250).unwrap();
        put(&blobs, &digest(1), 100);
        put(&blobs, &digest(2), 100);
        assert!(blobs.trim().unwrap().is_empty());
        blobs.touch(&digest(1));
        put(&blobs, &digest(3), 100);
        assert_eq!(blobs.trim().unwrap(), vec![digest(2)]);
        assert!(!blobs.exists(&digest(2)) && blobs.exists(&digest(1)));
        assert_eq!(blobs.usage(), Some((250, 200)));
        // A removal elsewhere (a delete) is accounted for.
        blobs.remove(&digest(1)).unwrap();
        assert_eq!(blobs.usage(), Some((250, 100)));

        // Reopened with less room: what is on disk counts, and trims.
        put(&blobs, &digest(4), 100);
        let reopened = BlobStore::open_bounded(dir.path(), 150).unwrap();
        assert_eq!(reopened.usage(), Some((150, 200)));
        assert_eq!(reopened.trim().unwrap().len(), 1);
        assert_eq!(reopened.digests().unwrap().len(), 1);
    }

    #[test]
    fn an_unbounded_store_never_trims() {
        let dir = tempfile::tempdir().unwrap();
        let blobs = BlobStore::open(dir.path()).unwrap();
        put(&blobs, &digest(1), 100);
        assert!(blobs.trim().unwrap().is_empty());
        assert_eq!(blobs.usage(), None);
        assert!(blobs.exists(&digest(1)));
    }
}
