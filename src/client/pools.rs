//! Calls of the sandbox-pool and named-context API.

use std::time::Duration;

use reqwest::Method;

use super::{Client, ClientError};
use crate::pool::view::{
    ContextVolume, ContextVolumeList, CreateContextVolume, CreatePool, Pool, PoolList,
};

/// Escapes one URL path segment (everything but RFC 3986 unreserved bytes).
pub fn path_segment(s: &str) -> String {
    // `.` and `..` would be resolved away by URL normalisation.
    if s == "." || s == ".." {
        return s.replace('.', "%2E");
    }
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

impl Client {
    /// `POST /v1/sandbox-pools`.
    pub async fn create_pool(&self, req: &CreatePool) -> Result<Pool, ClientError> {
        self.send_json(self.request(Method::POST, "/v1/sandbox-pools").json(req))
            .await
    }

    /// `GET /v1/sandbox-pools/{name}`.
    pub async fn get_pool(&self, name: &str) -> Result<Pool, ClientError> {
        let path = format!("/v1/sandbox-pools/{}", path_segment(name));
        self.send_json(self.request(Method::GET, &path)).await
    }

    /// `GET /v1/sandbox-pools/{name}?wait=ready&timeout=…`: answers when the
    /// pool is ready or failed, or after `timeout` with its current status.
    pub async fn wait_pool(&self, name: &str, timeout: Duration) -> Result<Pool, ClientError> {
        let path = format!(
            "/v1/sandbox-pools/{}?wait=ready&timeout={}ms",
            path_segment(name),
            timeout.as_millis()
        );
        self.send_json(self.request(Method::GET, &path)).await
    }

    /// `POST /v1/sandbox-pools/{name}/suspend`.
    pub async fn suspend_pool(&self, name: &str) -> Result<Pool, ClientError> {
        let path = format!("/v1/sandbox-pools/{}/suspend", path_segment(name));
        self.send_json(self.request(Method::POST, &path)).await
    }

    /// `POST /v1/sandbox-pools/{name}/resume`.
    pub async fn resume_pool(&self, name: &str) -> Result<Pool, ClientError> {
        let path = format!("/v1/sandbox-pools/{}/resume", path_segment(name));
        self.send_json(self.request(Method::POST, &path)).await
    }

    /// `GET /v1/sandbox-pools`: the caller's pools.
    pub async fn list_pools(&self) -> Result<PoolList, ClientError> {
        self.send_json(self.request(Method::GET, "/v1/sandbox-pools"))
            .await
    }

    /// `DELETE /v1/sandbox-pools/{name}` (`404 not_found` when there is none).
    pub async fn delete_pool(&self, name: &str) -> Result<(), ClientError> {
        let path = format!("/v1/sandbox-pools/{}", path_segment(name));
        self.send(self.request(Method::DELETE, &path)).await?;
        Ok(())
    }

    /// `POST /v1/contexts`.
    pub async fn create_volume(
        &self,
        req: &CreateContextVolume,
    ) -> Result<ContextVolume, ClientError> {
        self.send_json(self.request(Method::POST, "/v1/contexts").json(req))
            .await
    }

    /// `GET /v1/namespaces/{namespace}/contexts/{name}`.
    pub async fn get_volume(
        &self,
        namespace: &str,
        name: &str,
    ) -> Result<ContextVolume, ClientError> {
        let path = format!(
            "/v1/namespaces/{}/contexts/{}",
            path_segment(namespace),
            path_segment(name)
        );
        self.send_json(self.request(Method::GET, &path)).await
    }

    /// `GET /v1/namespaces/{namespace}/contexts`.
    pub async fn list_volumes(&self, namespace: &str) -> Result<ContextVolumeList, ClientError> {
        let path = format!("/v1/namespaces/{}/contexts", path_segment(namespace));
        self.send_json(self.request(Method::GET, &path)).await
    }

    /// `DELETE /v1/namespaces/{namespace}/contexts/{name}`.
    pub async fn delete_volume(&self, namespace: &str, name: &str) -> Result<(), ClientError> {
        let path = format!(
            "/v1/namespaces/{}/contexts/{}",
            path_segment(namespace),
            path_segment(name)
        );
        self.send(self.request(Method::DELETE, &path)).await?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn segments_are_escaped() {
        assert_eq!(path_segment("a-b.c_d~1"), "a-b.c_d~1");
        assert_eq!(path_segment("a/b c"), "a%2Fb%20c");
        assert_eq!(path_segment("..?x#"), "..%3Fx%23");
        assert_eq!(path_segment(".."), "%2E%2E");
    }
}
