//! Delivery calls of the typed client.

use reqwest::{Method, Response, StatusCode};
use serde::Serialize;

use super::pools::path_segment;
use super::{check, Client, ClientError};
use crate::delivery::{Delivered, FailedBody, RunList, RunView, Verify};

/// The body of `POST /v1/workloads/{name}/deliveries`: one of `sandbox`
/// and `pool`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct DeliverBody {
    /// The run id.
    pub run_id: String,
    /// One sandbox.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sandbox: Option<String>,
    /// Every ready sandbox of one of the caller's pools.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pool: Option<String>,
    /// How a cache hit is verified (the service's default: `default`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub verify: Option<Verify>,
}

/// A `502 delivery_failed` with outcomes becomes
/// [`ClientError::DeliveryFailed`]; anything else goes through [`check`].
async fn check_delivery(resp: Response) -> Result<Response, ClientError> {
    if resp.status() != StatusCode::BAD_GATEWAY {
        return check(resp).await;
    }
    let text = resp.text().await.unwrap_or_default();
    match serde_json::from_str::<FailedBody>(&text) {
        Ok(body) => Err(ClientError::DeliveryFailed { body }),
        Err(_) => {
            let body = serde_json::from_str(&text).unwrap_or_else(|_| crate::api::ErrorBody {
                error: "http_502".to_owned(),
                message: text.trim().chars().take(200).collect(),
            });
            Err(ClientError::Api {
                status: StatusCode::BAD_GATEWAY,
                body,
            })
        }
    }
}

impl Client {
    async fn send_delivery(&self, req: reqwest::RequestBuilder) -> Result<Response, ClientError> {
        let resp = req.send().await.map_err(|cause| ClientError::Transport {
            url: self.base_url().to_owned(),
            cause,
        })?;
        check_delivery(resp).await.map_err(|e| self.explain(e))
    }

    /// `POST /v1/workloads/{name}/deliveries`: delivers the active revision.
    pub async fn deliver(&self, name: &str, body: &DeliverBody) -> Result<Delivered, ClientError> {
        let path = format!("/v1/workloads/{}/deliveries", path_segment(name));
        let resp = self
            .send_delivery(self.request(Method::POST, &path).json(body))
            .await?;
        resp.json()
            .await
            .map_err(|e| ClientError::Protocol(format!("decoding the answer: {e}")))
    }

    /// `DELETE /v1/workloads/{name}/deliveries/{run}`: releases a run.
    pub async fn release(&self, name: &str, run_id: &str) -> Result<(), ClientError> {
        let path = format!(
            "/v1/workloads/{}/deliveries/{}",
            path_segment(name),
            path_segment(run_id)
        );
        self.send_delivery(self.request(Method::DELETE, &path))
            .await?;
        Ok(())
    }

    /// `GET /v1/workloads/{name}/deliveries`: the live runs.
    pub async fn deliveries(&self, name: &str) -> Result<Vec<RunView>, ClientError> {
        let path = format!("/v1/workloads/{}/deliveries", path_segment(name));
        let list: RunList = self.send_json(self.request(Method::GET, &path)).await?;
        Ok(list.deliveries)
    }
}
