//! README.md's shell examples, run: every fenced `sh` block that follows a
//! `<!-- tested ... -->` line runs under `bash -e` against a local service,
//! with the built `contextctl` first on `PATH`, so the docs cannot drift from
//! the CLI.

use std::path::Path;
use std::process::Command;

use crate::common::TestServer;

/// The blocks marked as tested, in README order.
fn tested_blocks(readme: &str) -> Vec<String> {
    let mut blocks = Vec::new();
    let mut lines = readme.lines();
    while let Some(line) = lines.next() {
        if !line.starts_with("<!-- tested") {
            continue;
        }
        assert_eq!(
            lines.next(),
            Some("```sh"),
            "a tested marker must precede a ```sh block"
        );
        let body: Vec<&str> = lines.by_ref().take_while(|l| *l != "```").collect();
        blocks.push(body.join("\n"));
    }
    blocks
}

/// The files the examples name: `./src`, `./my-workload`.
fn fixtures(dir: &Path) {
    for sub in ["src", "my-workload"] {
        std::fs::create_dir_all(dir.join(sub).join("docs")).unwrap();
        std::fs::write(dir.join(sub).join("docs/guide.md"), "guide\n").unwrap();
        std::fs::write(dir.join(sub).join("README.md"), "# example\n").unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readme_examples_run() {
    let readme = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/README.md"))
        .expect("README.md");
    let blocks = tested_blocks(&readme);
    assert!(blocks.len() >= 5, "found {} tested blocks", blocks.len());
    let commands = blocks
        .iter()
        .flat_map(|b| b.lines())
        .filter(|l| l.trim_start().starts_with("contextctl "))
        .count();
    assert!(commands >= 25, "only {commands} contextctl examples");

    // The warm pool the pool examples claim from.
    let server =
        TestServer::start_with(|c| c.local_warm_pools = vec!["research-agents".into()]).await;
    let work = tempfile::tempdir().unwrap();
    fixtures(work.path());
    let bin_dir = Path::new(env!("CARGO_BIN_EXE_contextctl"))
        .parent()
        .expect("bin dir");
    let path = format!(
        "{}:{}",
        bin_dir.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    for block in blocks {
        let out = tokio::process::Command::from({
            let mut cmd = Command::new("bash");
            cmd.arg("-ec")
                .arg(&block)
                .current_dir(work.path())
                .env("PATH", &path)
                .env("CONTEXT_SERVICE_URL", &server.base)
                .env("CS_DATA_DIR", &server.data_dir)
                .env_remove("CONTEXT_SERVICE_TOKEN")
                .env_remove("CS_STORAGE_CLASS");
            cmd
        })
        .output()
        .await
        .expect("bash runs");
        assert!(
            out.status.success(),
            "README block failed ({}):\n{block}\n--- stdout\n{}\n--- stderr\n{}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
}
