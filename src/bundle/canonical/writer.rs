//! The canonical archive: a deterministic tar of the accepted tree, its
//! digests, and the deterministic gzip wrapping.
//!
//! Entries are sorted by path (component-wise, see `CanonPath`),
//! directories are `0755` and named with a trailing `/`, files are `0644`
//! or `0755`, uid/gid/mtime are 0, user and group names are empty, there
//! are no xattrs, and a PAX `path` record appears only when a path does not
//! fit the ustar name/prefix fields. The gzip header has mtime 0, no file
//! name and OS byte 255, so the bundle bytes depend only on the tree, the
//! level and the zlib-rs version.

use std::fs::File;
use std::io::{self, BufWriter, Read, Write};
use std::sync::mpsc::{sync_channel, Receiver, SyncSender};
use std::thread::JoinHandle;

use flate2::write::GzEncoder;
use flate2::{Compression, GzBuilder};
use sha2::{Digest, Sha256};

use crate::bundle::budget::Charged;

/// Chunk size for copies and for the hand-off to the sink thread: large
/// enough that per-call costs (hash, deflate, channel) vanish.
pub(crate) const CHUNK: usize = 256 * 1024;

/// Chunks in flight to the sink thread; bounds that buffer at ~1 MiB.
const IN_FLIGHT: usize = 4;

/// A sha256 digest as 64 lowercase hex digits.
pub(crate) fn hex(digest: &[u8]) -> String {
    hex::encode(digest)
}

/// A gzip encoder with a deterministic header.
pub(crate) fn gzip<W: Write>(w: W, level: u32) -> GzEncoder<W> {
    GzBuilder::new()
        .mtime(0)
        .operating_system(255)
        .write(w, Compression::new(level.min(9)))
}

/// Passes bytes through while hashing and counting them.
pub(crate) struct HashingWriter<W> {
    inner: W,
    hasher: Sha256,
    count: u64,
}

impl<W: Write> HashingWriter<W> {
    pub(crate) fn new(inner: W) -> Self {
        Self {
            inner,
            hasher: Sha256::new(),
            count: 0,
        }
    }

    /// The writer, the digest and the byte count.
    pub(crate) fn finish(self) -> (W, [u8; 32], u64) {
        (self.inner, self.hasher.finalize().into(), self.count)
    }
}

impl<W: Write> Write for HashingWriter<W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.hasher.update(&buf[..n]);
        self.count += n as u64;
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }
}

/// Feeds `inner` in fixed `CHUNK`-sized writes, whatever the caller's
/// write sizes. Deflate output can depend on how input is split across
/// calls, so both gzip paths (sink thread and local) use the same split to
/// keep the bundle digest identical.
pub(crate) struct Chunked<W: Write> {
    inner: W,
    buf: Vec<u8>,
}

impl<W: Write> Chunked<W> {
    pub(crate) fn new(inner: W) -> Self {
        Self {
            inner,
            buf: Vec::with_capacity(CHUNK),
        }
    }

    /// Writes the last partial chunk and returns the writer (unflushed).
    pub(crate) fn finish(mut self) -> io::Result<W> {
        if !self.buf.is_empty() {
            self.inner.write_all(&self.buf)?;
        }
        Ok(self.inner)
    }
}

impl<W: Write> Write for Chunked<W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let n = buf.len().min(CHUNK - self.buf.len());
        self.buf.extend_from_slice(&buf[..n]);
        if self.buf.len() == CHUNK {
            self.inner.write_all(&self.buf)?;
            self.buf.clear();
        }
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// What the sink thread does with the canonical tar bytes it receives.
pub(crate) struct SinkJob {
    /// Hash the tar (the revision) on the sink thread.
    pub hash: bool,
    /// Gzip at this level into this (temporary, charged) file.
    pub gzip: Option<(u32, Charged<File>)>,
}

/// What the sink thread produced.
pub(crate) struct SinkOutput {
    /// sha256 of the tar, when hashed there.
    pub tar_digest: Option<[u8; 32]>,
    /// The gzip file, its sha256 and size.
    pub gz: Option<(File, [u8; 32], u64)>,
}

/// Handle on a running sink thread. Dropping it waits for the thread, so
/// no worker outlives the call that started it; drop the [`ChunkSender`]
/// first (it closes the channel the thread waits on).
pub(crate) struct Sink {
    join: Option<JoinHandle<io::Result<SinkOutput>>>,
}

impl Sink {
    /// Waits for the sink to drain and returns its output.
    pub(crate) fn join(mut self) -> io::Result<SinkOutput> {
        match self.join.take() {
            Some(handle) => handle
                .join()
                .unwrap_or_else(|_| Err(io::Error::other("canonical sink thread panicked"))),
            None => Err(io::Error::other("canonical sink already joined")),
        }
    }
}

impl Drop for Sink {
    fn drop(&mut self) {
        if let Some(handle) = self.join.take() {
            let _ = handle.join();
        }
    }
}

/// Sends canonical tar bytes to the sink thread in `CHUNK`-sized buffers,
/// reusing the buffers the sink hands back.
pub(crate) struct ChunkSender {
    tx: Option<SyncSender<Vec<u8>>>,
    recycled: Receiver<Vec<u8>>,
    buf: Vec<u8>,
}

impl ChunkSender {
    fn send_buf(&mut self) -> io::Result<()> {
        if self.buf.is_empty() {
            return Ok(());
        }
        let next = self
            .recycled
            .try_recv()
            .unwrap_or_else(|_| Vec::with_capacity(CHUNK));
        let full = std::mem::replace(&mut self.buf, next);
        let tx = self
            .tx
            .as_ref()
            .ok_or_else(|| io::Error::other("canonical sink already closed"))?;
        tx.send(full)
            .map_err(|_| io::Error::other("canonical sink stopped"))
    }

    /// Sends what is buffered and closes the channel.
    pub(crate) fn close(&mut self) -> io::Result<()> {
        self.send_buf()?;
        self.tx = None;
        Ok(())
    }
}

impl Write for ChunkSender {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let room = CHUNK - self.buf.len();
        let n = buf.len().min(room);
        self.buf.extend_from_slice(&buf[..n]);
        if self.buf.len() >= CHUNK {
            self.send_buf()?;
        }
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// Starts a sink thread for `job`.
pub(crate) fn spawn_sink(job: SinkJob) -> io::Result<(ChunkSender, Sink)> {
    let (tx, rx) = sync_channel::<Vec<u8>>(IN_FLIGHT);
    let (back_tx, back_rx) = sync_channel::<Vec<u8>>(IN_FLIGHT + 2);
    let join = std::thread::Builder::new()
        .name("bundle-sink".into())
        .spawn(move || -> io::Result<SinkOutput> {
            let mut hasher = job.hash.then(Sha256::new);
            let mut gz = job.gzip.map(|(level, file)| {
                gzip(
                    HashingWriter::new(BufWriter::with_capacity(CHUNK, file)),
                    level,
                )
            });
            for mut chunk in rx {
                if let Some(h) = hasher.as_mut() {
                    h.update(&chunk);
                }
                if let Some(g) = gz.as_mut() {
                    g.write_all(&chunk)?;
                }
                chunk.clear();
                // The main thread may be gone or have enough buffers.
                let _ = back_tx.try_send(chunk);
            }
            let gz = match gz {
                Some(g) => {
                    let (buffered, digest, bytes) = g.finish()?.finish();
                    let file = buffered
                        .into_inner()
                        .map_err(std::io::IntoInnerError::into_error)?;
                    Some((file.into_inner(), digest, bytes))
                }
                None => None,
            };
            Ok(SinkOutput {
                tar_digest: hasher.map(|h| h.finalize().into()),
                gz,
            })
        })?;
    Ok((
        ChunkSender {
            tx: Some(tx),
            recycled: back_rx,
            buf: Vec::with_capacity(CHUNK),
        },
        Sink { join: Some(join) },
    ))
}

/// Where the canonical tar bytes go: optionally hashed here, optionally
/// handed to a sink thread, optionally written to a local writer (the
/// gzip encoder of the caller's output).
pub(crate) struct TarTap<L> {
    hasher: Option<Sha256>,
    bytes: u64,
    chan: Option<ChunkSender>,
    local: Option<L>,
}

impl<L: Write> TarTap<L> {
    pub(crate) fn new(hash_here: bool, chan: Option<ChunkSender>, local: Option<L>) -> Self {
        Self {
            hasher: hash_here.then(Sha256::new),
            bytes: 0,
            chan,
            local,
        }
    }

    /// Flushes and closes everything; returns the local digest (if hashed
    /// here), the byte count and the local writer.
    pub(crate) fn finish(mut self) -> io::Result<(Option<[u8; 32]>, u64, Option<L>)> {
        if let Some(c) = self.chan.as_mut() {
            c.close()?;
        }
        // No flush of `local`: a gzip flush would emit a sync block and
        // change the bundle bytes.
        Ok((
            self.hasher.map(|h| h.finalize().into()),
            self.bytes,
            self.local,
        ))
    }
}

impl<L: Write> Write for TarTap<L> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        if let Some(l) = self.local.as_mut() {
            l.write_all(buf)?;
        }
        if let Some(c) = self.chan.as_mut() {
            c.write_all(buf)?;
        }
        if let Some(h) = self.hasher.as_mut() {
            h.update(buf);
        }
        self.bytes += buf.len() as u64;
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// Where a failed append went wrong: reading the content or writing the
/// archive. Callers classify the two differently.
#[derive(Debug)]
pub(crate) enum AppendError {
    /// Reading the entry's content failed or came up short.
    Read(io::Error),
    /// Writing the archive failed.
    Write(io::Error),
}

/// Writes the canonical tar.
pub(crate) struct CanonicalTar<W: Write> {
    builder: tar::Builder<W>,
    buf: Vec<u8>,
    entries: u64,
}

/// Builds the ustar header for `name` (with trailing `/` for directories),
/// plus the PAX path record when the name does not fit ustar.
fn header_for(name: &str, entry_type: tar::EntryType, mode: u32, size: u64) -> (tar::Header, bool) {
    let mut header = tar::Header::new_ustar();
    let needs_pax = header.set_path(name).is_err();
    if needs_pax {
        // Readers that ignore PAX see a truncated (but deterministic) name.
        let field = &mut header.as_old_mut().name;
        let mut cut = name.len().min(field.len());
        while !name.is_char_boundary(cut) {
            cut -= 1;
        }
        field.fill(0);
        field[..cut].copy_from_slice(&name.as_bytes()[..cut]);
    }
    header.set_entry_type(entry_type);
    header.set_mode(mode);
    header.set_uid(0);
    header.set_gid(0);
    header.set_mtime(0);
    header.set_size(size);
    header.set_cksum();
    (header, needs_pax)
}

/// Name of the PAX extended header. The tar crate's
/// `append_pax_extensions` leaves it empty, and busybox tar takes a header
/// with an empty name for an end-of-archive block (then fails on the
/// records); Python's fixed name is short and understood everywhere.
const PAX_HEADER_NAME: &str = "././@PaxHeader";

/// The PAX extended header and its one `path` record for `name`.
fn pax_path_header(name: &str) -> (tar::Header, Vec<u8>) {
    // A record is "<len> path=<name>\n" where <len> counts its own digits.
    let rest = " path=".len() + name.len() + 1;
    let mut len = rest + 1;
    while len != rest + len.to_string().len() {
        len = rest + len.to_string().len();
    }
    let mut records = format!("{len} path=").into_bytes();
    records.extend_from_slice(name.as_bytes());
    records.push(b'\n');
    let mut header = tar::Header::new_ustar();
    let fixed = header.set_path(PAX_HEADER_NAME);
    debug_assert!(fixed.is_ok(), "the PAX header name fits ustar");
    header.set_entry_type(tar::EntryType::XHeader);
    header.set_mode(0o644);
    header.set_uid(0);
    header.set_gid(0);
    header.set_mtime(0);
    header.set_size(records.len() as u64);
    header.set_cksum();
    (header, records)
}

impl<W: Write> CanonicalTar<W> {
    pub(crate) fn new(w: W) -> Self {
        Self {
            builder: tar::Builder::new(w),
            buf: vec![0u8; CHUNK],
            entries: 0,
        }
    }

    /// Entries written so far.
    pub(crate) fn entries(&self) -> u64 {
        self.entries
    }

    fn append_header(
        &mut self,
        name: &str,
        ty: tar::EntryType,
        mode: u32,
        size: u64,
    ) -> io::Result<()> {
        let (header, needs_pax) = header_for(name, ty, mode, size);
        if needs_pax {
            let (pax, records) = pax_path_header(name);
            self.builder.append(&pax, records.as_slice())?;
        }
        self.builder.get_mut().write_all(header.as_bytes())?;
        self.entries += 1;
        Ok(())
    }

    /// Appends a directory.
    pub(crate) fn append_dir(&mut self, path: &str) -> io::Result<()> {
        self.append_header(&format!("{path}/"), tar::EntryType::Directory, 0o755, 0)
    }

    /// Appends a regular file whose content (exactly `size` bytes) comes
    /// from `data`.
    pub(crate) fn append_file<R: Read>(
        &mut self,
        path: &str,
        size: u64,
        exec: bool,
        mut data: R,
    ) -> Result<(), AppendError> {
        let mode = if exec { 0o755 } else { 0o644 };
        self.append_header(path, tar::EntryType::Regular, mode, size)
            .map_err(AppendError::Write)?;
        let mut left = size;
        while left > 0 {
            let want = self
                .buf
                .len()
                .min(usize::try_from(left).unwrap_or(usize::MAX));
            let n = match data.read(&mut self.buf[..want]) {
                Ok(0) => {
                    return Err(AppendError::Read(io::Error::new(
                        io::ErrorKind::UnexpectedEof,
                        "content shorter than its declared size",
                    )))
                }
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(AppendError::Read(e)),
            };
            self.builder
                .get_mut()
                .write_all(&self.buf[..n])
                .map_err(AppendError::Write)?;
            left -= n as u64;
        }
        let pad = (512 - (size % 512)) % 512;
        if pad > 0 {
            let zeros = [0u8; 512];
            self.builder
                .get_mut()
                .write_all(&zeros[..pad as usize])
                .map_err(AppendError::Write)?;
        }
        Ok(())
    }

    /// Writes the end-of-archive marker and returns the writer.
    pub(crate) fn finish(self) -> io::Result<W> {
        self.builder.into_inner()
    }
}
