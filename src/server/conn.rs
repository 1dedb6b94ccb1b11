//! The accept loop: admits client connections under a global and a
//! per-address cap, serves each with hyper's HTTP/1 server under a
//! header-read timeout and a per-connection request limit, closes idle ones
//! when the cap comes near (see `drain`), and drains them on shutdown.
//!
//! axum's `serve` sets no hyper timer (so no header-read timeout) and
//! accepts without bound, which let half-sent requests and idle sockets pile
//! up until the service stopped answering; hence this loop.

use std::collections::HashMap;
use std::convert::Infallible;
use std::future::Future;
use std::io;
use std::net::IpAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::http::{header, HeaderValue, Request};
use axum::response::Response;
use axum::Router;
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::task::JoinSet;
use tower::ServiceExt as _;

use crate::api::ErrorBody;
use crate::metrics::Metrics;

use super::drain::{ConnState, DrainMetrics, Drainer, Tracked};
use super::in_flight::{self, InFlight};
use super::sendfile::SendfileStream;

/// Connection-level limits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConnectionLimits {
    /// Longest time to receive a request's line and headers; hyper runs the
    /// same timer while a keep-alive connection waits for its next request.
    pub header_read_timeout: Duration,
    /// Most connections served at once.
    pub max_connections: usize,
    /// Most connections served at once for one client address (0: none).
    pub max_connections_per_ip: usize,
    /// Requests answered on one connection before it is closed (0: none).
    pub max_requests_per_connection: usize,
}

/// Refusals being written at once; beyond this a refused connection is
/// closed without an answer, so a flood cannot pile up refusal tasks.
pub(super) const MAX_PENDING_REFUSALS: usize = 64;

/// How long a refusal may take to write its answer and read what the
/// client had already sent.
const REFUSAL_LINGER: Duration = Duration::from_secs(1);

/// Most bytes read from a refused client before closing (reading them lets
/// the close be a FIN, not a reset that could destroy the answer).
const REFUSAL_DRAIN_BYTES: usize = 64 * 1024;

/// Pause after an accept error such as running out of file descriptors.
const ACCEPT_ERROR_PAUSE: Duration = Duration::from_millis(100);

/// Pause after idle connections were picked to free descriptors for
/// `accept`: long enough for them to close.
const DRAINED_PAUSE: Duration = Duration::from_millis(10);

/// How long a connection over the cap waits for the slot of an idle one
/// being closed before it is refused.
const SLOT_WAIT: Duration = Duration::from_millis(100);

/// Serves `app` on `listener` until `shutdown` completes, then closes the
/// listener and gives open connections `drain_timeout` to finish their
/// requests (idle ones close at once); those still open then are closed.
/// Idle connections closed to make room are counted on `drained`.
#[allow(clippy::too_many_arguments)] // each is one of `Server::run`'s parts
pub(super) async fn serve(
    listener: TcpListener,
    app: Router,
    limits: ConnectionLimits,
    metrics: Metrics,
    drained: DrainMetrics,
    shutdown: impl Future<Output = ()>,
    drain_timeout: Duration,
    in_flight: InFlight,
) {
    let admission = Admission::new(&limits, metrics.clone());
    let drainer = Drainer::new(limits.max_connections, drained);
    let refusals = Arc::new(Semaphore::new(MAX_PENDING_REFUSALS));
    let mut http = http1::Builder::new();
    http.timer(TokioTimer::new())
        .header_read_timeout(limits.header_read_timeout)
        .keep_alive(true);
    // Every connection's task, so that those outliving the drain timeout
    // can be stopped; finished ones are reaped as the loop goes.
    let mut connections = JoinSet::new();
    tokio::pin!(shutdown);
    loop {
        let (stream, peer) = tokio::select! {
            biased;
            () = &mut shutdown => break,
            Some(_) = connections.join_next(), if !connections.is_empty() => continue,
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(e) => {
                    accept_failed(e, &drainer).await;
                    continue;
                }
            },
        };
        let picked = drainer.make_room();
        let admitted = match admission.admit(peer.ip()) {
            // Idle connections were just told to close: their slots are
            // about to free. (Only then: a connection picked earlier that
            // turned busy would hold the accept loop at every refusal.)
            Err(Refusal::Total(_)) if picked > 0 => {
                admission.admit_waiting(peer.ip(), SLOT_WAIT).await
            }
            admitted => admitted,
        };
        let admitted = match admitted {
            Ok(admitted) => admitted,
            Err(refusal) => {
                metrics.connection_refused(refusal.limit());
                tracing::debug!(peer = %peer, limit = refusal.limit(), "connection refused");
                refuse(stream, &refusal, &refusals);
                continue;
            }
        };
        // Small answers should not wait for Nagle's algorithm.
        let _ = stream.set_nodelay(true);
        let registration = drainer.register();
        let state = registration.state().clone();
        let service = ConnectionService::new(
            app.clone(),
            limits.max_requests_per_connection,
            in_flight.clone(),
            state.clone(),
        );
        let stream = SendfileStream::new(stream, metrics.sendfile_bytes().clone());
        let stream = Tracked::new(stream, state);
        let conn = http.serve_connection(TokioIo::new(stream), service);
        connections.spawn(async move {
            tokio::pin!(conn);
            // Told to close (drained, or shut down): hyper closes an idle
            // connection at once and lets a request in flight finish.
            let ended = tokio::select! {
                ended = conn.as_mut() => ended,
                () = registration.closed() => {
                    conn.as_mut().graceful_shutdown();
                    conn.await
                }
            };
            if let Err(e) = ended {
                // Header timeouts, resets and malformed requests end here.
                tracing::debug!(peer = %peer, error = %e, "connection ended with an error");
            }
            drop(admitted);
            drop(registration);
        });
    }
    drop(listener);
    while connections.try_join_next().is_some() {}
    tracing::info!(
        open = connections.len(),
        "listener closed; finishing in-flight requests"
    );
    drainer.close_all();
    let finished = async { while connections.join_next().await.is_some() {} };
    if tokio::time::timeout(drain_timeout, finished).await.is_err() {
        while connections.try_join_next().is_some() {}
        tracing::warn!(
            "--shutdown-timeout ({drain_timeout:?}) passed: closing {} connection(s) still open",
            connections.len()
        );
        connections.shutdown().await;
    }
}

/// The per-connection service: the router, with the answer to the
/// `max_requests`-th request marked `Connection: close` so that hyper closes
/// the connection after it. Each request counts as in flight until its
/// answer is sent.
struct ConnectionService {
    app: Router,
    served: AtomicUsize,
    max_requests: usize,
    in_flight: InFlight,
    /// Marked busy while a request is answered, for the drain.
    state: Arc<ConnState>,
}

impl ConnectionService {
    fn new(app: Router, max_requests: usize, in_flight: InFlight, state: Arc<ConnState>) -> Self {
        Self {
            app,
            served: AtomicUsize::new(0),
            max_requests,
            in_flight,
            state,
        }
    }
}

impl hyper::service::Service<Request<Incoming>> for ConnectionService {
    type Response = Response;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Response, Infallible>> + Send>>;

    fn call(&self, request: Request<Incoming>) -> Self::Future {
        let n = self.served.fetch_add(1, Ordering::Relaxed) + 1;
        let last = self.max_requests > 0 && n >= self.max_requests;
        let app = self.app.clone();
        let guard = self.in_flight.start();
        let busy = self.state.request();
        Box::pin(async move {
            let mut response = app.oneshot(request).await?;
            if last {
                response
                    .headers_mut()
                    .insert(header::CONNECTION, HeaderValue::from_static("close"));
            }
            Ok(in_flight::hold_until_sent(response, (guard, busy)))
        })
    }
}

/// Logs an accept error; out of file descriptors, closes idle connections
/// to free some; pauses so the loop does not spin while none come free.
async fn accept_failed(e: io::Error, drainer: &Drainer) {
    use io::ErrorKind as K;
    // The peer gave up between SYN and accept: nothing to do.
    if matches!(
        e.kind(),
        K::ConnectionAborted | K::ConnectionReset | K::ConnectionRefused
    ) {
        return;
    }
    let out_of_fds = matches!(e.raw_os_error(), Some(libc::EMFILE | libc::ENFILE));
    if out_of_fds {
        let freed = drainer.free_descriptors();
        if freed > 0 {
            tracing::info!(
                closing = freed,
                "out of file descriptors: closing idle connections"
            );
            tokio::time::sleep(DRAINED_PAUSE).await;
            return;
        }
    }
    tracing::warn!(error = %e, "accepting a connection failed");
    tokio::time::sleep(ACCEPT_ERROR_PAUSE).await;
}

/// Counts open connections, globally and per client address.
struct Admission {
    slots: Arc<Semaphore>,
    max_total: usize,
    max_per_address: usize,
    per_address: Arc<Mutex<HashMap<IpAddr, usize>>>,
    metrics: Metrics,
}

/// Why a connection was refused.
enum Refusal {
    /// The global cap.
    Total(usize),
    /// The per-address cap.
    PerAddress(usize),
}

impl Refusal {
    fn limit(&self) -> &'static str {
        match self {
            Refusal::Total(_) => "max_connections",
            Refusal::PerAddress(_) => "max_connections_per_ip",
        }
    }

    fn message(&self) -> String {
        match self {
            Refusal::Total(n) => {
                format!("the service is serving its limit of {n} connections; retry later")
            }
            Refusal::PerAddress(n) => format!(
                "this client address has {n} open connections, the limit per address; \
                 close some or retry later"
            ),
        }
    }
}

/// One admitted connection; dropping it frees its slots.
struct Admitted {
    _slot: OwnedSemaphorePermit,
    address: IpAddr,
    per_address: Option<Arc<Mutex<HashMap<IpAddr, usize>>>>,
    metrics: Metrics,
}

impl Admission {
    fn new(limits: &ConnectionLimits, metrics: Metrics) -> Self {
        Self {
            slots: Arc::new(Semaphore::new(limits.max_connections)),
            max_total: limits.max_connections,
            max_per_address: limits.max_connections_per_ip,
            per_address: Arc::new(Mutex::new(HashMap::new())),
            metrics,
        }
    }

    fn admit(&self, address: IpAddr) -> Result<Admitted, Refusal> {
        self.admit_with(address, None)
    }

    /// [`Admission::admit`], waiting up to `wait` for a global slot.
    async fn admit_waiting(&self, address: IpAddr, wait: Duration) -> Result<Admitted, Refusal> {
        let slot = tokio::time::timeout(wait, self.slots.clone().acquire_owned())
            .await
            .ok()
            .and_then(Result::ok)
            .ok_or(Refusal::Total(self.max_total))?;
        self.admit_with(address, Some(slot))
    }

    fn admit_with(
        &self,
        address: IpAddr,
        slot: Option<OwnedSemaphorePermit>,
    ) -> Result<Admitted, Refusal> {
        // One address whether it arrives as IPv4 or IPv4-mapped IPv6.
        let address = address.to_canonical();
        let take_slot = || match slot {
            Some(slot) => Ok(slot),
            None => self
                .slots
                .clone()
                .try_acquire_owned()
                .map_err(|_| Refusal::Total(self.max_total)),
        };
        let (slot, per_address) = if self.max_per_address == 0 {
            (take_slot()?, None)
        } else {
            let mut open = lock(&self.per_address);
            let count = open.get(&address).copied().unwrap_or(0);
            if count >= self.max_per_address {
                return Err(Refusal::PerAddress(self.max_per_address));
            }
            let slot = take_slot()?;
            open.insert(address, count + 1);
            (slot, Some(self.per_address.clone()))
        };
        self.metrics.connections_open().inc();
        Ok(Admitted {
            _slot: slot,
            address,
            per_address,
            metrics: self.metrics.clone(),
        })
    }
}

impl Drop for Admitted {
    fn drop(&mut self) {
        self.metrics.connections_open().dec();
        if let Some(per_address) = &self.per_address {
            let mut open = lock(per_address);
            if let Some(count) = open.get_mut(&self.address) {
                *count -= 1;
                if *count == 0 {
                    open.remove(&self.address);
                }
            }
        }
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // The map stays consistent under every panic point (none while held).
    mutex
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Answers a refused connection `503 too_many_connections` (JSON, like
/// every error) and closes it, without reading its request; when too many
/// refusals are already in flight it is closed at once instead.
fn refuse(mut stream: TcpStream, refusal: &Refusal, pending: &Arc<Semaphore>) {
    let Ok(permit) = pending.clone().try_acquire_owned() else {
        return;
    };
    let body = ErrorBody {
        error: "too_many_connections".to_owned(),
        message: refusal.message(),
    };
    let body = serde_json::to_string(&body).unwrap_or_default();
    let answer = format!(
        "HTTP/1.1 503 Service Unavailable\r\n\
         content-type: application/json\r\n\
         content-length: {}\r\n\
         retry-after: 1\r\n\
         connection: close\r\n\r\n{body}",
        body.len()
    );
    tokio::spawn(async move {
        let _permit = permit;
        let _ = tokio::time::timeout(REFUSAL_LINGER, async {
            stream.write_all(answer.as_bytes()).await?;
            stream.shutdown().await?;
            let mut buf = [0u8; 4096];
            let mut read = 0;
            while read < REFUSAL_DRAIN_BYTES {
                match stream.read(&mut buf).await? {
                    0 => break,
                    n => read += n,
                }
            }
            Ok::<_, io::Error>(())
        })
        .await;
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits(total: usize, per_address: usize) -> ConnectionLimits {
        ConnectionLimits {
            header_read_timeout: Duration::from_secs(1),
            max_connections: total,
            max_connections_per_ip: per_address,
            max_requests_per_connection: 0,
        }
    }

    #[test]
    fn admission_counts_per_address_and_in_total() {
        let admission = Admission::new(&limits(3, 2), Metrics::new());
        let a: IpAddr = "10.0.0.1".parse().unwrap();
        let b: IpAddr = "10.0.0.2".parse().unwrap();
        let a1 = admission.admit(a).ok().unwrap();
        // The same address as IPv4-mapped IPv6 counts as the same client.
        let a2 = admission
            .admit("::ffff:10.0.0.1".parse().unwrap())
            .ok()
            .unwrap();
        assert!(matches!(admission.admit(a), Err(Refusal::PerAddress(2))));
        let b1 = admission.admit(b).ok().unwrap();
        assert!(matches!(admission.admit(b), Err(Refusal::Total(3))));
        drop(a1);
        let b2 = admission.admit(b).ok().unwrap();
        drop((a2, b1, b2));
        assert!(lock(&admission.per_address).is_empty());
        assert_eq!(admission.slots.available_permits(), 3);
    }

    #[test]
    fn no_per_address_cap_when_zero() {
        let admission = Admission::new(&limits(2, 0), Metrics::new());
        let a: IpAddr = "10.0.0.1".parse().unwrap();
        let held = [admission.admit(a).ok(), admission.admit(a).ok()];
        assert!(held.iter().all(Option::is_some));
        assert!(matches!(admission.admit(a), Err(Refusal::Total(2))));
    }
}
