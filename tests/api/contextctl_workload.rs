//! `contextctl workload ...` end to end against a real server, finding the
//! development token through `--data-dir` as a newcomer would.

use crate::common::workload_bundles::{sha256, tgz, unpack};
use crate::common::TestServer;
use serde_json::Value;

struct Run {
    code: i32,
    stdout: String,
    stderr: String,
}

async fn ctl(server: &TestServer, args: &[&str]) -> Run {
    let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_contextctl"))
        .arg("--url")
        .arg(&server.base)
        .arg("--data-dir")
        .arg(&server.data_dir)
        .args(args)
        .env_remove("CONTEXT_SERVICE_URL")
        .env_remove("CONTEXT_SERVICE_TOKEN")
        .output()
        .await
        .unwrap();
    Run {
        code: out.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

fn ok(run: Run) -> String {
    assert_eq!(run.code, 0, "stderr: {}", run.stderr);
    run.stdout
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn workload_commands_end_to_end() {
    let server = TestServer::start().await;
    let work = tempfile::tempdir().unwrap();
    let src = work.path().join("project");
    std::fs::create_dir_all(src.join("docs")).unwrap();
    std::fs::write(src.join("README.md"), b"# project\n").unwrap();
    std::fs::write(src.join("docs/guide.md"), b"guide\n").unwrap();

    assert_eq!(
        ok(ctl(&server, &["workload", "create", "proj"]).await).trim(),
        "proj"
    );
    let revision = ok(ctl(
        &server,
        &["workload", "upload", "proj", src.to_str().unwrap()],
    )
    .await)
    .trim()
    .to_owned();
    assert_eq!(revision.len(), 64, "{revision}");
    // Activate defaults to the last upload.
    let out = ok(ctl(&server, &["workload", "activate", "proj"]).await);
    assert!(out.contains("ready") && out.contains(&revision), "{out}");

    let got: Value = serde_json::from_str(&ok(ctl(
        &server,
        &["--output", "json", "workload", "get", "proj"],
    )
    .await))
    .unwrap();
    assert_eq!(got["status"], "ready");
    assert_eq!(got["revision"], revision.as_str());
    let list = ok(ctl(&server, &["workload", "ls"]).await);
    assert!(
        list.lines()
            .any(|l| l.starts_with("proj ") && l.contains("ready")),
        "{list}"
    );

    let out_file = work.path().join("proj.tar.gz");
    let out = ok(ctl(
        &server,
        &[
            "workload",
            "download",
            "proj",
            "-f",
            out_file.to_str().unwrap(),
        ],
    )
    .await);
    assert!(out.contains("verified"), "{out}");
    let bytes = std::fs::read(&out_file).unwrap();
    assert_eq!(sha256(&bytes), got["bundleDigest"].as_str().unwrap());
    assert_eq!(
        unpack(&bytes),
        vec![
            ("README.md".to_owned(), b"# project\n".to_vec()),
            ("docs/guide.md".to_owned(), b"guide\n".to_vec()),
        ]
    );

    // A bundle file uploads as is, and gives the same revision as the directory.
    ok(ctl(&server, &["workload", "create", "fromfile"]).await);
    let file = work.path().join("b.tgz");
    std::fs::write(
        &file,
        tgz(&[("docs/guide.md", b"guide\n"), ("README.md", b"# project\n")]),
    )
    .unwrap();
    let rev: Value = serde_json::from_str(&ok(ctl(
        &server,
        &[
            "--output",
            "json",
            "workload",
            "upload",
            "fromfile",
            file.to_str().unwrap(),
        ],
    )
    .await))
    .unwrap();
    assert_eq!(rev["revision"], revision.as_str());

    assert_eq!(
        ok(ctl(&server, &["workload", "rm", "proj"]).await).trim(),
        "deleted proj"
    );

    // Errors: one line on stderr, non-zero exit.
    let run = ctl(&server, &["workload", "get", "proj"]).await;
    assert_eq!(run.code, 1);
    assert_eq!(run.stderr.trim().lines().count(), 1, "{}", run.stderr);
    assert!(run.stderr.contains("workload_not_found"), "{}", run.stderr);
    let run = ctl(
        &server,
        &[
            "workload",
            "upload",
            "fromfile",
            work.path().join("missing").to_str().unwrap(),
        ],
    )
    .await;
    assert_eq!(run.code, 1);
    assert_eq!(run.stderr.trim().lines().count(), 1, "{}", run.stderr);
    let bad = work.path().join("bad.tgz");
    std::fs::write(&bad, b"not a bundle").unwrap();
    let run = ctl(
        &server,
        &["workload", "upload", "fromfile", bad.to_str().unwrap()],
    )
    .await;
    assert_eq!(run.code, 1);
    assert!(run.stderr.contains("bundle_rejected"), "{}", run.stderr);
}
