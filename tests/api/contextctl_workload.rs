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
    // Uploaded, not yet activated: `ls` and `get` tell the same status in
    // the same columns, `get` adds the details below.
    let list = ok(ctl(&server, &["workload", "ls"]).await);
    let got = ok(ctl(&server, &["workload", "get", "proj"]).await);
    let (head, row) = (list.lines().next().unwrap(), list.lines().nth(1).unwrap());
    assert_eq!(
        got.lines().take(2).collect::<Vec<_>>(),
        [head, row],
        "{got}"
    );
    assert_eq!(
        row.split_whitespace().take(4).collect::<Vec<_>>(),
        ["proj", "workspace", "awaiting_activation", &revision[..12]],
        "{list}"
    );
    assert!(
        got.lines()
            .any(|l| l.split_whitespace().collect::<Vec<_>>() == ["candidate", &revision]),
        "{got}"
    );
    let wide_list = ok(ctl(&server, &["workload", "ls", "-o", "wide"]).await);
    let wide_got = ok(ctl(&server, &["workload", "get", "proj", "-o", "wide"]).await);
    assert_eq!(
        wide_got.lines().take(2).collect::<Vec<_>>(),
        wide_list.lines().take(2).collect::<Vec<_>>()
    );
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

    // Errors: one line on stderr naming the workload, the status, the
    // message and the code; exit 1.
    for args in [
        &["workload", "get", "proj"][..],
        &["workload", "rm", "proj"],
        &["workload", "activate", "proj"],
        &["workload", "deliveries", "proj"],
    ] {
        let run = ctl(&server, args).await;
        assert_eq!(
            (run.code, run.stderr.as_str()),
            (
                1,
                "contextctl: workload \"proj\": 404 Not Found: workload \"proj\" not found \
                 (workload_not_found)\n"
            ),
            "{args:?}"
        );
    }
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

/// One error line on stderr containing `code`, and exit code 1.
fn fails_with(run: Run, code: &str) -> Run {
    assert_eq!(
        run.code, 1,
        "stdout: {}\nstderr: {}",
        run.stdout, run.stderr
    );
    assert_eq!(run.stderr.trim().lines().count(), 1, "{}", run.stderr);
    assert!(run.stderr.starts_with("contextctl: "), "{}", run.stderr);
    assert!(run.stderr.contains(code), "{}", run.stderr);
    run
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delivery_commands_end_to_end() {
    let server = TestServer::start().await;
    // The development token's subject owns the pool, as `contextctl` would.
    let dev = crate::common::Caller::user(&server, context_service::auth::dev::DEV_SUBJECT);
    let body = serde_json::json!({"name": "p", "replicas": 2,
        "workspace": {"size": "1Gi", "accessMode": "ReadWriteOnce"}});
    assert_eq!(dev.post("/v1/sandbox-pools", &body).await.status(), 201);
    ok(ctl(&server, &["workload", "create", "proj"]).await);
    let file = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(file.path(), tgz(&[("README.md", b"# project\n")])).unwrap();
    ok(ctl(
        &server,
        &["workload", "upload", "proj", file.path().to_str().unwrap()],
    )
    .await);
    ok(ctl(&server, &["workload", "activate", "proj"]).await);

    let out = ok(ctl(
        &server,
        &[
            "workload",
            "deliver",
            "proj",
            "--sandbox",
            "sandbox-p-0",
            "--run",
            "r1",
        ],
    )
    .await);
    let line = out.lines().nth(1).unwrap_or_default();
    assert!(
        line.starts_with("sandbox-p-0 ") && line.contains(" sent "),
        "{out}"
    );
    let path = line.split_whitespace().last().unwrap().to_owned();
    assert_eq!(
        std::fs::read(std::path::Path::new(&path).join("README.md")).unwrap(),
        b"# project\n"
    );
    let got: Value = serde_json::from_str(&ok(ctl(
        &server,
        &[
            "--output", "json", "workload", "deliver", "proj", "--pool", "p", "--run", "r2",
            "--verify", "full",
        ],
    )
    .await))
    .unwrap();
    let d = got["deliveries"].as_array().unwrap();
    assert_eq!(d.len(), 2);
    assert_eq!(
        (d[0]["cached"].clone(), d[0]["bytesSent"].clone()),
        (Value::Bool(true), 0.into())
    );
    assert_eq!(d[1]["cached"], false);

    let list = ok(ctl(&server, &["workload", "deliveries", "proj"]).await);
    let rows: Vec<&str> = list.lines().skip(1).collect();
    assert_eq!(rows.len(), 3, "{list}");
    assert!(
        rows[0].starts_with("r1 ") && rows[0].contains("sandbox-p-0"),
        "{list}"
    );
    let json_list: Value = serde_json::from_str(&ok(ctl(
        &server,
        &["--output", "json", "workload", "deliveries", "proj"],
    )
    .await))
    .unwrap();
    assert_eq!(json_list["deliveries"][1]["runId"], "r2");
    // The other output formats.
    let yaml_list: Value = serde_saphyr::from_str(&ok(ctl(
        &server,
        &["workload", "deliveries", "proj", "-o", "yaml"],
    )
    .await))
    .unwrap();
    assert_eq!(yaml_list, json_list);
    assert_eq!(
        ok(ctl(&server, &["workload", "deliveries", "proj", "-o", "name"]).await),
        "run/r1\nrun/r2\n"
    );
    let revision = json_list["deliveries"][0]["revision"].as_str().unwrap();
    assert!(!list.contains(revision), "{list}");
    let wide = ok(ctl(&server, &["workload", "deliveries", "proj", "-o", "wide"]).await);
    assert!(wide.lines().next().unwrap().contains("POD"), "{wide}");
    assert_eq!(
        wide.lines().filter(|l| l.contains(revision)).count(),
        3,
        "{wide}"
    );
    assert_eq!(
        ok(ctl(
            &server,
            &[
                "workload",
                "deliver",
                "proj",
                "--sandbox",
                "sandbox-p-1",
                "--run",
                "r4",
                "-o",
                "name",
            ],
        )
        .await),
        "run/r4\n"
    );
    let wide = ok(ctl(
        &server,
        &[
            "workload", "deliver", "proj", "--pool", "p", "--run", "r5", "-o", "wide",
        ],
    )
    .await);
    assert!(wide.lines().next().unwrap().contains("POD"), "{wide}");
    assert_eq!(
        wide.lines().filter(|l| l.contains(" cached ")).count(),
        2,
        "{wide}"
    );
    let released: Value = serde_saphyr::from_str(&ok(ctl(
        &server,
        &["workload", "release", "proj", "--run", "r5", "-o", "yaml"],
    )
    .await))
    .unwrap();
    assert_eq!(
        released,
        serde_json::json!({"runId": "r5", "released": true})
    );
    assert_eq!(
        ok(ctl(
            &server,
            &["workload", "release", "proj", "--run", "r4", "-o", "name"]
        )
        .await),
        "run/r4\n"
    );
    assert_eq!(
        ok(ctl(&server, &["workload", "release", "proj", "--run", "r1"]).await).trim(),
        "released r1"
    );
    assert!(
        std::fs::symlink_metadata(&path).is_err(),
        "r1's view is gone"
    );

    // Errors: one line on stderr, exit 1 (2 for usage errors).
    fails_with(
        ctl(&server, &["workload", "release", "proj", "--run", "r1"]).await,
        "run_not_found",
    );
    // A run id the service would refuse is refused here (exit 2).
    let run = ctl(
        &server,
        &[
            "workload",
            "deliver",
            "proj",
            "--sandbox",
            "sandbox-p-0",
            "--run",
            "a b",
        ],
    )
    .await;
    assert_eq!(
        (run.code, run.stderr.as_str()),
        (
            2,
            "contextctl: invalid value 'a b' for '--run <RUN>': a run id is 1 to 63 lowercase \
             letters, digits, '.', '_' or '-', starting with a letter or digit\n"
        )
    );
    fails_with(
        ctl(
            &server,
            &[
                "workload",
                "deliver",
                "proj",
                "--sandbox",
                "nope",
                "--run",
                "x",
            ],
        )
        .await,
        "sandbox_not_found",
    );
    fails_with(
        ctl(
            &server,
            &[
                "workload", "deliver", "missing", "--pool", "p", "--run", "x",
            ],
        )
        .await,
        "workload_not_found",
    );
    let run = ctl(&server, &["workload", "deliver", "proj", "--run", "x"]).await;
    assert_eq!(run.code, 2, "{}", run.stderr);
    // A refused delivery names the run and the workload.
    let run = fails_with(
        ctl(
            &server,
            &[
                "workload", "deliver", "proj", "--pool", "none", "--run", "x",
            ],
        )
        .await,
        "not_found",
    );
    assert!(
        run.stderr
            .starts_with("contextctl: run \"x\" of workload \"proj\": 404 Not Found: "),
        "{}",
        run.stderr
    );
    // A pool with one broken sandbox: the outcomes on stdout, the reason on
    // stderr.
    let sandbox = server
        .data_dir
        .join("local/namespaces/default/sandboxes/sandbox-p-1/workspace");
    let root = std::fs::canonicalize(sandbox).unwrap().join(".context");
    std::fs::remove_dir_all(&root).unwrap();
    std::fs::write(&root, b"x").unwrap();
    let run = fails_with(
        ctl(
            &server,
            &[
                "--output", "json", "workload", "deliver", "proj", "--pool", "p", "--run", "r3",
            ],
        )
        .await,
        "1 of 2 sandboxes failed; sandbox-p-1: bad_root",
    );
    assert!(run.stderr.contains("delivery_failed"), "{}", run.stderr);
    let body: Value = serde_json::from_str(&run.stdout).unwrap();
    assert_eq!(body["error"], "delivery_failed");
    assert!(body["deliveries"][0]["path"].is_string());
    assert!(body["deliveries"][1]["error"]
        .as_str()
        .unwrap()
        .starts_with("bad_root: "));
}
