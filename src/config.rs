//! Service settings: every flag of `context-service serve` can also be set by
//! a `CS_*` environment variable.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use anyhow::Context as _;

use crate::auth::TokenPolicy;
use crate::bundle::Limits;
use crate::delivery::{AgentSet, DeliverySettings, Transport};
use crate::sandbox::{kube::KubeSettings, local::LocalSettings, SandboxSettings};
use crate::store::StorageSettings;
use crate::workload::{UploadLimits, WorkloadSettings};

/// Which sandbox backend the allocation engine uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum BackendKind {
    /// Sandboxes and workspaces are directories under the data dir.
    #[default]
    Local,
    /// A Kubernetes cluster with the agent-sandbox controller.
    Kube,
}

/// Log output format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum LogFormat {
    /// Human-readable lines.
    #[default]
    Text,
    /// One JSON object per line.
    Json,
}

/// Settings of `context-service serve`.
#[derive(Debug, Clone, clap::Args)]
pub struct ServeConfig {
    /// Address to listen on.
    #[arg(long, env = "CS_LISTEN_ADDR", default_value = "0.0.0.0:8080")]
    pub listen: SocketAddr,

    /// Serve `/metrics` on this address only (and not on `--listen`), so
    /// that scrapers reach it and API clients do not. Unset: `/metrics` is
    /// on the main address.
    #[arg(long, env = "CS_METRICS_ADDR")]
    pub metrics_addr: Option<SocketAddr>,

    /// Directory of the embedded store (metadata, bundles, keys, local sandboxes).
    #[arg(long, env = "CS_DATA_DIR", default_value = "./data")]
    pub data_dir: PathBuf,

    /// Keep workload metadata (workloads, upload grants, delivery runs) in
    /// this PostgreSQL database instead of the embedded one under the data
    /// dir, e.g. `postgres://cs:PASSWORD@db:5432/cs`, so that replicas share
    /// it; migrations run at start. Bundles stay under the data dir. The
    /// URL carries a password: set it from a Secret. Unset: embedded store.
    #[arg(long, env = "CS_DATABASE_URL")]
    pub database_url: Option<crate::store::DatabaseUrl>,

    /// Sandbox backend.
    #[arg(long, env = "CS_BACKEND", value_enum, default_value_t = BackendKind::Local)]
    pub backend: BackendKind,

    /// JWKS file with the keys trusted to sign tokens (EdDSA, ES256, RS256,
    /// selected by `kid`). Without it the service creates and trusts its own
    /// development signing key under the data dir.
    #[arg(long, env = "CS_JWKS_FILE")]
    pub jwks_file: Option<PathBuf>,

    /// File holding a shared secret to also accept HS256 tokens. Its bytes
    /// are the secret exactly as stored, unless it starts with `base64:` or
    /// `hex:` (then the rest, less one trailing newline, is decoded). The
    /// secret must be ≥ 32 bytes with ≥ 8 distinct byte values, else the
    /// service refuses to start.
    #[arg(long, env = "CS_HS256_SECRET_FILE")]
    pub hs256_secret_file: Option<PathBuf>,

    /// File holding the owner-scope key: the HMAC key that names owners
    /// where others can see (Kubernetes labels, folders in shared
    /// sandboxes). Same format and strength rules as `--hs256-secret-file`.
    /// Replicas serving the same owners must share it (mount it from a
    /// Secret). Unset: a random key kept under the data dir
    /// (`auth/server-secret`); to move such a replica onto a shared key
    /// without changing its owners' scopes, write `hex:` and that file's
    /// contents into this one.
    #[arg(long, env = "CS_OWNER_SCOPE_SECRET_FILE")]
    pub owner_scope_secret_file: Option<PathBuf>,

    /// The registry's externally visible base URL (`https://cs.example.com`),
    /// used in the `realm` of the OCI pull API's `401` challenges
    /// (`<url>/v2/token`). Unset: `http://` and the request's `Host`.
    #[arg(long, env = "CS_REGISTRY_URL")]
    pub registry_url: Option<String>,

    /// File holding the service token of the trusted ("Moca") routes
    /// (`/internal/v1/...`, upload capabilities): a caller presenting it as
    /// `Authorization: Bearer <token>` acts for the subject it names in
    /// `X-Context-Subject`. The file's contents less one trailing newline;
    /// at least 32 visible ASCII characters, else the service refuses to
    /// start. Compared in constant time. Unset: only JWTs with scope
    /// `delegate` reach the trusted routes.
    #[arg(long, env = "CS_SERVICE_TOKEN_FILE")]
    pub service_token_file: Option<PathBuf>,

    /// Required token issuer (`iss`).
    #[arg(long, env = "CS_TOKEN_ISSUER", default_value = "context-service")]
    pub token_issuer: String,

    /// Required token audience: `aud` must equal it, or be an array that
    /// contains it.
    #[arg(long, env = "CS_TOKEN_AUDIENCE", default_value = "context-service")]
    pub token_audience: String,

    /// Clock leeway for `exp`/`nbf`, in seconds (at most 60).
    #[arg(long, env = "CS_TOKEN_LEEWAY_SECS", default_value_t = 30)]
    pub token_leeway_secs: u64,

    /// Longest token lifetime accepted (`exp - iat`), e.g. `1h`; tokens then
    /// must carry `iat`. Unset: any lifetime. The development token is
    /// minted no longer than this.
    #[arg(long, env = "CS_TOKEN_MAX_LIFETIME", value_parser = humantime::parse_duration)]
    pub token_max_lifetime: Option<std::time::Duration>,

    /// Log format.
    #[arg(long, env = "CS_LOG_FORMAT", value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,

    /// Namespace of sandbox pools: their Sandboxes, SandboxClaims, workspace
    /// PVCs and the warm pools and existing claims they name.
    #[arg(long, env = "CS_NAMESPACE", default_value = "default")]
    pub namespace: String,

    /// A SandboxWarmPool the `local` backend offers to `warmPoolRef`
    /// (repeatable; the variable is comma-separated).
    #[arg(
        long = "local-warm-pool",
        value_name = "NAME",
        env = "CS_LOCAL_WARM_POOLS",
        value_delimiter = ','
    )]
    pub local_warm_pools: Vec<String>,

    /// Lifetime of a SandboxClaim: the `kube` backend sets
    /// `lifecycle.shutdownTime` to creation + this, with policy `Delete`, so
    /// a caller that never releases its pool cannot leak claims forever.
    #[arg(long, env = "CS_CLAIM_TTL", default_value = "24h", value_parser = humantime::parse_duration)]
    pub claim_ttl: std::time::Duration,

    /// Image of the sandbox container of direct pools (`kube` backend;
    /// required there).
    #[arg(long, env = "CS_SANDBOX_IMAGE")]
    pub kube_sandbox_image: Option<String>,

    /// `serviceAccountName` of sandbox pods of direct pools (`kube` backend).
    #[arg(long, env = "CS_SANDBOX_SERVICE_ACCOUNT")]
    pub kube_sandbox_service_account: Option<String>,

    /// Label claimed warm-pool pods with the pool label through the claim's
    /// `additionalPodMetadata` (`kube` backend). The agent-sandbox
    /// controller accepts it only with `context.rossoctl.io` in its allowed
    /// label domains; `false` for a stock controller.
    #[arg(long, env = "CS_CLAIM_POD_LABEL", default_value_t = true, action = clap::ArgAction::Set)]
    pub kube_claim_pod_label: bool,

    /// How long a pool create may take (`kube` backend), recorded on its
    /// objects: until then other replicas show it `provisioning`; after it
    /// an unfinished create counts as abandoned and any replica's reaper
    /// deletes it. Hidden, for tests: far above any real create.
    #[arg(long, hide = true, default_value = "2m", value_parser = humantime::parse_duration)]
    pub kube_create_window: std::time::Duration,

    /// How long a pool create (`kube` backend) waits at most for its
    /// workspace PVCs to bind before it makes the Sandboxes that mount
    /// them, on storage classes that bind `Immediate`ly (a pod meeting an
    /// unbound volume is retried by the scheduler with backoff of up to
    /// 10 s). Needs `get` on `storageclasses`; `0s`: never wait.
    #[arg(long, env = "CS_KUBE_VOLUME_BIND_TIMEOUT", default_value = "10s", value_parser = humantime::parse_duration)]
    pub kube_volume_bind_timeout: std::time::Duration,

    /// Most workloads per owner.
    #[arg(long, env = "CS_WORKLOAD_QUOTA", default_value_t = 20)]
    pub workload_quota: usize,

    /// Most sandbox replicas one owner's pools hold together; a create
    /// past it answers `429 pool_quota_exceeded`. `0`: no quota.
    #[arg(long, env = "CS_POOL_REPLICA_QUOTA", default_value_t = 100)]
    pub pool_replica_quota: u32,

    /// Shortest `ttl` a pool may ask for, e.g. `1m`; shorter ones answer
    /// `400 invalid_request`.
    #[arg(long, env = "CS_POOL_TTL_MIN", default_value = "1m", value_parser = humantime::parse_duration)]
    pub pool_ttl_min: std::time::Duration,

    /// Longest `ttl` a pool may ask for, e.g. `168h`; longer ones answer
    /// `400 invalid_request`. Pools without a `ttl` never expire.
    #[arg(long, env = "CS_POOL_TTL_MAX", default_value = "168h", value_parser = humantime::parse_duration)]
    pub pool_ttl_max: std::time::Duration,

    /// Most named contexts one owner holds, across namespaces; a create
    /// past it answers `429 context_quota_exceeded`. `0`: no quota.
    #[arg(long, env = "CS_CONTEXT_QUOTA", default_value_t = 20)]
    pub context_quota: u32,

    /// Lifetime of a one-time upload grant, e.g. `5m`.
    #[arg(long, env = "CS_UPLOAD_GRANT_TTL", default_value = "5m", value_parser = humantime::parse_duration)]
    pub upload_grant_ttl: std::time::Duration,

    /// Most uploads processed at once in the whole service (1 to 256); more
    /// are refused with `429 too_many_uploads` and `Retry-After`. Each
    /// running upload holds a blocking thread, so this also bounds threads.
    #[arg(long, env = "CS_UPLOAD_MAX_CONCURRENT", default_value_t = 16,
          value_parser = clap::value_parser!(u32).range(1..=crate::workload::MAX_CONCURRENT_UPLOADS as i64))]
    pub upload_max_concurrent: u32,

    /// Most uploads processed at once per owner (grant uploads count for
    /// the workload's owner); more are refused with `429 too_many_uploads`.
    #[arg(long, env = "CS_UPLOAD_MAX_PER_OWNER", default_value_t = 4,
          value_parser = clap::value_parser!(u32).range(1..))]
    pub upload_max_per_owner: u32,

    /// Temporary disk (spool and speculative gzip, under `<data-dir>/tmp`)
    /// all running uploads may hold together, in bytes (4 GiB by default);
    /// an upload that finds it used up is refused with
    /// `503 temp_space_exhausted` and `Retry-After`.
    #[arg(long, env = "CS_UPLOAD_TEMP_MAX_BYTES", default_value_t = crate::workload::DEFAULT_UPLOAD_TEMP_BYTES)]
    pub upload_temp_max_bytes: u64,

    /// Object storage for bundle bytes, `s3://<bucket>[/<prefix>]`, shared
    /// by the replicas that share one metadata store (endpoint, region and credentials from `AWS_*`
    /// variables: `AWS_ENDPOINT_URL`, `AWS_REGION`, `AWS_ACCESS_KEY_ID`,
    /// `AWS_SECRET_ACCESS_KEY`). The local blobs under the data dir are then
    /// this replica's copy. Unset: bundles live only under the data dir.
    #[arg(long, env = "CS_BLOB_URL")]
    pub blob_url: Option<String>,
    /// With `--blob-url`: how old an object no workload names must be
    /// before it is deleted from object storage, e.g. `15m` (another
    /// replica may have stored it and not yet named it).
    #[arg(long, env = "CS_BLOB_GC_GRACE", default_value = "15m", value_parser = humantime::parse_duration)]
    pub blob_gc_grace: std::time::Duration,
    /// With `--blob-url`: about how many bytes this replica's disk copies
    /// of stored bundles may take (8 GiB by default); the least recently
    /// used are dropped beyond it and fetched again when needed.
    #[arg(long, env = "CS_BLOB_LOCAL_MAX_BYTES", default_value_t = crate::store::DEFAULT_BLOB_LOCAL_BYTES)]
    pub blob_local_max_bytes: u64,
    /// Byte budget of the in-memory bundle cache (512 MiB by default).
    #[arg(long, env = "CS_CACHE_BYTES", default_value_t = 512 * 1024 * 1024)]
    pub cache_bytes: u64,

    /// Largest compressed bundle upload, in bytes (256 MiB by default).
    #[arg(long, env = "CS_BUNDLE_MAX_BYTES", default_value_t = 256 * 1024 * 1024)]
    pub bundle_max_bytes: u64,

    /// Most bytes a bundle may inflate to (1.25 GiB by default).
    #[arg(long, env = "CS_BUNDLE_MAX_INFLATED_BYTES", default_value_t = 1280 * 1024 * 1024)]
    pub bundle_max_inflated_bytes: u64,

    /// Most entries (files and directories) in a bundle.
    #[arg(long, env = "CS_BUNDLE_MAX_ENTRIES", default_value_t = 10_000)]
    pub bundle_max_entries: u64,

    /// Largest single file in a bundle, in bytes (256 MiB by default).
    #[arg(long, env = "CS_BUNDLE_MAX_FILE_BYTES", default_value_t = 256 * 1024 * 1024)]
    pub bundle_max_file_bytes: u64,

    /// Deflate threads of each upload's canonical gzip, 1 to 4; `0`: one per
    /// core, at most 4. The bundle's bytes do not depend on it.
    #[arg(long, env = "CS_BUNDLE_THREADS", default_value_t = 0,
          value_parser = clap::value_parser!(u8).range(0..=4))]
    pub bundle_threads: u8,

    /// Longest time a client may take to send a request's line and headers;
    /// the connection is closed after it. hyper starts this timer whenever
    /// it waits for a request, so it is also how long an idle keep-alive
    /// connection stays open.
    #[arg(long, env = "CS_HEADER_READ_TIMEOUT", default_value = "30s", value_parser = humantime::parse_duration)]
    pub header_read_timeout: std::time::Duration,

    /// Longest pause between two pieces of a request body (uploads
    /// included); the request then ends with `408 request_timeout`.
    #[arg(long, env = "CS_BODY_IDLE_TIMEOUT", default_value = "30s", value_parser = humantime::parse_duration)]
    pub body_idle_timeout: std::time::Duration,

    /// Longest time a request may take until its answer starts, except
    /// bundle uploads and downloads (they stream), deliveries (bounded per
    /// sandbox by `--delivery-timeout`) and `?wait=ready` long-polls
    /// (bounded on their own); then `503 deadline_exceeded`.
    #[arg(long, env = "CS_REQUEST_DEADLINE", default_value = "60s", value_parser = humantime::parse_duration)]
    pub request_deadline: std::time::Duration,

    /// Most open client connections; further ones are answered
    /// `503 too_many_connections` and closed.
    #[arg(long, env = "CS_MAX_CONNECTIONS", default_value_t = 1024)]
    pub max_connections: usize,

    /// Most open connections from one client address (0: no per-address
    /// cap). Behind a proxy that funnels every client through one address,
    /// raise it or set 0.
    #[arg(long, env = "CS_MAX_CONNECTIONS_PER_IP", default_value_t = 128)]
    pub max_connections_per_ip: usize,

    /// Most threads of the blocking pool, where store calls, file reads and
    /// running uploads (one thread each) wait; work beyond it queues rather
    /// than starting a thread per waiting request. At least
    /// `--upload-max-concurrent` + 16, so that running uploads leave room.
    #[arg(long, env = "CS_MAX_BLOCKING_THREADS", default_value_t = 64,
          value_parser = clap::value_parser!(u32).range(1..=1024))]
    pub max_blocking_threads: u32,

    /// Requests served on one keep-alive connection before it is closed
    /// (0: no limit).
    #[arg(long, env = "CS_MAX_REQUESTS_PER_CONNECTION", default_value_t = 1000)]
    pub max_requests_per_connection: usize,

    /// On SIGTERM or SIGINT, how long `/readyz` answers `503` while new
    /// connections are still served, so that load balancers stop sending
    /// traffic before the listener closes (`0s`: close at once). SIGINT
    /// (Ctrl-C) ends it early once no request is in flight.
    #[arg(long, env = "CS_SHUTDOWN_GRACE", default_value = "5s", value_parser = humantime::parse_duration)]
    pub shutdown_grace: std::time::Duration,

    /// Once the listener is closed, how long in-flight requests (downloads
    /// and uploads included) may take to finish; connections still open
    /// then are closed, and the store is closed after them.
    #[arg(long, env = "CS_SHUTDOWN_TIMEOUT", default_value = "30s", value_parser = humantime::parse_duration)]
    pub shutdown_timeout: std::time::Duration,

    /// Delivery root inside every sandbox: where delivered revisions, run
    /// views and the lock live. Absolute, or relative to the exec's working
    /// directory. On `local` it is taken inside the sandbox directory.
    #[arg(long, env = "CS_DELIVERY_ROOT", default_value = "/workspace/.context")]
    pub delivery_root: String,

    /// Unreferenced revisions each owner keeps per sandbox after their last
    /// run is released (0: removed at once).
    #[arg(long, env = "CS_DELIVERY_RETENTION", default_value_t = 0)]
    pub delivery_retention: u32,

    /// Longest a delivery (or release) into one sandbox may take, e.g. `5m`.
    #[arg(long, env = "CS_DELIVERY_TIMEOUT", default_value = "5m", value_parser = humantime::parse_duration)]
    pub delivery_timeout: std::time::Duration,

    /// Most sandboxes one pool-wide delivery serves at once.
    #[arg(long, env = "CS_DELIVERY_PARALLELISM", default_value_t = 8)]
    pub delivery_parallelism: usize,

    /// Budget of bundle bytes read from disk and held for deliveries at
    /// once, process-wide (512 MiB by default).
    #[arg(long, env = "CS_DELIVERY_INFLIGHT_BYTES", default_value_t = 512 * 1024 * 1024)]
    pub delivery_inflight_bytes: u64,

    /// Label selector (`k=v,k2=v2`) of shared sandboxes every owner may
    /// deliver into (e.g. a platform-owned pool: `context.rossoctl.io/pool=shared`).
    #[arg(long, env = "CS_DELIVERY_SHARED_SELECTOR")]
    pub delivery_shared_selector: Option<String>,

    /// Container of the sandbox pod that deliveries exec into (`kube`
    /// backend; default: the pod's first container).
    #[arg(long, env = "CS_DELIVERY_CONTAINER")]
    pub delivery_container: Option<String>,

    /// Directory holding the in-sandbox delivery agents
    /// (`context-agent-x86_64`, `context-agent-aarch64`; whichever exist).
    /// Default: the directory of the service's executable.
    #[arg(long, env = "CS_DELIVERY_AGENT_DIR")]
    pub delivery_agent_dir: Option<PathBuf>,

    /// How deliveries reach a sandbox: `auto` (the injected agent where
    /// one fits the sandbox and can run there, else the script), `exec`
    /// (the same, but an agent must be present at start) or `script`.
    #[arg(long, env = "CS_DELIVERY_TRANSPORT", default_value = "auto", value_parser = ["auto", "exec", "script"])]
    pub delivery_transport: String,
}

impl ServeConfig {
    /// Settings with every default, storing under `data_dir` and listening on
    /// `listen` (`CS_*` variables still apply, as they do for `serve`).
    pub fn with_defaults(data_dir: PathBuf, listen: SocketAddr) -> Self {
        #[derive(clap::Parser)]
        struct Wrapper {
            #[command(flatten)]
            config: ServeConfig,
        }
        let mut config = <Wrapper as clap::Parser>::parse_from(["serve"]).config;
        config.data_dir = data_dir;
        config.listen = listen;
        config
    }
}

/// Each component's settings, derived from the flags beside the flags, so
/// that settings flow one way: no component knows `ServeConfig`.
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
            uploads: UploadLimits {
                max_concurrent: self.upload_max_concurrent,
                max_per_owner: self.upload_max_per_owner,
            },
            upload_temp_bytes: self.upload_temp_max_bytes,
            deflate_threads: self.bundle_threads.into(),
        }
    }

    /// Where the store keeps metadata and bundles.
    pub fn storage_settings(&self) -> StorageSettings {
        StorageSettings {
            database_url: self.database_url.clone(),
            blob_url: self.blob_url.clone(),
            blob_gc_grace: self.blob_gc_grace,
            blob_local_max_bytes: self.blob_local_max_bytes,
        }
    }

    /// The delivery service's settings. The root is taken inside the
    /// sandbox directory on `local` (made relative to the exec's working
    /// directory, which is the sandbox directory there).
    pub fn delivery_settings(&self) -> anyhow::Result<DeliverySettings> {
        let root = match self.backend {
            BackendKind::Local => self.delivery_root.trim_start_matches('/').to_owned(),
            BackendKind::Kube => self.delivery_root.clone(),
        };
        let shared_selector = match self.delivery_shared_selector.as_deref().map(str::trim) {
            None | Some("") => None,
            Some(s) => Some(s.parse().context("--delivery-shared-selector")?),
        };
        let transport: Transport = self
            .delivery_transport
            .parse()
            .map_err(|e: String| anyhow::anyhow!(e))?;
        let agents = match transport {
            Transport::Script => AgentSet::default(),
            Transport::Auto | Transport::Exec => {
                let dir = match &self.delivery_agent_dir {
                    Some(d) => d.clone(),
                    None => std::env::current_exe()
                        .ok()
                        .and_then(|p| p.parent().map(Path::to_owned))
                        .unwrap_or_default(),
                };
                AgentSet::load(&dir).context("--delivery-agent-dir")?
            }
        };
        let settings = DeliverySettings {
            root,
            retention: self.delivery_retention,
            timeout: self.delivery_timeout,
            parallelism: self.delivery_parallelism,
            inflight_bytes: self.delivery_inflight_bytes,
            shared_selector,
            transport,
            agents: std::sync::Arc::new(agents),
        };
        settings.validate()?;
        Ok(settings)
    }

    /// The token policy these settings describe.
    pub fn token_policy(&self) -> TokenPolicy {
        TokenPolicy {
            issuer: self.token_issuer.clone(),
            audience: self.token_audience.clone(),
            leeway_secs: self.token_leeway_secs,
            max_lifetime: self.token_max_lifetime,
        }
    }

    /// The sandbox backend these settings select, with its settings:
    /// `local` under `<data-dir>/local`; `kube` with `--namespace`,
    /// `--kube-sandbox-image`, `--kube-sandbox-service-account`,
    /// `--claim-ttl`, `--kube-claim-pod-label`, `--kube-volume-bind-timeout`
    /// and the hidden `--kube-create-window`, every other setting at its
    /// default.
    pub fn sandbox_settings(&self) -> SandboxSettings {
        match self.backend {
            BackendKind::Local => SandboxSettings::Local(LocalSettings {
                root: self.data_dir.join("local"),
                namespace: self.namespace.clone(),
                warm_pools: self.local_warm_pools.clone(),
            }),
            BackendKind::Kube => {
                let mut settings = KubeSettings::new(
                    self.namespace.clone(),
                    self.kube_sandbox_image.clone().unwrap_or_default(),
                );
                settings.sandbox_service_account = self
                    .kube_sandbox_service_account
                    .clone()
                    .filter(|account| !account.is_empty());
                settings.claim_ttl = self.claim_ttl;
                settings.claim_pod_label = self.kube_claim_pod_label;
                settings.create_window = self.kube_create_window;
                settings.volume_bind_timeout = self.kube_volume_bind_timeout;
                settings.delivery_container = self
                    .delivery_container
                    .clone()
                    .filter(|container| !container.is_empty());
                SandboxSettings::Kube(Box::new(settings))
            }
        }
    }
}
