//! Reclaiming idle connections when the connection budget runs short, as
//! nginx does (`ngx_drain_connections`).
//!
//! Every connection is registered with its state: *never sent* (no byte
//! since it was accepted), *busy* (reading a request or answering one) or
//! *keep-alive* (answered, waiting for its next request), and the time it
//! last became idle. When the live connections reach 7/8 of the budget,
//! the idle ones are closed, oldest first, down to 3/4: keep-alive ones
//! whatever their age, never-sent ones only after [`NEVER_SENT_GRACE`], so
//! that a slow client's first bytes are not cut. When `accept` fails for
//! want of descriptors, an eighth of the budget is drained the same way.
//!
//! Closing is hyper's graceful shutdown of the connection, which closes a
//! connection that is idle and lets a request in flight finish: a
//! connection that turned busy after it was picked is never cut.

use std::collections::HashMap;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, AtomicU8, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::sync::Notify;

use crate::metrics::Metrics;

/// How long a connection that has sent nothing is spared: a client's
/// first bytes may be on their way.
pub(super) const NEVER_SENT_GRACE: Duration = Duration::from_secs(1);

const NEVER_SENT: u8 = 0;
const BUSY: u8 = 1;
const KEEP_ALIVE: u8 = 2;

/// Labels of connections closed to make room.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct IdleLabels {
    /// `never_sent` or `keep_alive`.
    pub(super) state: &'static str,
}

/// The counter of connections closed to make room, by their state.
#[derive(Clone)]
pub(super) struct DrainMetrics {
    closed: Family<IdleLabels, Counter>,
}

impl DrainMetrics {
    /// Registers `http_connections_closed_idle_total{state}` on `metrics`;
    /// once per process.
    pub(super) fn register(metrics: &Metrics) -> Self {
        let closed = Family::<IdleLabels, Counter>::default();
        // Both series from the start, so that `rate()` sees 0.
        for state in ["never_sent", "keep_alive"] {
            let _ = closed.get_or_create(&IdleLabels { state });
        }
        metrics.with_registry(|r| {
            r.register(
                "http_connections_closed_idle",
                "Idle client connections closed to make room for new ones, by state",
                closed.clone(),
            );
        });
        Self { closed }
    }
}

/// The registry of one listener's connections.
pub(super) struct Drainer {
    connections: Mutex<HashMap<u64, Entry>>,
    next_id: AtomicU64,
    /// Connections picked and not yet gone.
    closing: AtomicUsize,
    epoch: Instant,
    budget: usize,
    grace: Duration,
    metrics: DrainMetrics,
}

struct Entry {
    conn: Arc<ConnState>,
    closing: bool,
}

/// One connection's state, shared by its socket, its service and the
/// registry.
pub(super) struct ConnState {
    phase: AtomicU8,
    /// Requests being answered (more than one only when pipelined).
    in_flight: AtomicUsize,
    /// When it last became idle, in milliseconds since the registry's epoch.
    idle_since: AtomicU64,
    epoch: Instant,
    close: Notify,
}

impl ConnState {
    fn now(&self) -> u64 {
        millis(self.epoch.elapsed())
    }

    /// Bytes arrived: a request is being read.
    fn bytes_read(&self) {
        if self.phase.load(Ordering::Relaxed) != BUSY {
            self.phase.store(BUSY, Ordering::Relaxed);
        }
    }

    /// A request is answered until the returned guard drops.
    pub(super) fn request(self: &Arc<Self>) -> RequestGuard {
        self.in_flight.fetch_add(1, Ordering::AcqRel);
        self.phase.store(BUSY, Ordering::Relaxed);
        RequestGuard(self.clone())
    }
}

/// A request being answered; dropped when its answer is sent (or given
/// up), which makes the connection idle unless another one is in flight.
pub(super) struct RequestGuard(Arc<ConnState>);

impl Drop for RequestGuard {
    fn drop(&mut self) {
        if self.0.in_flight.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.0.idle_since.store(self.0.now(), Ordering::Relaxed);
            self.0.phase.store(KEEP_ALIVE, Ordering::Relaxed);
        }
    }
}

/// A connection's place in the registry; dropping it removes it.
pub(super) struct Registration {
    drainer: Arc<Drainer>,
    id: u64,
    conn: Arc<ConnState>,
}

impl Registration {
    /// The connection's shared state.
    pub(super) fn state(&self) -> &Arc<ConnState> {
        &self.conn
    }

    /// Completes when the connection is to be closed (drained or shut down).
    pub(super) async fn closed(&self) {
        self.conn.close.notified().await;
    }
}

impl Drop for Registration {
    fn drop(&mut self) {
        // Under the lock, so that `closing` never counts a removed entry.
        let mut connections = lock(&self.drainer.connections);
        if connections.remove(&self.id).is_some_and(|e| e.closing) {
            self.drainer.closing.fetch_sub(1, Ordering::AcqRel);
        }
    }
}

impl Drainer {
    /// A registry for at most `budget` connections.
    pub(super) fn new(budget: usize, metrics: DrainMetrics) -> Arc<Self> {
        Self::with_grace(budget, NEVER_SENT_GRACE, metrics)
    }

    fn with_grace(budget: usize, grace: Duration, metrics: DrainMetrics) -> Arc<Self> {
        Arc::new(Self {
            connections: Mutex::new(HashMap::new()),
            next_id: AtomicU64::new(0),
            closing: AtomicUsize::new(0),
            epoch: Instant::now(),
            budget,
            grace,
            metrics,
        })
    }

    /// Registers a connection just accepted.
    pub(super) fn register(self: &Arc<Self>) -> Registration {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let conn = Arc::new(ConnState {
            phase: AtomicU8::new(NEVER_SENT),
            in_flight: AtomicUsize::new(0),
            idle_since: AtomicU64::new(millis(self.epoch.elapsed())),
            epoch: self.epoch,
            close: Notify::new(),
        });
        lock(&self.connections).insert(
            id,
            Entry {
                conn: conn.clone(),
                closing: false,
            },
        );
        Registration {
            drainer: self.clone(),
            id,
            conn,
        }
    }

    /// Connections picked for closing that are still open.
    pub(super) fn closing(&self) -> usize {
        self.closing.load(Ordering::Acquire)
    }

    /// When the live connections (those not already closing) reach 7/8 of
    /// the budget, closes idle ones, oldest first, down to 3/4; returns how
    /// many were picked.
    pub(super) fn make_room(&self) -> usize {
        let high = (self.budget - self.budget / 8).max(1);
        let low = self.budget / 4 * 3 + (self.budget % 4) * 3 / 4;
        let mut connections = lock(&self.connections);
        let live = connections.len().saturating_sub(self.closing());
        if live < high {
            return 0;
        }
        self.close_idle(&mut connections, live - low)
    }

    /// `accept` found no descriptor: closes an eighth of the budget's worth
    /// of idle connections (at least one); returns how many were picked.
    pub(super) fn free_descriptors(&self) -> usize {
        let mut connections = lock(&self.connections);
        self.close_idle(&mut connections, (self.budget / 8).max(1))
    }

    /// Asks every connection to close once its request in flight, if any,
    /// is answered.
    pub(super) fn close_all(&self) {
        for entry in lock(&self.connections).values() {
            entry.conn.close.notify_one();
        }
    }

    fn close_idle(&self, connections: &mut HashMap<u64, Entry>, wanted: usize) -> usize {
        if wanted == 0 {
            return 0;
        }
        let now = millis(self.epoch.elapsed());
        let grace = millis(self.grace);
        let mut idle: Vec<(u64, u64, &'static str)> = connections
            .iter()
            .filter(|(_, e)| !e.closing)
            .filter_map(|(&id, e)| {
                let since = e.conn.idle_since.load(Ordering::Relaxed);
                match e.conn.phase.load(Ordering::Relaxed) {
                    KEEP_ALIVE => Some((since, id, "keep_alive")),
                    NEVER_SENT if now.saturating_sub(since) >= grace => {
                        Some((since, id, "never_sent"))
                    }
                    _ => None,
                }
            })
            .collect();
        let picked = wanted.min(idle.len());
        if picked < idle.len() {
            idle.select_nth_unstable(picked);
        }
        for &(_, id, state) in &idle[..picked] {
            if let Some(entry) = connections.get_mut(&id) {
                entry.closing = true;
                entry.conn.close.notify_one();
                self.metrics
                    .closed
                    .get_or_create(&IdleLabels { state })
                    .inc();
            }
        }
        self.closing.fetch_add(picked, Ordering::AcqRel);
        if picked > 0 {
            tracing::debug!(
                closed = picked,
                open = connections.len(),
                budget = self.budget,
                "closing idle connections to make room"
            );
        }
        picked
    }
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // Every update under the lock is a single insert or flag.
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

/// A connection's socket that marks the connection busy when bytes arrive.
pub(super) struct Tracked<S> {
    inner: S,
    conn: Arc<ConnState>,
}

impl<S> Tracked<S> {
    pub(super) fn new(inner: S, conn: Arc<ConnState>) -> Self {
        Self { inner, conn }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Tracked<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        let polled = Pin::new(&mut self.inner).poll_read(cx, buf);
        if buf.filled().len() > before {
            self.conn.bytes_read();
        }
        polled
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Tracked<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn drainer(budget: usize, grace: Duration) -> Arc<Drainer> {
        Drainer::with_grace(budget, grace, DrainMetrics::register(&Metrics::new()))
    }

    fn picked(regs: &[Registration]) -> Vec<usize> {
        regs.iter()
            .enumerate()
            .filter(|(_, r)| lock(&r.drainer.connections)[&r.id].closing)
            .map(|(i, _)| i)
            .collect()
    }

    #[test]
    fn nothing_is_closed_below_seven_eighths() {
        let d = drainer(16, Duration::ZERO);
        let regs: Vec<_> = (0..13).map(|_| d.register()).collect();
        assert_eq!(d.make_room(), 0);
        assert!(picked(&regs).is_empty());
    }

    #[test]
    fn idle_connections_close_oldest_first_down_to_three_quarters() {
        let d = drainer(16, Duration::ZERO);
        let regs: Vec<_> = (0..14).map(|_| d.register()).collect();
        // Oldest first: the first ones registered went idle earliest.
        for (i, r) in regs.iter().enumerate() {
            r.conn.idle_since.store(i as u64, Ordering::Relaxed);
        }
        // 14 ≥ 7/8 of 16: down to 12.
        assert_eq!(d.make_room(), 2);
        assert_eq!(picked(&regs), [0, 1]);
        assert_eq!(d.closing(), 2);
        // Already closing ones do not count as live.
        assert_eq!(d.make_room(), 0);
        drop(regs);
        assert_eq!(d.closing(), 0);
        assert!(lock(&d.connections).is_empty());
    }

    #[test]
    fn busy_connections_and_fresh_silent_ones_are_spared() {
        let d = drainer(8, Duration::from_secs(3600));
        let regs: Vec<_> = (0..8).map(|_| d.register()).collect();
        // Within the grace, silent connections are spared.
        assert_eq!(d.make_room(), 0);
        // Busy: reading a request, or answering one.
        regs[0].conn.bytes_read();
        let in_flight = regs[1].conn.request();
        // Keep-alive after an answer: closable at once.
        drop(regs[2].conn.request());
        drop(regs[3].conn.request());
        assert_eq!(d.make_room(), 2);
        assert_eq!(picked(&regs), [2, 3]);
        drop(in_flight);
        assert_eq!(d.free_descriptors(), 1);
        assert_eq!(picked(&regs), [1, 2, 3]);
    }

    #[tokio::test]
    async fn a_picked_connection_is_told_to_close() {
        let d = drainer(1, Duration::ZERO);
        let reg = d.register();
        assert_eq!(d.make_room(), 1);
        tokio::time::timeout(Duration::from_secs(5), reg.closed())
            .await
            .unwrap();
    }

    #[test]
    fn closed_connections_are_counted_by_state() {
        let metrics = Metrics::new();
        let d = Drainer::with_grace(1, Duration::ZERO, DrainMetrics::register(&metrics));
        let silent = d.register();
        assert_eq!(d.make_room(), 1);
        let answered = d.register();
        drop(answered.conn.request());
        assert_eq!(d.make_room(), 1);
        let text = metrics.render().unwrap();
        for state in ["never_sent", "keep_alive"] {
            let line = format!(
                "context_service_http_connections_closed_idle_total{{state=\"{state}\"}} 1"
            );
            assert!(text.contains(&line), "{text}");
        }
        drop((silent, answered));
    }
}
