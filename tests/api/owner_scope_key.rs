//! `--owner-scope-secret-file`: the key that names owners on shared objects
//! comes from a file replicas share, not from the data dir.

use std::path::Path;

use crate::common::{assert_error, json_of, Caller, TestServer};
use serde_json::json;

/// A key file in the documented `hex:` form.
fn write_key(path: &Path, byte_seed: u8) {
    let key: Vec<u8> = (0..32u8)
        .map(|i| i.wrapping_mul(37).wrapping_add(byte_seed))
        .collect();
    std::fs::write(path, format!("hex:{}\n", hex::encode(key))).unwrap();
}

async fn start(dir: &Path, key: Option<&Path>) -> TestServer {
    let key = key.map(Path::to_owned);
    TestServer::start_in(dir, move |c| c.owner_scope_secret_file = key).await
}

async fn create_pool(server: &TestServer, name: &str) {
    let body = json!({"name": name, "replicas": 1,
        "workspace": {"size": "1Gi", "accessMode": "ReadWriteOnce"}});
    json_of(
        Caller::user(server, "alice")
            .post("/v1/sandbox-pools", &body)
            .await,
        201,
    )
    .await;
}

async fn assert_sees(server: &TestServer, name: &str) {
    let path = format!("/v1/sandbox-pools/{name}");
    let pool = json_of(Caller::user(server, "alice").get(&path).await, 200).await;
    assert_eq!(pool["name"], name, "{pool}");
}

async fn assert_not_hers(server: &TestServer, name: &str) {
    let path = format!("/v1/sandbox-pools/{name}");
    assert_error(
        Caller::user(server, "alice").get(&path).await,
        404,
        "not_found",
        "sandbox pool not found",
    )
    .await;
}

#[tokio::test]
async fn the_key_file_alone_decides_owner_scopes() {
    let keys = tempfile::tempdir().unwrap();
    let (shared, other) = (keys.path().join("shared"), keys.path().join("other"));
    write_key(&shared, 1);
    write_key(&other, 2);
    let dir = tempfile::tempdir().unwrap();

    let mut server = start(dir.path(), Some(&shared)).await;
    create_pool(&server, "keyed").await;
    // No key of its own is made: nothing replica-local decides the scope.
    assert!(!dir.path().join("auth/server-secret").exists());
    server.stop().await;

    // The same key: the same owner scope, so alice still owns her pool.
    let mut server = start(dir.path(), Some(&shared)).await;
    assert_sees(&server, "keyed").await;
    server.stop().await;
    // Another key, or none (the data dir's own, created now): her scope
    // differs and the pool is not hers.
    let mut server = start(dir.path(), Some(&other)).await;
    assert_not_hers(&server, "keyed").await;
    server.stop().await;
    let server = start(dir.path(), None).await;
    assert_not_hers(&server, "keyed").await;
}

#[tokio::test]
async fn a_replica_moves_onto_a_shared_key_as_the_docs_say() {
    let dir = tempfile::tempdir().unwrap();
    let mut server = start(dir.path(), None).await;
    create_pool(&server, "before").await;
    server.stop().await;
    // `hex:` and the data dir's key file: the scopes stay as they were.
    let own = std::fs::read_to_string(dir.path().join("auth/server-secret")).unwrap();
    let keys = tempfile::tempdir().unwrap();
    let shared = keys.path().join("shared");
    std::fs::write(&shared, format!("hex:{own}")).unwrap();
    let server = start(dir.path(), Some(&shared)).await;
    assert_sees(&server, "before").await;
}

#[tokio::test]
async fn a_weak_or_missing_key_file_stops_the_start_naming_the_setting() {
    let keys = tempfile::tempdir().unwrap();
    let weak = keys.path().join("weak");
    std::fs::write(&weak, "hex:00112233").unwrap();
    let missing = keys.path().join("missing");
    for (path, why) in [
        (&weak, "the secret must be at least 32 bytes; it is 4"),
        (&missing, "No such file"),
    ] {
        let path = path.clone();
        let err = TestServer::try_start_with(move |c| c.owner_scope_secret_file = Some(path))
            .await
            .err()
            .expect("refused");
        let text = format!("{err:#}");
        assert!(
            text.starts_with("--owner-scope-secret-file/CS_OWNER_SCOPE_SECRET_FILE ")
                && text.contains(why),
            "{text}"
        );
    }
}
