//! Typed HTTP client for the Context Service API, used by `contextctl` and
//! the integration tests. One module per resource adds its calls.

pub mod deliveries;
pub mod pools;

use std::path::{Path, PathBuf};

use reqwest::{Method, RequestBuilder, Response, StatusCode};
use serde::de::DeserializeOwned;

use crate::api::error_body::ErrorBody;

pub mod workloads;

/// Default service URL when none is configured.
pub const DEFAULT_URL: &str = "http://127.0.0.1:8080";

/// Why a call failed.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The service answered with an error body.
    #[error("{status}: {} ({})", body.message, body.error)]
    Api {
        /// HTTP status.
        status: StatusCode,
        /// The `{error, message}` body.
        body: ErrorBody,
    },
    /// A delivery or release failed in at least one sandbox
    /// (`502 delivery_failed`); the body has every sandbox's outcome.
    #[error("{}: {} (delivery_failed)", StatusCode::BAD_GATEWAY, body.message)]
    DeliveryFailed {
        /// The `{error, message, deliveries}` body.
        body: crate::delivery::FailedBody,
    },
    /// The service could not be reached or the transfer broke.
    #[error("cannot reach {url}: {}", transport_summary(cause))]
    Transport {
        /// The URL called.
        url: String,
        /// The cause (summarised in the message rather than chained: a
        /// reqwest error's chain repeats itself three times over).
        cause: reqwest::Error,
    },
    /// `--url`/`CONTEXT_SERVICE_URL` is not an `http://` or `https://` URL.
    #[error("invalid service URL {0:?}: the URL needs http:// or https://")]
    InvalidUrl(String),
    /// The service wants a token and none was given or found.
    #[error(
        "{}: {} ({}); no token was given and none is at {}: pass --token, set \
         CONTEXT_SERVICE_TOKEN, or point --data-dir at the service's data dir",
        StatusCode::UNAUTHORIZED, body.message, body.error, looked.display()
    )]
    NoToken {
        /// The development token file looked for.
        looked: PathBuf,
        /// The service's `{error, message}` body.
        body: ErrorBody,
    },
    /// The answer was not what the API promises.
    #[error("unexpected answer from the service: {0}")]
    Protocol(String),
    /// A local file could not be read or written.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The cause.
        source: std::io::Error,
    },
}

impl ClientError {
    /// The API error code, when the service answered with one.
    pub fn code(&self) -> Option<&str> {
        match self {
            ClientError::Api { body, .. } | ClientError::NoToken { body, .. } => Some(&body.error),
            ClientError::DeliveryFailed { body } => Some(&body.error),
            _ => None,
        }
    }

    /// The HTTP status, when the service answered.
    pub fn status(&self) -> Option<StatusCode> {
        match self {
            ClientError::Api { status, .. } => Some(*status),
            ClientError::DeliveryFailed { .. } => Some(StatusCode::BAD_GATEWAY),
            ClientError::NoToken { .. } => Some(StatusCode::UNAUTHORIZED),
            _ => None,
        }
    }
}

/// One line for a transport failure: the innermost cause (reqwest's own
/// chain repeats the URL at every level), and the likely fix when nothing
/// answered at all.
fn transport_summary(err: &reqwest::Error) -> String {
    let mut root: &dyn std::error::Error = err;
    while let Some(next) = root.source() {
        root = next;
    }
    if err.is_connect() {
        format!("{root}; is the service running?")
    } else if err.is_timeout() {
        "the request timed out".to_owned()
    } else if std::ptr::addr_eq(root, err as &dyn std::error::Error) {
        err.to_string()
    } else {
        format!("{err}: {root}")
    }
}

// Lives in `tls` (storage uses it too); named here for the client's users.
pub use crate::tls::install_crypto_provider;

/// A client bound to one service URL and bearer token.
#[derive(Debug, Clone)]
pub struct Client {
    base: String,
    token: Option<String>,
    /// The development token file that was looked for when no token was
    /// given (named in the error when the service asks for one).
    token_looked: Option<PathBuf>,
    subject: Option<String>,
    http: reqwest::Client,
}

impl Client {
    /// A client for the service at `base` (e.g. `http://127.0.0.1:8080`).
    pub fn new(base: impl Into<String>, token: Option<String>) -> Result<Self, ClientError> {
        install_crypto_provider();
        let base = base.into().trim_end_matches('/').to_owned();
        let http = reqwest::Client::builder()
            .user_agent(concat!("contextctl/", env!("CARGO_PKG_VERSION")))
            .build()
            .map_err(|cause| ClientError::Transport {
                url: base.clone(),
                cause,
            })?;
        Ok(Self {
            base,
            token,
            token_looked: None,
            subject: None,
            http,
        })
    }

    /// Acts for `user` through `X-Context-Subject` (needs a `delegate` token).
    pub fn acting_for(mut self, user: impl Into<String>) -> Self {
        self.subject = Some(user.into());
        self
    }

    /// The service URL.
    pub fn base_url(&self) -> &str {
        &self.base
    }

    /// A request to `path` (which starts with `/`) with auth headers set.
    pub fn request(&self, method: Method, path: &str) -> RequestBuilder {
        let mut req = self.http.request(method, format!("{}{}", self.base, path));
        if let Some(token) = &self.token {
            req = req.bearer_auth(token);
        }
        if let Some(subject) = &self.subject {
            req = req.header("X-Context-Subject", format!("user:{subject}"));
        }
        req
    }

    /// Sends `req`, turning error statuses into [`ClientError::Api`].
    pub async fn send(&self, req: RequestBuilder) -> Result<Response, ClientError> {
        let resp = req.send().await.map_err(|cause| ClientError::Transport {
            url: self.base.clone(),
            cause,
        })?;
        check(resp).await.map_err(|e| self.explain(e))
    }

    /// Names where the token was looked for when the service asks for one
    /// and none was given.
    pub(crate) fn explain(&self, err: ClientError) -> ClientError {
        match (err, &self.token_looked) {
            (ClientError::Api { status, body }, Some(looked))
                if status == StatusCode::UNAUTHORIZED && body.error == "token_required" =>
            {
                ClientError::NoToken {
                    looked: looked.clone(),
                    body,
                }
            }
            (err, _) => err,
        }
    }

    /// Sends `req` and decodes a JSON answer.
    pub async fn send_json<T: DeserializeOwned>(
        &self,
        req: RequestBuilder,
    ) -> Result<T, ClientError> {
        let resp = self.send(req).await?;
        resp.json::<T>()
            .await
            .map_err(|e| ClientError::Protocol(format!("decoding the answer: {e}")))
    }

    /// `GET /healthz`.
    pub async fn health(&self) -> Result<serde_json::Value, ClientError> {
        self.send_json(self.request(Method::GET, "/healthz")).await
    }
}

/// Passes through a success; turns anything else into [`ClientError::Api`].
pub async fn check(resp: Response) -> Result<Response, ClientError> {
    let status = resp.status();
    if status.is_success() || status == StatusCode::NOT_MODIFIED {
        return Ok(resp);
    }
    let text = resp.text().await.unwrap_or_default();
    let body = serde_json::from_str::<ErrorBody>(&text).unwrap_or_else(|_| ErrorBody {
        error: format!("http_{}", status.as_u16()),
        message: text.trim().chars().take(200).collect(),
    });
    Err(ClientError::Api { status, body })
}

/// Where the client's settings come from, in order: flags, the environment
/// (`CONTEXT_SERVICE_URL`, `CONTEXT_SERVICE_TOKEN`, also read from a `.env`
/// file), then the embedded service's development token file.
#[derive(Debug, Clone, Default)]
pub struct ClientSettings {
    /// Service URL.
    pub url: Option<String>,
    /// Bearer token.
    pub token: Option<String>,
    /// Data dir of a local embedded service, to find its development token.
    pub data_dir: Option<PathBuf>,
}

impl ClientSettings {
    /// The URL to use (not yet checked: see [`ClientSettings::client`]).
    pub fn resolve_url(&self) -> String {
        self.url
            .clone()
            .or_else(|| std::env::var("CONTEXT_SERVICE_URL").ok())
            .filter(|u| !u.is_empty())
            .unwrap_or_else(|| DEFAULT_URL.to_owned())
    }

    /// The token to use: explicit, from the environment, or the development
    /// token of a local service (`$CS_DATA_DIR` or `./data`).
    pub fn resolve_token(&self) -> Option<String> {
        self.find_token().ok()
    }

    /// The token, or the development token file that was looked for.
    fn find_token(&self) -> Result<String, PathBuf> {
        if let Some(t) = self.token.clone().filter(|t| !t.is_empty()) {
            return Ok(t);
        }
        if let Some(t) = std::env::var("CONTEXT_SERVICE_TOKEN")
            .ok()
            .filter(|t| !t.is_empty())
        {
            return Ok(t);
        }
        let data_dir = self
            .data_dir
            .clone()
            .or_else(|| std::env::var_os("CS_DATA_DIR").map(PathBuf::from))
            .unwrap_or_else(|| PathBuf::from("./data"));
        let path = crate::auth::dev::dev_token_path(&data_dir);
        read_token_file(&path).ok_or(path)
    }

    /// A client from these settings; refuses a URL that is not `http://`
    /// or `https://` (`localhost:8080` would otherwise parse as a URL of
    /// scheme `localhost`).
    pub fn client(&self) -> Result<Client, ClientError> {
        let url = self.resolve_url();
        let scheme_ok = url::Url::parse(&url)
            .map(|u| matches!(u.scheme(), "http" | "https") && u.has_host())
            .unwrap_or(false);
        if !scheme_ok {
            return Err(ClientError::InvalidUrl(url));
        }
        let (token, looked) = match self.find_token() {
            Ok(t) => (Some(t), None),
            Err(path) => (None, Some(path)),
        };
        let mut client = Client::new(url, token)?;
        client.token_looked = looked;
        Ok(client)
    }
}

fn read_token_file(path: &Path) -> Option<String> {
    let text = std::fs::read_to_string(path).ok()?;
    let token = text.trim();
    (!token.is_empty()).then(|| token.to_owned())
}
