//! `contextctl` pool and context commands, run as the built binary against a
//! real server.

use std::process::Output;

use crate::common::TestServer;
use serde_json::Value;

struct Ctl<'a> {
    server: &'a TestServer,
    token: String,
}

impl Ctl<'_> {
    fn run(&self, args: &[&str]) -> Output {
        std::process::Command::new(env!("CARGO_BIN_EXE_contextctl"))
            .args(["--url", &self.server.base, "--token", &self.token])
            .args(args)
            .env_remove("CONTEXT_SERVICE_URL")
            .env_remove("CONTEXT_SERVICE_TOKEN")
            .env_remove("CS_STORAGE_CLASS")
            .current_dir(&self.server.data_dir)
            .output()
            .expect("contextctl runs")
    }

    /// Runs, expects success, returns stdout.
    fn ok(&self, args: &[&str]) -> String {
        let out = self.run(args);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{args:?} failed: {stderr}");
        String::from_utf8(out.stdout).unwrap()
    }

    /// Runs, expects a usage error: exit 2, exactly `contextctl: <message>`
    /// on stderr and nothing on stdout.
    fn usage(&self, args: &[&str], message: &str) {
        let out = self.run(args);
        assert_eq!(
            (
                out.status.code(),
                String::from_utf8_lossy(&out.stderr).as_ref()
            ),
            (Some(2), format!("contextctl: {message}\n").as_str()),
            "{args:?}"
        );
        assert!(out.stdout.is_empty(), "{args:?}");
    }

    /// Runs, expects exit 1 with exactly one stderr line containing `part`.
    fn fails(&self, args: &[&str], part: &str) {
        let out = self.run(args);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{args:?}: {stderr}");
        assert_eq!(stderr.lines().count(), 1, "one line: {stderr:?}");
        assert!(stderr.starts_with("contextctl: "), "{stderr:?}");
        assert!(stderr.contains(part), "{stderr:?} should contain {part:?}");
    }
}

async fn setup() -> TestServer {
    TestServer::start_with(|c| c.local_warm_pools = vec!["research-agents".into()]).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pool_lifecycle_in_text_and_json() {
    let server = setup().await;
    let ctl = Ctl {
        server: &server,
        token: server.user_token("alice"),
    };
    let out = tokio::task::block_in_place(|| ctl.ok(&["create", "demo"]));
    assert_eq!(
        out,
        "demo: ready (1/1 ready), 1Gi RWO, selector context.rossoctl.io/pool=demo\n"
    );
    let out = tokio::task::block_in_place(|| {
        ctl.ok(&[
            "create", "--shared", "-n", "1", "solo", "-s", "2Gi", "-c", "fast",
        ])
    });
    assert_eq!(
        out,
        "solo: ready (1/1 ready), 2Gi RWX, selector context.rossoctl.io/pool=solo\n"
    );
    let out = tokio::task::block_in_place(|| {
        ctl.ok(&[
            "create",
            "fast",
            "--warm-pool",
            "research-agents",
            "-n",
            "3",
        ])
    });
    assert_eq!(
        out,
        "fast: ready (3/3 ready), warm pool research-agents, selector context.rossoctl.io/pool=fast\n"
    );
    let out = tokio::task::block_in_place(|| ctl.ok(&["wait", "demo", "--timeout", "10s"]));
    assert_eq!(out, "demo: ready (1/1 ready)\n");
    let out = tokio::task::block_in_place(|| ctl.ok(&["get", "solo"]));
    assert_eq!(
        out,
        "solo: ready (1/1 ready), 2Gi RWX, selector context.rossoctl.io/pool=solo\n  sandbox-solo-0  pod=-  ready\n"
    );
    let json: Value = serde_json::from_str(&tokio::task::block_in_place(|| {
        ctl.ok(&["--output", "json", "get", "solo"])
    }))
    .unwrap();
    assert_eq!(json["workspace"]["storageClass"], "fast");
    assert_eq!(json["sandboxes"][0]["name"], "sandbox-solo-0");
    let json: Value = serde_json::from_str(&tokio::task::block_in_place(|| {
        ctl.ok(&["get", "fast", "--json"])
    }))
    .unwrap();
    assert_eq!(json["warmPoolRef"], "research-agents");
    let out = tokio::task::block_in_place(|| ctl.ok(&["ls"]));
    let names: Vec<&str> = out.lines().map(|l| l.split(':').next().unwrap()).collect();
    assert_eq!(names, ["demo", "fast", "solo"]);
    let json: Value = serde_json::from_str(&tokio::task::block_in_place(|| {
        ctl.ok(&["ls", "--output", "json"])
    }))
    .unwrap();
    assert_eq!(json["items"].as_array().unwrap().len(), 3);
    assert_eq!(
        tokio::task::block_in_place(|| ctl.ok(&["rm", "demo"])),
        "deleted demo\n"
    );
    // Deleting it again fails: exit 1, one line naming the pool, the
    // status, the service's message and its code; nothing on stdout.
    let not_found =
        "contextctl: pool \"demo\": 404 Not Found: sandbox pool not found (not_found)\n";
    for args in [
        &["delete", "demo"][..],
        &["get", "demo"],
        &["wait", "demo", "-t", "5s"],
        &["suspend", "demo"],
        &["resume", "demo"],
    ] {
        let again = tokio::task::block_in_place(|| ctl.run(args));
        assert_eq!(
            (
                again.status.code(),
                String::from_utf8_lossy(&again.stderr).as_ref()
            ),
            (Some(1), not_found),
            "{args:?}"
        );
        assert!(again.stdout.is_empty(), "{args:?}");
    }
    // Another user sees none of it.
    let bob = Ctl {
        server: &server,
        token: server.user_token("bob"),
    };
    assert_eq!(tokio::task::block_in_place(|| bob.ok(&["ls"])), "");
    tokio::task::block_in_place(|| bob.fails(&["get", "solo"], "sandbox pool not found"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wait_fails_when_the_pool_fails() {
    let server = setup().await;
    let ctl = Ctl {
        server: &server,
        token: server.user_token("alice"),
    };
    tokio::task::block_in_place(|| ctl.ok(&["create", "broken", "-n", "2"]));
    std::fs::remove_dir_all(
        server
            .data_dir
            .join("local/namespaces/default/sandboxes/sandbox-broken-0"),
    )
    .unwrap();
    tokio::task::block_in_place(|| ctl.fails(&["wait", "broken"], "broken failed: SandboxMissing"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn flag_combinations_are_checked_before_calling() {
    let server = setup().await;
    let ctl = Ctl {
        server: &server,
        token: server.user_token("alice"),
    };
    let cases: [(&[&str], &str); 8] = [
        (
            &["create", "x", "--warm-pool", "p", "--shared"],
            "--warm-pool cannot be combined with --shared",
        ),
        (
            &["create", "x", "--warm-pool", "p", "-c", ""],
            "--warm-pool cannot be combined with --storage-class",
        ),
        (
            &["create", "x", "--warm-pool", "p", "-s", "1Gi"],
            "--warm-pool cannot be combined with --size",
        ),
        (
            &["create", "x", "--warm-pool", "p", "--claim", "c"],
            "--warm-pool cannot be combined with --claim",
        ),
        (
            &["create", "x", "--claim", "c"],
            "--claim requires exactly one of --read-only or --read-write",
        ),
        (
            &["create", "x", "--claim", "c", "--read-only", "--read-write"],
            "--claim requires exactly one of --read-only or --read-write",
        ),
        (
            &["create", "x", "--claim", "c", "--read-only", "-s", "2Gi"],
            "--claim cannot be combined with --size",
        ),
        (
            &["create", "x", "--read-write"],
            "--read-only and --read-write require --claim",
        ),
    ];
    // Flags that do not fit together are usage errors (exit 2).
    for (args, message) in cases {
        tokio::task::block_in_place(|| ctl.usage(args, message));
    }
    // So are values the service would refuse, named with the flag.
    tokio::task::block_in_place(|| {
        ctl.usage(
            &["create", "Bad"],
            "invalid value 'Bad' for '<NAME>': a name is at most 50 lowercase letters, \
             digits and '-', starting and ending with a letter or digit",
        );
        ctl.usage(
            &["create", "x", "-n", "0"],
            "invalid value '0' for '--replicas <REPLICAS>': the number of sandboxes must \
             be a whole number from 1 to 100",
        );
    });
    // The service's refusals: one line naming the pool, status, message
    // and code (exit 1).
    tokio::task::block_in_place(|| {
        ctl.fails(
            &["create", "x", "--claim", "nope", "--read-only"],
            "contextctl: pool \"x\": 400 Bad Request: invalid sandbox pool: \
             workspace claim \"nope\" not found (invalid_request)\n",
        );
    });
    tokio::task::block_in_place(|| ctl.ok(&["create", "x"]));
    tokio::task::block_in_place(|| {
        ctl.fails(
            &["create", "x", "--shared"],
            "contextctl: pool \"x\": 409 Conflict: sandbox pool already exists (",
        );
    });
    // Help works and exits 0.
    let help = tokio::task::block_in_place(|| ctl.ok(&["help", "create"]));
    assert!(
        help.contains("--warm-pool") && help.contains("Examples:"),
        "{help}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn named_contexts_and_claims() {
    let server = setup().await;
    let ctl = Ctl {
        server: &server,
        token: server.user_token("alice"),
    };
    let out = tokio::task::block_in_place(|| {
        ctl.ok(&[
            "context",
            "create",
            "docs",
            "--type",
            "knowledge",
            "-s",
            "5Gi",
            "--shared",
        ])
    });
    assert_eq!(
        out,
        "default/docs: ready, knowledge, 5Gi RWX, claim context-docs\n"
    );
    let out = tokio::task::block_in_place(|| {
        ctl.ok(&[
            "create",
            "readers",
            "-n",
            "3",
            "--claim",
            "context-docs",
            "--read-only",
        ])
    });
    assert_eq!(
        out,
        "readers: ready (3/3 ready), claim context-docs read-only, selector context.rossoctl.io/pool=readers\n"
    );
    tokio::task::block_in_place(|| {
        ctl.ok(&[
            "context",
            "create",
            "notes",
            "--namespace",
            "team1",
            "--type",
            "memory",
        ])
    });
    let out = tokio::task::block_in_place(|| ctl.ok(&["context", "ls", "--namespace", "team1"]));
    assert_eq!(
        out,
        "team1/notes: ready, memory, 1Gi RWO, claim context-notes\n"
    );
    let json: Value = serde_json::from_str(&tokio::task::block_in_place(|| {
        ctl.ok(&["--output", "json", "context", "get", "docs"])
    }))
    .unwrap();
    assert_eq!(json["attachment"]["claimName"], "context-docs");
    tokio::task::block_in_place(|| {
        let out = ctl.run(&["context", "create", "bad", "--type", "session"]);
        assert_eq!(out.status.code(), Some(2), "{out:?}");
        assert_eq!(
            String::from_utf8_lossy(&out.stderr),
            "contextctl: invalid value 'session' for '--type <TYPE>' \
             [possible values: workspace, memory, knowledge, artifacts]\n"
        );
    });
    assert_eq!(
        tokio::task::block_in_place(|| ctl.ok(&["rm", "readers"])),
        "deleted readers\n"
    );
    assert_eq!(
        tokio::task::block_in_place(|| ctl.ok(&["context", "rm", "docs"])),
        "deleted default/docs\n"
    );
    tokio::task::block_in_place(|| {
        ctl.fails(
            &["context", "get", "docs"],
            "contextctl: context \"default/docs\": 404 Not Found: context resource not found (not_found)",
        );
    });
}
