//! Sizes come back in the form the Kubernetes API server stores
//! (`resource.Quantity.String()`), on the local backend too: in create
//! answers, reads, lists and `contextctl` output, for pools and contexts.

use crate::common::{json_of, Caller, TestServer};
use serde_json::json;

/// (as sent, as a cluster stores it): the examples and the
/// apimachinery quirks (verbatim fast-path inputs, binary sizes that are
/// not whole bytes, a bare exponent).
const SIZES: &[(&str, &str)] = &[
    ("1.5Gi", "1536Mi"),
    ("1000M", "1G"),
    (".5Gi", "512Mi"),
    ("2048Mi", "2Gi"),
    ("1024Ki", "1Mi"),
    ("5Gi", "5Gi"),
    ("1.500G", "1.500G"),
    ("+1Ki", "+1Ki"),
    ("1.5Ki", "1536"),
    ("100.035Ki", "102435840m"),
    ("1e3", "1e3"),
    ("1000E", "1"),
    // The API server's defaulting rounds resource lists up to 10⁻³.
    ("5n", "1m"),
];

#[tokio::test]
async fn pool_and_context_sizes_are_canonical_everywhere() {
    let server = TestServer::start().await;
    let alice = Caller::user(&server, "alice");
    for (i, (sent, stored)) in SIZES.iter().enumerate() {
        let name = format!("p{i}");
        let body = json!({"name": name, "replicas": 2,
                          "workspace": {"size": sent, "accessMode": "ReadWriteMany"}});
        let created = json_of(alice.post("/v1/sandbox-pools", &body).await, 201).await;
        assert_eq!(created["workspace"]["size"], *stored, "create {sent}");
        let got = json_of(alice.get(&format!("/v1/sandbox-pools/{name}")).await, 200).await;
        assert_eq!(got["workspace"]["size"], *stored, "get {sent}");

        let ctx = format!("c{i}");
        let body = json!({"name": ctx, "namespace": "team1", "type": "memory",
                          "storage": {"backend": "pvc", "size": sent, "accessMode": "ReadWriteOnce"}});
        let created = json_of(alice.post("/v1/contexts", &body).await, 201).await;
        assert_eq!(created["storage"]["size"], *stored, "create context {sent}");
        let path = format!("/v1/namespaces/team1/contexts/{ctx}");
        let got = json_of(alice.get(&path).await, 200).await;
        assert_eq!(got["storage"]["size"], *stored, "get context {sent}");
    }
    let pools = json_of(alice.get("/v1/sandbox-pools").await, 200).await;
    let contexts = json_of(alice.get("/v1/namespaces/team1/contexts").await, 200).await;
    for (i, (_, stored)) in SIZES.iter().enumerate() {
        let pool = pools["items"]
            .as_array()
            .unwrap()
            .iter()
            .find(|p| p["name"] == format!("p{i}"))
            .unwrap();
        assert_eq!(pool["workspace"]["size"], *stored);
        let ctx = contexts["items"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["name"] == format!("c{i}"))
            .unwrap();
        assert_eq!(ctx["storage"]["size"], *stored);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn contextctl_prints_canonical_sizes() {
    let server = TestServer::start().await;
    let token = server.user_token("alice");
    let run = |args: &[&str]| {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_contextctl"))
            .args(["--url", &server.base, "--token", &token])
            .args(args)
            .env_remove("CONTEXT_SERVICE_URL")
            .env_remove("CONTEXT_SERVICE_TOKEN")
            .env_remove("CS_STORAGE_CLASS")
            .current_dir(&server.data_dir)
            .output()
            .expect("contextctl runs");
        assert!(out.status.success(), "{args:?}: {out:?}");
        String::from_utf8(out.stdout).unwrap()
    };
    let created = tokio::task::block_in_place(|| run(&["create", "demo", "-s", "1.5Gi"]));
    assert_eq!(
        created,
        "demo: ready (1/1 ready), 1536Mi RWO, selector context.rossoctl.io/pool=demo\n"
    );
    let listed = tokio::task::block_in_place(|| run(&["ls"]));
    assert!(listed.contains(", 1536Mi RWO,"), "{listed}");
    let json = tokio::task::block_in_place(|| run(&["get", "demo", "--json"]));
    let pool: serde_json::Value = serde_json::from_str(&json).unwrap();
    assert_eq!(pool["workspace"]["size"], "1536Mi");
}
