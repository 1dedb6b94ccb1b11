//! The database URL setting: parsed once, its password kept out of logs.

use std::str::FromStr;

/// A `postgres://` (or `postgresql://`) URL. Its `Debug` form hides the
/// password, so settings can be logged.
#[derive(Clone, PartialEq, Eq)]
pub struct DatabaseUrl(String);

impl DatabaseUrl {
    /// The URL as given (with its password).
    pub fn expose(&self) -> &str {
        &self.0
    }

    /// The URL with any password replaced by `***`.
    pub fn redacted(&self) -> String {
        let Some((scheme, rest)) = self.0.split_once("://") else {
            return "***".to_owned();
        };
        let (authority, tail) = match rest.find(['/', '?']) {
            Some(i) => rest.split_at(i),
            None => (rest, ""),
        };
        let userless = match authority.rsplit_once('@') {
            Some((userinfo, host)) => {
                let user = userinfo.split_once(':').map_or(userinfo, |(u, _)| u);
                let hidden = if userinfo.contains(':') { ":***" } else { "" };
                format!("{scheme}://{user}{hidden}@{host}{tail}")
            }
            None => self.0.clone(),
        };
        hide_password_param(userless)
    }
}

/// `url` with a `password=` query parameter hidden.
fn hide_password_param(url: String) -> String {
    let Some((head, query)) = url.split_once('?') else {
        return url;
    };
    let query: Vec<String> = query
        .split('&')
        .map(|kv| match kv.split_once('=') {
            Some((k, _)) if k.eq_ignore_ascii_case("password") => format!("{k}=***"),
            _ => kv.to_owned(),
        })
        .collect();
    format!("{head}?{}", query.join("&"))
}

impl std::fmt::Debug for DatabaseUrl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.redacted())
    }
}

impl std::fmt::Display for DatabaseUrl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.redacted())
    }
}

impl FromStr for DatabaseUrl {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        if !(s.starts_with("postgres://") || s.starts_with("postgresql://")) {
            return Err("expected a postgres:// or postgresql:// URL".to_owned());
        }
        // The TLS parameters, then the rest as tokio-postgres reads it.
        super::tls::parse(s)?;
        Ok(Self(s.to_owned()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_hide_their_passwords() {
        let url: DatabaseUrl = "postgres://cs:s3cret@db.example:5432/cs?sslmode=disable"
            .parse()
            .unwrap();
        assert_eq!(
            format!("{url:?}"),
            "postgres://cs:***@db.example:5432/cs?sslmode=disable"
        );
        assert_eq!(
            url.expose(),
            "postgres://cs:s3cret@db.example:5432/cs?sslmode=disable"
        );
        let url: DatabaseUrl = "postgresql://cs@127.0.0.1/cs?password=s3cret&application_name=x"
            .parse()
            .unwrap();
        assert_eq!(
            url.to_string(),
            "postgresql://cs@127.0.0.1/cs?password=***&application_name=x"
        );
        assert!("mysql://x".parse::<DatabaseUrl>().is_err());
        assert!("postgres://cs@db/cs?sslmode=verify-full"
            .parse::<DatabaseUrl>()
            .is_ok());
        let err = "postgres://cs@db/cs?sslmode=bogus"
            .parse::<DatabaseUrl>()
            .unwrap_err();
        assert!(err.contains("sslmode=bogus"), "{err}");
        // No sslmode (prefer): plain TCP to a loopback server.
        assert!("postgres://cs@127.0.0.1:5432/cs"
            .parse::<DatabaseUrl>()
            .is_ok());
        assert!("postgres://cs@127.0.0.1:notaport/cs"
            .parse::<DatabaseUrl>()
            .is_err());
    }
}
