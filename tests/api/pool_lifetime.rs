//! Pool lifetime over real HTTP on the `local` backend: `ttl` validation,
//! `expiresAt`, removal at expiry (also across a restart, and of pools that
//! expired while the service was down), and suspend / resume with their
//! `409`s.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use k8s_openapi::jiff::{SignedDuration, Timestamp};
use reqwest::Method;
use serde_json::{json, Value};

use crate::common::workload_bundles::tgz;
use crate::common::{assert_error, json_of, Caller, TestServer};

/// A server whose pools may live as briefly as one second.
async fn short_lived() -> TestServer {
    TestServer::start_with(|c| {
        c.pool_ttl_min = Duration::from_secs(1);
        c.local_warm_pools = vec!["research-agents".into()];
    })
    .await
}

fn dedicated(name: &str, replicas: u32, ttl: Option<&str>) -> Value {
    let mut body = json!({"name": name, "replicas": replicas,
        "workspace": {"size": "1Gi", "accessMode": "ReadWriteOnce"}});
    if let Some(ttl) = ttl {
        body["ttl"] = json!(ttl);
    }
    body
}

fn sandbox_dir(server: &TestServer, name: &str) -> PathBuf {
    server
        .data_dir
        .join("local/namespaces/default/sandboxes")
        .join(name)
}

fn expires_at(pool: &Value) -> Timestamp {
    pool["expiresAt"]
        .as_str()
        .unwrap_or_else(|| panic!("no expiresAt in {pool}"))
        .parse()
        .expect("expiresAt is RFC 3339")
}

/// Polls `GET` until the pool answers `404`, at most `within`.
async fn gone_within(caller: &Caller, name: &str, within: Duration) {
    let deadline = Instant::now() + within;
    loop {
        let resp = caller.get(&format!("/v1/sandbox-pools/{name}")).await;
        if resp.status().as_u16() == 404 {
            assert_error(resp, 404, "not_found", "sandbox pool not found").await;
            return;
        }
        assert!(
            Instant::now() < deadline,
            "pool {name} still there after {within:?}: {}",
            resp.text().await.unwrap_or_default()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test]
async fn ttl_is_validated_against_the_bounds() {
    let server = TestServer::start().await;
    let alice = Caller::user(&server, "alice");
    let cases = [
        (
            dedicated("a", 1, Some("soon")),
            "ttl must be a duration such as 2h or 30m (between 1m and 168h)",
        ),
        (
            dedicated("a", 1, Some("30s")),
            "ttl must be between 1m and 168h; got 30s",
        ),
        (
            dedicated("a", 1, Some("169h")),
            "ttl must be between 1m and 168h; got 169h",
        ),
        (
            dedicated("a", 1, Some("0s")),
            "ttl must be between 1m and 168h; got 0s",
        ),
        (
            dedicated("a", 1, Some("-1h")),
            "ttl must be a duration such as 2h or 30m",
        ),
        // Upstream's rules come first.
        (
            dedicated("Bad", 1, Some("soon")),
            "name must be a lowercase Kubernetes name",
        ),
        (
            json!({"name": "a", "replicas": 1, "ttl": 5,
                "workspace": {"size": "1Gi", "accessMode": "ReadWriteOnce"}}),
            "json: cannot unmarshal number into Go struct field CreateRequest.ttl of type string",
        ),
    ];
    for (body, message) in cases {
        let resp = alice.post("/v1/sandbox-pools", &body).await;
        assert_error(resp, 400, "invalid_request", message).await;
    }
    let list = json_of(alice.get("/v1/sandbox-pools").await, 200).await;
    assert_eq!(list, json!({"items": []}), "nothing was created");

    // Bounds are settings.
    let strict = TestServer::start_with(|c| {
        c.pool_ttl_min = Duration::from_secs(600);
        c.pool_ttl_max = Duration::from_secs(3600);
    })
    .await;
    let bob = Caller::user(&strict, "bob");
    let resp = bob
        .post("/v1/sandbox-pools", &dedicated("b", 1, Some("5m")))
        .await;
    assert_error(
        resp,
        400,
        "invalid_request",
        "ttl must be between 10m and 1h; got 5m",
    )
    .await;
    let resp = bob
        .post("/v1/sandbox-pools", &dedicated("b", 1, Some("1h")))
        .await;
    json_of(resp, 201).await;
}

#[tokio::test]
async fn bounds_that_cannot_hold_refuse_to_start() {
    let err = TestServer::try_start_with(|c| {
        c.pool_ttl_min = Duration::from_secs(7200);
        c.pool_ttl_max = Duration::from_secs(3600);
    })
    .await
    .err()
    .expect("refused");
    assert!(format!("{err:#}").contains("--pool-ttl-min"), "{err:#}");
}

#[tokio::test]
async fn expires_at_is_shown_and_kept_across_a_restart() {
    let server = TestServer::start().await;
    let alice = Caller::user(&server, "alice");
    let before = Timestamp::now();
    let created = json_of(
        alice
            .post("/v1/sandbox-pools", &dedicated("p", 2, Some("2h")))
            .await,
        201,
    )
    .await;
    let at = expires_at(&created);
    let two_hours = SignedDuration::from_hours(2);
    assert!(
        at >= before.checked_add(two_hours).unwrap()
            && at
                <= Timestamp::now().checked_add(two_hours).unwrap() + SignedDuration::from_secs(1),
        "{at}"
    );
    assert_eq!(at.subsec_nanosecond(), 0, "whole seconds: {at}");
    assert_eq!(created["status"], "ready");
    let got = json_of(alice.get("/v1/sandbox-pools/p").await, 200).await;
    assert_eq!(got["expiresAt"], created["expiresAt"]);
    let list = json_of(alice.get("/v1/sandbox-pools").await, 200).await;
    assert_eq!(list["items"][0]["expiresAt"], created["expiresAt"]);

    // A pool without a ttl never expires and shows no expiresAt.
    let forever = json_of(
        alice
            .post("/v1/sandbox-pools", &dedicated("q", 1, None))
            .await,
        201,
    )
    .await;
    assert!(forever.get("expiresAt").is_none(), "{forever}");

    // The expiry is on disk, not in memory.
    let server = server.restart().await;
    let alice = Caller::user(&server, "alice");
    let got = json_of(alice.get("/v1/sandbox-pools/p").await, 200).await;
    assert_eq!(got["expiresAt"], created["expiresAt"]);
    let got = json_of(alice.get("/v1/sandbox-pools/q").await, 200).await;
    assert!(got.get("expiresAt").is_none(), "{got}");
}

#[tokio::test]
async fn an_expired_pool_is_removed_with_its_objects() {
    let server = short_lived().await;
    let alice = Caller::user(&server, "alice");
    let created = json_of(
        alice
            .post("/v1/sandbox-pools", &dedicated("brief", 2, Some("2s")))
            .await,
        201,
    )
    .await;
    // A longer-lived pool of another owner stays.
    let bob = Caller::user(&server, "bob");
    json_of(
        bob.post("/v1/sandbox-pools", &dedicated("stays", 1, Some("1h")))
            .await,
        201,
    )
    .await;
    assert!(sandbox_dir(&server, "sandbox-brief-0").is_dir());
    let started = Instant::now();
    gone_within(&alice, "brief", Duration::from_secs(10)).await;
    // Not before its time (the expiry is rounded up to a whole second).
    assert!(
        Timestamp::now() >= expires_at(&created),
        "removed early, after {:?}",
        started.elapsed()
    );
    for i in 0..2 {
        assert!(!sandbox_dir(&server, &format!("sandbox-brief-{i}")).exists());
        assert!(!server
            .data_dir
            .join(format!(
                "local/namespaces/default/volumes/brief-workspace-{i}"
            ))
            .exists());
    }
    let list = json_of(alice.get("/v1/sandbox-pools").await, 200).await;
    assert_eq!(list, json!({"items": []}));
    json_of(bob.get("/v1/sandbox-pools/stays").await, 200).await;
    // The name is free again.
    json_of(
        alice
            .post("/v1/sandbox-pools", &dedicated("brief", 1, None))
            .await,
        201,
    )
    .await;
}

#[tokio::test]
async fn pools_expire_across_restarts() {
    let server = short_lived().await;
    let alice = Caller::user(&server, "alice");
    // Expires while the service is down.
    json_of(
        alice
            .post("/v1/sandbox-pools", &dedicated("down", 1, Some("1s")))
            .await,
        201,
    )
    .await;
    // Expires after the restart: the new process must find it by itself.
    json_of(
        alice
            .post("/v1/sandbox-pools", &dedicated("later", 1, Some("4s")))
            .await,
        201,
    )
    .await;
    let mut server = server;
    server.stop().await;
    tokio::time::sleep(Duration::from_millis(2500)).await;
    let server = server.restart().await;
    let alice = Caller::user(&server, "alice");
    // Removed by the scan at start.
    gone_within(&alice, "down", Duration::from_secs(3)).await;
    assert!(!sandbox_dir(&server, "sandbox-down-0").exists());
    let later = json_of(alice.get("/v1/sandbox-pools/later").await, 200).await;
    assert_eq!(later["status"], "ready");
    gone_within(&alice, "later", Duration::from_secs(8)).await;
    assert!(!sandbox_dir(&server, "sandbox-later-0").exists());
}

/// Creates a workload `name` of `sub` and activates one revision.
async fn ready_workload(server: &TestServer, sub: &str, name: &str) {
    let client = server.client(sub);
    client.create_workload(Some(name), None).await.unwrap();
    let rev = client
        .upload_bundle(name, tgz(&[("README.md", b"hello\n")]))
        .await
        .unwrap();
    client.activate_workload(name, &rev.revision).await.unwrap();
}

#[tokio::test]
async fn suspend_and_resume_keep_the_sandboxes_and_refuse_deliveries() {
    let server = TestServer::start().await;
    let alice = Caller::user(&server, "alice");
    json_of(
        alice
            .post("/v1/sandbox-pools", &dedicated("p", 2, None))
            .await,
        201,
    )
    .await;
    ready_workload(&server, "alice", "docs").await;
    let note = sandbox_dir(&server, "sandbox-p-0").join("workspace/note.txt");
    std::fs::write(&note, "kept\n").unwrap();

    let suspended = json_of(
        alice.post("/v1/sandbox-pools/p/suspend", &json!({})).await,
        200,
    )
    .await;
    assert_eq!(suspended["status"], "suspended");
    assert_eq!(suspended["readyReplicas"], 0);
    assert_eq!(suspended["sandboxes"][1]["name"], "sandbox-p-1");
    assert_eq!(suspended["sandboxes"][1]["ready"], false);
    // Idempotent.
    let again = json_of(
        alice.post("/v1/sandbox-pools/p/suspend", &json!({})).await,
        200,
    )
    .await;
    assert_eq!(again, suspended);
    let got = json_of(alice.get("/v1/sandbox-pools/p").await, 200).await;
    assert_eq!(got["status"], "suspended");
    // A waiter does not hang on a pool that cannot become ready by itself.
    let started = Instant::now();
    let waited = json_of(
        alice
            .get("/v1/sandbox-pools/p?wait=ready&timeout=30s")
            .await,
        200,
    )
    .await;
    assert_eq!(waited["status"], "suspended");
    assert!(started.elapsed() < Duration::from_secs(5));
    // The directories and files stay.
    assert!(sandbox_dir(&server, "sandbox-p-1").is_dir());
    assert_eq!(std::fs::read_to_string(&note).unwrap(), "kept\n");

    // Nothing runs in a suspended sandbox.
    for (target, what) in [
        (
            json!({"runId": "r1", "sandbox": "sandbox-p-0"}),
            "sandbox \"sandbox-p-0\" is suspended (pool \"p\")",
        ),
        (
            json!({"runId": "r1", "pool": "p"}),
            "sandbox pool \"p\" is suspended",
        ),
    ] {
        let resp = alice.post("/v1/workloads/docs/deliveries", &target).await;
        assert_error(resp, 409, "sandbox_suspended", what).await;
    }

    // Still suspended after a restart.
    let server = server.restart().await;
    let alice = Caller::user(&server, "alice");
    let got = json_of(alice.get("/v1/sandbox-pools/p").await, 200).await;
    assert_eq!(got["status"], "suspended");

    let resumed = json_of(
        alice.post("/v1/sandbox-pools/p/resume", &json!({})).await,
        200,
    )
    .await;
    assert_eq!(resumed["status"], "ready");
    assert_eq!(resumed["readyReplicas"], 2);
    let again = json_of(
        alice.post("/v1/sandbox-pools/p/resume", &json!({})).await,
        200,
    )
    .await;
    assert_eq!(again, resumed);
    assert_eq!(std::fs::read_to_string(&note).unwrap(), "kept\n");
    let delivered = alice
        .post(
            "/v1/workloads/docs/deliveries",
            &json!({"runId": "r1", "pool": "p"}),
        )
        .await;
    // The workloads API writes no trailing newline (not `json_of`).
    assert_eq!(delivered.status().as_u16(), 201);
    let body: Value = delivered.json().await.expect("JSON");
    assert_eq!(body["deliveries"].as_array().map(Vec::len), Some(2));
}

#[tokio::test]
async fn suspend_answers_404_409_and_403_with_clear_messages() {
    let server = short_lived().await;
    let alice = Caller::user(&server, "alice");
    let bob = Caller::user(&server, "bob");
    json_of(
        alice
            .post("/v1/sandbox-pools", &dedicated("mine", 1, None))
            .await,
        201,
    )
    .await;
    for path in [
        "/v1/sandbox-pools/none/suspend",
        "/v1/sandbox-pools/none/resume",
        "/v1/sandbox-pools/Not_A_Name/suspend",
    ] {
        let resp = alice.post(path, &json!({})).await;
        assert_error(resp, 404, "not_found", "sandbox pool not found").await;
    }
    // Another owner's pool is missing for bob, and stays running.
    let resp = bob.post("/v1/sandbox-pools/mine/suspend", &json!({})).await;
    assert_error(resp, 404, "not_found", "sandbox pool not found").await;
    let got = json_of(alice.get("/v1/sandbox-pools/mine").await, 200).await;
    assert_eq!(got["status"], "ready");

    // Warm-pool pools cannot be suspended.
    json_of(
        alice
            .post(
                "/v1/sandbox-pools",
                &json!({"name": "warm", "replicas": 1, "warmPoolRef": "research-agents"}),
            )
            .await,
        201,
    )
    .await;
    for verb in ["suspend", "resume"] {
        let resp = alice
            .post(&format!("/v1/sandbox-pools/warm/{verb}"), &json!({}))
            .await;
        assert_error(
            resp,
            409,
            "pool_not_suspendable",
            "a warm-pool pool cannot be suspended",
        )
        .await;
    }
    let got = json_of(alice.get("/v1/sandbox-pools/warm").await, 200).await;
    assert_eq!(got["status"], "ready");

    // Reading is not enough.
    let reader = Caller::with_token(&server, server.token("alice", "pools:read"));
    let resp = reader
        .post("/v1/sandbox-pools/mine/suspend", &json!({}))
        .await;
    assert_error(resp, 403, "scope_missing", "pools:write").await;
    // GET is not a suspend.
    let resp = alice
        .send(Method::GET, "/v1/sandbox-pools/mine/suspend")
        .await;
    assert_eq!(resp.status().as_u16(), 405);

    // A suspended pool with a ttl still expires.
    json_of(
        alice
            .post("/v1/sandbox-pools", &dedicated("nap", 1, Some("2s")))
            .await,
        201,
    )
    .await;
    let nap = json_of(
        alice
            .post("/v1/sandbox-pools/nap/suspend", &json!({}))
            .await,
        200,
    )
    .await;
    assert_eq!(nap["status"], "suspended");
    assert!(nap["expiresAt"].is_string());
    gone_within(&alice, "nap", Duration::from_secs(10)).await;
    assert!(!sandbox_dir(&server, "sandbox-nap-0").exists());
}
