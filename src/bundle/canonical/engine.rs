//! The threads behind one canonicalisation: deflate workers (one per core)
//! and the bundle writer that puts their pieces back in order, and the
//! revision hasher of a canonical tar stream.
//!
//! Everything the bundle writer receives carries a sequence number from
//! one [`Dispatch`]: pieces to compress (through the workers), bytes of the
//! upload itself, precompressed files to copy, and the gzip framing. The
//! writer applies them strictly in that order, so the bundle bytes do not
//! depend on thread timing. A bounded number of items is in flight (slots),
//! so memory stays bounded whatever the speed of each thread.
//!
//! Large files are compressed as soon as their bytes arrive, even before
//! their place in the canonical order is known: their pieces go to a
//! *packed spool* (an unnamed temp file), keyed by file, and are copied
//! into the bundle when the file's turn comes.

use std::collections::{BTreeMap, HashMap};
use std::fs::File;
use std::io::{self, BufWriter, Seek, SeekFrom, Write};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::mpsc::{channel, sync_channel, Receiver, Sender, SyncSender};
use std::sync::{Arc, Mutex};
use std::thread::Scope;

use flate2::Crc;
use sha2::{Digest, Sha256};

use super::pgzip::{self, Body, Compressed, PieceCompressor, PIECE};
use crate::bundle::budget::{Charge, Charged};
use crate::bundle::threads::{spawn, testing, Joined};

/// A piece of the canonical tar, shared by the hasher and a worker.
pub(crate) type Piece = Arc<PieceBuf>;

/// Piece buffers kept for reuse, process-wide (a few MiB at most).
static SPARE_PIECES: Mutex<Vec<Vec<u8>>> = Mutex::new(Vec::new());

/// Spare piece buffers kept at most: enough for the pieces in flight of a
/// couple of runs.
const MAX_SPARE_PIECES: usize = 4 * SLOTS;

/// The bytes of one piece. When the last holder drops it, the buffer goes
/// back to a small pool, so the next piece reuses warm pages instead of
/// faulting in fresh ones (a 256 KiB allocation is a fresh `mmap` for the
/// allocator; the faults were a tenth of a small-file run).
#[derive(Debug)]
pub(crate) struct PieceBuf(Vec<u8>);

impl PieceBuf {
    /// An empty buffer with room for a whole piece, from the pool if it has one.
    pub(crate) fn empty() -> Vec<u8> {
        let spare = SPARE_PIECES.lock().ok().and_then(|mut p| p.pop());
        spare.unwrap_or_else(|| Vec::with_capacity(PIECE))
    }

    /// Shares `bytes` as a piece.
    pub(crate) fn share(bytes: Vec<u8>) -> Piece {
        Arc::new(Self(bytes))
    }
}

impl std::ops::Deref for PieceBuf {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        &self.0
    }
}

impl Drop for PieceBuf {
    fn drop(&mut self) {
        let mut buf = std::mem::take(&mut self.0);
        if buf.capacity() != PIECE {
            return;
        }
        buf.clear();
        if let Ok(mut spare) = SPARE_PIECES.lock() {
            if spare.len() < MAX_SPARE_PIECES {
                spare.push(buf);
            }
        }
    }
}

/// Items in flight between the main thread and the bundle writer (and
/// pieces queued for the hasher): a few per worker keeps every core busy;
/// more only holds memory.
const SLOTS: usize = 8;

/// Deflate output buffers handed back by the writer for reuse, so pieces
/// do not fault in fresh pages.
type Pool = Arc<Mutex<Vec<Vec<u8>>>>;

/// Where the bundle goes. Besides writing, it can be emptied: the upload's
/// own bytes are written as they arrive, and discarded if the upload turns
/// out not to be canonical after all.
pub trait BundleOut: Write + Send {
    /// Discards everything written so far.
    fn restart(&mut self) -> io::Result<()>;
}

impl BundleOut for File {
    fn restart(&mut self) -> io::Result<()> {
        self.seek(SeekFrom::Start(0))?;
        self.set_len(0)
    }
}

impl BundleOut for io::Sink {
    fn restart(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl BundleOut for Vec<u8> {
    fn restart(&mut self) -> io::Result<()> {
        self.clear();
        Ok(())
    }
}

impl<T: BundleOut + ?Sized> BundleOut for &mut T {
    fn restart(&mut self) -> io::Result<()> {
        (**self).restart()
    }
}

/// Adapts a plain writer that is only ever written in order (the directory
/// packer): restarting it is only possible before anything was written.
pub(crate) struct Forward<W> {
    inner: W,
    written: bool,
}

impl<W> Forward<W> {
    pub(crate) fn new(inner: W) -> Self {
        Self {
            inner,
            written: false,
        }
    }
}

impl<W: Write> Write for Forward<W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.written |= !buf.is_empty();
        self.inner.write(buf)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }
}

impl<W: Write + Send> BundleOut for Forward<W> {
    fn restart(&mut self) -> io::Result<()> {
        if self.written {
            return Err(io::Error::other("a packed bundle cannot restart"));
        }
        Ok(())
    }
}

/// Where a compressed piece goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Dest {
    /// Straight into the bundle, in order.
    Out,
    /// Appended to the packed spool under this file key.
    Pack(u64),
}

/// A piece for a worker.
struct Job {
    seq: u64,
    data: Piece,
    prev: Option<Piece>,
    dest: Dest,
}

/// What the bundle writer applies, in sequence order.
enum Item {
    /// Bytes of the upload, stored as they are.
    Raw(Vec<u8>),
    /// Empty the bundle and start over.
    Restart,
    /// The gzip header of a recompressed bundle.
    Header,
    /// A compressed piece (with its raw bytes, which stored blocks frame).
    Piece(Dest, Piece, Compressed),
    /// A packed file, copied from the packed spool.
    Copy(u64),
    /// The gzip end of a recompressed bundle.
    Trailer,
    /// A worker failed.
    Failed(String),
}

/// The bundle as written: its sha256 and size.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Written {
    pub digest: [u8; 32],
    pub bytes: u64,
}

/// Sends work to the writer and the workers, numbering it.
pub(crate) struct Dispatch {
    seq: u64,
    slots: SyncSender<()>,
    items: Sender<(u64, Item)>,
    jobs: Sender<Job>,
}

fn stopped() -> io::Error {
    io::Error::other("bundle writer stopped")
}

impl Dispatch {
    fn next(&mut self) -> io::Result<u64> {
        // Blocks while SLOTS items are unapplied.
        self.slots.send(()).map_err(|_| stopped())?;
        let seq = self.seq;
        self.seq += 1;
        Ok(seq)
    }

    fn item(&mut self, item: Item) -> io::Result<()> {
        let seq = self.next()?;
        self.items.send((seq, item)).map_err(|_| stopped())
    }

    /// Upload bytes to store as they are.
    pub(crate) fn raw(&mut self, bytes: Vec<u8>) -> io::Result<()> {
        self.item(Item::Raw(bytes))
    }

    /// Empties the bundle.
    pub(crate) fn restart(&mut self) -> io::Result<()> {
        self.item(Item::Restart)
    }

    /// Starts a recompressed bundle.
    pub(crate) fn header(&mut self) -> io::Result<()> {
        self.item(Item::Header)
    }

    /// Ends a recompressed bundle.
    pub(crate) fn trailer(&mut self) -> io::Result<()> {
        self.item(Item::Trailer)
    }

    /// Copies packed file `key` into the bundle.
    pub(crate) fn copy(&mut self, key: u64) -> io::Result<()> {
        self.item(Item::Copy(key))
    }

    /// Compresses `data` (primed with `prev`) into `dest`.
    pub(crate) fn piece(&mut self, data: Piece, prev: Option<Piece>, dest: Dest) -> io::Result<()> {
        let seq = self.next()?;
        self.jobs
            .send(Job {
                seq,
                data,
                prev,
                dest,
            })
            .map_err(|_| stopped())
    }
}

/// Handles on the writer and worker threads. Dropped unjoined (a panic),
/// it waits for them: drop the [`Dispatch`] first.
pub(crate) struct Engine<'scope> {
    writer: Joined<'scope, io::Result<Written>>,
    workers: Vec<Joined<'scope, ()>>,
}

impl<'scope> Engine<'scope> {
    /// Starts the workers (see [`deflate_threads`]) and the writer of a
    /// bundle at `level` into `out`.
    pub(crate) fn start<'env, W: BundleOut>(
        s: &'scope Scope<'scope, 'env>,
        out: &'env mut W,
        level: u32,
        threads: usize,
        temp_dir: Option<&'env Path>,
        charge: Charge,
    ) -> io::Result<(Dispatch, Self)> {
        let n = deflate_threads(threads);
        // Declared before the channels: if a spawn fails, the senders are
        // dropped first, so the workers started end and are joined.
        let mut workers = Vec::with_capacity(n);
        let (slot_tx, slot_rx) = sync_channel(SLOTS);
        let (item_tx, item_rx) = channel();
        let (job_tx, job_rx) = channel::<Job>();
        let job_rx = Arc::new(Mutex::new(job_rx));
        let pool: Pool = Arc::default();
        for _ in 0..n {
            let jobs = job_rx.clone();
            let items = item_tx.clone();
            let pool = pool.clone();
            workers.push(spawn(s, "bundle-deflate", move || {
                worker(level, &jobs, &items, &pool);
            })?);
        }
        let temp_dir = temp_dir.map(Path::to_path_buf);
        let writer = spawn(s, "bundle-writer", move || {
            let mut w = Writer::new(out, temp_dir, charge, pool);
            w.run(&item_rx, &slot_rx)
        })?;
        Ok((
            Dispatch {
                seq: 0,
                slots: slot_tx,
                items: item_tx,
                jobs: job_tx,
            },
            Self { writer, workers },
        ))
    }

    /// Waits for the threads (the [`Dispatch`] must be dropped first) and
    /// returns what the writer wrote.
    pub(crate) fn join(self) -> io::Result<Written> {
        for w in self.workers {
            w.join();
        }
        self.writer
            .join()
            .unwrap_or_else(|| Err(io::Error::other("bundle writer panicked")))
    }
}

/// Deflate workers: `requested` (`--bundle-threads`; benchmarks compare 1
/// with more), `0` for one per core; 1 to 4. The bundle bytes never depend
/// on it.
fn deflate_threads(requested: usize) -> usize {
    match requested {
        0 => std::thread::available_parallelism().map_or(2, std::num::NonZero::get),
        n => n,
    }
    .clamp(1, 4)
}

fn worker(level: u32, jobs: &Mutex<Receiver<Job>>, items: &Sender<(u64, Item)>, pool: &Pool) {
    let mut compressor = PieceCompressor::new(level);
    loop {
        // A poisoned lock means another worker panicked; stop too.
        let job = match jobs.lock() {
            Ok(rx) => rx.recv(),
            Err(_) => return,
        };
        let Ok(job) = job else { return };
        testing::jitter();
        let buf = pool
            .lock()
            .ok()
            .and_then(|mut p| p.pop())
            .unwrap_or_default();
        let prev = job.prev.as_deref().map(|p| &p[..]);
        let item = match compressor.compress(&job.data, prev, buf) {
            Ok(c) => Item::Piece(job.dest, job.data, c),
            Err(e) => Item::Failed(format!("deflate: {e}")),
        };
        if items.send((job.seq, item)).is_err() {
            return;
        }
    }
}

/// A packed file: where its compressed pieces are, and their CRC.
#[derive(Debug, Default)]
struct Packed {
    start: u64,
    len: u64,
    crc: Crc,
}

/// The bundle writer's state.
struct Writer<'o, W> {
    out: &'o mut W,
    hasher: Sha256,
    bytes: u64,
    crc: Crc,
    temp_dir: Option<PathBuf>,
    /// Charged for the packed spool (the run's temporary-space share).
    charge: Charge,
    spool: Option<BufWriter<Charged<File>>>,
    spool_len: u64,
    packed: HashMap<u64, Packed>,
    copy_buf: Vec<u8>,
    pool: Pool,
}

impl<'o, W: BundleOut> Writer<'o, W> {
    fn new(out: &'o mut W, temp_dir: Option<PathBuf>, charge: Charge, pool: Pool) -> Self {
        Self {
            out,
            hasher: Sha256::new(),
            bytes: 0,
            crc: Crc::new(),
            temp_dir,
            charge,
            spool: None,
            spool_len: 0,
            packed: HashMap::new(),
            copy_buf: Vec::new(),
            pool,
        }
    }

    fn run(&mut self, items: &Receiver<(u64, Item)>, slots: &Receiver<()>) -> io::Result<Written> {
        let mut next = 0u64;
        let mut early: BTreeMap<u64, Item> = BTreeMap::new();
        for (seq, item) in items {
            early.insert(seq, item);
            while let Some(item) = early.remove(&next) {
                next += 1;
                testing::jitter();
                self.apply(item)?;
                // Frees the slot this item held.
                let _ = slots.try_recv();
            }
        }
        if !early.is_empty() {
            return Err(io::Error::other("bundle writer: items missing"));
        }
        self.out.flush()?;
        Ok(Written {
            digest: std::mem::take(&mut self.hasher).finalize().into(),
            bytes: self.bytes,
        })
    }

    fn emit(&mut self, bytes: &[u8]) -> io::Result<()> {
        self.out.write_all(bytes)?;
        self.hasher.update(bytes);
        self.bytes += bytes.len() as u64;
        Ok(())
    }

    fn apply(&mut self, item: Item) -> io::Result<()> {
        match item {
            Item::Raw(bytes) => self.emit(&bytes),
            Item::Restart => {
                self.out.restart()?;
                self.hasher = Sha256::new();
                self.bytes = 0;
                self.crc = Crc::new();
                Ok(())
            }
            Item::Header => self.emit(&pgzip::HEADER),
            Item::Piece(Dest::Out, data, c) => {
                self.crc.combine(&c.crc);
                match c.body {
                    Body::Deflated(bytes) => {
                        self.emit(&bytes)?;
                        self.recycle(bytes);
                        Ok(())
                    }
                    Body::Stored => pgzip::stored_blocks(&data, |b| self.emit(b)),
                }
            }
            Item::Piece(Dest::Pack(key), data, c) => self.pack(key, &data, c),
            Item::Copy(key) => self.copy(key),
            Item::Trailer => {
                let end = pgzip::trailer(&self.crc).map_err(io::Error::other)?;
                self.emit(&end)
            }
            Item::Failed(detail) => Err(io::Error::other(detail)),
        }
    }

    fn recycle(&self, mut buf: Vec<u8>) {
        buf.clear();
        if let Ok(mut pool) = self.pool.lock() {
            if pool.len() < SLOTS {
                pool.push(buf);
            }
        }
    }

    fn pack(&mut self, key: u64, data: &[u8], c: Compressed) -> io::Result<()> {
        let spool = match self.spool.as_mut() {
            Some(s) => s,
            None => {
                let file = match &self.temp_dir {
                    Some(d) => tempfile::tempfile_in(d)?,
                    None => tempfile::tempfile()?,
                };
                self.spool.insert(BufWriter::with_capacity(
                    256 << 10,
                    Charged::new(file, self.charge.clone()),
                ))
            }
        };
        let start = self.spool_len;
        let mut len = 0u64;
        let mut put = |b: &[u8]| -> io::Result<()> {
            spool.write_all(b)?;
            len += b.len() as u64;
            Ok(())
        };
        match c.body {
            Body::Deflated(bytes) => {
                put(&bytes)?;
                self.recycle(bytes);
            }
            Body::Stored => pgzip::stored_blocks(data, put)?,
        }
        self.spool_len += len;
        let entry = self.packed.entry(key).or_insert_with(|| Packed {
            start,
            ..Packed::default()
        });
        entry.len += len;
        entry.crc.combine(&c.crc);
        Ok(())
    }

    fn copy(&mut self, key: u64) -> io::Result<()> {
        // Kept: an abandoned speculation may have copied it already.
        let packed = self
            .packed
            .get(&key)
            .ok_or_else(|| io::Error::other(format!("packed file {key} is missing")))?;
        let (start, len) = (packed.start, packed.len);
        let Some(spool) = self.spool.as_mut() else {
            return Err(io::Error::other("packed spool is missing"));
        };
        spool.flush()?;
        // A second handle: reading it must not hold a borrow of `self`.
        let file = spool.get_ref().get_ref().try_clone()?;
        if self.copy_buf.is_empty() {
            self.copy_buf = vec![0u8; 256 << 10];
        }
        let mut buf = std::mem::take(&mut self.copy_buf);
        let (mut at, end) = (start, start + len);
        while at < end {
            let want = buf
                .len()
                .min(usize::try_from(end - at).unwrap_or(usize::MAX));
            let n = file.read_at(&mut buf[..want], at)?;
            if n == 0 {
                return Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    "packed spool is short",
                ));
            }
            self.emit(&buf[..n])?;
            at += n as u64;
        }
        self.copy_buf = buf;
        if let Some(packed) = self.packed.get(&key) {
            self.crc.combine(&packed.crc);
        }
        Ok(())
    }
}

/// Starts a thread hashing a canonical tar stream; returns the sender for
/// its pieces (drop it to end the stream) and the handle yielding the
/// revision (drop the sender before it).
pub(crate) fn start_hasher<'scope>(
    s: &'scope Scope<'scope, '_>,
) -> io::Result<(SyncSender<Piece>, Joined<'scope, [u8; 32]>)> {
    let (tx, rx) = sync_channel::<Piece>(SLOTS);
    let handle = spawn(s, "bundle-hash", move || {
        let mut h = Sha256::new();
        for piece in rx {
            h.update(&piece[..]);
        }
        h.finalize().into()
    })?;
    Ok((tx, handle))
}
