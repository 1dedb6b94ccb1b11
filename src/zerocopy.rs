//! Bytes the server can send without copying them.
//!
//! A cached bundle is copied once into a sealed memfd that is mapped
//! read-only; its [`Bytes`] are that mapping. Before the server writes a
//! buffer to a socket it asks [`source`] whether the buffer lies in such a
//! mapping and, if so, sends it with `sendfile(2)` from the memfd: the
//! kernel hands the memfd's pages to the socket where `write(2)` would copy
//! them (that copy was what kept us behind nginx's `sendfile` from the page
//! cache). A buffer that is not found is written as usual, so the lookup
//! changes how bytes are sent, never which.
//!
//! The seals (no write, no shrink, no grow, no further seals) keep the
//! memfd's contents fixed for as long as anything references its pages,
//! the mapping or a socket buffer still holding sent pages, and rule out
//! the `SIGBUS` a truncated mapping would raise.
//!
//! Each memfd holds a file descriptor while it lives, so they are bounded
//! ([`MAX_MEMFDS`]) and kept for bundles big enough to gain from
//! `sendfile(2)` ([`MIN_MEMFD_BYTES`]); other copies go to the heap.

use std::collections::BTreeMap;
use std::fs::File;
use std::io::{self, Read};
use std::os::fd::OwnedFd;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, LazyLock, PoisonError, RwLock};

use bytes::Bytes;
use memmap2::Mmap;
use rustix::fs::{MemfdFlags, SealFlags};

/// The name the memfds carry in `/proc/<pid>/fd` (`/memfd:<name>`).
pub const MEMFD_NAME: &str = "context-service-bundle";

/// Most memfds alive at once (each holds a file descriptor; the server keeps
/// room for them beside client connections).
pub const MAX_MEMFDS: usize = 128;

/// Smallest copy worth a memfd: below it a `write(2)`'s copy is cheap next
/// to the request around it.
pub const MIN_MEMFD_BYTES: u64 = 256 * 1024;

/// Memfds alive now.
static LIVE_MEMFDS: AtomicUsize = AtomicUsize::new(0);

/// Where a buffer can be sent from: its memfd and its offset there.
#[derive(Debug, Clone)]
pub struct FileSlice {
    /// The sealed memfd.
    pub file: Arc<OwnedFd>,
    /// The buffer's first byte's offset in the memfd.
    pub offset: u64,
}

/// A live mapping: its length and its memfd.
struct Region {
    len: usize,
    file: Arc<OwnedFd>,
}

/// The live mappings by start address. A buffer is looked up by address,
/// so the registry has to be reachable from the socket's write path, which
/// knows nothing but the buffer: hence one per process.
static MAPPINGS: LazyLock<RwLock<BTreeMap<usize, Region>>> =
    LazyLock::new(|| RwLock::new(BTreeMap::new()));

/// A sealed memfd and its read-only mapping, registered while it lives.
struct SealedMapping {
    map: Mmap,
}

impl AsRef<[u8]> for SealedMapping {
    fn as_ref(&self) -> &[u8] {
        &self.map
    }
}

impl Drop for SealedMapping {
    fn drop(&mut self) {
        // Unregistered before `map` unmaps (fields drop after this body),
        // so no lookup can find an address that may be reused.
        MAPPINGS
            .write()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(&(self.map.as_ptr() as usize));
        LIVE_MEMFDS.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Copies the next `len` bytes of `source` into memory the server can send
/// without copying again: a sealed memfd's read-only mapping, which
/// [`source`] finds until the last `Bytes` sharing it is dropped, or the
/// heap when `len` is under [`MIN_MEMFD_BYTES`] or [`MAX_MEMFDS`] are alive.
/// Blocking. Fails if `source` ends early.
pub fn sendable_copy(source: impl Read, len: u64) -> io::Result<Bytes> {
    let memfd_slot = len >= MIN_MEMFD_BYTES
        && LIVE_MEMFDS
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |live| {
                (live < MAX_MEMFDS).then_some(live + 1)
            })
            .is_ok();
    if !memfd_slot {
        return heap_copy(source, len);
    }
    sealed_copy(source, len).inspect_err(|_| {
        LIVE_MEMFDS.fetch_sub(1, Ordering::AcqRel);
    })
}

fn heap_copy(source: impl Read, len: u64) -> io::Result<Bytes> {
    let mut buf = Vec::with_capacity(usize::try_from(len).unwrap_or(0));
    source.take(len).read_to_end(&mut buf)?;
    check_length(buf.len() as u64, len)?;
    Ok(Bytes::from(buf))
}

/// Copies into a new sealed memfd and maps it; the caller holds a slot of
/// [`LIVE_MEMFDS`], which the mapping releases when dropped.
fn sealed_copy(source: impl Read, len: u64) -> io::Result<Bytes> {
    let memfd =
        rustix::fs::memfd_create(MEMFD_NAME, MemfdFlags::CLOEXEC | MemfdFlags::ALLOW_SEALING)?;
    let mut file = File::from(memfd);
    // `io::copy` from a file's `Take` into a file copies in the kernel.
    let copied = io::copy(&mut source.take(len), &mut file)?;
    check_length(copied, len)?;
    rustix::fs::fcntl_add_seals(
        &file,
        SealFlags::WRITE | SealFlags::SHRINK | SealFlags::GROW | SealFlags::SEAL,
    )?;
    // SAFETY: the memfd is ours alone and sealed against writes and size
    // changes, so the mapped bytes can neither change under the `&[u8]`
    // the mapping hands out nor vanish (no SIGBUS).
    let map = unsafe { Mmap::map(&file)? };
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
    Ok(Bytes::from_owner(SealedMapping { map }))
}

fn check_length(copied: u64, len: u64) -> io::Result<()> {
    if copied == len {
        return Ok(());
    }
    Err(io::Error::new(
        io::ErrorKind::UnexpectedEof,
        format!("read {copied} of {len} bytes"),
    ))
}

/// The memfd and offset that `buf` can be sent from, when it lies wholly
/// inside a live sealed mapping.
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

#[cfg(test)]
mod tests {
    use super::*;

    const BIG: usize = MIN_MEMFD_BYTES as usize;

    #[test]
    fn a_sealed_copy_holds_the_bytes_and_is_found_by_address() {
        let data: Vec<u8> = (0..BIG + 100_000).map(|i| (i % 251) as u8).collect();
        let bytes = sendable_copy(&data[..], data.len() as u64).unwrap();
        assert_eq!(&bytes[..], &data[..]);

        let whole = source(&bytes).unwrap();
        assert_eq!(whole.offset, 0);
        let part = bytes.slice(1_000..2_000);
        let found = source(&part).unwrap();
        assert_eq!(found.offset, 1_000);
        assert!(Arc::ptr_eq(&found.file, &whole.file));
        // The memfd holds the same bytes at that offset.
        let mut at = vec![0u8; 1_000];
        rustix::io::pread(&*found.file, &mut at, 1_000).unwrap();
        assert_eq!(at, data[1_000..2_000]);

        // Memory that is not a sealed mapping is not found.
        assert!(source(&data).is_none());
        assert!(source(&data[10..20]).is_none());
        assert!(source(&bytes[..0]).is_none());
    }

    #[test]
    fn the_memfd_refuses_writes_and_size_changes() {
        let bytes = sendable_copy(&[9u8; BIG][..], BIG as u64).unwrap();
        let fd = source(&bytes).unwrap().file;
        assert_eq!(
            rustix::io::pwrite(&*fd, b"x", 0).unwrap_err(),
            rustix::io::Errno::PERM
        );
        assert_eq!(
            rustix::fs::ftruncate(&*fd, 1).unwrap_err(),
            rustix::io::Errno::PERM
        );
        assert!(bytes.iter().all(|&b| b == 9));
    }

    #[test]
    fn a_dropped_mapping_is_forgotten_and_its_memfd_closed() {
        let bytes = sendable_copy(&[7u8; BIG][..], BIG as u64).unwrap();
        let memfd = Arc::downgrade(&source(&bytes).unwrap().file);
        let copy = bytes.clone();
        drop(bytes);
        // Still shared by `copy`.
        assert!(source(&copy).is_some());
        assert!(memfd.upgrade().is_some());
        drop(copy);
        // The registry held the last other reference.
        assert!(memfd.upgrade().is_none());
    }

    #[test]
    fn small_copies_stay_on_the_heap() {
        let small = sendable_copy(&[3u8; BIG - 1][..], BIG as u64 - 1).unwrap();
        assert_eq!(small.len(), BIG - 1);
        assert!(source(&small).is_none());
        assert!(sendable_copy(&[][..], 0).unwrap().is_empty());
    }

    #[test]
    fn a_short_source_fails_on_either_path() {
        for len in [11, BIG as u64 + 1] {
            let have = vec![1u8; len as usize - 1];
            let err = sendable_copy(&have[..], len).unwrap_err();
            assert_eq!(err.kind(), io::ErrorKind::UnexpectedEof);
            assert_eq!(err.to_string(), format!("read {} of {len} bytes", len - 1));
        }
    }
}
