//! Binding, serving and graceful shutdown.

mod conn;
mod drain;
mod fd_budget;
mod in_flight;
mod sendfile;

use std::future::Future;
use std::net::SocketAddr;
use std::time::Duration;

use anyhow::Context as _;
use tokio::net::TcpListener;

use crate::api::{self, RequestLimits};
use crate::app::{AppState, BuildOptions};
use crate::config::ServeConfig;

pub use conn::ConnectionLimits;
use drain::DrainMetrics;
use fd_budget::FileDemand;
use in_flight::InFlight;

/// Which signal asked the process to stop; they differ in the grace.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StopSignal {
    /// SIGINT (Ctrl-C): someone at a terminal. The grace ends as soon as
    /// no request is in flight; on an idle server at once.
    Interrupt,
    /// SIGTERM (Kubernetes, systemd): the whole grace, busy or idle, as
    /// load balancers may still send new requests until they notice.
    Terminate,
}

/// A bound, ready-to-run server.
pub struct Server {
    listener: TcpListener,
    metrics_listener: Option<TcpListener>,
    state: AppState,
    connection_limits: ConnectionLimits,
    request_limits: RequestLimits,
    shutdown: ShutdownTimes,
}

/// How shutdown proceeds once signalled.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ShutdownTimes {
    /// `/readyz` answers `503` this long before the listener closes.
    pub grace: Duration,
    /// In-flight requests get this long after the listener closed.
    pub timeout: Duration,
}

impl Server {
    /// Checks the limits, builds the application state and binds the
    /// listener.
    pub async fn bind(config: &ServeConfig) -> anyhow::Result<Self> {
        Self::bind_with(config, &BuildOptions::default()).await
    }

    /// [`Server::bind`] with build `options` (e.g. a wrapped exec port in
    /// tests).
    pub async fn bind_with(config: &ServeConfig, options: &BuildOptions) -> anyhow::Result<Self> {
        check_limits(config)?;
        let state = AppState::build_with(config, options).await?;
        let listener = TcpListener::bind(config.listen)
            .await
            .with_context(|| format!("binding {}", config.listen))?;
        let metrics_listener = match config.metrics_addr {
            Some(addr) => Some(
                TcpListener::bind(addr)
                    .await
                    .with_context(|| format!("binding the metrics address {addr}"))?,
            ),
            None => None,
        };
        let mut connection_limits = connection_limits(config);
        connection_limits.max_connections =
            fd_budget::fit_connections(config.max_connections, &FileDemand::of(config));
        Ok(Self {
            listener,
            metrics_listener,
            state,
            connection_limits,
            request_limits: request_limits(config),
            shutdown: ShutdownTimes {
                grace: config.shutdown_grace,
                timeout: config.shutdown_timeout,
            },
        })
    }

    /// The address actually bound (useful with port 0).
    pub fn local_addr(&self) -> anyhow::Result<SocketAddr> {
        Ok(self.listener.local_addr()?)
    }

    /// The address `/metrics` is served on when it has its own
    /// (`--metrics-addr`).
    pub fn metrics_addr(&self) -> anyhow::Result<Option<SocketAddr>> {
        Ok(match &self.metrics_listener {
            Some(l) => Some(l.local_addr()?),
            None => None,
        })
    }

    /// The application state, e.g. for tests.
    pub fn state(&self) -> &AppState {
        &self.state
    }

    /// Serves until `shutdown` completes, then shuts down in order:
    /// `/readyz` answers `503` for the grace while everything is still
    /// served; then both listeners close (new connections are refused) and
    /// in-flight requests get the shutdown timeout to finish, after which
    /// the connections still open are closed. Returns once no connection
    /// holds the application state any more. The whole grace is kept, as
    /// on [`StopSignal::Terminate`].
    pub async fn run(
        self,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> anyhow::Result<()> {
        self.run_until(async move {
            shutdown.await;
            StopSignal::Terminate
        })
        .await
    }

    /// [`Server::run`] until `signal` says which signal arrived: on
    /// [`StopSignal::Interrupt`] the grace ends as soon as no request is
    /// in flight.
    pub async fn run_until(
        self,
        signal: impl Future<Output = StopSignal> + Send + 'static,
    ) -> anyhow::Result<()> {
        let metrics = self.state.metrics.clone();
        let readiness = self.state.readiness.clone();
        let separate_metrics = self.metrics_listener.is_some();
        let app = api::router(self.state, self.request_limits, !separate_metrics);
        let drained = DrainMetrics::register(&metrics);
        let in_flight = InFlight::default();
        // Both listeners stop on the one shutdown signal, after the grace.
        let (stop, stopped) = tokio::sync::watch::channel(false);
        let times = self.shutdown;
        let busy = in_flight.clone();
        tokio::spawn(async move {
            let signal = signal.await;
            readiness.drain();
            tracing::info!(
                grace = ?times.grace,
                timeout = ?times.timeout,
                ?signal,
                "shutting down: /readyz answers 503; the listener closes after the grace"
            );
            match signal {
                StopSignal::Terminate => tokio::time::sleep(times.grace).await,
                StopSignal::Interrupt => {
                    tokio::select! {
                        () = tokio::time::sleep(times.grace) => {}
                        () = busy.idle() => tracing::info!("no request in flight: the grace is skipped"),
                    }
                }
            }
            let _ = stop.send(true);
        });
        let on_stop = |mut stopped: tokio::sync::watch::Receiver<bool>| async move {
            let _ = stopped.wait_for(|stop| *stop).await;
        };
        let metrics_server = self.metrics_listener.map(|listener| {
            tokio::spawn(conn::serve(
                listener,
                api::metrics_router(metrics.clone()),
                self.connection_limits,
                metrics.clone(),
                drained.clone(),
                on_stop(stopped.clone()),
                times.timeout,
                in_flight.clone(),
            ))
        });
        conn::serve(
            self.listener,
            app,
            self.connection_limits,
            metrics,
            drained,
            on_stop(stopped),
            times.timeout,
            in_flight,
        )
        .await;
        if let Some(task) = metrics_server {
            task.await.context("serving metrics")?;
        }
        Ok(())
    }
}

/// Blocking-pool threads kept beyond the running uploads' (one each), for
/// store calls and file reads.
const BLOCKING_THREADS_BESIDE_UPLOADS: u32 = 16;

/// The runtime `serve` runs on: tokio's multi-thread scheduler, a worker per
/// core, with the blocking pool capped at `--max-blocking-threads` (tokio's
/// own default, 512, would let a burst of requests start a thread each).
pub fn runtime(config: &ServeConfig) -> std::io::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .max_blocking_threads(config.max_blocking_threads.max(1) as usize)
        .build()
}

/// The per-request time limits of `config`.
fn request_limits(config: &ServeConfig) -> RequestLimits {
    RequestLimits {
        body_idle_timeout: config.body_idle_timeout,
        deadline: config.request_deadline,
    }
}

/// The connection limits of `config`.
fn connection_limits(config: &ServeConfig) -> ConnectionLimits {
    ConnectionLimits {
        header_read_timeout: config.header_read_timeout,
        max_connections: config.max_connections,
        max_connections_per_ip: config.max_connections_per_ip,
        max_requests_per_connection: config.max_requests_per_connection,
    }
}

/// Refuses limits that would make the service unusable.
fn check_limits(config: &ServeConfig) -> anyhow::Result<()> {
    let timeouts = [
        ("--header-read-timeout", config.header_read_timeout),
        ("--body-idle-timeout", config.body_idle_timeout),
        ("--request-deadline", config.request_deadline),
    ];
    for (flag, value) in timeouts {
        anyhow::ensure!(value > Duration::ZERO, "{flag} must be longer than 0s");
    }
    anyhow::ensure!(
        config.max_connections > 0,
        "--max-connections must be at least 1"
    );
    let needed = config
        .upload_max_concurrent
        .saturating_add(BLOCKING_THREADS_BESIDE_UPLOADS);
    anyhow::ensure!(
        config.max_blocking_threads >= needed,
        "--max-blocking-threads ({}) must be at least --upload-max-concurrent ({}) + {BLOCKING_THREADS_BESIDE_UPLOADS}: \
         each running upload holds a blocking thread, and store calls need the rest",
        config.max_blocking_threads,
        config.upload_max_concurrent
    );
    Ok(())
}

/// Listens for SIGINT and SIGTERM from now on (so call it before logging
/// that the service listens: a signal right after must not find the default
/// action, which ends the process without a clean close); the future
/// completes with the first of them to arrive.
pub fn shutdown_signal() -> impl Future<Output = StopSignal> + Send + 'static {
    use tokio::signal::unix::{signal, SignalKind};
    let listen = |kind: SignalKind, name: &'static str| {
        let listener = signal(kind);
        if let Err(e) = &listener {
            tracing::warn!(error = %e, "cannot listen for {name}");
        }
        async move {
            match listener {
                Ok(mut s) => {
                    s.recv().await;
                }
                Err(_) => std::future::pending::<()>().await,
            }
        }
    };
    let interrupt = listen(SignalKind::interrupt(), "SIGINT");
    let terminate = listen(SignalKind::terminate(), "SIGTERM");
    async move {
        let signal = tokio::select! {
            () = interrupt => StopSignal::Interrupt,
            () = terminate => StopSignal::Terminate,
        };
        tracing::info!(?signal, "shutdown signal received");
        signal
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_runtime_runs_at_most_max_blocking_threads_blocking_tasks_at_once() {
        use std::sync::atomic::{AtomicUsize, Ordering};
        use std::sync::Arc;
        let mut config = ServeConfig::with_defaults(
            std::env::temp_dir(),
            "127.0.0.1:0".parse().expect("an address"),
        );
        config.max_blocking_threads = 3;
        let runtime = runtime(&config).unwrap();
        let running = Arc::new(AtomicUsize::new(0));
        let most = Arc::new(AtomicUsize::new(0));
        let (r, m) = (running.clone(), most.clone());
        crate::runtime::run_to_end(&runtime, async move {
            let (running, most) = (r, m);
            let tasks: Vec<_> = (0..24)
                .map(|_| {
                    let (running, most) = (running.clone(), most.clone());
                    tokio::task::spawn_blocking(move || {
                        let now = running.fetch_add(1, Ordering::SeqCst) + 1;
                        most.fetch_max(now, Ordering::SeqCst);
                        std::thread::sleep(Duration::from_millis(20));
                        running.fetch_sub(1, Ordering::SeqCst);
                    })
                })
                .collect();
            for task in tasks {
                task.await.unwrap();
            }
        })
        .unwrap();
        // Queued, not refused: all 24 ran, never more than 3 at once.
        assert_eq!(most.load(Ordering::SeqCst), 3);
    }
}
