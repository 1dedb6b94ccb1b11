//! The bundle cache: an LRU of bundle bytes under a byte budget.
//!
//! * Keyed by bundleDigest; values are [`Bytes`] shared with every response
//!   that streams them: the blob file's read-only mapping, so that the
//!   server sends them by `sendfile(2)` from the page cache without copying
//!   ([`crate::zerocopy`]).
//! * Memory is bounded by *resident* bytes, not only by what the LRU holds:
//!   an evicted bundle that responses still stream stays counted until its
//!   last reader finishes. A load that does not fit streams from disk
//!   instead, so peak memory does not grow with concurrent downloads.
//! * Concurrent misses for one key load once (single-flight).
//! * Bundles larger than the budget always stream from disk.
//! * Deleting a workload evicts its bundle.

use std::collections::HashMap;
use std::io::{self, SeekFrom};
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use bytes::Bytes;
use futures::stream::{self, Stream};
use lru::LruCache;
use tokio::io::{AsyncReadExt, AsyncSeekExt};
use tokio::sync::OnceCell;

use crate::zerocopy;

/// Size of the chunks a response from disk is read in: big enough that
/// the per-chunk hop to the blocking pool is noise, small enough that 32
/// concurrent downloads hold little.
const DISK_CHUNK: usize = 512 * 1024;

/// A stream of body chunks.
pub type ByteStream = Pin<Box<dyn Stream<Item = io::Result<Bytes>> + Send>>;

/// Bytes held in memory, released from the resident count when the last
/// holder (cache or response) drops it.
#[derive(Debug)]
pub struct Resident {
    bytes: Bytes,
    resident: Arc<AtomicU64>,
}

impl Drop for Resident {
    fn drop(&mut self) {
        self.resident
            .fetch_sub(self.bytes.len() as u64, Ordering::AcqRel);
    }
}

/// A range of a resident bundle, owning the residency: the bytes are
/// counted until the last response holding them drops them.
struct ResidentSlice {
    resident: Arc<Resident>,
    start: usize,
    end: usize,
}

impl AsRef<[u8]> for ResidentSlice {
    fn as_ref(&self) -> &[u8] {
        &self.resident.bytes[self.start..self.end]
    }
}

/// A bundle ready to stream: from memory, or from its blob file.
#[derive(Debug)]
pub enum CachedBundle {
    /// Held by the cache.
    Memory(Arc<Resident>),
    /// Streamed from disk (too big for the budget, or no room right now).
    Disk {
        /// The open blob.
        file: tokio::fs::File,
        /// Its length.
        len: u64,
    },
}

impl CachedBundle {
    /// Length in bytes.
    pub fn len(&self) -> u64 {
        match self {
            CachedBundle::Memory(r) => r.bytes.len() as u64,
            CachedBundle::Disk { len, .. } => *len,
        }
    }

    /// Whether the bundle is empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Whether the bytes come from memory.
    pub fn is_memory(&self) -> bool {
        matches!(self, CachedBundle::Memory(_))
    }

    /// Streams bytes `start..end` (end exclusive, within the length). From
    /// memory it is one chunk sharing the cached buffer (no copy; the
    /// server writes it in as few system calls as the socket allows), and
    /// the bytes stay counted as resident until the response drops it;
    /// from disk, bounded chunks.
    pub async fn stream(self, start: u64, end: u64) -> io::Result<ByteStream> {
        match self {
            CachedBundle::Memory(resident) => {
                let (start, end) = (start as usize, end as usize);
                let body = Bytes::from_owner(ResidentSlice {
                    resident,
                    start,
                    end,
                });
                Ok(Box::pin(stream::once(async move { Ok(body) })))
            }
            CachedBundle::Disk { mut file, .. } => {
                file.seek(SeekFrom::Start(start)).await?;
                let reader = file.take(end - start);
                Ok(Box::pin(tokio_util::io::ReaderStream::with_capacity(
                    reader, DISK_CHUNK,
                )))
            }
        }
    }
}

/// Counters for `/metrics` and tests.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct CacheStats {
    /// Served from memory.
    pub hits: u64,
    /// Loaded from disk into memory.
    pub loads: u64,
    /// Streamed from disk (too big or no room).
    pub disk: u64,
    /// Bytes the LRU holds.
    pub cached_bytes: u64,
    /// Bytes in memory, including evicted bundles still being streamed.
    pub resident_bytes: u64,
}

/// The budgeted LRU with single-flight loading.
#[derive(Debug)]
pub struct BundleCache {
    budget: u64,
    lru: Mutex<Lru>,
    resident: Arc<AtomicU64>,
    inflight: Mutex<HashMap<String, Arc<OnceCell<Arc<Resident>>>>>,
    hits: AtomicU64,
    loads: AtomicU64,
    disk: AtomicU64,
}

#[derive(Debug)]
struct Lru {
    entries: LruCache<String, Arc<Resident>>,
    bytes: u64,
}

/// Why a load did not produce cached bytes.
enum LoadError {
    NoRoom,
    Io(io::Error),
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panic while holding the lock leaves plain data; keep serving.
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl BundleCache {
    /// A cache holding at most `budget` bytes in memory.
    pub fn new(budget: u64) -> Self {
        Self {
            budget,
            lru: Mutex::new(Lru {
                entries: LruCache::unbounded(),
                bytes: 0,
            }),
            resident: Arc::new(AtomicU64::new(0)),
            inflight: Mutex::new(HashMap::new()),
            hits: AtomicU64::new(0),
            loads: AtomicU64::new(0),
            disk: AtomicU64::new(0),
        }
    }

    /// The byte budget.
    pub fn budget(&self) -> u64 {
        self.budget
    }

    /// Current counters.
    pub fn stats(&self) -> CacheStats {
        CacheStats {
            hits: self.hits.load(Ordering::Relaxed),
            loads: self.loads.load(Ordering::Relaxed),
            disk: self.disk.load(Ordering::Relaxed),
            cached_bytes: lock(&self.lru).bytes,
            resident_bytes: self.resident.load(Ordering::Acquire),
        }
    }

    /// The bundle `digest` of `len` bytes stored at `path`: from memory when
    /// cached, loaded once when it fits, else streamed from disk.
    pub async fn get(&self, digest: &str, len: u64, path: &Path) -> io::Result<CachedBundle> {
        if len <= self.budget {
            if let Some(hit) = lock(&self.lru).entries.get(digest).cloned() {
                self.hits.fetch_add(1, Ordering::Relaxed);
                return Ok(CachedBundle::Memory(hit));
            }
            let cell = lock(&self.inflight)
                .entry(digest.to_owned())
                .or_default()
                .clone();
            let mut loaded_here = false;
            let result = cell
                .get_or_try_init(|| {
                    loaded_here = true;
                    self.load(digest, len, path)
                })
                .await
                .cloned();
            {
                let mut inflight = lock(&self.inflight);
                if inflight.get(digest).is_some_and(|c| Arc::ptr_eq(c, &cell)) {
                    inflight.remove(digest);
                }
            }
            match result {
                Ok(resident) => {
                    if !loaded_here {
                        self.hits.fetch_add(1, Ordering::Relaxed);
                    }
                    return Ok(CachedBundle::Memory(resident));
                }
                Err(LoadError::Io(e)) => return Err(e),
                Err(LoadError::NoRoom) => {}
            }
        }
        self.disk.fetch_add(1, Ordering::Relaxed);
        let file = tokio::fs::File::open(path).await?;
        let actual = file.metadata().await?.len();
        if actual != len {
            return Err(size_mismatch(path, len, actual));
        }
        Ok(CachedBundle::Disk { file, len })
    }

    /// Reserves `len` resident bytes (evicting LRU entries as needed), reads
    /// the blob and caches it.
    async fn load(&self, digest: &str, len: u64, path: &Path) -> Result<Arc<Resident>, LoadError> {
        self.reserve(len)?;
        // From here `len` bytes are counted; `Resident` releases them, and so
        // does the error path below.
        let bytes = match load_blob(path.to_owned(), len).await {
            Ok(bytes) => bytes,
            Err(e) => {
                self.resident.fetch_sub(len, Ordering::AcqRel);
                return Err(LoadError::Io(e));
            }
        };
        let resident = Arc::new(Resident {
            bytes,
            resident: self.resident.clone(),
        });
        self.loads.fetch_add(1, Ordering::Relaxed);
        let mut lru = lock(&self.lru);
        if let Some(old) = lru.entries.put(digest.to_owned(), resident.clone()) {
            lru.bytes -= old.bytes.len() as u64;
        }
        lru.bytes += len;
        Ok(resident)
    }

    fn reserve(&self, len: u64) -> Result<(), LoadError> {
        let mut lru = lock(&self.lru);
        loop {
            let resident = self.resident.load(Ordering::Acquire);
            if resident + len <= self.budget {
                self.resident.fetch_add(len, Ordering::AcqRel);
                return Ok(());
            }
            // Evicting frees memory only once responses streaming it finish;
            // until then the load falls back to disk.
            match lru.entries.pop_lru() {
                Some((_, old)) => {
                    lru.bytes -= old.bytes.len() as u64;
                    drop(old);
                }
                None => return Err(LoadError::NoRoom),
            }
        }
    }

    /// Drops `digest` from the cache (responses already streaming finish).
    pub fn evict(&self, digest: &str) {
        let mut lru = lock(&self.lru);
        if let Some(old) = lru.entries.pop(digest) {
            lru.bytes -= old.bytes.len() as u64;
        }
    }

    /// Whether `digest` is cached.
    pub fn contains(&self, digest: &str) -> bool {
        lock(&self.lru).entries.contains(digest)
    }
}

/// Loads the `len`-byte blob at `path` into memory (mapped, so that the
/// server can send it by `sendfile(2)`, see [`crate::zerocopy`]).
async fn load_blob(path: PathBuf, len: u64) -> io::Result<Bytes> {
    let load = move || {
        let file = std::fs::File::open(&path)?;
        let actual = file.metadata()?.len();
        if actual != len {
            return Err(size_mismatch(&path, len, actual));
        }
        zerocopy::load_blob(file, len)
            .map_err(|e| io::Error::new(e.kind(), format!("{}: {e}", path.display())))
    };
    tokio::task::spawn_blocking(load)
        .await
        .unwrap_or_else(|joined| Err(io::Error::other(joined)))
}

fn size_mismatch(path: &Path, expected: u64, actual: u64) -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidData,
        format!(
            "{}: {actual} bytes on disk, {expected} recorded",
            path.display()
        ),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures::StreamExt;

    fn blob(dir: &Path, name: &str, len: usize) -> std::path::PathBuf {
        let path = dir.join(name);
        std::fs::write(&path, vec![name.as_bytes()[0]; len]).unwrap();
        path
    }

    async fn collect(b: CachedBundle, start: u64, end: u64) -> Vec<u8> {
        let mut s = b.stream(start, end).await.unwrap();
        let mut out = Vec::new();
        while let Some(chunk) = s.next().await {
            out.extend_from_slice(&chunk.unwrap());
        }
        out
    }

    #[tokio::test]
    async fn lru_under_budget_with_eviction_order() {
        let dir = tempfile::tempdir().unwrap();
        let cache = BundleCache::new(100);
        let a = blob(dir.path(), "a", 40);
        let b = blob(dir.path(), "b", 40);
        let c = blob(dir.path(), "c", 40);
        assert!(cache.get("a", 40, &a).await.unwrap().is_memory());
        assert!(cache.get("b", 40, &b).await.unwrap().is_memory());
        // Touch a, so b is the least recently used.
        assert!(cache.get("a", 40, &a).await.unwrap().is_memory());
        assert!(cache.get("c", 40, &c).await.unwrap().is_memory());
        assert!(cache.contains("a") && cache.contains("c") && !cache.contains("b"));
        let stats = cache.stats();
        assert_eq!(stats.cached_bytes, 80);
        assert_eq!(stats.resident_bytes, 80);
        assert_eq!((stats.hits, stats.loads), (1, 3));
        cache.evict("a");
        assert_eq!(cache.stats().resident_bytes, 40);
    }

    #[tokio::test]
    async fn bigger_than_budget_streams_from_disk_and_ranges_work() {
        let dir = tempfile::tempdir().unwrap();
        let cache = BundleCache::new(10);
        let big = dir.path().join("big");
        let data: Vec<u8> = (0..DISK_CHUNK * 2 + 7).map(|i| (i % 251) as u8).collect();
        std::fs::write(&big, &data).unwrap();
        let got = cache.get("big", data.len() as u64, &big).await.unwrap();
        assert!(!got.is_memory());
        assert_eq!(collect(got, 0, data.len() as u64).await, data);
        let got = cache.get("big", data.len() as u64, &big).await.unwrap();
        assert_eq!(collect(got, 5, 300_000).await, &data[5..300_000]);
        assert_eq!(cache.stats().resident_bytes, 0);
        // A recorded length that disagrees with the file is an error.
        assert!(cache.get("big", 3, &big).await.is_err());
    }

    #[tokio::test]
    async fn memory_ranges_match_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("m");
        let data: Vec<u8> = (0..DISK_CHUNK * 3 + 1).map(|i| (i % 13) as u8).collect();
        std::fs::write(&path, &data).unwrap();
        let cache = BundleCache::new(u64::MAX / 2);
        let got = cache.get("m", data.len() as u64, &path).await.unwrap();
        assert!(got.is_memory());
        assert_eq!(
            collect(got, 1, DISK_CHUNK as u64 + 9).await,
            &data[1..DISK_CHUNK + 9]
        );
    }

    #[tokio::test]
    async fn streaming_readers_keep_evicted_bytes_counted() {
        let dir = tempfile::tempdir().unwrap();
        let cache = BundleCache::new(100);
        let a = blob(dir.path(), "a", 60);
        let b = blob(dir.path(), "b", 60);
        let held = cache.get("a", 60, &a).await.unwrap();
        // b does not fit while a is held by a response: a is evicted from the
        // LRU but still resident, so b streams from disk.
        let got_b = cache.get("b", 60, &b).await.unwrap();
        assert!(!got_b.is_memory());
        assert!(!cache.contains("a"));
        assert_eq!(cache.stats().resident_bytes, 60);
        drop(held);
        assert_eq!(cache.stats().resident_bytes, 0);
        assert!(cache.get("b", 60, &b).await.unwrap().is_memory());
    }

    #[tokio::test]
    async fn a_streamed_memory_body_keeps_its_bytes_counted() {
        let dir = tempfile::tempdir().unwrap();
        let cache = BundleCache::new(100);
        let a = blob(dir.path(), "a", 60);
        let mut s = cache
            .get("a", 60, &a)
            .await
            .unwrap()
            .stream(10, 50)
            .await
            .unwrap();
        let body = s.next().await.unwrap().unwrap();
        assert!(s.next().await.is_none(), "one chunk");
        drop(s);
        assert_eq!(body, vec![b'a'; 40]);
        cache.evict("a");
        // The response still holds the bytes: still resident.
        assert_eq!(cache.stats().resident_bytes, 60);
        drop(body);
        assert_eq!(cache.stats().resident_bytes, 0);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn concurrent_misses_load_once() {
        let dir = tempfile::tempdir().unwrap();
        let path = blob(dir.path(), "s", 1 << 20);
        let cache = Arc::new(BundleCache::new(8 << 20));
        let tasks: Vec<_> = (0..16)
            .map(|_| {
                let cache = cache.clone();
                let path = path.clone();
                tokio::spawn(
                    async move { cache.get("s", 1 << 20, &path).await.unwrap().is_memory() },
                )
            })
            .collect();
        for t in tasks {
            assert!(t.await.unwrap());
        }
        let stats = cache.stats();
        assert_eq!(stats.loads, 1, "{stats:?}");
        assert_eq!(stats.hits, 15);
        assert_eq!(stats.resident_bytes, 1 << 20);
    }
}
