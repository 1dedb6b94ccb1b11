//! The keys tokens are verified with, each bound to one algorithm.

use std::collections::HashMap;
use std::path::Path;

use base64::Engine as _;

use jsonwebtoken::jwk::{AlgorithmParameters, EllipticCurve, Jwk, JwkSet, KeyAlgorithm};
use jsonwebtoken::{Algorithm, DecodingKey};

/// Why a key could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum KeyError {
    /// The file could not be read.
    #[error("reading {path}: {source}")]
    Read {
        /// The file.
        path: String,
        /// The cause.
        source: std::io::Error,
    },
    /// The JWKS is not valid JSON of the right shape.
    #[error("parsing the JWKS: {0}")]
    Parse(#[from] serde_json::Error),
    /// A key has no `kid`; keys are selected by `kid`.
    #[error("a JWKS key has no \"kid\"")]
    MissingKid,
    /// A `kid` appears twice.
    #[error("the JWKS lists kid {0:?} twice")]
    DuplicateKid(String),
    /// A key is of a type or algorithm this service does not accept.
    #[error("key {kid:?}: {reason}")]
    Unsupported {
        /// The key.
        kid: String,
        /// What is wrong with it.
        reason: String,
    },
    /// The key material is malformed.
    #[error("key {kid:?}: {source}")]
    Invalid {
        /// The key.
        kid: String,
        /// The cause.
        source: jsonwebtoken::errors::Error,
    },
    /// The HS256 secret is malformed, too short or trivially guessable.
    #[error(transparent)]
    WeakSecret(#[from] super::secret::SecretError),
}

/// Smallest RSA modulus accepted in a JWKS, in bits (NIST SP 800-131A).
pub const MIN_RSA_BITS: usize = 2048;

/// The size in bits of a JWK's base64url big-endian modulus `n`.
pub(super) fn rsa_modulus_bits(n: &str) -> Option<usize> {
    let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(n.trim_end_matches('='))
        .ok()?;
    let first = bytes.iter().position(|b| *b != 0)?;
    let top = bytes[first];
    Some((bytes.len() - first - 1) * 8 + (8 - top.leading_zeros() as usize))
}

/// A key and the one algorithm it verifies.
#[derive(Clone)]
pub struct VerifyingKey {
    key: DecodingKey,
    algorithm: Algorithm,
}

impl std::fmt::Debug for VerifyingKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "VerifyingKey({:?})", self.algorithm)
    }
}

impl VerifyingKey {
    /// The algorithm this key verifies.
    pub fn algorithm(&self) -> Algorithm {
        self.algorithm
    }

    /// The key material.
    pub fn decoding_key(&self) -> &DecodingKey {
        &self.key
    }

    /// Builds a key from one JWK: EdDSA (Ed25519), ES256 (P-256) or RS256.
    pub fn from_jwk(jwk: &Jwk) -> Result<(String, Self), KeyError> {
        let kid = jwk.common.key_id.clone().ok_or(KeyError::MissingKid)?;
        let unsupported = |reason: &str| KeyError::Unsupported {
            kid: kid.clone(),
            reason: reason.to_owned(),
        };
        let algorithm = match &jwk.algorithm {
            AlgorithmParameters::OctetKeyPair(p) if p.curve == EllipticCurve::Ed25519 => {
                Algorithm::EdDSA
            }
            AlgorithmParameters::EllipticCurve(p) if p.curve == EllipticCurve::P256 => {
                Algorithm::ES256
            }
            AlgorithmParameters::RSA(p) => {
                let bits = rsa_modulus_bits(&p.n)
                    .ok_or_else(|| unsupported("its RSA modulus \"n\" is not base64url"))?;
                if bits < MIN_RSA_BITS {
                    return Err(unsupported(&format!(
                        "its RSA modulus has {bits} bits; at least {MIN_RSA_BITS} are required"
                    )));
                }
                Algorithm::RS256
            }
            _ => {
                return Err(unsupported(
                    "only Ed25519 (EdDSA), P-256 (ES256) and RSA (RS256) keys are accepted",
                ))
            }
        };
        if let Some(declared) = jwk.common.key_algorithm {
            let matches = matches!(
                (declared, algorithm),
                (KeyAlgorithm::EdDSA, Algorithm::EdDSA)
                    | (KeyAlgorithm::ES256, Algorithm::ES256)
                    | (KeyAlgorithm::RS256, Algorithm::RS256)
            );
            if !matches {
                return Err(unsupported("its \"alg\" does not fit its key type"));
            }
        }
        let key = DecodingKey::from_jwk(jwk).map_err(|source| KeyError::Invalid {
            kid: kid.clone(),
            source,
        })?;
        Ok((kid, Self { key, algorithm }))
    }
}

/// The trusted keys: asymmetric keys by `kid`, and an optional HS256 secret
/// that is used only when configured explicitly.
#[derive(Debug, Default, Clone)]
pub struct KeySet {
    by_kid: HashMap<String, VerifyingKey>,
    hs256: Option<VerifyingKey>,
}

impl KeySet {
    /// An empty key set (verifies nothing).
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds every key of a JWKS document.
    pub fn add_jwks(&mut self, jwks: &JwkSet) -> Result<(), KeyError> {
        for jwk in &jwks.keys {
            let (kid, key) = VerifyingKey::from_jwk(jwk)?;
            if self.by_kid.insert(kid.clone(), key).is_some() {
                return Err(KeyError::DuplicateKid(kid));
            }
        }
        Ok(())
    }

    /// Adds every key of a JWKS file.
    pub fn add_jwks_file(&mut self, path: &Path) -> Result<(), KeyError> {
        let text = std::fs::read_to_string(path).map_err(|source| KeyError::Read {
            path: path.display().to_string(),
            source,
        })?;
        let jwks: JwkSet = serde_json::from_str(&text)?;
        self.add_jwks(&jwks)
    }

    /// Trusts HS256 tokens signed with `secret`, used byte for byte; it
    /// must pass [`super::secret::check_strength`] first.
    pub fn set_hs256_secret(&mut self, secret: &[u8]) -> Result<(), KeyError> {
        super::secret::check_strength(secret)?;
        self.hs256 = Some(VerifyingKey {
            key: DecodingKey::from_secret(secret).map_err(|source| KeyError::Invalid {
                kid: "hs256".to_owned(),
                source,
            })?,
            algorithm: Algorithm::HS256,
        });
        Ok(())
    }

    /// How many keys are trusted.
    pub fn len(&self) -> usize {
        self.by_kid.len() + usize::from(self.hs256.is_some())
    }

    /// Whether no key is trusted.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The key for a token whose header says `kid` and `alg`. The header's
    /// algorithm only selects; it must equal the key's own algorithm.
    pub fn select(&self, kid: Option<&str>, alg: Algorithm) -> Option<&VerifyingKey> {
        let key = match kid.and_then(|k| self.by_kid.get(k)) {
            Some(key) => Some(key),
            None if alg == Algorithm::HS256 => self.hs256.as_ref(),
            // Without a kid, a single asymmetric key is unambiguous.
            None if kid.is_none() && self.by_kid.len() == 1 => self.by_kid.values().next(),
            None => None,
        }?;
        (key.algorithm == alg).then_some(key)
    }
}
