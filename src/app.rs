//! The application state shared by every handler, and how it is built from
//! settings.

use std::sync::Arc;

use anyhow::Context as _;
use axum::extract::FromRef;

use crate::auth::dev::{self, DevIssuer};
use crate::auth::{Authenticator, KeySet, OwnerScope};
use crate::config::ServeConfig;
use crate::fsutil;
use crate::pool::PoolService;

/// Everything handlers need. Cheap to clone.
#[derive(Clone)]
pub struct AppState {
    /// Verifies bearer tokens.
    pub auth: Arc<Authenticator>,
    /// Computes owner scopes (labels, sandbox folders).
    pub owner_scope: OwnerScope,
    /// Sandbox pools and named contexts.
    pub pools: Arc<PoolService>,
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
        let backend = crate::backend::from_config(config)
            .await
            .with_context(|| format!("opening the {:?} sandbox backend", config.backend))?;
        let pools = Arc::new(PoolService::new(backend));
        Ok(Self {
            auth,
            owner_scope,
            pools,
        })
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
