//! `contextctl`'s kubectl-style conventions, run as the built binary:
//! `-o/--output` before or after the command in every format, one-line usage
//! errors with exit 2, an example in every command's help, the documented
//! exit codes, and shell completions.

use std::process::{Command, Output};

use crate::common::TestServer;
use serde_json::Value;

fn contextctl(server: Option<&TestServer>, args: &[&str]) -> Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_contextctl"));
    if let Some(server) = server {
        cmd.arg("--url")
            .arg(&server.base)
            .arg("--data-dir")
            .arg(&server.data_dir);
    }
    cmd.args(args)
        .env_remove("CONTEXT_SERVICE_URL")
        .env_remove("CONTEXT_SERVICE_TOKEN")
        .env_remove("CS_DATA_DIR")
        .output()
        .expect("contextctl runs")
}

/// Runs, expects exit 0, returns stdout.
fn ok(server: Option<&TestServer>, args: &[&str]) -> String {
    let out = contextctl(server, args);
    assert!(
        out.status.success(),
        "{args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("utf-8 stdout")
}

/// Runs, expects a usage error: exit 2 and one line `contextctl: ...`
/// containing `part` on stderr, nothing on stdout.
fn usage_error(server: Option<&TestServer>, args: &[&str], part: &str) {
    let out = contextctl(server, args);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{args:?}: {stderr}");
    assert_eq!(stderr.lines().count(), 1, "{args:?}: one line: {stderr:?}");
    assert!(stderr.starts_with("contextctl: "), "{stderr:?}");
    assert!(stderr.contains(part), "{stderr:?} should contain {part:?}");
    assert!(out.stdout.is_empty(), "{args:?}: stdout {:?}", out.stdout);
}

fn json(text: &str) -> Value {
    serde_json::from_str(text).unwrap_or_else(|e| panic!("not JSON ({e}): {text}"))
}

fn yaml(text: &str) -> Value {
    serde_saphyr::from_str(text).unwrap_or_else(|e| panic!("not YAML ({e}): {text}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn output_flag_goes_before_or_after_the_command_in_every_format() {
    let server = TestServer::start().await;
    let s = Some(&server);
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("a.md"), "a\n").unwrap();
    ok(s, &["workload", "create", "docs"]);
    ok(
        s,
        &["workload", "upload", "docs", dir.path().to_str().unwrap()],
    );
    ok(s, &["workload", "activate", "docs"]);
    ok(s, &["create", "team", "-n", "2"]);

    // The docs' example (docs/contextctl.md), and the same flag after the command.
    let before = json(&ok(s, &["-o", "json", "get", "team"]));
    let after = json(&ok(s, &["get", "team", "-o", "json"]));
    let long = json(&ok(s, &["get", "team", "--output", "json"]));
    assert_eq!(before["name"], "team");
    assert_eq!(before["replicas"], 2);
    assert_eq!(before, after);
    assert_eq!(before, long);
    assert_eq!(yaml(&ok(s, &["get", "team", "-o", "yaml"])), before);

    let wl = json(&ok(s, &["workload", "get", "docs", "-o", "json"]));
    assert_eq!(wl["status"], "ready");
    assert_eq!(json(&ok(s, &["-o", "json", "workload", "get", "docs"])), wl);
    assert_eq!(yaml(&ok(s, &["-o", "yaml", "workload", "get", "docs"])), wl);
    let listed = yaml(&ok(s, &["workload", "ls", "-o", "yaml"]));
    assert_eq!(listed[0], wl, "{listed}");

    // name: kind/name lines, kubectl's spelling.
    assert_eq!(ok(s, &["ls", "-o", "name"]), "pool/team\n");
    assert_eq!(ok(s, &["-o", "name", "get", "team"]), "pool/team\n");
    assert_eq!(ok(s, &["workload", "ls", "-o", "name"]), "workload/docs\n");
    assert_eq!(
        ok(s, &["workload", "get", "docs", "-o", "name"]),
        "workload/docs\n"
    );

    // wide: more than text. `ls` shows every pool's sandboxes; the workload
    // table shows the whole revision and digest.
    let text = ok(s, &["ls"]);
    let wide = ok(s, &["ls", "-o", "wide"]);
    assert_eq!(text.lines().count(), 1, "{text}");
    assert!(wide.starts_with(&text), "{wide}");
    assert_eq!(
        wide.lines().filter(|l| l.contains("pod=")).count(),
        2,
        "{wide}"
    );
    let revision = wl["revision"].as_str().unwrap();
    let digest = wl["bundleDigest"].as_str().unwrap();
    assert!(!ok(s, &["workload", "ls"]).contains(revision));
    let wide = ok(s, &["workload", "ls", "-o", "wide"]);
    assert!(wide.contains(revision) && wide.contains(digest), "{wide}");

    // rm with -o name says what it deleted, as kubectl does.
    assert_eq!(ok(s, &["rm", "team", "-o", "name"]), "pool/team\n");

    // A format a command cannot print is a usage error, before any call.
    usage_error(
        s,
        &["health", "-o", "name"],
        "--output name is not supported",
    );
    usage_error(
        s,
        &["-o", "name", "token"],
        "--output name is not supported",
    );
    usage_error(
        s,
        &["workload", "download", "docs", "-o", "name"],
        "--output name is not supported by `contextctl workload download`",
    );
    assert!(
        !std::path::Path::new(&format!("docs-{}.tar.gz", &revision[..12])).exists(),
        "nothing was downloaded"
    );
}

#[test]
fn usage_errors_are_one_line_with_exit_2() {
    usage_error(
        None,
        &["get"],
        "required arguments were not provided: <NAME>",
    );
    usage_error(
        None,
        &["-o", "toml", "ls"],
        "invalid value 'toml' for '--output <OUTPUT>' [possible values: text, json, yaml, name, wide]",
    );
    usage_error(None, &["gett", "x"], "unrecognized subcommand 'gett'");
    usage_error(None, &["ls", "--bogus"], "unexpected argument '--bogus'");
    usage_error(
        None,
        &["bundle", "pack", "."],
        "required arguments were not provided: --file <FILE>",
    );
    usage_error(None, &["completion", "tcsh"], "invalid value 'tcsh'");
}

#[test]
fn bundle_pack_writes_to_file_and_prints_in_any_format() {
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("src");
    std::fs::create_dir(&src).unwrap();
    std::fs::write(src.join("a.md"), "a\n").unwrap();
    let file = tmp.path().join("b.tar.gz");
    let (src_s, file_s) = (src.to_str().unwrap(), file.to_str().unwrap());
    let report = yaml(&ok(
        None,
        &["-o", "yaml", "bundle", "pack", src_s, "--file", file_s],
    ));
    assert_eq!(report["files"], 1);
    assert_eq!(
        report["bundleBytes"],
        std::fs::metadata(&file).unwrap().len()
    );
    let inspected = json(&ok(None, &["bundle", "inspect", file_s, "-o", "json"]));
    assert_eq!(inspected["revision"], report["revision"]);
}

/// Every command path below `path`, from the "Commands:" section of its help.
fn commands(path: &[String]) -> Vec<Vec<String>> {
    let mut args: Vec<&str> = path.iter().map(String::as_str).collect();
    args.push("--help");
    let help = ok(None, &args);
    let mut found = vec![path.to_vec()];
    let section = help
        .split("\nCommands:\n")
        .nth(1)
        .map(|rest| rest.split("\n\n").next().unwrap_or_default());
    for line in section.unwrap_or_default().lines() {
        let Some(name) = line.split_whitespace().next() else {
            continue;
        };
        if name != "help" {
            let mut sub = path.to_vec();
            sub.push(name.to_owned());
            found.extend(commands(&sub));
        }
    }
    found
}

#[test]
fn every_command_has_an_example_and_the_exit_codes_are_documented() {
    let all = commands(&[]);
    // The walk really found the tree.
    for expected in [
        vec!["workload", "download"],
        vec!["context", "create"],
        vec!["bundle", "pack"],
        vec!["token", "mint"],
        vec!["completion"],
    ] {
        assert!(
            all.iter().any(|p| *p == expected),
            "{expected:?} not in {all:?}"
        );
    }
    for path in &all {
        let mut args: Vec<&str> = path.iter().map(String::as_str).collect();
        args.push("--help");
        let help = ok(None, &args);
        let examples = help
            .split("\nExamples:\n")
            .nth(1)
            .unwrap_or_else(|| panic!("`contextctl {}` has no examples:\n{help}", path.join(" ")));
        assert!(
            examples
                .lines()
                .next()
                .is_some_and(|l| l.trim_start().contains("contextctl ")),
            "{path:?}: {examples}"
        );
    }
    let help = ok(None, &["--help"]);
    let exit = help.split("\nExit status:\n").nth(1).expect("exit codes");
    for code in ["0", "1", "2"] {
        assert!(
            exit.lines()
                .any(|l| l.trim_start().starts_with(&format!("{code} "))),
            "exit {code}: {exit}"
        );
    }
}

#[test]
fn completions_for_every_shell() {
    for (shell, marker) in [
        ("bash", "complete -F _contextctl"),
        ("zsh", "#compdef contextctl"),
        ("fish", "complete -c contextctl"),
        ("powershell", "Register-ArgumentCompleter"),
    ] {
        let script = ok(None, &["completion", shell]);
        assert!(script.contains(marker), "{shell}: no {marker:?}");
        assert!(script.contains("workload"), "{shell}: no subcommands");
    }
    // bash: load the script and ask it, as a shell would on <TAB>.
    let probe = format!(
        r#"source <("{bin}" completion bash) || exit 3
complete -p contextctl >/dev/null || exit 4
COMP_WORDS=(contextctl wor); COMP_CWORD=1; _contextctl contextctl wor contextctl
echo "${{COMPREPLY[*]}}"
COMP_WORDS=(contextctl get x -o ''); COMP_CWORD=4; _contextctl contextctl '' -o
echo "${{COMPREPLY[*]}}""#,
        bin = env!("CARGO_BIN_EXE_contextctl")
    );
    let out = Command::new("bash").arg("-c").arg(probe).output().unwrap();
    assert!(out.status.success(), "{out:?}");
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "workload\ntext json yaml name wide\n"
    );
}

/// `contextctl completion bash | head` and friends: a reader that goes away
/// ends the command as it ends `cat` (SIGPIPE), without a panic or a
/// message.
#[test]
fn a_closed_stdout_ends_the_command_quietly() {
    use std::os::fd::{FromRawFd as _, OwnedFd};
    use std::os::unix::process::ExitStatusExt as _;
    use std::process::Stdio;
    for args in [&["completion", "bash"][..], &["--help"][..]] {
        // A pipe whose reader is closed before the command starts: every
        // write meets a pipe without a reader, however fast the child is.
        let mut fds = [0; 2];
        // SAFETY: `fds` has room for the two descriptors pipe(2) returns;
        // each is owned exactly once below.
        assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0, "pipe(2)");
        let (reader, writer) =
            unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
        drop(reader);
        let child = Command::new(env!("CARGO_BIN_EXE_contextctl"))
            .args(args)
            .stdout(Stdio::from(writer))
            .stderr(Stdio::piped())
            .spawn()
            .expect("contextctl runs");
        let out = child.wait_with_output().expect("contextctl ends");
        assert_eq!(
            String::from_utf8_lossy(&out.stderr),
            "",
            "{args:?}: nothing on stderr"
        );
        assert_eq!(
            out.status.signal(),
            Some(libc::SIGPIPE),
            "{args:?}: ended by SIGPIPE, not a panic: {:?}",
            out.status
        );
    }
}

#[test]
fn a_token_that_would_be_born_expired_is_refused() {
    usage_error(
        None,
        &["token", "mint", "--sub", "bob", "--ttl", "0s"],
        "invalid value '0s' for '--ttl <TTL>': a token must live longer than 0s",
    );
}

#[test]
fn a_service_url_without_a_scheme_is_a_usage_error() {
    for url in ["localhost:8080", "127.0.0.1:8080", "ftp://example"] {
        let out = contextctl(None, &["--url", url, "health"]);
        assert_eq!(out.status.code(), Some(2), "{url}: {out:?}");
        assert_eq!(
            String::from_utf8_lossy(&out.stderr),
            format!("contextctl: invalid service URL {url:?}: the URL needs http:// or https://\n")
        );
    }
}

#[test]
fn an_unreachable_service_is_one_line_with_the_likely_fix() {
    // Port 1 on loopback: nothing listens there.
    let out = contextctl(None, &["--url", "http://127.0.0.1:1", "workload", "ls"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert_eq!(stderr.lines().count(), 1, "one line: {stderr:?}");
    assert!(
        stderr.starts_with("contextctl: cannot reach http://127.0.0.1:1: Connection refused"),
        "{stderr:?}"
    );
    assert!(
        stderr.ends_with("; is the service running?\n"),
        "{stderr:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_token_names_where_it_was_looked_for_and_how_to_give_one() {
    let server = TestServer::start().await;
    let elsewhere = tempfile::tempdir().unwrap();
    let out = tokio::task::spawn_blocking({
        let (base, dir) = (server.base.clone(), elsewhere.path().to_owned());
        move || {
            Command::new(env!("CARGO_BIN_EXE_contextctl"))
                .args(["--url", &base, "workload", "ls"])
                .current_dir(&dir)
                .env_remove("CONTEXT_SERVICE_URL")
                .env_remove("CONTEXT_SERVICE_TOKEN")
                .env_remove("CS_DATA_DIR")
                .output()
                .unwrap()
        }
    })
    .await
    .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert_eq!(stderr.lines().count(), 1, "one line: {stderr:?}");
    assert!(
        stderr.starts_with("contextctl: 401 Unauthorized: "),
        "{stderr:?}"
    );
    assert!(
        stderr.ends_with(
            "(token_required); no token was given and none is at ./data/auth/dev-token: \
             pass --token, set CONTEXT_SERVICE_TOKEN, or point --data-dir at the service's data dir\n"
        ),
        "{stderr:?}"
    );
}

/// Runs without a service, expects exit 2 and exactly `stderr`.
fn usage_exactly(args: &[&str], stderr: &str) {
    let out = contextctl(None, args);
    assert_eq!(
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stderr).as_ref()
        ),
        (Some(2), stderr),
        "{args:?}"
    );
    assert!(out.stdout.is_empty(), "{args:?}: stdout {:?}", out.stdout);
}

#[test]
fn a_delivery_needs_exactly_one_target_and_a_run_id_of_the_service_rule() {
    usage_exactly(
        &["workload", "deliver", "docs", "--run", "r2"],
        "contextctl: the following required arguments were not provided: \
         <--sandbox <SANDBOX>|--pool <POOL>>\n",
    );
    usage_exactly(
        &[
            "workload",
            "deliver",
            "docs",
            "--sandbox",
            "s",
            "--pool",
            "p",
            "--run",
            "r2",
        ],
        "contextctl: the argument '--sandbox <SANDBOX>' cannot be used with '--pool <POOL>'\n",
    );
    // The service's pattern, ^[a-z0-9][a-z0-9._-]{0,62}$, in words; on
    // `release` too.
    let rule = "a run id is 1 to 63 lowercase letters, digits, '.', '_' or '-', \
                starting with a letter or digit";
    let long = "a".repeat(64);
    for (run, command) in [
        ("R2", &["workload", "deliver", "docs", "--pool", "p"][..]),
        ("-r", &["workload", "deliver", "docs", "--sandbox", "s"][..]),
        ("a b", &["workload", "release", "docs"][..]),
        (long.as_str(), &["workload", "release", "docs"][..]),
    ] {
        let run_flag = format!("--run={run}");
        let args: Vec<&str> = command.iter().copied().chain([run_flag.as_str()]).collect();
        usage_exactly(
            &args,
            &format!("contextctl: invalid value '{run}' for '--run <RUN>': {rule}\n"),
        );
    }
}

#[test]
fn bad_flag_values_name_the_flag_and_the_rule() {
    let revision_rule = "a revision is 64 lowercase hex digits (as `workload upload` prints it)";
    let name_rule = "a name is at most 50 lowercase letters, digits and '-', \
                     starting and ending with a letter or digit";
    let cases: &[(&[&str], &str)] = &[
        (
            &["create", "demo", "-s", "10Qi"],
            "invalid value '10Qi' for '--size <SIZE>': must be a positive Kubernetes \
             quantity such as 512Mi, 5Gi or 1T",
        ),
        (
            &["context", "create", "docs", "-s", "0"],
            "invalid value '0' for '--size <SIZE>': must be a positive Kubernetes \
             quantity such as 512Mi, 5Gi or 1T",
        ),
        (
            &["create", "demo", "-n", "0"],
            "invalid value '0' for '--replicas <REPLICAS>': the number of sandboxes \
             must be a whole number from 1 to 100",
        ),
        (
            &["create", "demo", "-n", "101"],
            "invalid value '101' for '--replicas <REPLICAS>': the number of sandboxes \
             must be a whole number from 1 to 100",
        ),
        (
            &["create", "demo", "--ttl", "soon"],
            "invalid value 'soon' for '--ttl <DURATION>': must be a duration such as \
             2h, 30m or 1h 30m",
        ),
        (
            &["create", "demo", "--ttl", "0s"],
            "invalid value '0s' for '--ttl <DURATION>': a pool must live longer than 0s",
        ),
        (
            &["create", "Demo"],
            &format!("invalid value 'Demo' for '<NAME>': {name_rule}"),
        ),
        (
            &["create", "demo", "--claim", "Docs", "--read-only"],
            "invalid value 'Docs' for '--claim <PVC>': must be a lowercase Kubernetes \
             name: lowercase letters, digits, '-' and '.', at most 253",
        ),
        (
            &["context", "ls", "--namespace", "Team_A"],
            "invalid value 'Team_A' for '--namespace <NAMESPACE>': a namespace is at most \
             63 lowercase letters, digits and '-', starting and ending with a letter or digit",
        ),
        (
            &["workload", "create", "My_Docs"],
            "invalid value 'My_Docs' for '[NAME]': the workload name must be at most 50 \
             lowercase letters, digits and '-', starting and ending with a letter or digit",
        ),
        (
            &["workload", "activate", "docs", "abc"],
            &format!("invalid value 'abc' for '[REVISION]': {revision_rule}"),
        ),
        (
            &["workload", "download", "docs", "--revision", "abc"],
            &format!("invalid value 'abc' for '--revision <REVISION>': {revision_rule}"),
        ),
        (
            &["token", "mint", "--sub", " "],
            "invalid value ' ' for '--sub <SUB>': the subject must not be empty",
        ),
    ];
    for (args, message) in cases {
        usage_exactly(args, &format!("contextctl: {message}\n"));
    }
    // A closed set lists what it takes.
    usage_error(
        None,
        &["workload", "create", "docs", "--type", "notes"],
        "invalid value 'notes' for '--type <TYPE>'",
    );
}
