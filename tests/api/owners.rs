//! Issue 10, item 5: delegation acts only for users. Owners carry their
//! kind (`sub:<sub>` for a token's own subject, `user:<id>` for a user a
//! trusted service acts for), and a data dir written before owners had
//! kinds is migrated at start.

use std::path::Path;

use redb::{Database, ReadableDatabase, ReadableTable, TableDefinition};
use reqwest::header;
use serde_json::{json, Value};

use crate::common::workload_bundles::{tgz, MEDIA};
use crate::common::{assert_error, embedded_only, json_of, Caller, TestServer};
use context_service::bundle::{self, CanonicalOptions, Limits};

/// A token with the `delegate` scope and every user scope, acting for
/// `X-Context-Subject: <subject>`.
fn delegate(server: &TestServer, subject: &str) -> Caller {
    let scopes = format!("delegate {}", context_service::auth::Scope::user_scopes());
    Caller::with_token(server, server.token("gateway", &scopes))
        .with_header("x-context-subject", subject)
}

#[tokio::test]
async fn a_delegate_cannot_reach_what_a_token_subject_owns() {
    let server = TestServer::start().await;
    // The service principal svc-billing, with its own token.
    let billing = Caller::user(&server, "svc-billing");
    let resp = billing
        .post("/v1/workloads", &json!({"name": "invoices"}))
        .await;
    assert_eq!(resp.status(), 201);
    let pool = json!({"name": "billing", "replicas": 1,
        "workspace": {"size": "1Gi", "accessMode": "ReadWriteOnce"}});
    assert_eq!(billing.post("/v1/sandbox-pools", &pool).await.status(), 201);
    let context = json!({"name": "ledger", "namespace": "team", "type": "memory",
        "storage": {"backend": "pvc", "size": "1Gi", "accessMode": "ReadWriteOnce"}});
    assert_eq!(billing.post("/v1/contexts", &context).await.status(), 201);

    // A delegate naming the user "svc-billing" acts for someone else.
    let impostor = delegate(&server, "user:svc-billing");
    let resp = impostor.get("/v1/workloads/invoices").await;
    assert_error(resp, 404, "workload_not_found", "\"invoices\" not found").await;
    let body: Value = impostor.get("/v1/workloads").await.json().await.unwrap();
    assert_eq!(body["workloads"], json!([]));
    let resp = impostor.delete("/v1/workloads/invoices").await;
    assert_error(resp, 404, "workload_not_found", "invoices").await;
    let resp = impostor
        .post("/v1/workloads/invoices/uploads", &json!({}))
        .await;
    assert_error(resp, 404, "workload_not_found", "invoices").await;
    let resp = impostor.get("/v1/sandbox-pools/billing").await;
    assert_error(resp, 404, "not_found", "sandbox pool not found").await;
    let list = json_of(impostor.get("/v1/sandbox-pools").await, 200).await;
    assert_eq!(list, json!({"items": []}));
    let resp = impostor.get("/v1/namespaces/team/contexts/ledger").await;
    assert_error(resp, 404, "not_found", "context resource not found").await;
    // Its own workload of the same name is its own.
    let resp = impostor
        .post("/v1/workloads", &json!({"name": "invoices"}))
        .await;
    assert_eq!(resp.status(), 201);
    assert_eq!(
        impostor.delete("/v1/workloads/invoices").await.status(),
        204
    );

    // The service's things are untouched, and it is still served.
    let got: Value = billing
        .get("/v1/workloads/invoices")
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(got["status"], "awaiting_upload");
    let pool = json_of(billing.get("/v1/sandbox-pools/billing").await, 200).await;
    assert_eq!(pool["name"], "billing");
}

#[tokio::test]
async fn a_delegate_cannot_reach_the_dev_owner() {
    let server = TestServer::start().await;
    let dev_token = std::fs::read_to_string(server.data_dir.join("auth/dev-token")).unwrap();
    let dev = Caller::with_token(&server, dev_token.trim());
    assert_eq!(
        dev.post("/v1/workloads", &json!({"name": "dev-docs"}))
            .await
            .status(),
        201
    );
    let as_dev = delegate(&server, "user:dev");
    let resp = as_dev.get("/v1/workloads/dev-docs").await;
    assert_error(resp, 404, "workload_not_found", "dev-docs").await;
    let body: Value = as_dev.get("/v1/workloads").await.json().await.unwrap();
    assert_eq!(body["workloads"], json!([]));
    // The dev token keeps working (contextctl's default).
    let body: Value = dev.get("/v1/workloads").await.json().await.unwrap();
    assert_eq!(body["workloads"][0]["name"], "dev-docs");
}

const WORKLOADS: TableDefinition<&str, &[u8]> = TableDefinition::new("workloads");
const GRANTS: TableDefinition<&str, &[u8]> = TableDefinition::new("grants");

/// The key the previous version stored a workload under: the bare
/// owner's length in 8 hex digits, the owner, `/`, the name.
fn old_key(owner: &str, name: &str) -> String {
    format!("{:08x}{owner}/{name}", owner.len())
}

/// A data dir as the previous version left it: bare owners in keys and
/// records, no schema version, a ready workload of `alice` whose blob is
/// on disk, and an awaiting workload of `svc-billing` with an open grant
/// whose secret is `grant-secret`. Returns the bundle and its revision.
fn previous_version_data_dir(dir: &Path) -> (Vec<u8>, String) {
    let upload = tgz(&[("README.md", b"from the previous version\n")]);
    let mut bundle = Vec::new();
    let report = bundle::canonicalize(
        &upload[..],
        &Limits::default(),
        &CanonicalOptions::default(),
        &mut bundle,
    )
    .unwrap();
    let digest = report.bundle_digest.clone();
    let blob_dir = dir.join("blobs/sha256").join(&digest[..2]);
    std::fs::create_dir_all(&blob_dir).unwrap();
    std::fs::write(blob_dir.join(&digest), &bundle).unwrap();

    let revision = json!({
        "revision": report.inspection.revision,
        "bundle_digest": digest,
        "files": report.inspection.files,
        "entries": report.inspection.entries,
        "bytes": report.bundle_bytes,
        "inflated_bytes": report.inspection.inflated_bytes,
        "uploaded_at_ms": 1_700_000_000_000u64,
    });
    let record = |owner: &str, name: &str, status: &str, active: Value| {
        json!({
            "owner": owner, "name": name, "uid": format!("uid-{name}"),
            "kind": "workspace", "status": status, "candidate": null,
            "active": active, "failure": null,
            "created_at_ms": 1_700_000_000_000u64, "updated_at_ms": 1_700_000_000_000u64,
            "version": 3,
        })
    };
    let far_future = 4_000_000_000_000u64;
    let grant = json!({
        "id": "0123456789abcdef0123456789abcdef",
        "token_sha256": crate::common::workload_bundles::sha256(b"grant-secret"),
        "owner": "svc-billing", "name": "inbox", "workload_uid": "uid-inbox",
        "expires_at_ms": far_future,
    });
    std::fs::create_dir_all(dir.join("store")).unwrap();
    let db = Database::create(dir.join("store/meta.redb")).unwrap();
    let txn = db.begin_write().unwrap();
    {
        let mut workloads = txn.open_table(WORKLOADS).unwrap();
        for (owner, name, status, active) in [
            ("alice", "docs", "ready", revision.clone()),
            ("svc-billing", "inbox", "awaiting_upload", Value::Null),
        ] {
            let value = record(owner, name, status, active).to_string();
            workloads
                .insert(old_key(owner, name).as_str(), value.as_bytes())
                .unwrap();
        }
        let mut grants = txn.open_table(GRANTS).unwrap();
        let value = grant.to_string();
        grants
            .insert("0123456789abcdef0123456789abcdef", value.as_bytes())
            .unwrap();
    }
    txn.commit().unwrap();
    (bundle, report.inspection.revision)
}

#[tokio::test]
async fn a_previous_version_data_dir_is_migrated_once() {
    let dir = tempfile::tempdir().unwrap();
    let (bundle, revision) = previous_version_data_dir(dir.path());
    let mut server = TestServer::start_in(dir.path(), embedded_only).await;

    for round in 0..2 {
        // The owners were token subjects: their tokens reach their things.
        let alice = Caller::user(&server, "alice");
        let docs: Value = alice.get("/v1/workloads/docs").await.json().await.unwrap();
        assert_eq!(docs["status"], "ready", "round {round}: {docs}");
        assert_eq!(docs["revision"], revision.as_str());
        let resp = alice
            .get(&format!("/v1/workloads/docs/revisions/{revision}/bundle"))
            .await;
        assert_eq!(resp.status(), 200);
        assert_eq!(resp.bytes().await.unwrap().to_vec(), bundle);
        let listed: Value = alice.get("/v1/workloads").await.json().await.unwrap();
        assert_eq!(listed["workloads"].as_array().unwrap().len(), 1);
        // A delegate for the user "alice" does not.
        let resp = delegate(&server, "user:alice")
            .get("/v1/workloads/docs")
            .await;
        assert_error(resp, 404, "workload_not_found", "docs").await;
        let billing = Caller::user(&server, "svc-billing");
        let inbox: Value = billing
            .get("/v1/workloads/inbox")
            .await
            .json()
            .await
            .unwrap();
        assert_eq!(inbox["status"], "awaiting_upload", "round {round}");
        // Restart: the migration does not run twice.
        server = server.restart().await;
    }

    // Its revision was activated before tree manifests were recorded: the
    // first delivery computes and records it, and the second is a verified
    // hit against the recorded one (also after a restart).
    let alice = Caller::user(&server, "alice");
    let body = json!({"name": "p", "replicas": 1,
        "workspace": {"size": "1Gi", "accessMode": "ReadWriteOnce"}});
    json_of(alice.post("/v1/sandbox-pools", &body).await, 201).await;
    let pool = json_of(
        alice
            .get("/v1/sandbox-pools/p?wait=ready&timeout=30s")
            .await,
        200,
    )
    .await;
    let sandbox = pool["sandboxes"][0]["name"].as_str().unwrap().to_owned();
    for (run, cached) in [("r1", false), ("r2", true)] {
        let alice = Caller::user(&server, "alice");
        let body = json!({"runId": run, "sandbox": sandbox});
        let resp = alice.post("/v1/workloads/docs/deliveries", &body).await;
        assert_eq!(resp.status(), 201);
        let done: Value = resp.json().await.unwrap();
        assert_eq!(done["deliveries"][0]["cached"], cached, "{run}: {done}");
        if run == "r1" {
            server = server.restart().await;
        }
    }
    server.stop().await;
    let stored = {
        let db = Database::open(dir.path().join("store/meta.redb")).unwrap();
        let txn = db.begin_read().unwrap();
        let table = txn.open_table(WORKLOADS).unwrap();
        let found: Vec<Value> = table
            .iter()
            .unwrap()
            .map(|kv| serde_json::from_slice(kv.unwrap().1.value()).unwrap())
            .filter(|r: &Value| r["name"] == "docs")
            .collect();
        found
    };
    assert_eq!(stored.len(), 1);
    let tree = &stored[0]["active"]["tree"];
    assert!(
        tree["names"].is_string() && tree["content"].is_string(),
        "{tree}"
    );
    let server = TestServer::start_in(dir.path(), embedded_only).await;

    // The grant issued by the previous version still uploads (its owner
    // was migrated with the workload), once.
    let holder = Caller::with_token(&server, "grant-secret");
    let path = "/v1/uploads/0123456789abcdef0123456789abcdef";
    let upload = tgz(&[("a.txt", b"new\n")]);
    let resp = holder.put(path, MEDIA, upload.clone()).await;
    assert_eq!(resp.status(), 201, "{}", resp.text().await.unwrap());
    let resp = holder.put(path, MEDIA, upload).await;
    assert_error(resp, 401, "token_invalid", "already used").await;
    let billing = Caller::user(&server, "svc-billing");
    let resp = billing.get("/v1/workloads/inbox").await;
    assert_eq!(
        resp.headers().get(header::CONTENT_TYPE).unwrap(),
        "application/json"
    );
    let inbox: Value = resp.json().await.unwrap();
    assert!(inbox["candidateRevision"].is_string(), "{inbox}");
}
