//! Papercuts of a first hour with the service: a second `serve` on a data
//! dir in use, an upload of a plain tar, an empty JWKS, Ctrl-C on an idle
//! server. Each asserts what the person at the terminal reads.

use std::os::unix::fs::MetadataExt as _;
use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::common::process::Process;
use crate::common::workload_bundles::{gunzip, tgz};
use crate::common::{Caller, TestServer};
use crate::compat_support::{error_body, exact};

/// Runs `context-service serve` on `data_dir` to its end (it must end
/// within a minute), logs as JSON.
fn serve_to_end(data_dir: &Path) -> Output {
    let mut child = Command::new(env!("CARGO_BIN_EXE_context-service"))
        .args(["serve", "--listen", "127.0.0.1:0", "--log-format", "json"])
        .arg("--data-dir")
        .arg(data_dir)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("context-service starts");
    let deadline = Instant::now() + Duration::from_secs(60);
    while child.try_wait().unwrap().is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("a second service on the same data dir kept running");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    child.wait_with_output().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_service_on_a_data_dir_in_use_changes_nothing_and_names_the_first() {
    let dir = tempfile::tempdir().unwrap();
    let data_dir = dir.path().join("data");
    let first = Process::start(&data_dir, &[]);
    let token_path = context_service::auth::dev::dev_token_path(&data_dir);
    let key_path = context_service::auth::dev::signing_key_path(&data_dir);
    let before = (
        std::fs::read(&token_path).unwrap(),
        std::fs::metadata(&token_path).unwrap().ino(),
        std::fs::read(&key_path).unwrap(),
    );

    let out = serve_to_end(&data_dir);
    assert!(!out.status.success(), "{:?}", out.status);
    let stderr = String::from_utf8_lossy(&out.stderr);
    let last = stderr.lines().last().unwrap_or_default();
    assert_eq!(
        last,
        format!(
            "context-service: data dir {} in use by another context-service (pid {})",
            data_dir.display(),
            first.child.id()
        ),
        "{stderr}"
    );
    // Not rewritten (a rewrite replaces the file: a new inode), not
    // changed.
    let after = (
        std::fs::read(&token_path).unwrap(),
        std::fs::metadata(&token_path).unwrap().ino(),
        std::fs::read(&key_path).unwrap(),
    );
    assert!(before == after, "the data dir changed");
    // The first one still serves with its token.
    let token = String::from_utf8(before.0).unwrap();
    let listed = first.get_json("/v1/workloads", token.trim()).await;
    assert_eq!(listed["workloads"], serde_json::json!([]), "{listed}");
}

#[tokio::test]
async fn a_plain_tar_upload_says_a_gzip_compressed_tar_is_expected() {
    let server = TestServer::start().await;
    let alice = Caller::user(&server, "alice");
    server
        .client("alice")
        .create_workload(Some("docs"), None)
        .await
        .unwrap();
    let plain_tar = gunzip(&tgz(&[("guide.md", b"# guide\n")]));
    let got = exact(
        alice
            .put("/v1/workloads/docs/bundle", "application/gzip", plain_tar)
            .await,
    )
    .await;
    let message = format!(
        "invalid_gzip: the upload is a tar archive without gzip compression; {}",
        context_service::bundle::BUNDLE_EXPECTED
    );
    assert_eq!(
        (got.status, got.body.as_str()),
        (400, error_body("bundle_rejected", &message).as_str())
    );
    assert!(
        message.contains("`tar -czf bundle.tgz -C <dir> .`") && message.contains("contextctl"),
        "{message}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_empty_jwks_is_warned_about_at_start() {
    let dir = tempfile::tempdir().unwrap();
    let jwks = dir.path().join("jwks.json");
    // As deploy/base/secret.yaml ships it.
    std::fs::write(&jwks, "{\"keys\": []}\n").unwrap();
    let p = Process::start(
        &dir.path().join("data"),
        &["--jwks-file", jwks.to_str().unwrap()],
    );
    let warned: Vec<Value> = p
        .logs()
        .iter()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|l| l["level"] == "WARN" && l["fields"]["jwks"] == jwks.to_str().unwrap())
        .collect();
    assert_eq!(warned.len(), 1, "{:#?}", p.logs());
    assert_eq!(
        warned[0]["fields"]["message"],
        format!(
            "the JWKS {} holds no keys and no --hs256-secret-file is set: every request with \
             a token will be refused (401 token_invalid). Put your token issuer's public keys \
             in it (as deploy/base/secret.yaml's jwks.json), or leave --jwks-file/CS_JWKS_FILE \
             unset to use the embedded development issuer",
            jwks.display()
        )
    );
    // A JWKS with a key: no such warning.
    let dev = tempfile::tempdir().unwrap();
    let issuer = context_service::auth::dev::DevIssuer::ensure(dev.path()).unwrap();
    let keyed = dir.path().join("keyed.json");
    std::fs::write(&keyed, serde_json::to_vec(&issuer.jwks()).unwrap()).unwrap();
    let p = Process::start(
        &dir.path().join("data2"),
        &["--jwks-file", keyed.to_str().unwrap()],
    );
    assert!(
        !p.logs().iter().any(|l| l.contains("holds no keys")),
        "{:#?}",
        p.logs()
    );
}
