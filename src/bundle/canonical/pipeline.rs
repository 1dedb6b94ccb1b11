//! Where the canonical tar bytes go: cut into pieces (the unit of hashing
//! hand-off and of parallel compression), sent to the revision hasher, and
//! routed to the bundle writer according to what the bundle will be.
//!
//! The cut is a function of the canonical tar alone, so the bundle bytes
//! are too: a *chain* of pieces of at most [`PIECE`] bytes runs over
//! everything except the data of large files (at least one piece long);
//! each large file's data is a chain of its own. A piece is primed with the
//! piece before it in its chain. Because a large file's chain does not
//! depend on what precedes it, it can be compressed as soon as the file
//! arrives, before its place in the canonical order is known.
//!
//! While the upload may still be canonical (`Matching`), nothing is
//! compressed: the upload's own bytes are going to the writer, and the
//! first pieces are kept aside in case the comparison fails early, so that
//! compression can start from the beginning without re-reading anything.

use std::cell::RefCell;
use std::collections::HashSet;
use std::io::{self, Write};
use std::rc::Rc;
use std::sync::mpsc::SyncSender;

use super::compare::{Comparator, Side};
use super::engine::{Dest, Dispatch, Piece, PieceBuf};
use super::pgzip::PIECE;

/// Bytes of pieces kept aside while matching. Uploads that are not
/// canonical differ in their first header; one that differs only later
/// is rebuilt from the spool instead.
const RETAIN: usize = 4 * PIECE;

/// Upload bytes are handed to the writer in chunks of this size.
const RAW_CHUNK: usize = 256 * 1024;

/// The dispatcher, shared by the pipeline and the raw tap; closing it
/// (taking it out) lets the writer and workers wind down.
#[derive(Clone)]
pub(crate) struct Shared(Rc<RefCell<Option<Dispatch>>>);

impl Shared {
    pub(crate) fn new(d: Dispatch) -> Self {
        Self(Rc::new(RefCell::new(Some(d))))
    }

    /// Runs `f` on the dispatcher, if still open.
    pub(crate) fn with<T>(&self, f: impl FnOnce(&mut Dispatch) -> io::Result<T>) -> io::Result<T> {
        match self.0.borrow_mut().as_mut() {
            Some(d) => f(d),
            None => Err(io::Error::other("bundle dispatcher closed")),
        }
    }

    /// Closes the dispatcher for every holder.
    pub(crate) fn close(&self) {
        self.0.borrow_mut().take();
    }
}

/// Sends the upload's compressed bytes to the writer while it may be
/// stored as it is.
pub(crate) struct RawTap {
    dispatch: Option<Shared>,
    buf: Vec<u8>,
}

impl RawTap {
    pub(crate) fn new(dispatch: Shared) -> Self {
        Self {
            dispatch: Some(dispatch),
            buf: Vec::new(),
        }
    }

    /// Takes more upload bytes.
    pub(crate) fn feed(&mut self, bytes: &[u8]) -> io::Result<()> {
        let Some(d) = &self.dispatch else {
            return Ok(());
        };
        self.buf.extend_from_slice(bytes);
        if self.buf.len() >= RAW_CHUNK {
            let chunk = std::mem::take(&mut self.buf);
            d.with(|d| d.raw(chunk))?;
        }
        Ok(())
    }

    /// Sends what is buffered (the upload has ended).
    fn flush(&mut self) -> io::Result<()> {
        if let Some(d) = &self.dispatch {
            let chunk = std::mem::take(&mut self.buf);
            if !chunk.is_empty() {
                d.with(|d| d.raw(chunk))?;
            }
        }
        Ok(())
    }

    /// Stops for good: the upload will not be stored as it is.
    fn stop(&mut self) {
        self.dispatch = None;
        self.buf = Vec::new();
    }
}

/// What the bundle is, once the canonical stream has ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Bundle {
    /// No bundle is being written.
    None,
    /// The upload's own bytes.
    AsUploaded,
    /// The canonical gzip.
    Recompressed,
    /// The speculative bundle is unusable: emit again from the spool.
    Lost,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    /// No bundle: hash only.
    Off,
    /// The upload may be canonical; `retaining` while the pieces so far
    /// are kept aside.
    Matching { retaining: bool },
    /// Compressing the canonical tar.
    Deflating,
    /// Gave up on this stream's bundle.
    Lost,
}

/// Something for the writer, in canonical order.
enum Pending {
    Piece {
        data: Piece,
        prev: Option<Piece>,
        dest: Dest,
    },
    Copy(u64),
}

/// The large file being written.
#[derive(Clone, Copy)]
struct Big {
    key: u64,
    prepacked: bool,
}

/// Whether a file's data is a chain of its own.
pub(crate) fn is_big(size: u64) -> bool {
    size >= PIECE as u64
}

/// The canonical tar's destination (see the module docs).
pub(crate) struct Pipeline {
    hasher: Option<SyncSender<Piece>>,
    dispatch: Option<Shared>,
    mode: Mode,
    speculative: bool,
    compare: Option<Rc<RefCell<Comparator>>>,
    raw: Option<Rc<RefCell<RawTap>>>,
    cur: Vec<u8>,
    prev: Option<Piece>,
    big: Option<Big>,
    retained: Vec<Pending>,
    retained_bytes: usize,
    bytes: u64,
    packed: HashSet<u64>,
    dead: bool,
}

fn hasher_gone() -> io::Error {
    io::Error::other("revision hasher stopped")
}

impl Pipeline {
    fn new(hasher: SyncSender<Piece>, dispatch: Option<Shared>, mode: Mode) -> Self {
        Self {
            hasher: Some(hasher),
            dispatch,
            mode,
            speculative: false,
            compare: None,
            raw: None,
            cur: PieceBuf::empty(),
            prev: None,
            big: None,
            retained: Vec::new(),
            retained_bytes: 0,
            bytes: 0,
            packed: HashSet::new(),
            dead: false,
        }
    }

    /// Hashes only (no bundle).
    pub(crate) fn hash_only(hasher: SyncSender<Piece>) -> Self {
        Self::new(hasher, None, Mode::Off)
    }

    /// Compresses the canonical tar in order into a new bundle: starts it
    /// (discarding whatever the writer wrote before).
    pub(crate) fn deflating(hasher: SyncSender<Piece>, dispatch: Shared) -> io::Result<Self> {
        dispatch.with(|d| {
            d.restart()?;
            d.header()
        })?;
        Ok(Self::new(hasher, Some(dispatch), Mode::Deflating))
    }

    /// The speculative stream of an upload that may be canonical: the raw
    /// tap is sending the upload's bytes, `compare` watches the two
    /// streams. Large files are packed, so their compression survives if
    /// the speculation is abandoned.
    pub(crate) fn matching(
        hasher: SyncSender<Piece>,
        dispatch: Shared,
        compare: Rc<RefCell<Comparator>>,
        raw: Rc<RefCell<RawTap>>,
    ) -> Self {
        let mut p = Self::new(hasher, Some(dispatch), Mode::Matching { retaining: true });
        p.speculative = true;
        p.compare = Some(compare);
        p.raw = Some(raw);
        p
    }

    /// Canonical tar bytes written so far.
    pub(crate) fn bytes(&self) -> u64 {
        self.bytes
    }

    /// Whether this stream's bundle was given up (emit from the spool).
    pub(crate) fn lost(&self) -> bool {
        self.mode == Mode::Lost
    }

    /// Starts the data of a large file (see [`is_big`]) with key `key`;
    /// `prepacked` when its pieces are already in the packed spool.
    pub(crate) fn begin_big(&mut self, key: u64, prepacked: bool) -> io::Result<()> {
        if self.dead {
            return Ok(());
        }
        self.cut()?;
        self.prev = None;
        self.big = Some(Big { key, prepacked });
        Ok(())
    }

    /// Ends the data of the large file.
    pub(crate) fn end_big(&mut self) -> io::Result<()> {
        if self.dead {
            return Ok(());
        }
        self.cut()?;
        self.prev = None;
        if let Some(b) = self.big.take() {
            if b.prepacked || self.speculative {
                self.route(Pending::Copy(b.key))?;
            }
        }
        Ok(())
    }

    /// Stops this stream for good (speculation abandoned): later writes
    /// are ignored, its hasher ends, nothing more reaches the writer.
    /// Returns the large files packed so far.
    pub(crate) fn abandon(&mut self) -> HashSet<u64> {
        self.dead = true;
        self.hasher = None;
        self.stop_raw();
        self.retained.clear();
        self.mode = Mode::Lost;
        std::mem::take(&mut self.packed)
    }

    /// Ends the stream (after the tar's end marker): flushes the last
    /// piece, closes the hasher, and settles what the bundle is.
    pub(crate) fn finish(&mut self) -> io::Result<Bundle> {
        self.cut()?;
        self.hasher = None;
        self.dead = true;
        if let Mode::Matching { .. } = self.mode {
            let identical = self
                .compare
                .as_ref()
                .is_some_and(|c| c.borrow().identical());
            if identical {
                if let Some(raw) = &self.raw {
                    raw.borrow_mut().flush()?;
                }
                self.stop_raw();
                return Ok(Bundle::AsUploaded);
            }
            self.mismatch()?;
        }
        match self.mode {
            Mode::Off => Ok(Bundle::None),
            Mode::Lost | Mode::Matching { .. } => Ok(Bundle::Lost),
            Mode::Deflating => {
                self.dispatch()?.with(super::engine::Dispatch::trailer)?;
                Ok(Bundle::Recompressed)
            }
        }
    }

    fn dispatch(&self) -> io::Result<&Shared> {
        self.dispatch
            .as_ref()
            .ok_or_else(|| io::Error::other("no bundle is being written"))
    }

    fn stop_raw(&mut self) {
        self.compare = None;
        if let Some(raw) = self.raw.take() {
            raw.borrow_mut().stop();
        }
    }

    /// The streams differ: compress from the start if the pieces are still
    /// at hand, else give the bundle up.
    fn mismatch(&mut self) -> io::Result<()> {
        self.stop_raw();
        match self.mode {
            Mode::Matching { retaining: true } => {
                self.dispatch()?.with(|d| {
                    d.restart()?;
                    d.header()
                })?;
                self.mode = Mode::Deflating;
                for p in std::mem::take(&mut self.retained) {
                    self.submit(p)?;
                }
            }
            Mode::Matching { retaining: false } => self.mode = Mode::Lost,
            _ => {}
        }
        Ok(())
    }

    fn cut(&mut self) -> io::Result<()> {
        if self.cur.is_empty() {
            return Ok(());
        }
        let piece = PieceBuf::share(std::mem::replace(&mut self.cur, PieceBuf::empty()));
        if let Some(h) = &self.hasher {
            h.send(piece.clone()).map_err(|_| hasher_gone())?;
        }
        let prev = self.prev.replace(piece.clone());
        let dest = match self.big {
            Some(Big {
                prepacked: true, ..
            }) => return Ok(()),
            Some(Big { key, .. }) if self.speculative => Dest::Pack(key),
            _ => Dest::Out,
        };
        self.route(Pending::Piece {
            data: piece,
            prev,
            dest,
        })
    }

    fn route(&mut self, p: Pending) -> io::Result<()> {
        match self.mode {
            Mode::Deflating => self.submit(p),
            Mode::Matching { retaining: true } => {
                let len = match &p {
                    Pending::Piece { data, .. } => data.len(),
                    Pending::Copy(_) => 0,
                };
                if self.retained_bytes + len > RETAIN {
                    self.retained.clear();
                    self.mode = Mode::Matching { retaining: false };
                } else {
                    self.retained_bytes += len;
                    self.retained.push(p);
                }
                Ok(())
            }
            Mode::Matching { retaining: false } | Mode::Off | Mode::Lost => Ok(()),
        }
    }

    fn submit(&mut self, p: Pending) -> io::Result<()> {
        let d = self.dispatch()?.clone();
        match p {
            Pending::Piece { data, prev, dest } => d.with(|d| d.piece(data, prev, dest)),
            Pending::Copy(key) => {
                d.with(|d| d.copy(key))?;
                self.packed.insert(key);
                Ok(())
            }
        }
    }
}

impl Write for Pipeline {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        if self.dead {
            return Ok(buf.len());
        }
        self.bytes += buf.len() as u64;
        if let Some(c) = &self.compare {
            let same = c.borrow_mut().feed(Side::Canonical, buf);
            if !same {
                self.mismatch()?;
            }
        }
        let mut rest = buf;
        while !rest.is_empty() {
            let n = rest.len().min(PIECE - self.cur.len());
            self.cur.extend_from_slice(&rest[..n]);
            rest = &rest[n..];
            if self.cur.len() == PIECE {
                self.cut()?;
            }
        }
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}
