//! The sandbox-pool API over real HTTP on the `local` backend.

use crate::common::{assert_error, json_of, Caller, TestServer};
use reqwest::Method;
use serde_json::{json, Value};

async fn server() -> TestServer {
    TestServer::start_with(|c| c.local_warm_pools = vec!["research-agents".into()]).await
}

#[tokio::test]
async fn every_validation_rule_in_order_with_upstream_messages() {
    let server = server().await;
    let alice = Caller::user(&server, "alice");
    let long = "a".repeat(51);
    let ok_ws = json!({"size": "1Gi", "accessMode": "ReadWriteOnce"});
    let cases: Vec<(Value, &str)> = vec![
        (
            json!({}),
            "name must be a lowercase Kubernetes name no longer than 50 characters",
        ),
        (json!({"name": "Bad"}), "name must be a lowercase"),
        (
            json!({"name": long, "replicas": 1, "workspace": ok_ws}),
            "no longer than 50 characters",
        ),
        (
            json!({"name": "a\n", "replicas": 1}),
            "name must be a lowercase",
        ),
        (
            json!({"name": "-a", "replicas": 0}),
            "name must be a lowercase",
        ),
        (json!({"name": "a"}), "replicas must be between 1 and 100"),
        (
            json!({"name": "a", "replicas": 101, "workspace": ok_ws}),
            "replicas must be between 1 and 100",
        ),
        (
            json!({"name": "a", "replicas": -1}),
            "replicas must be between 1 and 100",
        ),
        (
            json!({"name": "a", "replicas": 1, "warmPoolRef": "Bad_Pool"}),
            "warmPoolRef must be a lowercase Kubernetes name",
        ),
        (
            json!({"name": "a", "replicas": 1, "warmPoolRef": "p..q"}),
            "warmPoolRef must be a lowercase Kubernetes name",
        ),
        (
            json!({"name": "a", "replicas": 1, "warmPoolRef": "p", "workspace": {"size": "1Gi"}}),
            "warmPoolRef cannot be combined with workspace settings",
        ),
        (
            json!({"name": "a", "replicas": 1, "warmPoolRef": "p", "workspace": {"readOnly": false}}),
            "warmPoolRef cannot be combined with workspace settings",
        ),
        (
            json!({"name": "a", "replicas": 1, "warmPoolRef": "p", "workspace": {"claimName": "x"}}),
            "warmPoolRef cannot be combined with workspace settings",
        ),
        (
            json!({"name": "a", "replicas": 1, "workspace": {"claimName": "X"}}),
            "workspace.claimName must be a lowercase Kubernetes name",
        ),
        (
            json!({"name": "a", "replicas": 1, "workspace": {"claimName": "x", "size": "1Gi", "readOnly": true}}),
            "workspace.claimName cannot be combined with size, accessMode, or storageClass",
        ),
        (
            json!({"name": "a", "replicas": 1, "workspace": {"claimName": "x", "storageClass": "s", "readOnly": true}}),
            "workspace.claimName cannot be combined with size, accessMode, or storageClass",
        ),
        (
            json!({"name": "a", "replicas": 1, "workspace": {"claimName": "x"}}),
            "workspace.readOnly is required with workspace.claimName",
        ),
        (
            json!({"name": "a", "replicas": 1, "workspace": {"claimName": "x", "readOnly": null}}),
            "workspace.readOnly is required with workspace.claimName",
        ),
        (
            json!({"name": "a", "replicas": 1, "workspace": {"size": "1Gi", "accessMode": "ReadWriteOnce", "readOnly": true}}),
            "workspace.readOnly requires workspace.claimName",
        ),
        (
            json!({"name": "a", "replicas": 1}),
            "workspace.size is required",
        ),
        (
            json!({"name": "a", "replicas": 1, "workspace": null}),
            "workspace.size is required",
        ),
        (
            json!({"name": "a", "replicas": 1, "workspace": {"size": "   "}}),
            "workspace.size is required",
        ),
        (
            json!({"name": "a", "replicas": 1, "workspace": {"size": " 1Gi"}}),
            "workspace.size must be a positive Kubernetes quantity",
        ),
        (
            json!({"name": "a", "replicas": 1, "workspace": {"size": "0Gi"}}),
            "workspace.size must be a positive Kubernetes quantity",
        ),
        (
            json!({"name": "a", "replicas": 1, "workspace": {"size": "-1Gi"}}),
            "workspace.size must be a positive Kubernetes quantity",
        ),
        (
            json!({"name": "a", "replicas": 1, "workspace": {"size": "1gi"}}),
            "workspace.size must be a positive Kubernetes quantity",
        ),
        (
            json!({"name": "a", "replicas": 1, "workspace": {"size": "1Gi"}}),
            "workspace.accessMode must be ReadWriteMany or ReadWriteOnce",
        ),
        (
            json!({"name": "a", "replicas": 1, "workspace": {"size": "1Gi", "accessMode": "readwriteonce"}}),
            "workspace.accessMode must be ReadWriteMany or ReadWriteOnce",
        ),
        (
            json!({"name": "a", "replicas": 1, "workspace": {"size": "1Gi", "accessMode": "ReadOnlyMany"}}),
            "workspace.accessMode must be ReadWriteMany or ReadWriteOnce",
        ),
    ];
    for (body, message) in cases {
        let resp = alice.post("/v1/sandbox-pools", &body).await;
        assert_error(resp, 400, "invalid_request", message).await;
    }
    // Nothing was created by any of them.
    let list = json_of(alice.get("/v1/sandbox-pools").await, 200).await;
    assert_eq!(list, json!({"items": []}));
}

#[tokio::test]
async fn request_bodies_decode_like_upstream() {
    let server = server().await;
    let alice = Caller::user(&server, "alice");
    let cases: Vec<(String, &str)> = vec![
        (String::new(), "EOF"),
        ("   \n".into(), "EOF"),
        ("{\"name\":".into(), "unexpected EOF"),
        ("xyz".into(), "invalid character 'x'"),
        ("[]".into(), "json: cannot unmarshal array into Go value of type pool.CreateRequest"),
        ("\"s\"".into(), "json: cannot unmarshal string into Go value of type pool.CreateRequest"),
        (r#"{"name":"a","extra":1}"#.into(), r#"json: unknown field "extra""#),
        (r#"{"name":"a","workspace":{"sizes":"1Gi"}}"#.into(), r#"json: unknown field "sizes""#),
        (r#"{"name":"a","replicas":"3"}"#.into(), "json: cannot unmarshal string into Go struct field CreateRequest.replicas of type int"),
        (r#"{"name":"a","replicas":3.5}"#.into(), "json: cannot unmarshal number 3.5 into Go struct field CreateRequest.replicas of type int"),
        (r#"{"name":"a","workspace":{"size":5}}"#.into(), "json: cannot unmarshal number into Go struct field Workspace.workspace.size of type string"),
        (r#"{"name":"a","workspace":{"readOnly":"true"}}"#.into(), "json: cannot unmarshal string into Go struct field Workspace.workspace.readOnly of type bool"),
        (r#"{"name":"a","workspace":[]}"#.into(), "json: cannot unmarshal array into Go struct field CreateRequest.workspace of type pool.Workspace"),
        (format!("{{\"name\":\"{}", "a".repeat(2 << 20)), "http: request body too large"),
    ];
    for (body, message) in cases {
        let resp = alice
            .post_raw("/v1/sandbox-pools", "application/json", body)
            .await;
        assert_error(resp, 400, "invalid_request", message).await;
    }
    // Case-insensitive keys, trailing garbage ignored, null = absent, and a
    // small first value followed by 2 MiB of spaces is accepted.
    let body = format!(
        r#"{{"NAME":"ci","Replicas":1,"warmPoolRef":null,"WORKSPACE":{{"Size":"1Gi","accessmode":"ReadWriteOnce"}}}} garbage{}"#,
        " ".repeat(2 << 20)
    );
    let pool = json_of(
        alice
            .post_raw("/v1/sandbox-pools", "application/json", body)
            .await,
        201,
    )
    .await;
    assert_eq!(pool["name"], "ci");
    assert_eq!(pool["workspace"]["accessMode"], "ReadWriteOnce");
}

#[tokio::test]
async fn dedicated_pool_end_to_end() {
    let server = server().await;
    let alice = Caller::user(&server, "alice");
    let body = json!({"name": "code-review", "replicas": 3, "workspace": {"size": "5Gi", "accessMode": "ReadWriteOnce", "storageClass": "fast"}});
    let resp = alice.post("/v1/sandbox-pools", &body).await;
    assert_eq!(resp.status().as_u16(), 201);
    let text = resp.text().await.unwrap();
    // Field order and omissions as upstream, then the members.
    assert_eq!(
        text,
        concat!(
            r#"{"name":"code-review","status":"ready","replicas":3,"readyReplicas":3,"#,
            r#""sandboxSelector":"context.rossoctl.io/pool=code-review","#,
            r#""workspace":{"size":"5Gi","accessMode":"ReadWriteOnce","storageClass":"fast"},"#,
            r#""sandboxes":[{"name":"sandbox-code-review-0","pod":null,"ready":true},"#,
            r#"{"name":"sandbox-code-review-1","pod":null,"ready":true},"#,
            r#"{"name":"sandbox-code-review-2","pod":null,"ready":true}]}"#,
            "\n"
        )
    );
    let got = json_of(alice.get("/v1/sandbox-pools/code-review").await, 200).await;
    assert_eq!(got, serde_json::from_str::<Value>(&text).unwrap());
    // Each sandbox mounts its own volume.
    let ns = server.data_dir.join("local/namespaces/default");
    for i in 0..3 {
        let link =
            std::fs::read_link(ns.join(format!("sandboxes/sandbox-code-review-{i}/workspace")))
                .unwrap();
        assert!(
            link.ends_with(format!("code-review-workspace-{i}/data")),
            "{link:?}"
        );
    }
    let resp = alice.delete("/v1/sandbox-pools/code-review").await;
    assert_eq!(resp.status().as_u16(), 204);
    assert_eq!(resp.text().await.unwrap(), "");
    assert!(std::fs::read_dir(ns.join("sandboxes"))
        .unwrap()
        .next()
        .is_none());
    assert!(std::fs::read_dir(ns.join("volumes"))
        .unwrap()
        .next()
        .is_none());
    assert_error(
        alice.get("/v1/sandbox-pools/code-review").await,
        404,
        "not_found",
        "sandbox pool not found",
    )
    .await;
    // A second delete finds nothing: 404, as upstream and Kubernetes.
    assert_error(
        alice.delete("/v1/sandbox-pools/code-review").await,
        404,
        "not_found",
        "sandbox pool not found",
    )
    .await;
}

#[tokio::test]
async fn shared_pool_end_to_end_allows_one_replica() {
    let server = server().await;
    let alice = Caller::user(&server, "alice");
    let body = json!({"name": "shared-review", "replicas": 3, "workspace": {"size": "5Gi", "accessMode": "ReadWriteMany"}});
    let pool = json_of(alice.post("/v1/sandbox-pools", &body).await, 201).await;
    assert_eq!(
        pool["workspace"],
        json!({"size": "5Gi", "accessMode": "ReadWriteMany"})
    );
    assert_eq!(
        pool["sandboxSelector"],
        "context.rossoctl.io/pool=shared-review"
    );
    let ns = server.data_dir.join("local/namespaces/default");
    for i in 0..3 {
        let link =
            std::fs::read_link(ns.join(format!("sandboxes/sandbox-shared-review-{i}/workspace")))
                .unwrap();
        assert!(link.ends_with("shared-review-workspace/data"), "{link:?}");
    }
    let solo = json!({"name": "solo", "replicas": 1, "workspace": {"size": "1Gi", "accessMode": "ReadWriteMany"}});
    let pool = json_of(alice.post("/v1/sandbox-pools", &solo).await, 201).await;
    assert_eq!(
        (pool["status"].as_str(), pool["replicas"].as_u64()),
        (Some("ready"), Some(1))
    );
    for name in ["shared-review", "solo"] {
        assert_eq!(
            alice
                .delete(&format!("/v1/sandbox-pools/{name}"))
                .await
                .status()
                .as_u16(),
            204
        );
    }
    assert!(std::fs::read_dir(ns.join("volumes"))
        .unwrap()
        .next()
        .is_none());
}

#[tokio::test]
async fn existing_claim_pool_end_to_end_keeps_the_volume() {
    let server = server().await;
    let alice = Caller::user(&server, "alice");
    let ctx = json!({"name": "prepared", "namespace": "default", "type": "workspace", "storage": {"backend": "pvc", "size": "2Gi", "accessMode": "ReadWriteMany", "storageClass": "scale"}});
    json_of(alice.post("/v1/contexts", &ctx).await, 201).await;
    let missing = json!({"name": "readers", "replicas": 3, "workspace": {"claimName": "nope", "readOnly": true}});
    assert_error(
        alice.post("/v1/sandbox-pools", &missing).await,
        400,
        "invalid_request",
        r#"invalid sandbox pool: workspace claim "nope" not found"#,
    )
    .await;
    let body = json!({"name": "readers", "replicas": 3, "workspace": {"claimName": "context-prepared", "readOnly": true}});
    let pool = json_of(alice.post("/v1/sandbox-pools", &body).await, 201).await;
    // The existing volume's own properties, plus claimName and readOnly.
    assert_eq!(
        pool["workspace"],
        json!({"size": "2Gi", "accessMode": "ReadWriteMany", "storageClass": "scale", "claimName": "context-prepared", "readOnly": true})
    );
    assert_eq!(pool["readyReplicas"], 3);
    // readOnly:false is kept in the answer.
    let rw = json!({"name": "writer", "replicas": 1, "workspace": {"claimName": "context-prepared", "readOnly": false}});
    let pool = json_of(alice.post("/v1/sandbox-pools", &rw).await, 201).await;
    assert_eq!(pool["workspace"]["readOnly"], false);
    for name in ["readers", "writer"] {
        assert_eq!(
            alice
                .delete(&format!("/v1/sandbox-pools/{name}"))
                .await
                .status()
                .as_u16(),
            204
        );
    }
    // The existing volume is never deleted.
    let ctx = json_of(
        alice.get("/v1/namespaces/default/contexts/prepared").await,
        200,
    )
    .await;
    assert_eq!(ctx["attachment"]["claimName"], "context-prepared");

    // A RWO volume serves one sandbox only.
    let rwo = json!({"name": "single", "namespace": "default", "type": "memory", "storage": {"backend": "pvc", "size": "1Gi", "accessMode": "ReadWriteOnce"}});
    json_of(alice.post("/v1/contexts", &rwo).await, 201).await;
    let body = json!({"name": "many", "replicas": 2, "workspace": {"claimName": "context-single", "readOnly": false}});
    assert_error(alice.post("/v1/sandbox-pools", &body).await, 400, "invalid_request", r#"invalid sandbox pool: workspace claim "context-single" must support ReadWriteMany for multiple sandboxes"#).await;
    let body = json!({"name": "one", "replicas": 1, "workspace": {"claimName": "context-single", "readOnly": false}});
    json_of(alice.post("/v1/sandbox-pools", &body).await, 201).await;
}

#[tokio::test]
async fn warm_pool_end_to_end() {
    let server = server().await;
    let alice = Caller::user(&server, "alice");
    let unknown =
        json!({"name": "fast-review", "replicas": 3, "warmPoolRef": "nope", "workspace": {}});
    assert_error(
        alice.post("/v1/sandbox-pools", &unknown).await,
        400,
        "invalid_request",
        r#"invalid sandbox pool: warm pool "nope" not found"#,
    )
    .await;
    let body = json!({"name": "fast-review", "replicas": 3, "warmPoolRef": "research-agents", "workspace": {}});
    let pool = json_of(alice.post("/v1/sandbox-pools", &body).await, 201).await;
    assert_eq!(pool["warmPoolRef"], "research-agents");
    assert_eq!(pool["workspace"], json!({"size": "", "accessMode": ""}));
    assert_eq!(
        (pool["status"].as_str(), pool["readyReplicas"].as_u64()),
        (Some("ready"), Some(3))
    );
    let members = pool["sandboxes"].as_array().unwrap();
    assert_eq!(members.len(), 3);
    for m in members {
        assert!(
            m["name"].as_str().unwrap().starts_with("research-agents-"),
            "{m}"
        );
        assert_eq!(m["ready"], true);
    }
    let ns = server.data_dir.join("local/namespaces/default");
    assert!(ns.join("claims/claim-fast-review-2.json").is_file());
    assert_eq!(
        alice
            .delete("/v1/sandbox-pools/fast-review")
            .await
            .status()
            .as_u16(),
        204
    );
    assert!(std::fs::read_dir(ns.join("claims"))
        .unwrap()
        .next()
        .is_none());
    assert!(std::fs::read_dir(ns.join("sandboxes"))
        .unwrap()
        .next()
        .is_none());
}

#[tokio::test]
async fn conflicts_across_strategies_answer_409() {
    let server = server().await;
    let alice = Caller::user(&server, "alice");
    let warm = json!({"name": "dup", "replicas": 1, "warmPoolRef": "research-agents"});
    json_of(alice.post("/v1/sandbox-pools", &warm).await, 201).await;
    for body in [
        warm.clone(),
        json!({"name": "dup", "replicas": 2, "workspace": {"size": "1Gi", "accessMode": "ReadWriteOnce"}}),
        json!({"name": "dup", "replicas": 2, "workspace": {"size": "1Gi", "accessMode": "ReadWriteMany"}}),
    ] {
        assert_error(
            alice.post("/v1/sandbox-pools", &body).await,
            409,
            "already_exists",
            "sandbox pool already exists",
        )
        .await;
    }
    // Another owner gets the same 409: names are global in the namespace.
    let bob = Caller::user(&server, "bob");
    assert_error(
        bob.post("/v1/sandbox-pools", &warm).await,
        409,
        "already_exists",
        "sandbox pool already exists",
    )
    .await;
    // The original is untouched.
    let pool = json_of(alice.get("/v1/sandbox-pools/dup").await, 200).await;
    assert_eq!(
        (pool["status"].as_str(), pool["replicas"].as_u64()),
        (Some("ready"), Some(1))
    );
}

#[tokio::test]
async fn another_owners_pools_are_invisible() {
    let server = server().await;
    let alice = Caller::user(&server, "alice");
    let bob = Caller::user(&server, "bob");
    let body = json!({"name": "private", "replicas": 1, "workspace": {"size": "1Gi", "accessMode": "ReadWriteOnce"}});
    json_of(alice.post("/v1/sandbox-pools", &body).await, 201).await;
    assert_error(
        bob.get("/v1/sandbox-pools/private").await,
        404,
        "not_found",
        "sandbox pool not found",
    )
    .await;
    assert_error(
        bob.get("/v1/sandbox-pools/private?wait=ready&timeout=5s")
            .await,
        404,
        "not_found",
        "sandbox pool not found",
    )
    .await;
    assert_eq!(
        json_of(bob.get("/v1/sandbox-pools").await, 200).await,
        json!({"items": []})
    );
    // Bob's delete answers like a missing pool's (404), and deletes nothing.
    assert_error(
        bob.delete("/v1/sandbox-pools/private").await,
        404,
        "not_found",
        "sandbox pool not found",
    )
    .await;
    let list = json_of(alice.get("/v1/sandbox-pools").await, 200).await;
    assert_eq!(list["items"].as_array().unwrap().len(), 1);
    assert_eq!(list["items"][0]["name"], "private");
    // Bob cannot mount Alice's context volume: it is "not found" to him.
    let ctx = json!({"name": "secret", "namespace": "default", "type": "memory", "storage": {"backend": "pvc", "size": "1Gi", "accessMode": "ReadWriteMany"}});
    json_of(alice.post("/v1/contexts", &ctx).await, 201).await;
    let steal = json!({"name": "steal", "replicas": 1, "workspace": {"claimName": "context-secret", "readOnly": true}});
    assert_error(
        bob.post("/v1/sandbox-pools", &steal).await,
        400,
        "invalid_request",
        r#"workspace claim "context-secret" not found"#,
    )
    .await;
    // Nor Alice's pool workspace.
    let steal = json!({"name": "steal", "replicas": 1, "workspace": {"claimName": "private-workspace-0", "readOnly": true}});
    assert_error(
        bob.post("/v1/sandbox-pools", &steal).await,
        400,
        "invalid_request",
        r#"workspace claim "private-workspace-0" not found"#,
    )
    .await;
}

#[tokio::test]
async fn scopes_and_tokens_are_enforced() {
    let server = server().await;
    let body = json!({"name": "p", "replicas": 1, "workspace": {"size": "1Gi", "accessMode": "ReadWriteOnce"}});
    let resp = Caller::anonymous(&server)
        .post("/v1/sandbox-pools", &body)
        .await;
    assert_error(resp, 401, "token_required", "").await;
    let read_only = Caller::with_token(&server, server.token("carol", "pools:read"));
    let resp = read_only.post("/v1/sandbox-pools", &body).await;
    assert_error(resp, 403, "scope_missing", "pools:write").await;
    let resp = read_only.delete("/v1/sandbox-pools/p").await;
    assert_error(resp, 403, "scope_missing", "pools:write").await;
    let write_only = Caller::with_token(&server, server.token("carol", "pools:write"));
    let resp = write_only.get("/v1/sandbox-pools").await;
    assert_error(resp, 403, "scope_missing", "pools:read").await;
    let resp = write_only.get("/v1/sandbox-pools/p").await;
    assert_error(resp, 403, "scope_missing", "pools:read").await;
    let resp = write_only.post("/v1/sandbox-pools", &body).await;
    assert_eq!(resp.status().as_u16(), 201);
}

#[tokio::test]
async fn wait_long_polls_and_reports_failure() {
    let server = server().await;
    let alice = Caller::user(&server, "alice");
    let body = json!({"name": "w", "replicas": 2, "workspace": {"size": "1Gi", "accessMode": "ReadWriteOnce"}});
    json_of(alice.post("/v1/sandbox-pools", &body).await, 201).await;
    let pool = json_of(
        alice
            .get("/v1/sandbox-pools/w?wait=ready&timeout=10s")
            .await,
        200,
    )
    .await;
    assert_eq!(pool["status"], "ready");
    assert_error(
        alice.get("/v1/sandbox-pools/w?wait=soon").await,
        400,
        "invalid_request",
        "wait must be \"ready\"",
    )
    .await;
    assert_error(
        alice
            .get("/v1/sandbox-pools/w?wait=ready&timeout=forever")
            .await,
        400,
        "invalid_request",
        "timeout must be a duration",
    )
    .await;
    assert_error(
        alice
            .get("/v1/sandbox-pools/missing?wait=ready&timeout=10s")
            .await,
        404,
        "not_found",
        "sandbox pool not found",
    )
    .await;
    // A sandbox that disappears fails the pool, with a reason.
    let sandbox = server
        .data_dir
        .join("local/namespaces/default/sandboxes/sandbox-w-1");
    std::fs::remove_dir_all(sandbox).unwrap();
    let pool = json_of(
        alice
            .get("/v1/sandbox-pools/w?wait=ready&timeout=10s")
            .await,
        200,
    )
    .await;
    assert_eq!(pool["status"], "failed");
    assert_eq!(pool["readyReplicas"], 1);
    assert_eq!(pool["reason"], "SandboxMissing");
    assert!(pool["message"].as_str().unwrap().contains("sandbox-w-1"));
    assert_eq!(
        pool["sandboxes"][1],
        json!({"name": "sandbox-w-1", "pod": null, "ready": false})
    );
    assert_eq!(
        alice.delete("/v1/sandbox-pools/w").await.status().as_u16(),
        204
    );
}

#[tokio::test]
async fn pools_survive_a_restart() {
    let server = server().await;
    let token = server.user_token("alice");
    let body = json!({"name": "durable", "replicas": 2, "workspace": {"size": "1Gi", "accessMode": "ReadWriteMany"}});
    let resp = Caller::with_token(&server, &token)
        .post("/v1/sandbox-pools", &body)
        .await;
    let before = json_of(resp, 201).await;
    let server = server.restart().await;
    let resp = Caller::with_token(&server, &token)
        .get("/v1/sandbox-pools/durable")
        .await;
    assert_eq!(json_of(resp, 200).await, before);
}

#[tokio::test]
async fn unknown_paths_and_methods() {
    let server = server().await;
    let alice = Caller::user(&server, "alice");
    let resp = alice.send(Method::PUT, "/v1/sandbox-pools/x").await;
    assert_eq!(resp.status().as_u16(), 405);
    let allow = resp.headers()["allow"].to_str().unwrap().to_owned();
    for m in ["GET", "DELETE"] {
        assert!(allow.contains(m), "{allow}");
    }
    // Names that cannot exist are simply not found; never passed on.
    assert_error(
        alice.get("/v1/sandbox-pools/a%2Fb").await,
        404,
        "not_found",
        "sandbox pool not found",
    )
    .await;
    assert_error(
        alice.get("/v1/sandbox-pools/..%2F..").await,
        404,
        "not_found",
        "sandbox pool not found",
    )
    .await;
}

#[tokio::test]
async fn concurrent_creates_of_one_name_give_one_pool() {
    let server = server().await;
    let alice = Caller::user(&server, "alice");
    let mut tasks = Vec::new();
    for i in 0..8 {
        let alice = alice.clone();
        // Mixed strategies, all under one name.
        let body = if i % 2 == 0 {
            json!({"name": "race", "replicas": 3, "workspace": {"size": "1Gi", "accessMode": "ReadWriteOnce"}})
        } else {
            json!({"name": "race", "replicas": 3, "warmPoolRef": "research-agents"})
        };
        tasks.push(tokio::spawn(async move {
            let resp = alice.post("/v1/sandbox-pools", &body).await;
            (resp.status().as_u16(), resp.text().await.unwrap())
        }));
    }
    let mut created = 0;
    for t in tasks {
        let (status, body) = t.await.unwrap();
        match status {
            201 => created += 1,
            409 => assert!(body.contains("sandbox pool already exists"), "{body}"),
            other => panic!("unexpected {other}: {body}"),
        }
    }
    assert_eq!(created, 1);
    let list = json_of(alice.get("/v1/sandbox-pools").await, 200).await;
    assert_eq!(list["items"].as_array().unwrap().len(), 1);
    assert_eq!(list["items"][0]["readyReplicas"], 3);
}

#[tokio::test]
async fn malformed_paths_and_queries_answer_json() {
    let server = server().await;
    let alice = Caller::user(&server, "alice");
    let resp = alice.get("/v1/sandbox-pools/%FF").await;
    assert_error(resp, 400, "invalid_request", "").await;
    let resp = alice.get("/v1/sandbox-pools/x?wait=ready&wait=ready").await;
    assert_error(resp, 400, "invalid_request", "").await;
    let resp = alice.get("/v1/sandbox-pools/x?timeout=5s").await;
    assert_error(resp, 400, "invalid_request", "timeout requires wait=ready").await;
}
