//! [`Caller`]: one way for every API test to send a request as someone
//! (a bearer token, or none) and read the answer.

use reqwest::{Body, Method, RequestBuilder, Response};
use serde_json::Value;

use super::TestServer;

/// Sends requests to one [`TestServer`] with a fixed bearer token (or none)
/// and fixed extra headers. Cheap to clone, and `'static`, so it can move
/// into spawned tasks.
#[derive(Clone)]
pub(crate) struct Caller {
    http: reqwest::Client,
    base: String,
    token: Option<String>,
    headers: Vec<(String, String)>,
}

impl Caller {
    /// `sub` with every user scope, signed by the server's development key.
    pub(crate) fn user(server: &TestServer, sub: &str) -> Self {
        Self::with_token(server, server.user_token(sub))
    }

    /// Any bearer token, taken as is (a narrow-scoped, forged or grant one).
    pub(crate) fn with_token(server: &TestServer, token: impl Into<String>) -> Self {
        Self {
            token: Some(token.into()),
            ..Self::anonymous(server)
        }
    }

    /// No `Authorization` header at all.
    pub(crate) fn anonymous(server: &TestServer) -> Self {
        Self {
            http: server.http(),
            base: server.base.clone(),
            token: None,
            headers: Vec::new(),
        }
    }

    /// The same caller, also sending `name: value` on every request.
    pub(crate) fn with_header(&self, name: &str, value: &str) -> Self {
        let mut next = self.clone();
        next.headers.push((name.to_owned(), value.to_owned()));
        next
    }

    /// A request to `path` with the token and headers attached, for what
    /// the shortcuts below do not cover (e.g. timeouts).
    pub(crate) fn request(&self, method: Method, path: &str) -> RequestBuilder {
        let mut req = self.http.request(method, format!("{}{path}", self.base));
        if let Some(token) = &self.token {
            req = req.bearer_auth(token);
        }
        for (name, value) in &self.headers {
            req = req.header(name, value);
        }
        req
    }

    /// `method path` without a body.
    pub(crate) async fn send(&self, method: Method, path: &str) -> Response {
        send(self.request(method, path)).await
    }

    /// `GET path`.
    pub(crate) async fn get(&self, path: &str) -> Response {
        self.send(Method::GET, path).await
    }

    /// `DELETE path`.
    pub(crate) async fn delete(&self, path: &str) -> Response {
        self.send(Method::DELETE, path).await
    }

    /// `POST path` with `body` as JSON.
    pub(crate) async fn post(&self, path: &str, body: &Value) -> Response {
        send(self.request(Method::POST, path).json(body)).await
    }

    /// `POST path` with raw bytes under `content_type` (bodies that are not
    /// valid JSON, or not JSON at all).
    pub(crate) async fn post_raw(
        &self,
        path: &str,
        content_type: &str,
        body: impl Into<Body>,
    ) -> Response {
        self.with_body(Method::POST, path, content_type, body).await
    }

    /// `PUT path` with raw bytes (or a stream) under `content_type`.
    pub(crate) async fn put(
        &self,
        path: &str,
        content_type: &str,
        body: impl Into<Body>,
    ) -> Response {
        self.with_body(Method::PUT, path, content_type, body).await
    }

    async fn with_body(
        &self,
        method: Method,
        path: &str,
        content_type: &str,
        body: impl Into<Body>,
    ) -> Response {
        let req = self
            .request(method, path)
            .header(reqwest::header::CONTENT_TYPE, content_type)
            .body(body);
        send(req).await
    }
}

/// Sends `req`; a transport failure fails the test (the server is local).
async fn send(req: RequestBuilder) -> Response {
    let resp = match req.send().await {
        Ok(resp) => resp,
        Err(e) => panic!("request failed: {e}"),
    };
    // The answer (recorded before it was sent) is one the document lists.
    super::answers::check();
    resp
}

/// Asserts `status`, that the body is one line of JSON ending in a newline
/// (as the upstream API answers), and returns it parsed.
pub(crate) async fn json_of(resp: Response, status: u16) -> Value {
    let got = resp.status().as_u16();
    let text = resp.text().await.expect("body");
    assert_eq!(got, status, "body: {text}");
    assert!(
        text.ends_with('\n'),
        "JSON answers end with a newline: {text:?}"
    );
    serde_json::from_str(&text).expect("JSON body")
}
