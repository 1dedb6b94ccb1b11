//! Whether the upload's inflated stream *is* the canonical tar, byte for
//! byte: then the upload's own gzip bytes are stored as the bundle and
//! nothing is recompressed.
//!
//! Both streams are produced on the calling thread, a little out of step:
//! the input runs ahead by the decoder's read-ahead, the canonical stream
//! runs ahead by the padding it writes before the walker reads the
//! input's. Whichever side is ahead queues its bytes; the other side
//! compares against the queue. The queue is capped: a stream that drifts
//! further apart than that is simply "not canonical", which is always safe
//! (the bundle is then built as usual).

/// Bytes one side may run ahead of the other before the comparison gives
/// up (a few read-ahead buffers).
const MAX_AHEAD: usize = 4 * 256 * 1024;

/// Which stream a chunk of bytes belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Side {
    /// The upload, inflated.
    Input,
    /// The canonical tar.
    Canonical,
}

/// Compares two byte streams fed in interleaved chunks.
#[derive(Debug)]
pub(crate) struct Comparator {
    queue: Vec<u8>,
    start: usize,
    ahead: Side,
    totals: [u64; 2],
    differs: bool,
}

impl Default for Comparator {
    fn default() -> Self {
        Self {
            queue: Vec::new(),
            start: 0,
            ahead: Side::Input,
            totals: [0, 0],
            differs: false,
        }
    }
}

impl Comparator {
    /// Feeds `bytes` of `side`; returns whether the streams still agree.
    pub(crate) fn feed(&mut self, side: Side, mut bytes: &[u8]) -> bool {
        if self.differs {
            return false;
        }
        self.totals[side as usize] += bytes.len() as u64;
        let queued = self.queue.len() - self.start;
        if queued > 0 && self.ahead != side {
            let n = queued.min(bytes.len());
            if self.queue[self.start..self.start + n] != bytes[..n] {
                return self.give_up();
            }
            self.start += n;
            bytes = &bytes[n..];
            if self.start == self.queue.len() {
                self.queue.clear();
                self.start = 0;
            }
        }
        if !bytes.is_empty() {
            if self.start == self.queue.len() {
                self.queue.clear();
                self.start = 0;
                self.ahead = side;
            }
            if self.queue.len() - self.start + bytes.len() > MAX_AHEAD {
                return self.give_up();
            }
            if self.start > 0 && self.start >= self.queue.len() / 2 {
                self.queue.drain(..self.start);
                self.start = 0;
            }
            self.queue.extend_from_slice(bytes);
        }
        true
    }

    fn give_up(&mut self) -> bool {
        self.differs = true;
        self.queue = Vec::new();
        self.start = 0;
        false
    }

    /// After both streams ended: whether they were identical.
    pub(crate) fn identical(&self) -> bool {
        !self.differs && self.queue.len() == self.start && self.totals[0] == self.totals[1]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn identical_streams_in_any_interleaving() {
        let data: Vec<u8> = (0..10_000u32).map(|i| (i * 7 % 251) as u8).collect();
        let mut c = Comparator::default();
        let (mut i, mut o) = (0, 0);
        let steps = [700, 3, 1200, 512, 1, 4096];
        let mut k = 0;
        while i < data.len() || o < data.len() {
            let n = steps[k % steps.len()];
            if k % 2 == 0 && i < data.len() {
                let e = (i + n).min(data.len());
                assert!(c.feed(Side::Input, &data[i..e]));
                i = e;
            } else if o < data.len() {
                let e = (o + n).min(data.len());
                assert!(c.feed(Side::Canonical, &data[o..e]));
                o = e;
            }
            k += 1;
        }
        assert!(c.identical());
    }

    #[test]
    fn a_difference_a_length_or_a_drift_is_not_identical() {
        let mut c = Comparator::default();
        assert!(c.feed(Side::Input, b"abcdef"));
        assert!(!c.feed(Side::Canonical, b"abcdeX"));
        assert!(!c.identical());

        let mut c = Comparator::default();
        assert!(c.feed(Side::Input, b"abc"));
        assert!(c.feed(Side::Canonical, b"ab"));
        assert!(!c.identical(), "the canonical stream is shorter");

        let mut c = Comparator::default();
        let big = vec![0u8; MAX_AHEAD + 1];
        assert!(!c.feed(Side::Canonical, &big));
        assert!(!c.identical());
    }
}
