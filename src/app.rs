//! The application state shared by every handler, and how it is built from
//! settings.

use std::sync::Arc;

use anyhow::Context as _;
use axum::extract::FromRef;

use crate::auth::dev::{self, DevIssuer};
use crate::auth::{Authenticator, KeySet, OwnerScope, TokenPolicy};
use crate::bundle::Limits;
use crate::config::{BackendKind, ServeConfig};
use crate::fsutil;
use crate::metrics::Metrics;
use crate::pool::metrics::{self as pool_metrics, PoolMetrics};
use crate::pool::PoolService;
use crate::sandbox::{self, kube::KubeSettings, local::LocalSettings, SandboxSettings};
use crate::workload::{WorkloadService, WorkloadSettings};

/// Everything handlers need. Cheap to clone.
#[derive(Clone)]
pub struct AppState {
    /// Verifies bearer tokens.
    pub auth: Arc<Authenticator>,
    /// Computes owner scopes (labels, sandbox folders).
    pub owner_scope: OwnerScope,
    /// Prometheus metrics of the process.
    pub metrics: Metrics,
    /// Sandbox pools and named contexts.
    pub pools: Arc<PoolService>,
    /// Workloads, revisions, uploads and downloads.
    pub workloads: WorkloadService,
}

impl FromRef<AppState> for WorkloadService {
    fn from_ref(state: &AppState) -> Self {
        state.workloads.clone()
    }
}

impl FromRef<AppState> for Metrics {
    fn from_ref(state: &AppState) -> Self {
        state.metrics.clone()
    }
}

impl FromRef<AppState> for Arc<Authenticator> {
    fn from_ref(state: &AppState) -> Self {
        state.auth.clone()
    }
}

impl AppState {
    /// Opens the store and backends that `config` names, recovering from a
    /// crash where needed.
    pub async fn build(config: &ServeConfig) -> anyhow::Result<Self> {
        fsutil::ensure_dir(&config.data_dir, 0o700)
            .with_context(|| format!("creating the data dir {}", config.data_dir.display()))?;
        let auth = Arc::new(build_authenticator(config)?);
        let secret = dev::ensure_server_secret(&config.data_dir)?;
        let owner_scope = OwnerScope::new(&secret).context("the server secret is empty")?;
        let metrics = Metrics::new();
        let backend = sandbox::open(sandbox_settings(config))
            .await
            .with_context(|| format!("opening the {:?} sandbox backend", config.backend))?;
        let pools = Arc::new(PoolService::new(backend));
        let workloads = build_workloads(config).await?;
        metrics.with_registry(|r| workloads.metrics().register(r));
        let pool_metrics = PoolMetrics::default();
        metrics.with_registry(|r| pool_metrics.register(r));
        pool_metrics::spawn_sampler(&pools, pool_metrics, pool_metrics::SAMPLE_EVERY);
        Ok(Self {
            auth,
            owner_scope,
            metrics,
            pools,
            workloads,
        })
    }
}

/// The sandbox backend `config` selects, with its settings: `local` under
/// `<data-dir>/local`; `kube` with `--namespace`, `--kube-sandbox-image`,
/// `--kube-sandbox-service-account`, `--claim-ttl` and
/// `--kube-claim-pod-label`, every other setting at its default.
fn sandbox_settings(config: &ServeConfig) -> SandboxSettings {
    match config.backend {
        BackendKind::Local => SandboxSettings::Local(LocalSettings {
            root: config.data_dir.join("local"),
            namespace: config.namespace.clone(),
            warm_pools: config.local_warm_pools.clone(),
        }),
        BackendKind::Kube => {
            let mut settings = KubeSettings::new(
                config.namespace.clone(),
                config.kube_sandbox_image.clone().unwrap_or_default(),
            );
            settings.sandbox_service_account = config
                .kube_sandbox_service_account
                .clone()
                .filter(|account| !account.is_empty());
            settings.claim_ttl = config.claim_ttl;
            settings.claim_pod_label = config.kube_claim_pod_label;
            SandboxSettings::Kube(settings)
        }
    }
}

/// Each component's settings, derived from the flags here so that settings
/// flow one way: `config` knows no component, and no component knows
/// `ServeConfig`.
impl ServeConfig {
    /// The workload service's settings.
    pub fn workload_settings(&self) -> WorkloadSettings {
        WorkloadSettings {
            quota: self.workload_quota,
            grant_ttl: self.upload_grant_ttl,
            limits: Limits {
                compressed_bytes: self.bundle_max_bytes,
                inflated_bytes: self.bundle_max_inflated_bytes,
                entries: self.bundle_max_entries,
                file_bytes: self.bundle_max_file_bytes,
                ..Limits::default()
            },
        }
    }

    /// The token policy these settings describe.
    pub fn token_policy(&self) -> TokenPolicy {
        TokenPolicy {
            issuer: self.token_issuer.clone(),
            audience: self.token_audience.clone(),
            leeway_secs: self.token_leeway_secs,
        }
    }
}

/// Trusts the configured JWKS (and HS256 secret), or the embedded development
/// issuer when no JWKS is configured.
fn build_authenticator(config: &ServeConfig) -> anyhow::Result<Authenticator> {
    let policy = config.token_policy();
    let mut keys = KeySet::new();
    match &config.jwks_file {
        Some(path) => keys
            .add_jwks_file(path)
            .with_context(|| format!("loading the JWKS {}", path.display()))?,
        None => {
            let issuer = DevIssuer::ensure(&config.data_dir)?;
            keys.add_jwks(&issuer.jwks())?;
            let token_path = issuer.write_dev_token(&config.data_dir, &policy)?;
            tracing::info!(
                path = %token_path.display(),
                "no JWKS configured: trusting the embedded development key; development token written"
            );
        }
    }
    if let Some(path) = &config.hs256_secret_file {
        let secret = std::fs::read(path)
            .with_context(|| format!("reading the HS256 secret {}", path.display()))?;
        let trimmed = String::from_utf8_lossy(&secret).trim().as_bytes().to_vec();
        keys.set_hs256_secret(&trimmed)?;
    }
    Ok(Authenticator::new(keys, policy))
}

/// Opens the embedded store and runs start-up recovery.
async fn build_workloads(config: &ServeConfig) -> anyhow::Result<WorkloadService> {
    let cache = Arc::new(crate::cache::BundleCache::new(config.cache_bytes));
    let (service, report) =
        WorkloadService::open(&config.data_dir, config.workload_settings(), cache)
            .await
            .context("opening the workload store")?;
    if report != Default::default() {
        tracing::warn!(
            temp_files_removed = report.temp_files_removed,
            failed = ?report.failed,
            deletes_finished = report.deletes_finished,
            orphan_blobs_removed = report.orphan_blobs_removed,
            "start-up recovery"
        );
    }
    Ok(service)
}
