//! A connection's socket that sends buffers living in mapped blob files
//! (cached bundles, see [`crate::zerocopy`]) with `sendfile(2)` and
//! everything else with ordinary writes.
//!
//! hyper writes a response body's `Bytes` as they are (vectored writes
//! point into them), so a cached bundle reaches this wrapper as a slice of
//! its mapping, and the kernel can take the page cache's pages instead of
//! a copy.

use std::io::{self, IoSlice};
use std::pin::Pin;
use std::task::{ready, Context, Poll};

use prometheus_client::metrics::counter::Counter;
use socket2::SockRef;
use tokio::io::{AsyncRead, AsyncWrite, Interest, ReadBuf};
use tokio::net::TcpStream;

use crate::zerocopy::{self, FileSlice};

/// Most bytes one `sendfile(2)` call moves (the kernel's own cap).
const MAX_SENDFILE: usize = 0x7fff_f000;

/// Most *unsent* bytes the kernel queues on a connection before a send
/// stops and the socket reads as not writable (`TCP_NOTSENT_LOWAT`; bytes
/// in flight do not count, so the window is not limited). By default a
/// long body fills the whole send buffer (megabytes) with queued page
/// references that go cold before they are sent; a short queue keeps them
/// in the caches. On loopback (`benches/download.sh`) it took 8 and 32
/// concurrent downloads of a cached bundle from about nginx's rate to
/// 1.3–1.6 times it; 16 and 32 KiB measured alike, 128 KiB and up less.
/// Small answers never queue this much, so they are not affected.
const NOTSENT_LOWAT: u32 = 32 * 1024;

/// A TCP stream whose writes of mapped-blob buffers go by `sendfile(2)`.
#[derive(Debug)]
pub(super) struct SendfileStream {
    stream: TcpStream,
    /// Bytes sent by `sendfile(2)`.
    sent: Counter,
}

impl SendfileStream {
    /// Wraps `stream`, counting the bytes sent from blob files on `sent`,
    /// and limits its unsent queue to [`NOTSENT_LOWAT`].
    pub(super) fn new(stream: TcpStream, sent: Counter) -> Self {
        if let Err(error) = SockRef::from(&stream).set_tcp_notsent_lowat(NOTSENT_LOWAT) {
            // Only slower, never wrong.
            tracing::debug!(%error, "TCP_NOTSENT_LOWAT not set");
        }
        Self { stream, sent }
    }

    /// Sends up to `len` bytes of `from`, as one `sendfile(2)` once the
    /// socket is writable; like a write, it may send fewer.
    fn poll_sendfile(
        &self,
        cx: &mut Context<'_>,
        from: &FileSlice,
        len: usize,
    ) -> Poll<io::Result<usize>> {
        let len = len.min(MAX_SENDFILE);
        loop {
            ready!(self.stream.poll_write_ready(cx))?;
            let mut offset = from.offset;
            let sent = self.stream.try_io(Interest::WRITABLE, || {
                rustix::fs::sendfile(&self.stream, &*from.file, Some(&mut offset), len)
                    .map_err(io::Error::from)
            });
            match sent {
                Ok(n) => {
                    self.sent.inc_by(n as u64);
                    return Poll::Ready(Ok(n));
                }
                // Readiness was stale; `try_io` cleared it: wait again.
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
                Err(e) => return Poll::Ready(Err(e)),
            }
        }
    }
}

impl AsyncRead for SendfileStream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().stream).poll_read(cx, buf)
    }
}

impl AsyncWrite for SendfileStream {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        match zerocopy::source(buf) {
            Some(from) => this.poll_sendfile(cx, &from, buf.len()),
            None => Pin::new(&mut this.stream).poll_write(cx, buf),
        }
    }

    /// Sends the first buffer by `sendfile(2)` when it lives in a blob mapping,
    /// else writes the buffers up to the first that does, in one call; the
    /// caller comes back for the rest, as after any short write.
    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let bufs = match bufs.iter().position(|b| !b.is_empty()) {
            Some(first) => &bufs[first..],
            None => return Poll::Ready(Ok(0)),
        };
        if let Some(from) = zerocopy::source(&bufs[0]) {
            return this.poll_sendfile(cx, &from, bufs[0].len());
        }
        let plain = bufs
            .iter()
            .position(|b| zerocopy::source(b).is_some())
            .unwrap_or(bufs.len());
        Pin::new(&mut this.stream).poll_write_vectored(cx, &bufs[..plain])
    }

    fn is_write_vectored(&self) -> bool {
        // hyper queues body buffers (rather than copying them into its own
        // buffer) only for a transport that writes vectors.
        true
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().stream).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().stream).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    use tokio::net::TcpListener;

    /// A connected pair: the wrapped server side and the client side.
    async fn pair() -> (SendfileStream, TcpStream, Counter) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let client = TcpStream::connect(listener.local_addr().unwrap());
        let (client, accepted) = tokio::join!(client, listener.accept());
        let sent = Counter::default();
        let server = SendfileStream::new(accepted.unwrap().0, sent.clone());
        (server, client.unwrap(), sent)
    }

    fn pattern(len: usize) -> Vec<u8> {
        (0..len).map(|i| (i * 7 % 253) as u8).collect()
    }

    #[tokio::test]
    async fn mapped_blob_buffers_go_by_sendfile_and_arrive_whole_in_order() {
        let (mut server, mut client, sent) = pair().await;
        let data = pattern(8 << 20);
        let blob = zerocopy::load_test_blob(&data);
        let body = blob.slice(100..(8 << 20) - 100);
        let expected_len = 5 + body.len() + 8;
        let reader = tokio::spawn(async move {
            let mut got = Vec::new();
            // A slow start, so the socket buffer fills and sends come short.
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
            let mut chunk = vec![0u8; 64 * 1024];
            while got.len() < expected_len {
                let n = client.read(&mut chunk).await.unwrap();
                assert!(n > 0, "closed after {} bytes", got.len());
                got.extend_from_slice(&chunk[..n]);
            }
            got
        });
        // What hyper does: a vectored write of headers and body, repeated
        // past short writes, then the plain trailer by `write`.
        let mut parts = [&b"head:"[..], &body[..]];
        let mut total = 0;
        while parts.iter().any(|p| !p.is_empty()) {
            let slices = [IoSlice::new(parts[0]), IoSlice::new(parts[1])];
            let mut n = server.write_vectored(&slices).await.unwrap();
            total += n;
            for part in &mut parts {
                let k = n.min(part.len());
                *part = &part[k..];
                n -= k;
            }
        }
        server.write_all(b":trailer").await.unwrap();
        assert_eq!(total, 5 + body.len());
        let got = reader.await.unwrap();
        assert_eq!(&got[..5], b"head:");
        assert_eq!(&got[5..5 + body.len()], &data[100..(8 << 20) - 100]);
        assert_eq!(&got[5 + body.len()..], b":trailer");
        // Every body byte, and nothing else, went by sendfile.
        assert_eq!(sent.get(), body.len() as u64);
    }

    #[tokio::test]
    async fn a_wrapped_socket_queues_little_unsent_data() {
        let (server, _client, _) = pair().await;
        let lowat = SockRef::from(&server.stream).tcp_notsent_lowat().unwrap();
        assert_eq!(lowat, NOTSENT_LOWAT);
    }

    #[tokio::test]
    async fn ordinary_buffers_are_written() {
        let (mut server, mut client, sent) = pair().await;
        let data = pattern(300_000);
        // More than the unsent queue holds: the client reads meanwhile.
        let reader = tokio::spawn(async move {
            let mut got = Vec::new();
            client.read_to_end(&mut got).await.unwrap();
            got
        });
        server.write_all(&data).await.unwrap();
        let wrote = server
            .write_vectored(&[IoSlice::new(b""), IoSlice::new(b"!")])
            .await
            .unwrap();
        assert_eq!(wrote, 1);
        server.shutdown().await.unwrap();
        let got = reader.await.unwrap();
        assert_eq!(&got[..data.len()], &data[..]);
        assert_eq!(&got[data.len()..], b"!");
        assert_eq!(sent.get(), 0);
    }
}
