//! Go `net/http` behaviours a client sees around the handlers: `404 page
//! not found`, `405` with Go's `Allow`, `307` to the clean path, JSON
//! answers ending in `\n` with `<`, `>`, `&` escaped, and a body past 1 MiB
//! closing the connection cleanly.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use crate::common::{json_of, Caller, TestServer};
use crate::compat_support::{exact, Exact};
use reqwest::Method;
use serde_json::json;

const NOT_FOUND: &str = "404 page not found\n";
const TEXT: &str = "text/plain; charset=utf-8";

fn assert_go_error(got: &Exact, status: u16, body: &str) {
    assert_eq!((got.status, got.body.as_str()), (status, body), "{got:?}");
    assert_eq!(got.content_type.as_deref(), Some(TEXT));
    assert_eq!(got.headers["x-content-type-options"], "nosniff");
}

/// One raw HTTP/1.1 exchange (off the runtime, which serves it): `request`
/// as written, the answer as read until the server closes; a reset or no
/// close at all fails.
async fn raw(server: &TestServer, request: &str) -> String {
    let addr = server.base.trim_start_matches("http://").to_owned();
    let request = request.to_owned();
    tokio::task::spawn_blocking(move || {
        let mut s = TcpStream::connect(addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        s.write_all(request.as_bytes()).unwrap();
        let mut out = Vec::new();
        let closed = s.read_to_end(&mut out);
        let text = String::from_utf8_lossy(&out).into_owned();
        assert!(
            closed.is_ok(),
            "no orderly close after {text:?}: {closed:?}"
        );
        text
    })
    .await
    .unwrap()
}

#[tokio::test]
async fn unknown_paths_are_go_404s() {
    let server = TestServer::start().await;
    let alice = Caller::user(&server, "alice");
    for path in [
        "/nope",
        "/healthz/",
        "/v1/sandbox-pools/",
        "/v1/sandbox-pools/a/b",
        "/v1/namespaces/ns/contexts/",
        "/v1/namespaces/ns/contexts/a/b",
    ] {
        assert_go_error(&exact(alice.get(path).await).await, 404, NOT_FOUND);
        // No token needed to learn that nothing is there.
        let anonymous = Caller::anonymous(&server);
        assert_go_error(&exact(anonymous.delete(path).await).await, 404, NOT_FOUND);
    }
}

#[tokio::test]
async fn wrong_methods_are_go_405s() {
    let server = TestServer::start().await;
    let alice = Caller::user(&server, "alice");
    for (method, path, allow) in [
        (Method::PUT, "/healthz", "GET, HEAD"),
        (Method::POST, "/healthz", "GET, HEAD"),
        (Method::PATCH, "/v1/sandbox-pools/x", "DELETE, GET, HEAD"),
        (Method::POST, "/v1/sandbox-pools/x", "DELETE, GET, HEAD"),
        // Upstream: `POST` only; we also list pools (documented).
        (Method::PUT, "/v1/sandbox-pools", "GET, HEAD, POST"),
        (Method::GET, "/v1/contexts", "POST"),
        (Method::DELETE, "/v1/namespaces/ns/contexts", "GET, HEAD"),
        (
            Method::POST,
            "/v1/namespaces/ns/contexts/x",
            "DELETE, GET, HEAD",
        ),
    ] {
        let got = exact(alice.send(method.clone(), path).await).await;
        assert_go_error(&got, 405, "Method Not Allowed\n");
        assert_eq!(got.headers["allow"], allow, "{method} {path}");
    }
}

#[tokio::test]
async fn non_clean_paths_redirect_307_to_the_clean_path() {
    let server = TestServer::start().await;
    let http = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap();
    let got = exact(
        http.get(format!("{}//healthz", server.base))
            .send()
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(got.status, 307);
    assert_eq!(got.headers["location"], "/healthz");
    assert_eq!(
        got.content_type.as_deref(),
        Some("text/html; charset=utf-8")
    );
    assert_eq!(got.body, "<a href=\"/healthz\">Temporary Redirect</a>.\n\n");
    // Any method; the query is kept; no body but for GET.
    let url = format!("{}/v1/namespaces//contexts?x=1&y=2", server.base);
    let got = exact(http.post(url).send().await.unwrap()).await;
    assert_eq!(got.status, 307);
    assert_eq!(got.headers["location"], "/v1/namespaces/contexts?x=1&y=2");
    assert_eq!((got.content_type, got.body.as_str()), (None, ""));
    // Dot segments (a URL library would resolve them; send them raw).
    let answer = raw(
        &server,
        "GET /v1/sandbox-pools/../healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
    )
    .await;
    assert!(
        answer.starts_with("HTTP/1.1 307 Temporary Redirect\r\n"),
        "{answer}"
    );
    assert!(answer.contains("\r\nlocation: /v1/healthz\r\n"), "{answer}");
    let answer = raw(
        &server,
        "GET /./ HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
    )
    .await;
    assert!(answer.contains("\r\nlocation: /\r\n"), "{answer}");
}

#[tokio::test]
async fn json_answers_are_written_like_go() {
    let server = TestServer::start().await;
    let alice = Caller::user(&server, "alice");
    let got = exact(alice.get("/healthz").await).await;
    assert_eq!(
        (got.status, got.body.as_str()),
        (200, "{\"status\":\"ok\"}\n")
    );
    assert_eq!(got.content_type.as_deref(), Some("application/json"));
    let head = exact(alice.send(Method::HEAD, "/healthz").await).await;
    assert_eq!((head.status, head.body.as_str()), (200, ""));
    // StorageClass is never validated (as upstream): it comes back escaped.
    let body = json!({"name": "esc", "replicas": 1,
        "workspace": {"size": "1Gi", "accessMode": "ReadWriteOnce", "storageClass": "a<b>&c"}});
    let got = exact(alice.post("/v1/sandbox-pools", &body).await).await;
    assert_eq!(got.status, 201, "{}", got.body);
    assert!(
        got.body.starts_with(
            "{\"name\":\"esc\",\"status\":\"ready\",\"replicas\":1,\"readyReplicas\":1,\
         \"sandboxSelector\":\"context.rossoctl.io/pool=esc\",\"workspace\":{\"size\":\"1Gi\",\
         \"accessMode\":\"ReadWriteOnce\",\"storageClass\":\"a\\u003cb\\u003e\\u0026c\"}"
        ),
        "{}",
        got.body
    );
    assert!(got.body.ends_with("}\n"), "{}", got.body);
    let list = exact(alice.get("/v1/sandbox-pools").await).await;
    assert!(list.body.contains("a\\u003cb\\u003e\\u0026c") && list.body.ends_with("}\n"));
}

#[tokio::test]
async fn an_oversized_body_closes_the_connection_cleanly() {
    let server = TestServer::start().await;
    let token = server.user_token("alice");
    let big = format!("{{\"name\":\"{}\"}}", "a".repeat(2 << 20));
    // A keep-alive client: the answer says close, the server closes after
    // it (an orderly EOF, not a reset), and the next request works.
    let request = format!(
        "POST /v1/sandbox-pools HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {token}\r\n\
         Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{big}",
        big.len()
    );
    let answer = raw(&server, &request).await;
    assert!(
        answer.starts_with("HTTP/1.1 400 Bad Request\r\n"),
        "{answer}"
    );
    assert!(answer.contains("\r\nconnection: close\r\n"), "{answer}");
    assert!(answer.ends_with(
        "\r\n\r\n{\"error\":\"invalid_request\",\"message\":\"http: request body too large\"}\n"
    ), "{answer}");
    // Through a pooled client: the second request does not hit a dead
    // connection.
    let alice = Caller::user(&server, "alice");
    let got = exact(
        alice
            .post_raw("/v1/sandbox-pools", "application/json", big)
            .await,
    )
    .await;
    assert_eq!(got.status, 400);
    json_of(alice.get("/v1/sandbox-pools").await, 200).await;
    json_of(alice.get("/v1/sandbox-pools").await, 200).await;
}
