//! A real server on 127.0.0.1:0 with a temporary data dir, for API tests;
//! [`Caller`] to talk to it; and (in `archive`) helpers that craft bundles,
//! including hostile ones.
//!
//! Shared by the `api` test binary and the ones that must run alone in
//! their process; each uses a part, hence `dead_code` is allowed.
#![allow(dead_code)]

pub(crate) mod agent;
pub(crate) mod answers;
mod archive;
mod caller;
#[cfg(feature = "e2e")]
pub(crate) mod k8s;
pub(crate) mod postgres;
pub(crate) mod process;
#[cfg(feature = "e2e")]
pub(crate) mod rbac;
pub(crate) mod s3;
pub(crate) mod workload_bundles;
#[allow(unused_imports)]
pub(crate) use archive::*;
#[allow(unused_imports)]
pub(crate) use caller::{json_of, Caller};

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use context_service::app::BuildOptions;
use context_service::auth::dev::DevIssuer;
use context_service::auth::{Scope, TokenPolicy};
use context_service::client::Client;
use context_service::config::ServeConfig;
use context_service::server::Server;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

/// With `CONTEXT_SERVICE_TEST_BLOBS=s3`, a fresh prefix in the S3 test
/// bucket (`tests/scale/seaweedfs.sh env`) for one spawned service, so the
/// API suite runs against object storage; otherwise `None` (local blobs).
pub(crate) fn test_blob_url() -> Option<String> {
    if std::env::var("CONTEXT_SERVICE_TEST_BLOBS").ok()? != "s3" {
        return None;
    }
    let bucket = std::env::var("CONTEXT_SERVICE_TEST_S3_BUCKET").expect(
        "CONTEXT_SERVICE_TEST_BLOBS=s3 needs the S3 test server: eval \"$(tests/scale/seaweedfs.sh env)\"",
    );
    Some(format!("s3://{bucket}/{}", s3::fresh_prefix("api")))
}

/// Whether spawned services keep bundles in object storage
/// (`CONTEXT_SERVICE_TEST_BLOBS=s3`); tests that inspect or break the local
/// blob files directly assume local blobs and skip then.
pub(crate) fn s3_blobs() -> bool {
    std::env::var("CONTEXT_SERVICE_TEST_BLOBS").as_deref() == Ok("s3")
}

/// A running service.
pub(crate) struct TestServer {
    /// `http://127.0.0.1:<port>`.
    pub base: String,
    /// The data dir (kept alive by `_dir` when the server owns it).
    pub data_dir: PathBuf,
    config: ServeConfig,
    options: BuildOptions,
    _dir: Option<tempfile::TempDir>,
    shutdown: Option<oneshot::Sender<()>>,
    task: Option<JoinHandle<anyhow::Result<()>>>,
}

impl TestServer {
    /// Starts a server on a fresh data dir with default settings.
    pub(crate) async fn start() -> Self {
        Self::start_with(|_| {}).await
    }

    /// Starts a server on a fresh data dir after `adjust` changes settings.
    pub(crate) async fn start_with(adjust: impl FnOnce(&mut ServeConfig)) -> Self {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut server = Self::start_in(dir.path(), adjust).await;
        server._dir = Some(dir);
        server
    }

    /// Starts a server on a fresh data dir with `options` (e.g. a wrapped
    /// exec port) after `adjust` changes settings.
    pub(crate) async fn start_with_options(
        adjust: impl FnOnce(&mut ServeConfig),
        options: BuildOptions,
    ) -> Self {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut server = Self::start_in_with(dir.path(), adjust, options).await;
        server._dir = Some(dir);
        server
    }

    /// Starts a server on a fresh data dir after `adjust` changes settings,
    /// or returns why it refused to start.
    pub(crate) async fn try_start_with(
        adjust: impl FnOnce(&mut ServeConfig),
    ) -> anyhow::Result<Self> {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut server = Self::try_start_in(dir.path(), adjust).await?;
        server._dir = Some(dir);
        Ok(server)
    }

    /// Starts a server on an existing data dir (e.g. to test a restart).
    pub(crate) async fn start_in(data_dir: &Path, adjust: impl FnOnce(&mut ServeConfig)) -> Self {
        Self::start_in_with(data_dir, adjust, BuildOptions::default()).await
    }

    async fn start_in_with(
        data_dir: &Path,
        adjust: impl FnOnce(&mut ServeConfig),
        options: BuildOptions,
    ) -> Self {
        Self::try_start_in_with(data_dir, adjust, options)
            .await
            .expect("server starts")
    }

    /// [`Self::start_in`], or why the server refused to start.
    pub(crate) async fn try_start_in(
        data_dir: &Path,
        adjust: impl FnOnce(&mut ServeConfig),
    ) -> anyhow::Result<Self> {
        Self::try_start_in_with(data_dir, adjust, BuildOptions::default()).await
    }

    async fn try_start_in_with(
        data_dir: &Path,
        adjust: impl FnOnce(&mut ServeConfig),
        options: BuildOptions,
    ) -> anyhow::Result<Self> {
        answers::install();
        let listen: SocketAddr = "127.0.0.1:0".parse().expect("addr");
        let mut config = ServeConfig::with_defaults(data_dir.to_owned(), listen);
        // Nothing balances load in front of a test server: stop at once
        // (tests/api/shutdown.rs covers the grace).
        config.shutdown_grace = Duration::ZERO;
        if config.blob_url.is_none() {
            config.blob_url = test_blob_url();
        }
        if postgres::requested() {
            // One database per data dir, so a server started again on the
            // same dir finds its records, as with the embedded store.
            config.database_url = Some(postgres::database_for(data_dir));
        }
        adjust(&mut config);
        let server = Server::bind_with(&config, &options).await?;
        let addr = server.local_addr().expect("local addr");
        let (tx, rx) = oneshot::channel::<()>();
        let task = tokio::spawn(server.run(async move {
            let _ = rx.await;
        }));
        Ok(Self {
            base: format!("http://{addr}"),
            data_dir: data_dir.to_owned(),
            config,
            options,
            _dir: None,
            shutdown: Some(tx),
            task: Some(task),
        })
    }

    /// The same server, now owning `dir` (removed when it is dropped).
    pub(crate) fn owning(mut self, dir: tempfile::TempDir) -> Self {
        self._dir = Some(dir);
        self
    }

    /// The data dir the server owns, handed over (e.g. to a server started
    /// again on it); the server must be stopped first.
    pub(crate) fn into_dir(mut self) -> tempfile::TempDir {
        self._dir.take().expect("the server owns its data dir")
    }

    /// The settings the server runs with.
    pub(crate) fn config(&self) -> &ServeConfig {
        &self.config
    }

    /// What the server expects of a token (issuer, audience, leeway).
    pub(crate) fn token_policy(&self) -> TokenPolicy {
        self.config.token_policy()
    }

    /// Stops the server gracefully and waits for it; keeps the data dir.
    pub(crate) async fn stop(&mut self) {
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
        if let Some(task) = self.task.take() {
            let _ = tokio::time::timeout(Duration::from_secs(10), task).await;
        }
    }

    /// Stops this server and starts a new one on the same data dir, with
    /// the same settings and options (on a new port).
    pub(crate) async fn restart(mut self) -> Self {
        self.stop().await;
        let dir = self._dir.take();
        let config = self.config.clone();
        let keep = move |c: &mut ServeConfig| {
            let listen = c.listen;
            *c = config;
            c.listen = listen;
        };
        let mut next =
            Self::start_in_with(&self.data_dir.clone(), keep, self.options.clone()).await;
        next._dir = dir;
        next
    }

    /// A token for `sub` with `scopes` (space-separated), signed by the
    /// server's development key.
    pub(crate) fn token(&self, sub: &str, scopes: &str) -> String {
        DevIssuer::load(&self.data_dir)
            .expect("dev key")
            .mint(&self.token_policy(), sub, scopes, Duration::from_secs(600))
            .expect("mint")
    }

    /// A token for `sub` with every user scope.
    pub(crate) fn user_token(&self, sub: &str) -> String {
        self.token(sub, &Scope::user_scopes())
    }

    /// A typed client for `sub` with every user scope.
    pub(crate) fn client(&self, sub: &str) -> Client {
        Client::new(self.base.clone(), Some(self.user_token(sub))).expect("client")
    }

    /// A raw HTTP client (no auth); [`Caller`] sends through it.
    pub(crate) fn http(&self) -> reqwest::Client {
        context_service::client::install_crypto_provider();
        reqwest::Client::new()
    }
}

impl Drop for TestServer {
    fn drop(&mut self) {
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
        if let Some(task) = self.task.take() {
            task.abort();
        }
        // Every answer it gave is one the OpenAPI document lists.
        answers::check();
    }
}

/// Settings of a test that reads or writes the embedded store's file
/// itself: it runs on the embedded store even when
/// `CONTEXT_SERVICE_TEST_DATABASE=postgres` puts the others on PostgreSQL.
pub(crate) fn embedded_only(config: &mut ServeConfig) {
    config.database_url = None;
}

/// `POST /v1/workloads/{workload}/deliveries` of run `run_id` into one
/// `sandbox`.
pub(crate) async fn deliver(
    caller: &Caller,
    workload: &str,
    run_id: &str,
    sandbox: &str,
) -> reqwest::Response {
    let body = serde_json::json!({ "runId": run_id, "sandbox": sandbox });
    caller
        .post(&format!("/v1/workloads/{workload}/deliveries"), &body)
        .await
}

/// Polls `check` every 100 ms until it holds (`true`) or `limit` passed
/// (`false`).
pub(crate) async fn eventually(limit: Duration, mut check: impl AsyncFnMut() -> bool) -> bool {
    let deadline = std::time::Instant::now() + limit;
    loop {
        if check().await {
            return true;
        }
        if std::time::Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Asserts an error response: status, `error` code, and a message fragment.
pub(crate) async fn assert_error(
    resp: reqwest::Response,
    status: u16,
    code: &str,
    message_part: &str,
) {
    let got_status = resp.status().as_u16();
    let text = resp.text().await.expect("body");
    assert_eq!(got_status, status, "status for body {text}");
    let body: serde_json::Value = serde_json::from_str(&text)
        .unwrap_or_else(|e| panic!("error body is not JSON ({e}): {text}"));
    assert_eq!(body["error"], code, "error code in {text}");
    let message = body["message"].as_str().expect("message is a string");
    assert!(
        message.contains(message_part),
        "message {message:?} should contain {message_part:?}"
    );
}
