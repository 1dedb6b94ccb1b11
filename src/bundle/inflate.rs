//! Gzip inflation on a helper thread, so that inflating and parsing an
//! upload share the machine's cores instead of taking turns.
//!
//! The input is still read on the caller's thread: its counter, its tap and
//! its errors stay where they were, and the helper only ever sees bytes
//! already in memory. So the helper ends as soon as the caller drops its
//! side, whatever the input (a stalled HTTP body, say) is doing.
//!
//! The two sides trade messages over bounded channels: the caller sends
//! compressed chunks ([`DEPTH`] to start with, then one for each the helper
//! takes) and the helper sends inflated chunks back, at most [`AHEAD`]
//! ahead of the caller. So a bomb never runs more than that far ahead of
//! the limits the caller enforces on what it reads, and an input error
//! surfaces exactly where a decoder reading in line would have hit it:
//! once the bytes read before it are used up.

use std::io::{self, BufRead, Read};
use std::sync::mpsc::{channel, sync_channel, Receiver, Sender, SyncSender};
use std::thread::Scope;

use flate2::bufread::GzDecoder;

use super::affinity::Helper;
use super::counters::{untrap, Trap};
use super::error::BundleError;
use super::threads::{spawn, Joined};

/// Compressed bytes per chunk sent to the helper: each is one read of the
/// input, which for an upload is a hop into the async runtime, so not small.
const IN_CHUNK: usize = 256 * 1024;
/// Inflated bytes per chunk sent back.
const OUT_CHUNK: usize = 256 * 1024;
/// Compressed chunks queued for the helper.
const DEPTH: usize = 2;
/// Messages (mostly inflated chunks) the helper may queue ahead of the
/// caller.
const AHEAD: usize = 4;

/// A buffer and how much of it holds data. Buffers travel back and forth
/// at their full length, so a reused one is never zeroed again (that was a
/// pass over every inflated byte).
#[derive(Default)]
struct Filled {
    buf: Vec<u8>,
    len: usize,
}

impl Filled {
    fn data(&self) -> &[u8] {
        &self.buf[..self.len]
    }

    /// The buffer of a spent chunk, or a fresh one (`vec!` asks for zeroed
    /// memory, which fresh pages already are: no pass over them).
    fn reuse(spent: Option<Vec<u8>>, size: usize) -> Vec<u8> {
        match spent {
            Some(buf) if buf.len() == size => buf,
            _ => vec![0u8; size],
        }
    }
}

/// From the caller to the helper. A closed channel is the end of input.
enum In {
    /// Compressed bytes (never empty).
    Chunk(Filled),
    /// Reading the input failed; nothing follows.
    Failed,
}

/// From the helper to the caller, in stream order.
enum Out {
    /// Inflated bytes.
    Data(Filled),
    /// The helper took a compressed chunk: send another. Carries the
    /// previous chunk's buffer, for reuse.
    Want(Vec<u8>),
    /// The decoder failed (or ran into the input's failure); nothing
    /// follows.
    Failed(io::Error),
    /// The gzip member ended; nothing follows.
    End {
        /// Compressed chunks the helper took.
        took: usize,
        /// Whether bytes of the last chunk taken follow the member.
        leftover: bool,
    },
}

/// The caller's side: reads as the inflated stream.
pub(crate) struct ParallelGz<'scope, R> {
    /// The helper thread, for [`ParallelGz::helper`].
    helper: Helper,
    input: R,
    /// `None` once the end of input (or its failure) was sent.
    to_helper: Option<SyncSender<In>>,
    from_helper: Receiver<Out>,
    /// Spent inflated buffers, back to the helper.
    free: Sender<Vec<u8>>,
    cur: Filled,
    pos: usize,
    /// Compressed chunks read from the input (all of them non-empty).
    read: usize,
    /// The input's error, for when the helper runs into it.
    input_failed: Option<io::Error>,
    /// Once the member ended: whether input bytes follow it.
    trailing: Option<bool>,
    /// Last: joined once the channels above are closed, which ends it.
    _thread: Joined<'scope, ()>,
}

impl<'scope, R: Read> ParallelGz<'scope, R> {
    /// Starts the helper thread in `s` and sends it the first chunks of
    /// `input`, the gzip stream.
    pub(crate) fn start(s: &'scope Scope<'scope, '_>, input: R) -> io::Result<Self> {
        let (to_helper, chunks) = sync_channel::<In>(DEPTH);
        let (out, from_helper) = sync_channel::<Out>(AHEAD);
        let (free, spare) = channel::<Vec<u8>>();
        let helper = Helper::default();
        let registered = helper.clone();
        let thread = spawn(s, "bundle-inflate", move || {
            let _registered = registered.register();
            inflate(chunks, out, spare);
        })?;
        let mut gz = Self {
            helper,
            input,
            to_helper: Some(to_helper),
            from_helper,
            free,
            cur: Filled::default(),
            pos: 0,
            read: 0,
            input_failed: None,
            trailing: None,
            _thread: thread,
        };
        for _ in 0..DEPTH {
            gz.feed(None);
        }
        Ok(gz)
    }

    /// The helper thread (to keep it off the caller's CPU, see
    /// [`Helper::keep_off_my_cpu`]).
    pub(crate) fn helper(&self) -> Helper {
        self.helper.clone()
    }

    /// After the inflated stream ended: checks that nothing follows the
    /// gzip member in the input, and returns the input.
    pub(crate) fn finish(mut self, trap: &Trap) -> Result<R, BundleError> {
        if self.trailing != Some(false) {
            return Err(BundleError::TrailingGarbage);
        }
        if let Some(e) = self.input_failed.take() {
            return Err(untrap(trap, e));
        }
        if self.to_helper.is_some() {
            match self.input.by_ref().take(1).read_to_end(&mut Vec::new()) {
                Ok(0) => {}
                Ok(_) => return Err(BundleError::TrailingGarbage),
                Err(e) => return Err(untrap(trap, e)),
            }
        }
        Ok(self.input)
    }

    /// Sends the helper the next chunk of input (in `spent`'s buffer, if
    /// any), or the end of input, or its failure.
    fn feed(&mut self, spent: Option<Vec<u8>>) {
        let Some(tx) = &self.to_helper else {
            return;
        };
        let mut buf = Filled::reuse(spent, IN_CHUNK);
        let read = loop {
            match self.input.read(&mut buf) {
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                other => break other,
            }
        };
        let msg = match read {
            // Closing the channel is the end of input for the helper.
            Ok(0) => {
                self.to_helper = None;
                return;
            }
            Ok(n) => {
                self.read += 1;
                In::Chunk(Filled { buf, len: n })
            }
            Err(e) => {
                self.input_failed = Some(e);
                In::Failed
            }
        };
        let last = matches!(msg, In::Failed);
        // A send fails once the helper is done: the member ended before
        // these bytes (counted as read, so trailing), or the decoder
        // failed, which it reports next.
        if tx.send(msg).is_err() || last {
            self.to_helper = None;
        }
    }
}

impl<R: Read> Read for ParallelGz<'_, R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        loop {
            let cur = self.cur.data();
            if self.pos < cur.len() {
                let n = buf.len().min(cur.len() - self.pos);
                buf[..n].copy_from_slice(&cur[self.pos..self.pos + n]);
                self.pos += n;
                return Ok(n);
            }
            if self.trailing.is_some() || buf.is_empty() {
                return Ok(0);
            }
            // After `Failed` the helper is gone, so a further read ends in
            // `Err` here rather than waiting.
            match self.from_helper.recv() {
                Ok(Out::Data(data)) => {
                    let spent = std::mem::replace(&mut self.cur, data);
                    // The helper may be gone already; the buffer is then
                    // simply dropped.
                    let _ = self.free.send(spent.buf);
                    self.pos = 0;
                }
                Ok(Out::Want(spent)) => self.feed(Some(spent)),
                Ok(Out::Failed(e)) => return Err(self.input_failed.take().unwrap_or(e)),
                // Every `Want` before `End` was answered: `read` is final.
                Ok(Out::End { took, leftover }) => {
                    self.trailing = Some(leftover || took < self.read);
                }
                Err(_) => return Err(helper_gone()),
            }
        }
    }
}

fn helper_gone() -> io::Error {
    io::Error::other("the inflate thread stopped")
}

/// The helper's input: compressed chunks as they arrive.
struct Chunks {
    rx: Receiver<In>,
    out: SyncSender<Out>,
    cur: Filled,
    pos: usize,
    took: usize,
    ended: bool,
}

impl Read for Chunks {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let avail = self.fill_buf()?;
        let n = avail.len().min(buf.len());
        buf[..n].copy_from_slice(&avail[..n]);
        self.consume(n);
        Ok(n)
    }
}

impl BufRead for Chunks {
    fn fill_buf(&mut self) -> io::Result<&[u8]> {
        if self.pos == self.cur.len && !self.ended {
            match self.rx.recv() {
                Ok(In::Chunk(chunk)) => {
                    let spent = std::mem::replace(&mut self.cur, chunk);
                    self.pos = 0;
                    self.took += 1;
                    if self.out.send(Out::Want(spent.buf)).is_err() {
                        return Err(helper_gone());
                    }
                }
                // The caller holds the real error and reports it instead.
                Ok(In::Failed) => return Err(io::Error::other("the input failed")),
                Err(_) => self.ended = true,
            }
        }
        Ok(&self.cur.data()[self.pos..])
    }

    fn consume(&mut self, amt: usize) {
        self.pos = (self.pos + amt).min(self.cur.len);
    }
}

/// The helper thread: inflates until the member ends, the decoder fails,
/// or the caller goes away.
fn inflate(chunks: Receiver<In>, out: SyncSender<Out>, spare: Receiver<Vec<u8>>) {
    let src = Chunks {
        rx: chunks,
        out: out.clone(),
        cur: Filled::default(),
        pos: 0,
        took: 0,
        ended: false,
    };
    let mut gz = GzDecoder::new(src);
    loop {
        let mut buf = Filled::reuse(spare.try_recv().ok(), OUT_CHUNK);
        let mut n = 0;
        let mut failure = None;
        while n < buf.len() {
            match gz.read(&mut buf[n..]) {
                Ok(0) => break,
                Ok(k) => n += k,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => {
                    failure = Some(e);
                    break;
                }
            }
        }
        let full = n == buf.len();
        if n > 0 && out.send(Out::Data(Filled { buf, len: n })).is_err() {
            return;
        }
        let last = match failure {
            Some(e) => Out::Failed(e),
            None if full => continue,
            None => {
                let src = gz.get_ref();
                Out::End {
                    took: src.took,
                    leftover: src.pos < src.cur.len,
                }
            }
        };
        let _ = out.send(last);
        return;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use flate2::write::GzEncoder;
    use flate2::Compression;
    use std::io::Write;

    fn gzip(data: &[u8]) -> Vec<u8> {
        let mut e = GzEncoder::new(Vec::new(), Compression::fast());
        e.write_all(data).unwrap();
        e.finish().unwrap()
    }

    /// The inflated stream, and (when it ended) what `finish` said: the
    /// input bytes left, or the error's code.
    fn inflate_all(input: &[u8]) -> (io::Result<Vec<u8>>, Option<Result<usize, &'static str>>) {
        std::thread::scope(|s| {
            let mut gz = ParallelGz::start(s, input).unwrap();
            let mut out = Vec::new();
            let res = gz.read_to_end(&mut out).map(|_| out);
            let fin = res.is_ok().then(|| {
                gz.finish(&Trap::default())
                    .map(<[u8]>::len)
                    .map_err(|e| e.code())
            });
            (res, fin)
        })
    }

    #[test]
    fn inflates_what_a_decoder_in_line_would() {
        for len in [0, 1, IN_CHUNK, OUT_CHUNK, 3 * OUT_CHUNK + 7, 5 << 20] {
            let mut data = crate::bundle::noise(len / 2);
            data.extend(std::iter::repeat_n(b'x', len - len / 2));
            let (out, fin) = inflate_all(&gzip(&data));
            assert_eq!(out.unwrap(), data, "length {len}");
            assert_eq!(fin, Some(Ok(0)), "length {len}");
        }
    }

    #[test]
    fn bytes_after_the_member_are_trailing() {
        for extra in [1, IN_CHUNK, 3 * IN_CHUNK + 1] {
            let mut input = gzip(&crate::bundle::noise(200_000));
            input.extend(std::iter::repeat_n(7u8, extra));
            let (out, fin) = inflate_all(&input);
            assert_eq!(out.unwrap().len(), 200_000);
            assert_eq!(fin, Some(Err("trailing_garbage")), "{extra} trailing bytes");
        }
    }

    #[test]
    fn a_cut_member_is_unexpected_eof_and_corruption_is_an_error() {
        let input = gzip(&crate::bundle::noise(300_000));
        let (out, _) = inflate_all(&input[..input.len() - 10]);
        assert_eq!(out.unwrap_err().kind(), io::ErrorKind::UnexpectedEof);
        let mut bad = input.clone();
        bad[20] ^= 0xff;
        bad[21] ^= 0xff;
        let (out, _) = inflate_all(&bad);
        assert!(out.is_err());
    }

    /// An input that fails after `ok` bytes.
    struct Failing<'a> {
        data: &'a [u8],
        ok: usize,
    }

    impl Read for Failing<'_> {
        fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
            if self.ok == 0 {
                return Err(io::Error::other("input broke"));
            }
            let n = buf.len().min(self.ok).min(self.data.len());
            buf[..n].copy_from_slice(&self.data[..n]);
            self.data = &self.data[n..];
            self.ok -= n;
            Ok(n)
        }
    }

    #[test]
    fn an_input_error_surfaces_after_the_bytes_read_before_it() {
        let data = crate::bundle::noise(1 << 20);
        let input = gzip(&data);
        let ok = input.len() / 2;
        std::thread::scope(|s| {
            let mut gz = ParallelGz::start(s, Failing { data: &input, ok }).unwrap();
            let mut out = Vec::new();
            let err = gz.read_to_end(&mut out).unwrap_err();
            assert_eq!(err.to_string(), "input broke");
            // Everything inflatable from the bytes before the failure
            // came out first.
            assert!(out.len() > data.len() / 3, "{} bytes", out.len());
            assert_eq!(out[..], data[..out.len()]);
        });
    }

    /// Counts what is read through it.
    struct Counted<R> {
        inner: R,
        read: usize,
    }

    impl<R: Read> Read for Counted<R> {
        fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
            let n = self.inner.read(buf)?;
            self.read += n;
            Ok(n)
        }
    }

    #[test]
    fn reads_a_bounded_amount_ahead_of_the_reader() {
        // An endless gzip stream of zeros: a reader in line would read a
        // chunk or two of it; the helper may hold only a few more.
        let endless = flate2::read::GzEncoder::new(io::repeat(0), Compression::fast());
        std::thread::scope(|s| {
            let mut gz = ParallelGz::start(
                s,
                Counted {
                    inner: endless,
                    read: 0,
                },
            )
            .unwrap();
            let mut buf = vec![0u8; 1 << 20];
            gz.read_exact(&mut buf).unwrap();
            assert!(buf.iter().all(|b| *b == 0));
            std::thread::sleep(std::time::Duration::from_millis(50));
            assert!(
                gz.input.read <= (DEPTH + 2) * IN_CHUNK,
                "{} compressed bytes read for 1 MiB",
                gz.input.read
            );
            // Dropping the reader ends the helper (else the scope hangs).
            drop(gz);
        });
    }
}
