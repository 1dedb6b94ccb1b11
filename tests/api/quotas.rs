//! Issue 10: per-owner quotas on pools (replicas summed) and named
//! contexts (across namespaces), like the workload quota.

use serde_json::{json, Value};

use crate::common::{assert_error, json_of, Caller, TestServer};

fn pool(name: &str, replicas: u32) -> Value {
    json!({"name": name, "replicas": replicas,
        "workspace": {"size": "1Gi", "accessMode": "ReadWriteOnce"}})
}

fn context(name: &str, namespace: &str) -> Value {
    json!({"name": name, "namespace": namespace, "type": "memory",
        "storage": {"backend": "pvc", "size": "1Gi", "accessMode": "ReadWriteOnce"}})
}

#[tokio::test]
async fn pool_replicas_are_summed_per_owner() {
    let server = TestServer::start_with(|c| c.pool_replica_quota = 5).await;
    let alice = Caller::user(&server, "alice");
    let bob = Caller::user(&server, "bob");
    assert_eq!(
        alice
            .post("/v1/sandbox-pools", &pool("p1", 3))
            .await
            .status(),
        201
    );
    let resp = alice.post("/v1/sandbox-pools", &pool("p2", 3)).await;
    assert_error(
        resp,
        429,
        "pool_quota_exceeded",
        "the quota of 5 sandbox replicas per owner is reached: your pools hold 3 and this one asks for 3; delete a pool first",
    )
    .await;
    // Nothing of the refused pool exists.
    let resp = alice.get("/v1/sandbox-pools/p2").await;
    assert_error(resp, 404, "not_found", "sandbox pool not found").await;
    assert_eq!(
        alice
            .post("/v1/sandbox-pools", &pool("p2", 2))
            .await
            .status(),
        201
    );
    // Another owner has a quota of its own, and is served.
    assert_eq!(
        bob.post("/v1/sandbox-pools", &pool("b1", 5)).await.status(),
        201
    );
    let list = json_of(bob.get("/v1/sandbox-pools").await, 200).await;
    assert_eq!(list["items"].as_array().unwrap().len(), 1);
    // Deleting gives the room back.
    assert_eq!(alice.delete("/v1/sandbox-pools/p1").await.status(), 204);
    assert_eq!(
        alice
            .post("/v1/sandbox-pools", &pool("p3", 3))
            .await
            .status(),
        201
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_creates_cannot_pass_the_quota_together() {
    let server = TestServer::start_with(|c| c.pool_replica_quota = 5).await;
    let carol = Caller::user(&server, "carol");
    let tasks: Vec<_> = (0..6)
        .map(|i| {
            let carol = carol.clone();
            tokio::spawn(async move {
                let resp = carol
                    .post("/v1/sandbox-pools", &pool(&format!("c{i}"), 2))
                    .await;
                let status = resp.status().as_u16();
                let body: Value = resp.json().await.unwrap();
                (status, body)
            })
        })
        .collect();
    let mut created = 0;
    for t in tasks {
        match t.await.unwrap() {
            (201, _) => created += 1,
            (429, body) => assert_eq!(body["error"], "pool_quota_exceeded", "{body}"),
            other => panic!("unexpected answer {other:?}"),
        }
    }
    assert_eq!(created, 2, "2 pools of 2 replicas fit a quota of 5");
    let list = json_of(carol.get("/v1/sandbox-pools").await, 200).await;
    assert_eq!(list["items"].as_array().unwrap().len(), 2);
}

#[tokio::test]
async fn named_contexts_are_counted_across_namespaces() {
    let server = TestServer::start_with(|c| c.context_quota = 2).await;
    let alice = Caller::user(&server, "alice");
    assert_eq!(
        alice
            .post("/v1/contexts", &context("c1", "team1"))
            .await
            .status(),
        201
    );
    assert_eq!(
        alice
            .post("/v1/contexts", &context("c2", "team1"))
            .await
            .status(),
        201
    );
    let resp = alice.post("/v1/contexts", &context("c3", "team2")).await;
    assert_error(
        resp,
        429,
        "context_quota_exceeded",
        "the quota of 2 named contexts per owner is reached; delete one first",
    )
    .await;
    let bob = Caller::user(&server, "bob");
    assert_eq!(
        bob.post("/v1/contexts", &context("b1", "team2"))
            .await
            .status(),
        201
    );
    assert_eq!(
        alice
            .delete("/v1/namespaces/team1/contexts/c1")
            .await
            .status(),
        204
    );
    assert_eq!(
        alice
            .post("/v1/contexts", &context("c3", "team2"))
            .await
            .status(),
        201
    );
}

#[tokio::test]
async fn quotas_have_defaults() {
    let server = TestServer::start().await;
    assert_eq!(server.config().pool_replica_quota, 100);
    assert_eq!(server.config().context_quota, 20);
    let alice = Caller::user(&server, "alice");
    let resp = alice.post("/v1/sandbox-pools", &pool("big", 100)).await;
    assert_eq!(resp.status(), 201);
    let resp = alice.post("/v1/sandbox-pools", &pool("one-more", 1)).await;
    assert_error(resp, 429, "pool_quota_exceeded", "your pools hold 100").await;
}
