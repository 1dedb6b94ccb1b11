//! Helpers of the upstream-compatibility tests (`compat_*`): answers taken
//! apart byte for byte, because a Go client sees bytes, not parsed JSON.

use reqwest::Response;

/// An answer: status, the headers that matter, and the body as text.
#[derive(Debug)]
pub(crate) struct Exact {
    /// Status code.
    pub status: u16,
    /// `Content-Type`, if any.
    pub content_type: Option<String>,
    /// The whole response's headers.
    pub headers: reqwest::header::HeaderMap,
    /// The body, exactly.
    pub body: String,
}

/// Reads `resp` completely.
pub(crate) async fn exact(resp: Response) -> Exact {
    let status = resp.status().as_u16();
    let headers = resp.headers().clone();
    let content_type = headers
        .get(reqwest::header::CONTENT_TYPE)
        .map(|v| v.to_str().expect("ASCII content type").to_owned());
    let body = resp.text().await.expect("body");
    Exact {
        status,
        content_type,
        headers,
        body,
    }
}

/// Asserts a JSON answer of upstream's: `status`, `Content-Type:
/// application/json` (no charset) and exactly `body` (which ends in `\n`).
pub(crate) async fn assert_json(resp: Response, status: u16, body: &str) {
    let got = exact(resp).await;
    assert_eq!((got.status, got.body.as_str()), (status, body), "{got:?}");
    assert_eq!(got.content_type.as_deref(), Some("application/json"));
}

/// `{"error":"<code>","message":"<message>"}\n`, as upstream writes errors
/// (Go escapes `<`, `>` and `&`; outside strings JSON has none of them).
pub(crate) fn error_body(code: &str, message: &str) -> String {
    let body = serde_json::to_string(&serde_json::json!({
        "error": code,
        "message": message,
    }))
    .expect("JSON");
    body.replace('<', "\\u003c")
        .replace('>', "\\u003e")
        .replace('&', "\\u0026")
        + "\n"
}
