//! `contextctl workload pull-secret`: a `kubernetes.io/dockerconfigjson`
//! Secret holding a pull-only registry token for one workload, for pods
//! that mount a revision as an image volume (see `docs/oci.md`).

use std::time::Duration;

use anyhow::{bail, Context as _};
use base64::engine::general_purpose::STANDARD;
use base64::Engine as _;
use reqwest::Method;
use serde_json::{json, Value};

use super::{print_doc, About as _, OutputFormat};
use crate::api::registry::MAX_TTL_SECS;
use crate::client::Client;

/// The username written into the credential: the registry ignores it, but
/// some clients only send Basic credentials with a non-empty one.
pub const USERNAME: &str = "context-service";

/// What `workload pull-secret` was asked for.
#[derive(Debug)]
pub struct PullSecretArgs {
    /// The workload.
    pub name: String,
    /// Pin the credential to this revision.
    pub revision: Option<String>,
    /// Lifetime of the credential.
    pub ttl: Duration,
    /// Registry host[:port] as nodes reach it.
    pub registry: Option<String>,
    /// Name of the Secret.
    pub secret_name: Option<String>,
    /// Namespace of the Secret.
    pub namespace: Option<String>,
    /// Print only the docker `config.json`.
    pub docker_config: bool,
}

/// `host[:port]` of a service URL.
fn host_of(url: &str) -> anyhow::Result<String> {
    let parsed = url::Url::parse(url).with_context(|| format!("the service URL {url:?}"))?;
    let host = parsed
        .host_str()
        .with_context(|| format!("the service URL {url:?} has no host"))?;
    Ok(match parsed.port() {
        Some(port) => format!("{host}:{port}"),
        None => host.to_owned(),
    })
}

/// The first error of a distribution-spec error body, as one line.
fn spec_error(status: reqwest::StatusCode, text: &str) -> String {
    let parsed: Option<Value> = serde_json::from_str(text).ok();
    match parsed.as_ref().and_then(|v| v["errors"].get(0)) {
        Some(e) => format!(
            "{} {}: {}",
            status.as_u16(),
            e["code"].as_str().unwrap_or("UNKNOWN"),
            e["message"].as_str().unwrap_or("")
        ),
        None => format!("{}: {}", status, text.trim()),
    }
}

/// Runs `contextctl workload pull-secret`.
pub async fn run(
    client: &Client,
    args: PullSecretArgs,
    output: OutputFormat,
) -> anyhow::Result<()> {
    let ttl = args.ttl.as_secs();
    if ttl == 0 || ttl > MAX_TTL_SECS {
        bail!("--ttl must be between 1s and 30 days");
    }
    // The workload must exist and be ready: a credential for nothing helps
    // no one (and the registry never tells who owns what).
    let view = client
        .workload(&args.name)
        .await
        .about(|| format!("workload {:?}", args.name))?;
    let active = view.revision.with_context(|| {
        format!(
            "workload {} is not active yet; activate a revision first",
            args.name
        )
    })?;
    if let Some(r) = &args.revision {
        if *r != active {
            bail!(
                "revision {r} is not the active revision of workload {} (that is {active})",
                args.name
            );
        }
    }
    // Built in one expression: the serializer must not live across an await.
    let query = {
        let mut query = url::form_urlencoded::Serializer::new(String::new());
        query
            .append_pair("service", "context-service")
            .append_pair("scope", &format!("repository:workloads/{}:pull", args.name))
            .append_pair("ttl", &ttl.to_string());
        if let Some(r) = &args.revision {
            query.append_pair("revision", r);
        }
        query.finish()
    };
    let resp = client
        .request(Method::GET, &format!("/v2/token?{query}"))
        .send()
        .await
        .with_context(|| format!("requesting a registry token from {}", client.base_url()))?;
    let status = resp.status();
    let text = resp.text().await.context("reading the token answer")?;
    if !status.is_success() {
        bail!(
            "registry token for workload {:?}: {}",
            args.name,
            spec_error(status, &text)
        );
    }
    let answer: Value = serde_json::from_str(&text).context("decoding the token answer")?;
    let token = answer["token"]
        .as_str()
        .context("the token answer holds no token")?;
    let registry = match args.registry {
        Some(r) => r,
        None => host_of(client.base_url())?,
    };
    let auth = STANDARD.encode(format!("{USERNAME}:{token}"));
    let config = json!({
        "auths": { registry.clone(): { "username": USERNAME, "password": token, "auth": auth } }
    });
    if args.docker_config {
        println!("{}", serde_json::to_string_pretty(&config)?);
        return Ok(());
    }
    let secret_name = args
        .secret_name
        .unwrap_or_else(|| format!("{}-pull", args.name));
    let mut metadata = json!({
        "name": secret_name,
        "annotations": {
            "context-service/workload": args.name,
            "context-service/reference": format!("{registry}/workloads/{}:{}", args.name, args.revision.as_deref().unwrap_or("active")),
            "context-service/expires-in": format!("{}s", answer["expires_in"]),
        },
    });
    if let Some(ns) = args.namespace {
        metadata["namespace"] = json!(ns);
    }
    let secret = json!({
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": metadata,
        "type": "kubernetes.io/dockerconfigjson",
        "data": { ".dockerconfigjson": STANDARD.encode(serde_json::to_vec(&config)?) },
    });
    match output {
        OutputFormat::Json => print_doc(&secret, OutputFormat::Json)?,
        OutputFormat::Name => println!("secret/{secret_name}"),
        _ => print_doc(&secret, OutputFormat::Yaml)?,
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hosts_and_errors() {
        assert_eq!(host_of("http://127.0.0.1:8080").unwrap(), "127.0.0.1:8080");
        assert_eq!(
            host_of("https://cs.example.com/").unwrap(),
            "cs.example.com"
        );
        assert_eq!(
            spec_error(
                reqwest::StatusCode::FORBIDDEN,
                r#"{"errors":[{"code":"DENIED","message":"no"}]}"#
            ),
            "403 DENIED: no"
        );
    }
}
