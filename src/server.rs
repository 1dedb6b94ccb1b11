//! Binding, serving and graceful shutdown.

use std::future::Future;
use std::net::SocketAddr;

use anyhow::Context as _;
use tokio::net::TcpListener;

use crate::api;
use crate::app::{AppState, BuildOptions};
use crate::config::ServeConfig;

/// A bound, ready-to-run server.
pub struct Server {
    listener: TcpListener,
    state: AppState,
}

impl Server {
    /// Builds the application state and binds the listener.
    pub async fn bind(config: &ServeConfig) -> anyhow::Result<Self> {
        Self::bind_with(config, &BuildOptions::default()).await
    }

    /// [`Server::bind`] with build `options` (e.g. a wrapped exec port in
    /// tests).
    pub async fn bind_with(config: &ServeConfig, options: &BuildOptions) -> anyhow::Result<Self> {
        let state = AppState::build_with(config, options).await?;
        let listener = TcpListener::bind(config.listen)
            .await
            .with_context(|| format!("binding {}", config.listen))?;
        Ok(Self { listener, state })
    }

    /// The address actually bound (useful with port 0).
    pub fn local_addr(&self) -> anyhow::Result<SocketAddr> {
        Ok(self.listener.local_addr()?)
    }

    /// The application state, e.g. for tests.
    pub fn state(&self) -> &AppState {
        &self.state
    }

    /// Serves until `shutdown` completes, then finishes in-flight requests.
    pub async fn run(
        self,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> anyhow::Result<()> {
        let app = api::router(self.state);
        axum::serve(self.listener, app)
            .with_graceful_shutdown(shutdown)
            .await
            .context("serving HTTP")
    }
}

/// Completes on SIGINT or SIGTERM.
pub async fn shutdown_signal() {
    let ctrl_c = async {
        if let Err(e) = tokio::signal::ctrl_c().await {
            tracing::warn!(error = %e, "cannot listen for Ctrl-C");
            std::future::pending::<()>().await;
        }
    };
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(e) => {
                tracing::warn!(error = %e, "cannot listen for SIGTERM");
                std::future::pending::<()>().await;
            }
        }
    };
    tokio::select! {
        () = ctrl_c => {},
        () = term => {},
    }
    tracing::info!("shutting down; finishing in-flight requests");
}
