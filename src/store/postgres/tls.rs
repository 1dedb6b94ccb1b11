//! TLS to the database, from the URL's libpq-style `sslmode` and
//! `sslrootcert` parameters.
//!
//! TLS here is always **verified**: the server's chain against the CA
//! certificates of `sslrootcert` (a PEM file, or `system` for the host's
//! store, the default) and its name (or IP address) against the URL's
//! host. libpq's `require`, which encrypts without checking who answers,
//! is verified too, since an unverified channel to the metadata store
//! protects nothing against the one attack TLS is for; `verify-ca` is
//! `verify-full` for the same reason. `disable`, `prefer` and no `sslmode`
//! connect over plain TCP (or a Unix socket), as before.
//!
//! tokio-postgres knows `sslmode` only up to `require` and refuses
//! `sslrootcert`, so both are taken out of the URL before it parses it.

use std::path::PathBuf;
use std::str::FromStr;
use std::sync::Arc;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::CertificateDer;
use rustls::{ClientConfig, RootCertStore};
use tokio_postgres::config::SslMode;
use tokio_postgres_rustls::MakeRustlsConnect;

/// Where the CA certificates that verify the server come from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Roots {
    /// The host's certificate store (`sslrootcert=system` or none given).
    System,
    /// A PEM file of one or more CA certificates.
    File(PathBuf),
}

/// How connections are made.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Transport {
    /// Plain TCP or a Unix socket.
    Plain,
    /// Verified TLS.
    Tls(Roots),
}

/// A URL split into what tokio-postgres reads and how to secure it.
#[derive(Debug)]
pub(super) struct Connection {
    /// The connection settings (`sslmode` set to `require` for TLS).
    pub(super) config: tokio_postgres::Config,
    /// Plain or verified TLS.
    pub(super) transport: Transport,
}

/// Reads `url`'s TLS parameters; the rest is tokio-postgres's to parse.
pub(super) fn parse(url: &str) -> Result<Connection, String> {
    let (base, query) = match url.split_once('?') {
        Some((base, query)) => (base, query),
        None => (url, ""),
    };
    let mut mode: Option<String> = None;
    let mut root_cert: Option<String> = None;
    let mut rest = Vec::new();
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        // The raw pair goes on to tokio-postgres as given; ours are decoded.
        let (key, value) = url::form_urlencoded::parse(pair.as_bytes())
            .next()
            .unwrap_or_default();
        match key.as_ref() {
            "sslmode" => mode = Some(value.into_owned()),
            "sslrootcert" => root_cert = Some(value.into_owned()),
            _ => rest.push(pair),
        }
    }
    let verified = match mode.as_deref() {
        None | Some("disable" | "allow" | "prefer") => false,
        Some("require" | "verify-ca" | "verify-full") => true,
        Some(other) => {
            return Err(format!(
                "sslmode={other}: expected disable, prefer, require, verify-ca or verify-full"
            ))
        }
    };
    let transport = match (verified, root_cert) {
        (false, Some(_)) => {
            return Err(
                "sslrootcert needs sslmode=require, verify-ca or verify-full (TLS is off)"
                    .to_owned(),
            )
        }
        (false, None) => Transport::Plain,
        (true, None) => Transport::Tls(Roots::System),
        (true, Some(path)) if path == "system" => Transport::Tls(Roots::System),
        (true, Some(path)) if path.is_empty() => {
            return Err("sslrootcert is empty: give a PEM file or `system`".to_owned())
        }
        (true, Some(path)) => Transport::Tls(Roots::File(PathBuf::from(path))),
    };
    let passed = if rest.is_empty() {
        base.to_owned()
    } else {
        format!("{base}?{}", rest.join("&"))
    };
    let mut config = tokio_postgres::Config::from_str(&passed)
        .map_err(|e| format!("invalid database URL: {e}"))?;
    config.ssl_mode(match transport {
        Transport::Plain => SslMode::Disable,
        Transport::Tls(_) => SslMode::Require,
    });
    Ok(Connection { config, transport })
}

/// The TLS connector for `roots`: ring, TLS 1.2 and 1.3, no client
/// certificate.
pub(super) fn connector(roots: &Roots) -> Result<MakeRustlsConnect, String> {
    let mut store = RootCertStore::empty();
    match roots {
        Roots::System => {
            let found = rustls_native_certs::load_native_certs();
            let (added, _) = store.add_parsable_certificates(found.certs);
            if added == 0 {
                return Err(
                    "sslrootcert=system: the host has no CA certificates; give sslrootcert=<PEM file>"
                        .to_owned(),
                );
            }
        }
        Roots::File(path) => {
            let shown = path.display();
            let certs = CertificateDer::pem_file_iter(path)
                .map_err(|e| format!("sslrootcert {shown}: {e}"))?
                .collect::<Result<Vec<_>, _>>()
                .map_err(|e| format!("sslrootcert {shown}: {e}"))?;
            if certs.is_empty() {
                return Err(format!("sslrootcert {shown}: no PEM certificate in it"));
            }
            for cert in certs {
                store
                    .add(cert)
                    .map_err(|e| format!("sslrootcert {shown}: {e}"))?;
            }
        }
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| format!("TLS settings: {e}"))?
        .with_root_certificates(store)
        .with_no_client_auth();
    Ok(MakeRustlsConnect::new(config))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn transport(url: &str) -> Result<Transport, String> {
        parse(url).map(|c| c.transport)
    }

    #[test]
    fn sslmode_chooses_plain_or_verified_tls() {
        for plain in [
            "postgres://cs@db/cs",
            "postgres://cs@db/cs?sslmode=disable",
            "postgres://cs@db/cs?sslmode=prefer&application_name=x",
        ] {
            assert_eq!(transport(plain), Ok(Transport::Plain), "{plain}");
        }
        for verified in ["require", "verify-ca", "verify-full"] {
            let url = format!("postgres://cs@db/cs?sslmode={verified}");
            assert_eq!(transport(&url), Ok(Transport::Tls(Roots::System)), "{url}");
        }
        assert_eq!(
            transport("postgres://cs@db/cs?sslmode=verify-full&sslrootcert=%2Fetc%2Fca%20x.pem"),
            Ok(Transport::Tls(Roots::File("/etc/ca x.pem".into())))
        );
        assert_eq!(
            transport("postgres://cs@db/cs?sslrootcert=system&sslmode=require"),
            Ok(Transport::Tls(Roots::System))
        );
    }

    #[test]
    fn the_rest_of_the_url_reaches_tokio_postgres() {
        let c = parse(
            "postgres://cs@db:6432/cs?sslmode=require&application_name=app&connect_timeout=3",
        )
        .unwrap();
        assert_eq!(c.config.get_application_name(), Some("app"));
        assert_eq!(c.config.get_ssl_mode(), SslMode::Require);
        assert_eq!(c.config.get_ports(), &[6432]);
        let plain = parse("postgres://cs@db/cs?sslmode=prefer").unwrap();
        assert_eq!(plain.config.get_ssl_mode(), SslMode::Disable);
    }

    #[test]
    fn contradictions_and_unknown_modes_are_refused() {
        let err = transport("postgres://cs@db/cs?sslmode=verify").unwrap_err();
        assert!(err.contains("sslmode=verify: expected disable"), "{err}");
        let err = transport("postgres://cs@db/cs?sslrootcert=/ca.pem").unwrap_err();
        assert!(err.contains("sslrootcert needs sslmode=require"), "{err}");
        let err = transport("postgres://cs@db/cs?sslmode=require&sslrootcert=").unwrap_err();
        assert!(err.contains("sslrootcert is empty"), "{err}");
        let err = transport("postgres://cs@db/cs?nonsense=1").unwrap_err();
        assert!(err.contains("invalid database URL"), "{err}");
    }

    #[test]
    fn a_root_file_without_certificates_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("ca.pem");
        std::fs::write(&file, "not a certificate\n").unwrap();
        let err = connector(&Roots::File(file)).err().unwrap();
        assert!(err.contains("no PEM certificate"), "{err}");
        let err = connector(&Roots::File(dir.path().join("missing.pem")))
            .err()
            .unwrap();
        assert!(err.contains("missing.pem"), "{err}");
    }
}
