//! Bytes the server can send without copying them.
//!
//! A cached bundle of [`MIN_MAPPED_BYTES`] or more is its blob file mapped
//! read-only, its pages read in at load; its [`Bytes`] are that mapping.
//! Before the server writes a buffer to a socket it asks [`source`] whether
//! the buffer lies in such a mapping and, if so, sends it with
//! `sendfile(2)` from the blob file: the kernel hands the page cache's
//! pages to the socket where `write(2)` would copy them, exactly as nginx
//! serves a file. A buffer that is not found is written as usual, so the
//! lookup changes how bytes are sent, never which.
//!
//! Why the blob file and not a private copy: a copy in a memfd (shmem)
//! lives in 4 KiB pages where shmem huge pages are off (the default), and
//! `sendfile(2)` then looks every page up; the page cache of a disk file
//! system holds large folios, and serving from it costs the server about
//! a fifth less CPU per byte (measured with `perf` beside
//! `benches/download.sh`; nginx itself is as slow from `/dev/shm`).
//!
//! The mapping is sound because a blob never changes after it is stored:
//! it is written to a temporary file, made read-only (mode `0400`), fsynced
//! and renamed into place, and the service never opens it for writing
//! again; unlinking or replacing it (trimming, garbage collection) leaves
//! the mapped inode intact. Writing or truncating a stored blob in place
//! is outside the contract of the data dir, as it is for any database's
//! files.
//!
//! Each mapping holds its blob's file descriptor while it lives, so they
//! are bounded ([`MAX_MAPPINGS`]); smaller bundles, and any beyond the
//! bound, are copied to the heap.

use std::collections::BTreeMap;
use std::fs::File;
use std::io::{self, Read};
use std::os::fd::OwnedFd;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, LazyLock, PoisonError, RwLock};

use bytes::Bytes;
use memmap2::{Mmap, MmapOptions};

/// Most mappings alive at once (each holds a file descriptor; the server
/// keeps room for them beside client connections).
pub const MAX_MAPPINGS: usize = 128;

/// Smallest bundle worth a mapping: below it a `write(2)`'s copy is cheap
/// next to the request around it.
pub const MIN_MAPPED_BYTES: u64 = 256 * 1024;

/// Mappings alive now.
static LIVE_MAPPINGS: AtomicUsize = AtomicUsize::new(0);

/// Where a buffer can be sent from: its file and its offset there.
#[derive(Debug, Clone)]
pub struct FileSlice {
    /// The mapped blob file.
    pub file: Arc<OwnedFd>,
    /// The buffer's first byte's offset in the file.
    pub offset: u64,
}

/// A live mapping: its length and its file.
struct Region {
    len: usize,
    file: Arc<OwnedFd>,
}

/// The live mappings by start address. A buffer is looked up by address,
/// so the registry has to be reachable from the socket's write path, which
/// knows nothing but the buffer: hence one per process.
static MAPPINGS: LazyLock<RwLock<BTreeMap<usize, Region>>> =
    LazyLock::new(|| RwLock::new(BTreeMap::new()));

/// A blob's read-only mapping, registered while it lives.
struct BlobMapping {
    map: Mmap,
}

impl AsRef<[u8]> for BlobMapping {
    fn as_ref(&self) -> &[u8] {
        &self.map
    }
}

impl Drop for BlobMapping {
    fn drop(&mut self) {
        // Unregistered before `map` unmaps (fields drop after this body),
        // so no lookup can find an address that may be reused.
        MAPPINGS
            .write()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(&(self.map.as_ptr() as usize));
        LIVE_MAPPINGS.fetch_sub(1, Ordering::AcqRel);
    }
}

/// The `len` bytes of the stored blob `file`, in memory the server can send
/// without copying: the file's read-only mapping, its pages read in, which
/// [`source`] finds until the last `Bytes` sharing it is dropped; or a heap
/// copy when `len` is under [`MIN_MAPPED_BYTES`] or [`MAX_MAPPINGS`] are
/// alive. `file` must be a stored blob (never written again, see the module
/// docs). Blocking. Fails if the file is shorter than `len`, or mapped and
/// longer.
pub fn load_blob(file: File, len: u64) -> io::Result<Bytes> {
    let mapping_slot = len >= MIN_MAPPED_BYTES
        && LIVE_MAPPINGS
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |live| {
                (live < MAX_MAPPINGS).then_some(live + 1)
            })
            .is_ok();
    if !mapping_slot {
        return heap_copy(file, len);
    }
    map_blob(file, len).inspect_err(|_| {
        LIVE_MAPPINGS.fetch_sub(1, Ordering::AcqRel);
    })
}

fn heap_copy(source: impl Read, len: u64) -> io::Result<Bytes> {
    let mut buf = Vec::with_capacity(usize::try_from(len).unwrap_or(0));
    source.take(len).read_to_end(&mut buf)?;
    check_length(buf.len() as u64, len)?;
    Ok(Bytes::from(buf))
}

/// Maps `file` read-only with its pages read in; the caller holds a slot of
/// [`LIVE_MAPPINGS`], which the mapping releases when dropped.
fn map_blob(file: File, len: u64) -> io::Result<Bytes> {
    // SAFETY: `file` is a stored blob, which nothing writes or truncates
    // once stored (module docs), so the mapped bytes neither change under
    // the `&[u8]` the mapping hands out nor vanish (SIGBUS). The mapping
    // spans the file's own length; `populate` reads the pages in now, so
    // the load, not the first download, waits for the disk.
    let map = unsafe { MmapOptions::new().populate().map(&file)? };
    check_length(map.len() as u64, len)?;
    let file = Arc::new(OwnedFd::from(file));
    MAPPINGS
        .write()
        .unwrap_or_else(PoisonError::into_inner)
        .insert(
            map.as_ptr() as usize,
            Region {
                len: map.len(),
                file,
            },
        );
    Ok(Bytes::from_owner(BlobMapping { map }))
}

fn check_length(have: u64, len: u64) -> io::Result<()> {
    if have == len {
        return Ok(());
    }
    Err(io::Error::new(
        io::ErrorKind::UnexpectedEof,
        format!("the blob has {have} bytes, {len} expected"),
    ))
}

/// The file and offset that `buf` can be sent from, when it lies wholly
/// inside a live blob mapping.
pub fn source(buf: &[u8]) -> Option<FileSlice> {
    if buf.is_empty() {
        return None;
    }
    let start = buf.as_ptr() as usize;
    let mappings = MAPPINGS.read().unwrap_or_else(PoisonError::into_inner);
    let (&base, region) = mappings.range(..=start).next_back()?;
    let offset = start - base;
    (offset + buf.len() <= region.len).then(|| FileSlice {
        file: region.file.clone(),
        offset: offset as u64,
    })
}

/// A stored-blob stand-in for tests: `data` in an unnamed temporary file
/// (which nothing else can open, so nothing writes it), loaded as the cache
/// loads a blob.
#[cfg(test)]
pub(crate) fn load_test_blob(data: &[u8]) -> Bytes {
    use std::io::{Seek, Write};
    let mut file = tempfile::tempfile().unwrap();
    file.write_all(data).unwrap();
    file.rewind().unwrap();
    load_blob(file, data.len() as u64).unwrap()
}

#[cfg(test)]
mod tests {
    use super::*;

    const BIG: usize = MIN_MAPPED_BYTES as usize;

    #[test]
    fn a_mapped_blob_holds_the_bytes_and_is_found_by_address() {
        let data: Vec<u8> = (0..BIG + 100_000).map(|i| (i % 251) as u8).collect();
        let bytes = load_test_blob(&data);
        assert_eq!(&bytes[..], &data[..]);

        let whole = source(&bytes).unwrap();
        assert_eq!(whole.offset, 0);
        let part = bytes.slice(1_000..2_000);
        let found = source(&part).unwrap();
        assert_eq!(found.offset, 1_000);
        assert!(Arc::ptr_eq(&found.file, &whole.file));
        // The file holds the same bytes at that offset.
        let mut at = vec![0u8; 1_000];
        rustix::io::pread(&*found.file, &mut at, 1_000).unwrap();
        assert_eq!(at, data[1_000..2_000]);

        // Memory that is not a blob mapping is not found.
        assert!(source(&data).is_none());
        assert!(source(&data[10..20]).is_none());
        assert!(source(&bytes[..0]).is_none());
    }

    #[test]
    fn a_dropped_mapping_is_forgotten_and_its_file_closed() {
        let bytes = load_test_blob(&[7u8; BIG]);
        let file = Arc::downgrade(&source(&bytes).unwrap().file);
        let copy = bytes.clone();
        drop(bytes);
        // Still shared by `copy`.
        assert!(source(&copy).is_some());
        assert!(file.upgrade().is_some());
        drop(copy);
        // The registry held the last other reference.
        assert!(file.upgrade().is_none());
    }

    #[test]
    fn small_blobs_are_copied_to_the_heap() {
        let small = load_test_blob(&[3u8; BIG - 1]);
        assert_eq!(&small[..], &[3u8; BIG - 1][..]);
        assert!(source(&small).is_none());
        assert!(load_test_blob(&[]).is_empty());
    }

    #[test]
    fn a_blob_of_another_length_fails_on_either_path() {
        for len in [11, BIG as u64 + 1] {
            let file = tempfile::tempfile().unwrap();
            file.set_len(len - 1).unwrap();
            let err = load_blob(file, len).unwrap_err();
            assert_eq!(err.kind(), io::ErrorKind::UnexpectedEof);
            assert_eq!(
                err.to_string(),
                format!("the blob has {} bytes, {len} expected", len - 1)
            );
        }
    }
}
