//! The process-wide TLS crypto provider, shared by everything that speaks
//! TLS: `contextctl`'s HTTP client and the S3 object store (reqwest is built
//! without a provider of its own), and the server's clients in tests.

/// Installs the process-wide TLS crypto provider (ring) once; later calls
/// (and a provider installed before) leave it as it is.
pub fn install_crypto_provider() {
    let _ = rustls::crypto::ring::default_provider().install_default();
}
