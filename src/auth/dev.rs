//! The embedded default's own token issuer.
//!
//! On first start without a configured JWKS the service creates an Ed25519
//! signing key under `<data-dir>/auth/`, trusts it, and writes a development
//! token there that `contextctl` picks up by itself. `contextctl token mint`
//! signs more tokens with the same key for local testing with several users.

use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use base64::Engine;
use ed25519_dalek::pkcs8::{DecodePrivateKey, EncodePrivateKey};
use ed25519_dalek::SigningKey;
use jsonwebtoken::jwk::{
    AlgorithmParameters, CommonParameters, EllipticCurve, Jwk, JwkSet, KeyAlgorithm,
    OctetKeyPairParameters, OctetKeyPairType, PublicKeyUse,
};
use jsonwebtoken::{encode, Algorithm, EncodingKey, Header};
use rand::RngCore;
use sha2::{Digest, Sha256};

use super::{Claims, Scope, TokenPolicy};
use crate::fsutil;

/// Folder under the data dir that holds keys and the development token.
pub const AUTH_DIR: &str = "auth";
const SIGNING_KEY_FILE: &str = "signing-key.pem";
const DEV_TOKEN_FILE: &str = "dev-token";
const SERVER_SECRET_FILE: &str = "server-secret";
/// Subject of the development token.
pub const DEV_SUBJECT: &str = "dev";
/// Lifetime of the development token, re-minted at every start.
pub const DEV_TOKEN_TTL: Duration = Duration::from_secs(30 * 24 * 3600);

/// Why the embedded issuer could not be set up or used.
#[derive(Debug, thiserror::Error)]
pub enum DevAuthError {
    /// Reading or writing a key file failed.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The cause.
        source: std::io::Error,
    },
    /// The stored key is not a valid Ed25519 PKCS#8 key.
    #[error("{path}: not an Ed25519 PKCS#8 private key")]
    BadKey {
        /// The file.
        path: PathBuf,
    },
    /// No signing key exists yet (the service has not started there).
    #[error("no signing key at {0}; start `context-service serve` with this data dir first")]
    Missing(PathBuf),
    /// Signing failed.
    #[error("signing a token: {0}")]
    Sign(#[from] jsonwebtoken::errors::Error),
}

fn io_err(path: &Path) -> impl FnOnce(std::io::Error) -> DevAuthError + '_ {
    move |source| DevAuthError::Io {
        path: path.to_owned(),
        source,
    }
}

/// The embedded signing key.
pub struct DevIssuer {
    kid: String,
    public: [u8; 32],
    encoding: EncodingKey,
}

impl std::fmt::Debug for DevIssuer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "DevIssuer(kid={})", self.kid)
    }
}

impl DevIssuer {
    /// Loads the signing key under `data_dir`, creating it on first use.
    pub fn ensure(data_dir: &Path) -> Result<Self, DevAuthError> {
        let path = signing_key_path(data_dir);
        if !path.exists() {
            let mut seed = [0u8; 32];
            rand::rng().fill_bytes(&mut seed);
            let key = SigningKey::from_bytes(&seed);
            let pem = key
                .to_pkcs8_pem(Default::default())
                .map_err(|_| DevAuthError::BadKey { path: path.clone() })?;
            fsutil::ensure_dir(&data_dir.join(AUTH_DIR), 0o700).map_err(io_err(&path))?;
            fsutil::write_atomic(&path, pem.as_bytes(), 0o600).map_err(io_err(&path))?;
        }
        Self::load(data_dir)
    }

    /// Loads the existing signing key under `data_dir`.
    pub fn load(data_dir: &Path) -> Result<Self, DevAuthError> {
        let path = signing_key_path(data_dir);
        if !path.exists() {
            return Err(DevAuthError::Missing(path));
        }
        let pem = std::fs::read_to_string(&path).map_err(io_err(&path))?;
        let key = SigningKey::from_pkcs8_pem(&pem)
            .map_err(|_| DevAuthError::BadKey { path: path.clone() })?;
        let der = key
            .to_pkcs8_der()
            .map_err(|_| DevAuthError::BadKey { path: path.clone() })?;
        let public = key.verifying_key().to_bytes();
        let kid = format!("dev-{}", &hex::encode(Sha256::digest(public))[..16]);
        Ok(Self {
            kid,
            public,
            encoding: EncodingKey::from_ed_der(der.as_bytes()),
        })
    }

    /// The key id tokens are signed under.
    pub fn kid(&self) -> &str {
        &self.kid
    }

    /// The public key as a JWKS document.
    pub fn jwks(&self) -> JwkSet {
        JwkSet {
            keys: vec![Jwk {
                common: CommonParameters {
                    public_key_use: Some(PublicKeyUse::Signature),
                    key_algorithm: Some(KeyAlgorithm::EdDSA),
                    key_id: Some(self.kid.clone()),
                    ..Default::default()
                },
                algorithm: AlgorithmParameters::OctetKeyPair(OctetKeyPairParameters {
                    key_type: OctetKeyPairType::OctetKeyPair,
                    curve: EllipticCurve::Ed25519,
                    x: base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(self.public),
                }),
            }],
        }
    }

    /// Signs a token for `sub` with `scope` that expires after `ttl`.
    pub fn mint(
        &self,
        policy: &TokenPolicy,
        sub: &str,
        scope: &str,
        ttl: Duration,
    ) -> Result<String, DevAuthError> {
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default()
            .as_secs();
        let claims = Claims {
            sub: sub.to_owned(),
            iss: policy.issuer.clone(),
            aud: policy.audience.clone().into(),
            exp: now + ttl.as_secs(),
            iat: Some(now),
            nbf: Some(now),
            scope: scope.to_owned(),
        };
        let mut header = Header::new(Algorithm::EdDSA);
        header.kid = Some(self.kid.clone());
        Ok(encode(&header, &claims, &self.encoding)?)
    }

    /// Mints the development token (all user scopes, for
    /// [`DEV_TOKEN_TTL`] or the policy's maximum lifetime if shorter) and
    /// writes it where `contextctl` looks for it. Returns the file's path.
    pub fn write_dev_token(
        &self,
        data_dir: &Path,
        policy: &TokenPolicy,
    ) -> Result<PathBuf, DevAuthError> {
        // Never longer than the service accepts.
        let ttl = policy
            .max_lifetime
            .map_or(DEV_TOKEN_TTL, |max| max.min(DEV_TOKEN_TTL));
        let token = self.mint(policy, DEV_SUBJECT, &Scope::user_scopes(), ttl)?;
        let path = dev_token_path(data_dir);
        fsutil::write_atomic(&path, format!("{token}\n").as_bytes(), 0o600)
            .map_err(io_err(&path))?;
        Ok(path)
    }
}

/// Where the signing key lives under `data_dir`.
pub fn signing_key_path(data_dir: &Path) -> PathBuf {
    data_dir.join(AUTH_DIR).join(SIGNING_KEY_FILE)
}

/// Where the development token lives under `data_dir`.
pub fn dev_token_path(data_dir: &Path) -> PathBuf {
    data_dir.join(AUTH_DIR).join(DEV_TOKEN_FILE)
}

/// Loads the server secret (HMAC key for owner scopes) under `data_dir`,
/// creating 32 random bytes on first use.
pub fn ensure_server_secret(data_dir: &Path) -> Result<Vec<u8>, DevAuthError> {
    let path = data_dir.join(AUTH_DIR).join(SERVER_SECRET_FILE);
    if !path.exists() {
        let mut secret = [0u8; 32];
        rand::rng().fill_bytes(&mut secret);
        fsutil::ensure_dir(&data_dir.join(AUTH_DIR), 0o700).map_err(io_err(&path))?;
        fsutil::write_atomic(&path, hex::encode(secret).as_bytes(), 0o600)
            .map_err(io_err(&path))?;
    }
    let text = std::fs::read_to_string(&path).map_err(io_err(&path))?;
    hex::decode(text.trim())
        .ok()
        .filter(|s| s.len() >= 16)
        .ok_or(DevAuthError::BadKey { path })
}
