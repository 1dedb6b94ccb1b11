//! The service starts on its embedded default and answers health checks.

use crate::common::{Caller, TestServer};

#[tokio::test]
async fn health_and_dev_token_on_first_start() {
    let server = TestServer::start().await;
    let health = server.client("alice").health().await.unwrap();
    assert_eq!(health["status"], "ok");
    let token = std::fs::read_to_string(server.data_dir.join("auth/dev-token")).unwrap();
    assert_eq!(token.trim().split('.').count(), 3, "dev token is a JWT");
    let resp = Caller::anonymous(&server).get("/readyz").await;
    assert_eq!(resp.status(), 200);
    let body: serde_json::Value = resp.json().await.unwrap();
    assert_eq!(body["status"], "ready");
}

#[tokio::test]
async fn restart_keeps_the_signing_key() {
    let server = TestServer::start().await;
    let token = server.user_token("alice");
    let server = server.restart().await;
    let principal = server_auth_check(&server, &token);
    assert_eq!(principal, "alice");
}

fn server_auth_check(server: &TestServer, token: &str) -> String {
    let issuer = context_service::auth::dev::DevIssuer::load(&server.data_dir).unwrap();
    let mut keys = context_service::auth::KeySet::new();
    keys.add_jwks(&issuer.jwks()).unwrap();
    let auth = context_service::auth::Authenticator::new(keys, server.token_policy());
    auth.authenticate(token, None).unwrap().subject().to_owned()
}

#[tokio::test]
async fn metrics_count_requests_by_route_and_status() {
    let server = TestServer::start().await;
    let anyone = Caller::anonymous(&server);
    for _ in 0..3 {
        assert_eq!(anyone.get("/healthz").await.status(), 200);
    }
    let resp = anyone.get("/metrics").await;
    assert_eq!(resp.status(), 200);
    let text = resp.text().await.unwrap();
    let line = text
        .lines()
        .find(|l| {
            l.starts_with("context_service_http_requests_total{")
                && l.contains("route=\"/healthz\"")
                && l.contains("status=\"200\"")
        })
        .unwrap_or_else(|| panic!("no healthz counter in:\n{text}"));
    assert!(line.ends_with(" 3"), "{line}");
    assert!(text.contains("context_service_http_request_duration_seconds_bucket"));
}
