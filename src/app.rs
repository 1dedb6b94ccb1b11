//! The application state shared by every handler, and how it is built from
//! settings.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use anyhow::Context as _;
use axum::extract::FromRef;

use crate::auth::dev::{self, DevIssuer};
use crate::auth::registry::RegistryTokens;
use crate::auth::{secret, Authenticator, KeySet, Owner, OwnerScope, ServiceToken};
use crate::config::ServeConfig;
use crate::delivery::{DeliveryDeps, DeliveryService, SandboxExec};
use crate::fsutil;
use crate::fsutil::lock::DataDirLock;
use crate::metrics::Metrics;
use crate::pool::metrics::{self as pool_metrics, PoolMetrics};
use crate::pool::validate::TtlBounds;
use crate::pool::{reaper, PoolQuotas, PoolService};
use crate::sandbox;
use crate::store::Storage;
use crate::workload::WorkloadService;

/// Whether the process still takes traffic: cleared when shutdown begins,
/// so that `/readyz` turns unready before the listener closes. Cheap to
/// clone (one shared flag).
#[derive(Debug, Clone, Default)]
pub struct Readiness(Arc<AtomicBool>);

impl Readiness {
    /// Marks the process as leaving: `/readyz` answers `503` from now on.
    pub fn drain(&self) {
        self.0.store(true, Ordering::SeqCst);
    }

    /// Whether [`Readiness::drain`] was called.
    pub fn is_draining(&self) -> bool {
        self.0.load(Ordering::SeqCst)
    }
}

/// Everything handlers need. Cheap to clone.
#[derive(Clone)]
pub struct AppState {
    /// Verifies bearer tokens.
    pub auth: Arc<Authenticator>,
    /// The service token of the trusted routes, if configured.
    pub service_token: Option<Arc<ServiceToken>>,
    /// Computes owner scopes (labels, sandbox folders).
    pub owner_scope: OwnerScope,
    /// Prometheus metrics of the process.
    pub metrics: Metrics,
    /// Sandbox pools and named contexts.
    pub pools: Arc<PoolService>,
    /// Workloads, revisions, uploads and downloads.
    pub workloads: WorkloadService,
    /// Deliveries into sandboxes (`None` on a backend without exec).
    pub deliveries: Option<DeliveryService>,
    /// Cleared when shutdown begins.
    pub readiness: Readiness,
    /// The OCI pull API's tokens and public URL.
    pub registry: RegistrySettings,
    /// The data dir's lock, held while any clone of the state lives.
    _data_dir_lock: Arc<DataDirLock>,
}

/// What the OCI pull API (`/v2`) needs beyond the workloads.
#[derive(Debug, Clone)]
pub struct RegistrySettings {
    /// Issues and verifies its pull tokens (keyed by the server secret).
    pub tokens: RegistryTokens,
    /// `--registry-url`, without a trailing `/`.
    pub url: Option<String>,
}

/// Wraps the backend's exec port, e.g. to count or corrupt execs in tests.
pub type ExecWrapper = Arc<dyn Fn(Arc<dyn SandboxExec>) -> Arc<dyn SandboxExec> + Send + Sync>;

/// What [`AppState::build_with`] may change beyond the settings.
#[derive(Clone, Default)]
pub struct BuildOptions {
    /// Applied to the backend's exec port before the delivery service gets
    /// it.
    pub exec_wrapper: Option<ExecWrapper>,
    /// The `kube` backend's client, instead of the one
    /// `kube::Client::try_default` builds from the environment (the e2e
    /// tests run the service as the deploy's ServiceAccount this way).
    pub kube_client: Option<kube::Client>,
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
        Self::build_with(config, &BuildOptions::default()).await
    }

    /// [`AppState::build`] with `options`.
    pub async fn build_with(config: &ServeConfig, options: &BuildOptions) -> anyhow::Result<Self> {
        let delivery_settings = config.delivery_settings()?;
        fsutil::ensure_dir(&config.data_dir, 0o700)
            .with_context(|| format!("creating the data dir {}", config.data_dir.display()))?;
        // Before anything under the data dir is written: a second service
        // there must change nothing (it once rewrote the development token).
        let data_dir_lock = Arc::new(DataDirLock::acquire(&config.data_dir)?);
        make_data_dir_private(config);
        let auth = Arc::new(build_authenticator(config)?);
        let service_token = load_service_token(config)?.map(Arc::new);
        let secret = owner_scope_secret(config)?;
        let owner_scope = OwnerScope::new(&secret).context("the server secret is empty")?;
        let registry = RegistrySettings {
            tokens: RegistryTokens::new(&secret).context("the server secret is empty")?,
            url: config
                .registry_url
                .as_deref()
                .map(|u| u.trim_end_matches('/').to_owned()),
        };
        let metrics = Metrics::new();
        let backend = sandbox::open(config.sandbox_settings(), options.kube_client.clone())
            .await
            .with_context(|| format!("opening the {:?} sandbox backend", config.backend))?;
        let quotas = PoolQuotas {
            replicas: config.pool_replica_quota,
            contexts: config.context_quota,
        };
        let ttl_bounds = TtlBounds::new(config.pool_ttl_min, config.pool_ttl_max)?;
        let pools =
            Arc::new(PoolService::with_quotas(backend.pools, quotas).with_ttl_bounds(ttl_bounds));
        // Deletes expired pools, first those that expired while we were down.
        reaper::spawn_reaper(&pools, reaper::RESCAN_EVERY);
        let storage = Storage::open(&config.data_dir, &config.storage_settings())
            .await
            .context("opening the workload store")?;
        let workloads = build_workloads(config, &storage).await?;
        metrics.with_registry(|r| workloads.metrics().register(r));
        let pool_metrics = PoolMetrics::default();
        metrics.with_registry(|r| pool_metrics.register(r));
        pool_metrics::spawn_sampler(&pools, pool_metrics, pool_metrics::SAMPLE_EVERY);
        let deliveries = match backend.exec {
            Some(exec) => {
                let exec = match &options.exec_wrapper {
                    Some(wrap) => wrap(exec),
                    None => exec,
                };
                let deps = DeliveryDeps {
                    exec,
                    pools: pools.clone(),
                    workloads: workloads.clone(),
                    runs: storage.runs().clone(),
                    owner_scope: owner_scope.clone(),
                };
                let service = DeliveryService::new(delivery_settings, deps)?;
                metrics.with_registry(|r| service.metrics().register(r));
                Some(service)
            }
            None => None,
        };
        Ok(Self {
            auth,
            service_token,
            owner_scope,
            metrics,
            pools,
            workloads,
            deliveries,
            readiness: Readiness::default(),
            registry,
            _data_dir_lock: data_dir_lock,
        })
    }
}

/// Narrows the permissions of a data dir left readable by others (older
/// versions created `store/meta.redb` with the umask's permissions) and
/// logs what changed. The local backend's sandbox trees are left as they
/// are: the data dir's own `0700` already closes them.
fn make_data_dir_private(config: &ServeConfig) {
    let done = fsutil::make_private(&config.data_dir, &["local"]);
    if done.changed > 0 {
        tracing::warn!(
            changed = done.changed,
            first = ?done.first,
            "made files and directories under the data dir private (0600/0700)"
        );
    }
    if done.failures > 0 {
        tracing::warn!(
            failures = done.failures,
            first = ?done.failed,
            "could not make everything under the data dir private"
        );
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
        // One line naming the setting: this is what an operator sees when
        // the service refuses to start.
        let setting = || {
            format!(
                "--hs256-secret-file/CS_HS256_SECRET_FILE {}",
                path.display()
            )
        };
        let contents = std::fs::read(path).with_context(setting)?;
        let secret = secret::parse_secret_file(&contents).with_context(setting)?;
        keys.set_hs256_secret(&secret).with_context(setting)?;
    }
    if let (Some(path), true) = (&config.jwks_file, keys.is_empty()) {
        // Starts anyway (the keys may be on their way, e.g. a Secret being
        // filled in), but say so: otherwise every 401 looks like the
        // client's fault.
        tracing::warn!(
            jwks = %path.display(),
            "{}",
            empty_jwks_warning(path)
        );
    }
    Ok(Authenticator::new(keys, policy))
}

/// The start-up warning of a JWKS without keys (and no HS256 secret).
pub fn empty_jwks_warning(path: &std::path::Path) -> String {
    format!(
        "the JWKS {} holds no keys and no --hs256-secret-file is set: every request with a token \
         will be refused (401 token_invalid). Put your token issuer's public keys in it (as \
         deploy/base/secret.yaml's jwks.json), or leave --jwks-file/CS_JWKS_FILE unset to use \
         the embedded development issuer",
        path.display()
    )
}

/// The owner-scope key: from `--owner-scope-secret-file` (shared by
/// replicas), else the data dir's own, created on first start.
fn owner_scope_secret(config: &ServeConfig) -> anyhow::Result<Vec<u8>> {
    let Some(path) = &config.owner_scope_secret_file else {
        return Ok(dev::ensure_server_secret(&config.data_dir)?);
    };
    let setting = || {
        format!(
            "--owner-scope-secret-file/CS_OWNER_SCOPE_SECRET_FILE {}",
            path.display()
        )
    };
    let contents = std::fs::read(path).with_context(setting)?;
    secret::parse_secret_file(&contents).with_context(setting)
}

/// Reads `--service-token-file`, if set; a refused token stops the start.
fn load_service_token(config: &ServeConfig) -> anyhow::Result<Option<ServiceToken>> {
    let Some(path) = &config.service_token_file else {
        return Ok(None);
    };
    let setting = || {
        format!(
            "--service-token-file/CS_SERVICE_TOKEN_FILE {}",
            path.display()
        )
    };
    let contents = std::fs::read(path).with_context(setting)?;
    let token = ServiceToken::from_file_contents(&contents).with_context(setting)?;
    Ok(Some(token))
}

/// The workload service over `storage`, after start-up recovery.
async fn build_workloads(
    config: &ServeConfig,
    storage: &Storage,
) -> anyhow::Result<WorkloadService> {
    let cache = Arc::new(crate::cache::BundleCache::new(config.cache_bytes));
    let (service, report) =
        WorkloadService::open(storage.clone(), config.workload_settings(), cache)
            .await
            .context("opening the workload store")?;
    // Owners recorded before they had kinds were token subjects (or
    // delegated ids sharing their namespace): they become subjects.
    let migrated = service
        .migrate_owners(Owner::legacy_key)
        .await
        .context("migrating stored owners")?;
    if let Some(m) = migrated {
        tracing::info!(
            from_version = m.from_version,
            workloads = m.workloads,
            grants = m.grants,
            "stored owners migrated to owners with kinds (sub:<sub>, user:<id>)"
        );
    }
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
