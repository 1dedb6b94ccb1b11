//! The one renderer of failed service calls: every command routes its
//! [`ClientError`]s through [`CallFailed`], so a refusal always reads
//! `<what>: <status>: <message> (<code>)`, e.g.
//! `pool "demo": 404 Not Found: sandbox pool not found (not_found)`.

use std::fmt;

use crate::client::ClientError;

/// A service call that failed, and what it acted on.
#[derive(Debug, thiserror::Error)]
pub struct CallFailed {
    /// What the call acted on, e.g. `pool "demo"` or `workloads`.
    pub what: String,
    /// Why it failed.
    pub error: ClientError,
}

impl CallFailed {
    /// `error` of a call on `what`.
    pub fn new(what: impl Into<String>, error: ClientError) -> Self {
        Self {
            what: what.into(),
            error,
        }
    }
}

impl fmt::Display for CallFailed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let what = &self.what;
        match &self.error {
            ClientError::Api { status, body } => write!(
                f,
                "{what}: {status}: {} ({})",
                one_line(&body.message),
                body.error
            ),
            ClientError::DeliveryFailed { body } => write!(
                f,
                "{what}: {}: {} ({})",
                reqwest::StatusCode::BAD_GATEWAY,
                one_line(&body.message),
                body.error
            ),
            // Nothing about `what`: the service was not reached, or no
            // token was found; the error says what to fix.
            e @ (ClientError::Transport { .. }
            | ClientError::InvalidUrl(_)
            | ClientError::NoToken { .. }) => write!(f, "{e}"),
            e @ (ClientError::Protocol(_) | ClientError::Io { .. }) => write!(f, "{what}: {e}"),
        }
    }
}

/// `text` on one line: a proxy's error page may span several.
fn one_line(text: &str) -> String {
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// Names what a failed call acted on: `.about(|| format!("pool {name:?}"))`.
pub trait About<T> {
    /// The error, if any, as a [`CallFailed`] on `what`.
    fn about(self, what: impl FnOnce() -> String) -> Result<T, CallFailed>;
}

impl<T> About<T> for Result<T, ClientError> {
    fn about(self, what: impl FnOnce() -> String) -> Result<T, CallFailed> {
        self.map_err(|error| CallFailed::new(what(), error))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::error_body::ErrorBody;

    #[test]
    fn an_api_failure_names_what_status_message_and_code() {
        let error = ClientError::Api {
            status: reqwest::StatusCode::NOT_FOUND,
            body: ErrorBody {
                error: "not_found".into(),
                message: "sandbox pool\nnot found".into(),
            },
        };
        assert_eq!(
            CallFailed::new("pool \"demo\"", error).to_string(),
            "pool \"demo\": 404 Not Found: sandbox pool not found (not_found)"
        );
    }

    #[test]
    fn a_bad_url_says_only_the_url() {
        let error = ClientError::InvalidUrl("x".into());
        assert_eq!(
            CallFailed::new("workloads", error).to_string(),
            "invalid service URL \"x\": the URL needs http:// or https://"
        );
    }
}
