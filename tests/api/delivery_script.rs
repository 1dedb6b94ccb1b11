//! The delivery scripts, run for real the way the gateway runs them: under
//! `dash` with GNU coreutils/tar/gzip, and under busybox with a PATH that
//! holds busybox applet links only. Bundles come from the crate's own
//! bundle engine. The harness reads `NEED n`, writes exactly n bytes and
//! keeps stdin open until the script exits (kwok never closes exec stdin).
//!
//! Every test that runs under both shells runs a third time through the
//! injected agent (`context-agent`, built by `tests/common/agent.rs`):
//! the launcher before the script sends it once per sandbox and execs it,
//! and it must give the same answers; the agent-only cases (injection,
//! reuse, a tampered or corrupted agent, an unknown arch, a `noexec` root)
//! follow at the end.
//!
//! As root the scripts run as uid 1001 / gid 0 (the shared sandboxes'
//! user), so read-only bits mean something; the disk-full test needs root
//! to mount a small tmpfs.

use std::collections::BTreeSet;
use std::fs;
use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::fs::{symlink, MetadataExt, PermissionsExt};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};
use std::sync::mpsc::{self, RecvTimeoutError};
use std::sync::{Barrier, Once};
use std::thread;
use std::time::{Duration, Instant};

use context_service::bundle::{
    manifest_of_bundle, pack_dir, CanonicalOptions, Limits, Report, TreeManifest,
};
use context_service::delivery::{
    parse_line, render_deliver, render_deliver_with_agent, render_release, AgentOffer,
    DeliverRequest, DeliveredBy, ReleaseRequest, ScriptError, ScriptLine, Verify,
};
use sha2::{Digest, Sha256};

use crate::common::agent::agent;
use rand::{RngCore, SeedableRng};

/// The user the scripts run as when the tests run as root.
const SANDBOX_UID: u32 = 1001;

/// Every tool the scripts may use (besides shell builtins).
const TOOLS: &[&str] = &[
    "sh",
    "head",
    "tee",
    "sha256sum",
    "gzip",
    "tar",
    "flock",
    "mkdir",
    "mv",
    "rm",
    "chmod",
    "stat",
    "ln",
];

const SCOPE_A: &str = "0123456789abcdef0123456789abcdef";
const SCOPE_B: &str = "fedcba9876543210fedcba9876543210";

/// A script that runs longer than this is killed and the test fails.
const SCRIPT_TIMEOUT: Duration = Duration::from_secs(90);

fn is_root() -> bool {
    fs::metadata("/proc/self").is_ok_and(|m| m.uid() == 0)
}

fn which(tool: &str) -> Option<PathBuf> {
    let path = std::env::var("PATH").unwrap_or_default();
    let found = path
        .split(':')
        .chain(["/usr/local/bin", "/usr/bin", "/bin", "/usr/sbin", "/sbin"])
        .map(|d| Path::new(d).join(tool))
        .find(|p| p.is_file());
    found
}

fn install_hint(what: &str) -> String {
    format!(
        "{what} is not installed, and the delivery script tests must run under it \
         (Debian: apt-get install -y dash busybox)"
    )
}

// ---------------------------------------------------------------------------
// Shells

/// A shell and the PATH the script sees.
struct Shell {
    name: &'static str,
    sh: PathBuf,
    path: String,
    /// The applet-link dir for busybox (kept alive here).
    _bin: Option<tempfile::TempDir>,
    /// The agent offered to deliveries (`None`: the plain script).
    agent: Option<Offered>,
}

/// An agent as the gateway offers it: what it sends on `AGENT <arch>`.
#[derive(Clone)]
struct Offered {
    arch: &'static str,
    bytes: Vec<u8>,
    sha: String,
    /// Sends these bytes instead (a transfer that corrupts the agent),
    /// still announcing `bytes`' digest and size.
    send_instead: Option<Vec<u8>>,
}

impl Offered {
    fn built() -> Offered {
        let a = agent();
        Self::of(a.arch, fs::read(&a.binary).expect("read the agent"))
    }

    fn of(arch: &'static str, bytes: Vec<u8>) -> Offered {
        Offered {
            arch,
            sha: hex::encode(Sha256::digest(&bytes)),
            bytes,
            send_instead: None,
        }
    }

    fn offer(&self) -> AgentOffer {
        let mine = Some((self.sha.clone(), self.bytes.len() as u64));
        match self.arch {
            "x86_64" => AgentOffer {
                x86_64: mine,
                aarch64: None,
            },
            _ => AgentOffer {
                x86_64: None,
                aarch64: mine,
            },
        }
    }
}

impl Shell {
    /// `dash` with the system's GNU tools.
    fn dash() -> Shell {
        let sh = which("dash").unwrap_or_else(|| panic!("{}", install_hint("dash")));
        let tar = Command::new("tar").arg("--version").output();
        assert!(
            tar.is_ok_and(|o| String::from_utf8_lossy(&o.stdout).contains("GNU")),
            "the dash tests expect GNU tar on PATH"
        );
        Shell {
            name: "dash",
            sh,
            path: "/usr/local/bin:/usr/bin:/bin".into(),
            _bin: None,
            agent: None,
        }
    }

    /// `dash` and the system's tools, with the agent offered: the launcher
    /// injects it and it delivers.
    fn agent() -> Shell {
        Shell {
            name: "agent",
            agent: Some(Offered::built()),
            ..Shell::dash()
        }
    }

    /// Like [`Shell::agent`], with `offered` as the agent.
    fn offering(offered: Offered) -> Shell {
        Shell {
            agent: Some(offered),
            ..Shell::agent()
        }
    }

    /// Whether deliveries should come from the agent.
    fn expects_agent(&self) -> bool {
        self.agent.is_some()
    }

    /// busybox `sh` with a PATH of busybox applet links only.
    fn busybox() -> Shell {
        Self::busybox_without(&[])
    }

    /// Like [`Shell::busybox`], without the links for `missing`.
    ///
    /// Debian builds busybox without the `flock` applet (Debian ships
    /// util-linux's), while Alpine's busybox has it; where the applet is
    /// missing, util-linux `flock` is the one non-busybox link.
    fn busybox_without(missing: &[&str]) -> Shell {
        let busybox = which("busybox").unwrap_or_else(|| panic!("{}", install_hint("busybox")));
        let list = Command::new(&busybox)
            .arg("--list")
            .output()
            .expect("busybox --list");
        let applets: BTreeSet<String> = String::from_utf8_lossy(&list.stdout)
            .lines()
            .map(str::to_owned)
            .collect();
        let bin = tempfile::tempdir().expect("tempdir");
        fs::set_permissions(bin.path(), fs::Permissions::from_mode(0o755)).expect("chmod");
        for tool in TOOLS.iter().filter(|t| !missing.contains(t)) {
            let target = if applets.contains(*tool) {
                busybox.clone()
            } else if *tool == "flock" {
                static NOTE: Once = Once::new();
                NOTE.call_once(|| {
                    eprintln!(
                        "note: this busybox has no flock applet (Debian builds it without); \
                         linking util-linux flock instead"
                    );
                });
                which("flock").expect("util-linux flock")
            } else {
                panic!("busybox has no {tool} applet")
            };
            symlink(&target, bin.path().join(tool)).expect("applet link");
        }
        Shell {
            name: "busybox",
            sh: bin.path().join("sh"),
            path: bin.path().display().to_string(),
            _bin: Some(bin),
            agent: None,
        }
    }
}

// ---------------------------------------------------------------------------
// Sandboxes, bundles, requests

/// A temporary "sandbox" directory; the delivery root is `<dir>/ctx`.
struct Sandbox {
    dir: tempfile::TempDir,
    root: PathBuf,
}

impl Sandbox {
    fn new() -> Sandbox {
        let dir = tempfile::tempdir().expect("tempdir");
        let root = dir.path().join("ctx");
        let sb = Sandbox { dir, root };
        sb.give_to_sandbox_user(sb.dir.path());
        sb
    }

    /// Makes `path` the sandbox user's, as in a real sandbox.
    fn give_to_sandbox_user(&self, path: &Path) {
        fs::set_permissions(path, fs::Permissions::from_mode(0o755)).expect("chmod");
        if is_root() {
            std::os::unix::fs::chown(path, Some(SANDBOX_UID), Some(0)).expect("chown");
        }
    }

    fn root_str(&self) -> String {
        self.root.display().to_string()
    }

    fn cache_dir(&self, scope: &str, b: &Bundle) -> PathBuf {
        self.root
            .join("cache")
            .join(format!("{scope}-{}", b.report.revision))
    }

    fn view(&self, scope: &str, workload: &str, run: &str) -> PathBuf {
        self.root.join("runs").join(scope).join(workload).join(run)
    }

    /// Names under `cache/` (published dirs and any staging dirs).
    fn cache_entries(&self) -> Vec<String> {
        names(&self.root.join("cache"))
    }

    fn assert_no_staging(&self) {
        let staging: Vec<String> = self
            .cache_entries()
            .into_iter()
            .filter(|n| n.starts_with(".staging"))
            .collect();
        assert!(staging.is_empty(), "staging dirs left behind: {staging:?}");
    }
}

fn names(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = match fs::read_dir(dir) {
        Ok(rd) => rd
            .map(|e| {
                e.expect("dir entry")
                    .file_name()
                    .to_string_lossy()
                    .into_owned()
            })
            .collect(),
        Err(_) => Vec::new(),
    };
    v.sort();
    v
}

/// A canonical bundle and what the bundle engine recorded for it.
struct Bundle {
    bytes: Vec<u8>,
    report: Report,
}

/// Packs a tree of `files` (path, contents, executable) with the crate's
/// bundle engine.
fn bundle_exec(files: &[(&str, &[u8], bool)]) -> Bundle {
    let src = tempfile::tempdir().expect("tempdir");
    for (path, data, exec) in files {
        let p = src.path().join(path);
        fs::create_dir_all(p.parent().expect("parent")).expect("mkdir");
        fs::write(&p, data).expect("write");
        let mode = if *exec { 0o755 } else { 0o644 };
        fs::set_permissions(&p, fs::Permissions::from_mode(mode)).expect("chmod");
    }
    let mut bytes = Vec::new();
    let report = pack_dir(
        src.path(),
        &Limits::default(),
        &CanonicalOptions::default(),
        &mut bytes,
    )
    .expect("pack");
    assert_eq!(report.bundle_bytes, bytes.len() as u64);
    Bundle { bytes, report }
}

fn bundle(files: &[(&str, &[u8])]) -> Bundle {
    let files: Vec<(&str, &[u8], bool)> = files.iter().map(|(p, d)| (*p, *d, false)).collect();
    bundle_exec(&files)
}

fn noise(len: usize, seed: u64) -> Vec<u8> {
    let mut v = vec![0u8; len];
    rand::rngs::StdRng::seed_from_u64(seed).fill_bytes(&mut v);
    v
}

fn request(
    sb: &Sandbox,
    scope: &str,
    workload: &str,
    run: &str,
    b: &Bundle,
    verify: Verify,
) -> DeliverRequest {
    DeliverRequest {
        root: sb.root_str(),
        scope: scope.into(),
        workload: workload.into(),
        run_id: run.into(),
        revision: b.report.revision.clone(),
        bundle_digest: b.report.bundle_digest.clone(),
        bundle_bytes: b.report.bundle_bytes,
        inflated_bytes: b.report.inflated_bytes,
        entries: b.report.entries,
        manifest: manifest_of_bundle(&b.bytes[..]).expect("the bundle's tree manifest"),
        verify,
    }
}

fn release_request(
    sb: &Sandbox,
    scope: &str,
    workload: &str,
    run: &str,
    retention: u32,
) -> ReleaseRequest {
    ReleaseRequest {
        root: sb.root_str(),
        scope: scope.into(),
        workload: workload.into(),
        run_id: run.into(),
        retention,
    }
}

// ---------------------------------------------------------------------------
// Driving a script like the gateway

/// What one exec printed and how it ended. `lines` are the script's
/// protocol (`NEED`, the result); the launcher's lines are kept apart.
struct Run {
    /// The reason of a leading `RESEND` line (kept apart from `lines`, so
    /// the protocol's shape checks stay as they are).
    resend: Option<String>,
    lines: Vec<ScriptLine>,
    /// `TRANSPORT …`, when the launcher ran.
    transport: Option<DeliveredBy>,
    /// Whether the launcher asked for the agent (`AGENT <arch>`).
    agent_sent: bool,
    status: ExitStatus,
    stderr: String,
    elapsed: Duration,
}

impl Run {
    /// The `NEED` the script asked for.
    fn need(&self) -> u64 {
        match self.lines.first() {
            Some(ScriptLine::Need(n)) => *n,
            other => panic!("expected NEED first, got {other:?}\n{}", self.stderr),
        }
    }

    fn last(&self) -> &ScriptLine {
        self.lines.last().expect("the script printed nothing")
    }

    /// The final `Done` line: (path, cached). Checks the exit status and
    /// the whole protocol shape.
    fn done(&self) -> (String, bool) {
        assert!(
            self.status.success(),
            "script failed ({}): {:?}\n{}",
            self.status,
            self.lines,
            self.stderr
        );
        assert_eq!(self.lines.len(), 2, "{:?}", self.lines);
        self.need();
        match self.last() {
            ScriptLine::Done { path, cached, .. } => (path.clone(), *cached),
            other => panic!("expected the JSON line, got {other:?}\n{}", self.stderr),
        }
    }

    /// The `ERROR` line: (code, reason); checks the exit status.
    fn error(&self) -> (String, String) {
        assert!(
            !self.status.success(),
            "script succeeded: {:?}\n{}",
            self.lines,
            self.stderr
        );
        match self.last() {
            ScriptLine::Error { code, reason } => (code.clone(), reason.clone()),
            other => panic!("expected an ERROR line, got {other:?}\n{}", self.stderr),
        }
    }

    fn released(&self) -> bool {
        assert!(self.status.success(), "{:?}\n{}", self.lines, self.stderr);
        assert_eq!(self.lines.len(), 1, "{:?}", self.lines);
        match self.last() {
            ScriptLine::Released(r) => *r,
            other => panic!("expected the released line, got {other:?}\n{}", self.stderr),
        }
    }
}

/// `sh -c script` in `cwd` with the shell's PATH only, in its own process
/// group, as the sandbox user when the tests run as root.
fn command(shell: &Shell, script: &str, cwd: &Path) -> Command {
    let mut cmd = Command::new(&shell.sh);
    cmd.arg("-c")
        .arg(script)
        .env_clear()
        .env("PATH", &shell.path)
        .current_dir(cwd)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0);
    if is_root() {
        cmd.uid(SANDBOX_UID).gid(0);
    }
    cmd
}

/// Runs `script` as `sh -c` in `cwd`. On `NEED n` (n > 0) writes `payload`
/// from another thread while stdout is read; stdin then stays open until
/// the script has exited, unless `close_after` (a transport that ends
/// early).
fn exec(shell: &Shell, script: &str, cwd: &Path, payload: &[u8], close_after: bool) -> Run {
    let start = Instant::now();
    let mut cmd = command(shell, script, cwd);
    let mut child = cmd
        .spawn()
        .unwrap_or_else(|e| panic!("{}: {e}", shell.name));
    let pgid = child.id();
    let (done_tx, done_rx) = mpsc::channel::<()>();
    let watchdog = thread::spawn(move || {
        if let Err(RecvTimeoutError::Timeout) = done_rx.recv_timeout(SCRIPT_TIMEOUT) {
            let _ = Command::new("kill")
                .args(["-KILL", "--", &format!("-{pgid}")])
                .status();
            return true;
        }
        false
    });
    let mut stdin = child.stdin.take();
    let stdout = child.stdout.take().expect("stdout");
    let mut stderr = child.stderr.take().expect("stderr");
    let errors = thread::spawn(move || {
        let mut s = String::new();
        let _ = stderr.read_to_string(&mut s);
        s
    });
    let mut writer = None;
    let mut resend = None;
    let mut lines = Vec::new();
    let (mut transport, mut agent_sent) = (None, false);
    let mut reader = BufReader::new(stdout);
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line).expect("read stdout") == 0 {
            break;
        }
        let parsed = parse_line(&line).unwrap_or_else(|e| panic!("{}: {e}", shell.name));
        if let ScriptLine::Resend(reason) = &parsed {
            // Only first, and once; anywhere else it stays in `lines`,
            // which breaks the shape checks.
            if lines.is_empty() && resend.is_none() {
                resend = Some(reason.clone());
                continue;
            }
        }
        match &parsed {
            ScriptLine::Transport(by) => {
                transport = Some(*by);
                continue;
            }
            ScriptLine::Agent(arch) => {
                let offered = shell
                    .agent
                    .as_ref()
                    .expect("an agent asked for, none offered");
                assert_eq!(arch, offered.arch);
                let bytes = offered.send_instead.as_ref().unwrap_or(&offered.bytes);
                let sink = stdin.as_mut().expect("stdin");
                sink.write_all(bytes).expect("send the agent");
                sink.flush().expect("flush");
                agent_sent = true;
                continue;
            }
            _ => {}
        }
        if let ScriptLine::Need(n) = parsed {
            if n > 0 {
                let mut sink = stdin.take().expect("NEED printed twice");
                let data = payload.to_vec();
                writer = Some(thread::spawn(move || {
                    // The script may fail early (disk full): EPIPE is fine.
                    let _ = sink.write_all(&data);
                    let _ = sink.flush();
                    (!close_after).then_some(sink)
                }));
            }
        }
        lines.push(parsed);
    }
    let status = child.wait().expect("wait");
    let elapsed = start.elapsed();
    let _ = done_tx.send(());
    let killed = watchdog.join().expect("watchdog");
    // Only now may stdin close: the script had to finish without EOF.
    let kept_open = writer.map(|w| w.join().expect("writer"));
    drop((kept_open, stdin));
    let stderr = errors.join().expect("stderr reader");
    assert!(
        !killed,
        "{}: the script did not finish within {SCRIPT_TIMEOUT:?} (waiting for stdin EOF?)\n{stderr}",
        shell.name
    );
    Run {
        resend,
        lines,
        transport,
        agent_sent,
        status,
        stderr,
        elapsed,
    }
}

/// What the gateway would run for `req` with this shell's offer.
fn script_for(shell: &Shell, req: &DeliverRequest) -> String {
    match &shell.agent {
        Some(offered) => render_deliver_with_agent(req, &offered.offer()).expect("render"),
        None => render_deliver(req).expect("render"),
    }
}

/// Delivers `req`; with an agent offered, checks the agent delivered.
fn deliver(shell: &Shell, sb: &Sandbox, req: &DeliverRequest, payload: &[u8]) -> Run {
    let run = exec(
        shell,
        &script_for(shell, req),
        sb.dir.path(),
        payload,
        false,
    );
    let want = shell.expects_agent().then_some(DeliveredBy::Agent);
    assert_eq!(
        run.transport, want,
        "{}: transport\n{}",
        shell.name, run.stderr
    );
    run
}

fn release(shell: &Shell, sb: &Sandbox, req: &ReleaseRequest) -> Run {
    let script = render_release(req).expect("render");
    exec(shell, &script, sb.dir.path(), b"", false)
}

/// Runs `f` with `dir` (and `file`, if any) writable by the test process,
/// then restores both modes, so only the intended change is visible.
fn tamper(dir: &Path, file: Option<&Path>, f: impl FnOnce()) {
    let saved: Vec<(PathBuf, u32)> = std::iter::once(dir)
        .chain(file.filter(|p| p.exists()))
        .map(|p| (p.to_owned(), fs::metadata(p).expect("stat").mode() & 0o7777))
        .collect();
    for (p, mode) in &saved {
        fs::set_permissions(p, fs::Permissions::from_mode(mode | 0o200)).expect("chmod");
    }
    f();
    for (p, mode) in &saved {
        if p.exists() {
            fs::set_permissions(p, fs::Permissions::from_mode(*mode)).expect("chmod");
        }
    }
}

/// Declares `mod NAME { dash, busybox, agent }` tests calling
/// `NAME(&Shell)`.
macro_rules! both_shells {
    ($($name:ident),* $(,)?) => {$(
        mod $name {
            #[test]
            fn dash() {
                super::$name(&super::Shell::dash());
            }
            #[test]
            fn busybox() {
                super::$name(&super::Shell::busybox());
            }
            #[test]
            fn agent() {
                super::$name(&super::Shell::agent());
            }
        }
    )*};
}

both_shells!(
    lifecycle,
    retention_keeps_the_newest,
    corrupted_transfer_is_refused,
    garbage_and_bombs_are_digest_mismatches,
    short_transfer_is_refused,
    inconsistent_records_are_refused,
    tampered_cache_is_delivered_again,
    hostile_file_names,
    scopes_are_separate,
    concurrent_deliveries_transfer_once,
    disk_full,
    long_pax_paths,
    many_files_verify_on_hit,
    stale_staging_is_removed,
    killed_mid_transfer,
    run_conflict_and_retry,
    relative_root,
);

// ---------------------------------------------------------------------------
// Tests run under both shells

fn lifecycle(sh: &Shell) {
    let sb = Sandbox::new();
    let b = bundle_exec(&[
        ("README.md", b"# hello\n", false),
        ("bin/run.sh", b"#!/bin/sh\necho hi\n", true),
        ("docs/a/b.txt", b"nested", false),
        (".hidden", b"dot", false),
    ]);
    let r1 = request(&sb, SCOPE_A, "wl-1", "run-1", &b, Verify::Default);

    // First delivery: the bytes are sent.
    let first = deliver(sh, &sb, &r1, &b.bytes);
    assert_eq!(first.need(), b.report.bundle_bytes);
    let (path, cached) = first.done();
    assert!(!cached);
    assert_eq!(path, r1.view_path());
    let view = PathBuf::from(&path);
    assert_eq!(view, sb.view(SCOPE_A, "wl-1", "run-1"));
    assert_eq!(fs::read(view.join("README.md")).unwrap(), b"# hello\n");
    assert_eq!(fs::read(view.join("docs/a/b.txt")).unwrap(), b"nested");
    assert_eq!(fs::read(view.join(".hidden")).unwrap(), b"dot");
    let exe = fs::metadata(view.join("bin/run.sh")).unwrap().mode();
    assert_eq!(exe & 0o777, 0o555, "executable and read-only");
    let plain = fs::metadata(view.join("README.md")).unwrap().mode();
    assert_eq!(plain & 0o777, 0o444, "read-only");
    assert_eq!(fs::metadata(view.join("docs")).unwrap().mode() & 0o222, 0);
    if is_root() {
        let owner = fs::metadata(view.join("README.md")).unwrap().uid();
        assert_eq!(owner, SANDBOX_UID, "extracted as the sandbox user");
    }
    assert!(fs::symlink_metadata(&view)
        .unwrap()
        .file_type()
        .is_symlink());

    // Second run: a hit, no bytes.
    let r2 = request(&sb, SCOPE_A, "wl-1", "run-2", &b, Verify::Default);
    let second = deliver(sh, &sb, &r2, &[]);
    assert_eq!(second.need(), 0);
    let (path2, cached2) = second.done();
    assert!(cached2);
    assert_eq!(path2, r2.view_path());

    // Both views are the one cache dir.
    let cache = sb.cache_dir(SCOPE_A, &b);
    let shared = fs::canonicalize(&cache).unwrap().join("tree");
    assert_eq!(fs::canonicalize(&path).unwrap(), shared);
    assert_eq!(fs::canonicalize(&path2).unwrap(), shared);
    assert_eq!(
        sb.cache_entries(),
        vec![format!("{SCOPE_A}-{}", b.report.revision)]
    );

    // Releasing one keeps the other's view.
    let rel1 = release_request(&sb, SCOPE_A, "wl-1", "run-1", 0);
    assert!(release(sh, &sb, &rel1).released());
    assert!(fs::symlink_metadata(&path).is_err(), "run-1's view is gone");
    assert_eq!(
        fs::read(Path::new(&path2).join("README.md")).unwrap(),
        b"# hello\n"
    );
    // Idempotent: the run is gone now.
    assert!(!release(sh, &sb, &rel1).released());

    // Releasing the last run removes the cache dir (retention 0).
    let rel2 = release_request(&sb, SCOPE_A, "wl-1", "run-2", 0);
    assert!(release(sh, &sb, &rel2).released());
    assert!(!cache.exists(), "the unreferenced cache dir is removed");
    assert!(sb.cache_entries().is_empty());
    assert!(
        names(&sb.root.join("refs")).is_empty(),
        "no references left"
    );
    assert!(names(&sb.root.join("runs")).is_empty(), "no views left");
    sb.assert_no_staging();
}

fn retention_keeps_the_newest(sh: &Shell) {
    let sb = Sandbox::new();
    let bundles: Vec<Bundle> = (0..4)
        .map(|i| bundle(&[("v.txt", format!("version {i}").as_bytes())]))
        .collect();
    for (i, b) in bundles.iter().enumerate() {
        let req = request(&sb, SCOPE_A, "wl", &format!("r{i}"), b, Verify::Default);
        deliver(sh, &sb, &req, &b.bytes).done();
    }
    // Another scope's idle revisions do not count against this scope.
    let other = request(&sb, SCOPE_B, "wl", "rb", &bundles[0], Verify::Default);
    deliver(sh, &sb, &other, &bundles[0].bytes).done();
    assert!(release(sh, &sb, &release_request(&sb, SCOPE_B, "wl", "rb", 2)).released());

    // Released in order 0..4 with retention 2: revisions 2 and 3 stay.
    for i in 0..4 {
        let rel = release_request(&sb, SCOPE_A, "wl", &format!("r{i}"), 2);
        assert!(release(sh, &sb, &rel).released());
    }
    let kept: Vec<bool> = bundles
        .iter()
        .map(|b| sb.cache_dir(SCOPE_A, b).exists())
        .collect();
    assert_eq!(kept, [false, false, true, true]);
    assert!(sb.cache_dir(SCOPE_B, &bundles[0]).exists());

    // A kept revision is a hit again, and is no longer idle.
    let again = request(&sb, SCOPE_A, "wl", "r5", &bundles[2], Verify::Default);
    let run = deliver(sh, &sb, &again, &bundles[2].bytes);
    assert_eq!(run.need(), 0);
    assert!(run.done().1);
    // Now revision 3 is the only idle one; retention 0 prunes it at the next
    // release, which also drops revision 2 as its last run goes.
    let rel = release_request(&sb, SCOPE_A, "wl", "r5", 0);
    assert!(release(sh, &sb, &rel).released());
    assert!(!sb.cache_dir(SCOPE_A, &bundles[2]).exists());
    assert!(!sb.cache_dir(SCOPE_A, &bundles[3]).exists());
    assert!(
        sb.cache_dir(SCOPE_B, &bundles[0]).exists(),
        "other scope kept"
    );
}

fn corrupted_transfer_is_refused(sh: &Shell) {
    let sb = Sandbox::new();
    let b = bundle(&[("a.txt", &noise(100_000, 1))]);
    let req = request(&sb, SCOPE_A, "wl", "r1", &b, Verify::Default);
    let mut bad = b.bytes.clone();
    let mid = bad.len() / 2;
    bad[mid] ^= 0x01;
    let run = deliver(sh, &sb, &req, &bad);
    assert_eq!(run.need(), b.report.bundle_bytes);
    let (code, reason) = run.error();
    assert_eq!(code, "digest_mismatch");
    assert_eq!(
        reason,
        "sha256 of the received bytes is not the bundle digest"
    );
    assert!(sb.cache_entries().is_empty(), "nothing published");
    assert!(fs::symlink_metadata(req.view_path()).is_err(), "no view");
    sb.assert_no_staging();
    // The next, intact transfer succeeds.
    assert!(!deliver(sh, &sb, &req, &b.bytes).done().1);
}

/// gzip inflates the bytes while they arrive, before their digest is
/// known. Bytes it rejects at once, or a bomb that inflates past the cap,
/// stop it early; the rest is still received (drained), so the verdict is
/// the digest's, not a short transfer, and nothing is left behind.
fn garbage_and_bombs_are_digest_mismatches(sh: &Shell) {
    use flate2::{write::GzEncoder, Compression};
    let sb = Sandbox::new();
    let b = bundle(&[("a.txt", &noise(200_000, 3))]);
    let n = b.bytes.len();
    let req = request(&sb, SCOPE_A, "wl", "r1", &b, Verify::Default);
    let garbage = vec![0xffu8; n];
    let mut bomb = GzEncoder::new(Vec::new(), Compression::best());
    bomb.write_all(&vec![0u8; 64 << 20]).unwrap();
    let mut bomb = bomb.finish().unwrap();
    assert!(bomb.len() < n, "the bomb fits in the bundle's size");
    bomb.resize(n, 0);
    for (what, payload) in [("garbage", garbage), ("bomb", bomb)] {
        let run = deliver(sh, &sb, &req, &payload);
        assert_eq!(run.need(), b.report.bundle_bytes, "{what}");
        assert_eq!(
            run.error(),
            (
                "digest_mismatch".into(),
                "sha256 of the received bytes is not the bundle digest".into()
            ),
            "{what}: {}",
            run.stderr
        );
        assert!(sb.cache_entries().is_empty(), "{what}: nothing published");
        sb.assert_no_staging();
    }
    assert!(!deliver(sh, &sb, &req, &b.bytes).done().1);
}

fn short_transfer_is_refused(sh: &Shell) {
    let sb = Sandbox::new();
    let b = bundle(&[("a.txt", &noise(50_000, 2))]);
    let req = request(&sb, SCOPE_A, "wl", "r1", &b, Verify::Default);
    let cut = &b.bytes[..b.bytes.len() - 10];
    let run = exec(sh, &script_for(sh, &req), sb.dir.path(), cut, true);
    let (code, reason) = run.error();
    assert_eq!(code, "short_transfer");
    assert_eq!(
        reason,
        format!("received {} of {} bundle bytes", cut.len(), b.bytes.len())
    );
    assert!(sb.cache_entries().is_empty());
}

/// Values the gateway got wrong (or a store that lies) are caught by the
/// end-to-end pin and the counts, and nothing is published.
fn inconsistent_records_are_refused(sh: &Shell) {
    let sb = Sandbox::new();
    let b = bundle(&[("a/b.txt", b"b"), ("c.txt", b"c")]);
    let good = request(&sb, SCOPE_A, "wl", "r1", &b, Verify::Default);
    let cases = [
        (
            DeliverRequest {
                revision: "0".repeat(64),
                ..good.clone()
            },
            "revision_mismatch",
            "sha256 of the inflated bundle is not the revision".to_owned(),
        ),
        (
            DeliverRequest {
                inflated_bytes: b.report.inflated_bytes - 512,
                ..good.clone()
            },
            "too_large",
            format!(
                "the bundle inflates to more than the recorded {} bytes",
                b.report.inflated_bytes - 512
            ),
        ),
        (
            DeliverRequest {
                entries: b.report.entries - 1,
                ..good.clone()
            },
            "too_many_entries",
            format!(
                "the bundle has {} entries, more than the recorded {}",
                b.report.entries,
                b.report.entries - 1
            ),
        ),
        (
            DeliverRequest {
                entries: b.report.entries + 1,
                ..good.clone()
            },
            "extract_failed",
            format!(
                "extracted {} of {} entries",
                b.report.entries,
                b.report.entries + 1
            ),
        ),
        (
            DeliverRequest {
                manifest: TreeManifest {
                    names: "0".repeat(64),
                    ..good.manifest.clone()
                },
                ..good.clone()
            },
            "extract_failed",
            "the extracted tree does not match the revision's manifest: its paths or entry kinds differ"
                .to_owned(),
        ),
        (
            DeliverRequest {
                manifest: TreeManifest {
                    modes: "0".repeat(64),
                    ..good.manifest.clone()
                },
                ..good.clone()
            },
            "extract_failed",
            "the extracted tree does not match the revision's manifest: its file modes or sizes differ"
                .to_owned(),
        ),
    ];
    for (req, want_code, want_reason) in cases {
        let run = deliver(sh, &sb, &req, &b.bytes);
        let (code, reason) = run.error();
        assert_eq!((code.as_str(), reason), (want_code, want_reason));
        assert!(
            sb.cache_entries().is_empty(),
            "{want_code}: nothing published"
        );
        assert!(fs::symlink_metadata(req.view_path()).is_err());
    }
    assert!(!deliver(sh, &sb, &good, &b.bytes).done().1);
}

fn tampered_cache_is_delivered_again(sh: &Shell) {
    let sb = Sandbox::new();
    let b = bundle(&[
        ("keep.txt", b"keep"),
        ("d/file.txt", b"original"),
        ("gone.txt", b"x"),
    ]);
    let mut n = 0;
    // (bytes asked for, the view, the RESEND reason if any)
    let mut deliver_run = |verify: Verify| {
        n += 1;
        let req = request(&sb, SCOPE_A, "wl", &format!("r{n}"), &b, verify);
        let run = deliver(sh, &sb, &req, &b.bytes);
        let need = run.need();
        let (path, cached) = run.done();
        assert_eq!(cached, need == 0);
        (need, PathBuf::from(path), run.resend.clone())
    };
    let (need, view, resend) = deliver_run(Verify::Full);
    assert!(need > 0);
    assert_eq!(resend, None, "nothing to re-send on a first delivery");
    let tree = sb.cache_dir(SCOPE_A, &b).join("tree");
    let file = tree.join("d/file.txt");
    let intact = |view: &Path| {
        assert_eq!(fs::read(view.join("d/file.txt")).unwrap(), b"original");
        assert_eq!(fs::read(view.join("gone.txt")).unwrap(), b"x");
        assert!(!view.join("extra.txt").exists());
    };
    let failed = |why: &str| Some(format!("the cache dir failed verification: {why}"));
    let entries = b.report.entries;
    let resent = (
        b.report.bundle_bytes,
        failed("its file modes or sizes differ"),
    );

    // A file whose size changed.
    tamper(&tree.join("d"), Some(&file), || {
        fs::OpenOptions::new()
            .append(true)
            .open(&file)
            .unwrap()
            .write_all(b"!")
            .unwrap();
    });
    let (need, _, resend) = deliver_run(Verify::Default);
    assert_eq!((need, resend), resent.clone(), "size change detected");
    intact(&view);

    // A file added.
    tamper(&tree, None, || {
        fs::write(tree.join("extra.txt"), b"e").unwrap();
    });
    let (need, _, resend) = deliver_run(Verify::Default);
    assert_eq!(
        (need, resend),
        (
            b.report.bundle_bytes,
            failed(&format!(
                "it has {} entries, the revision has {entries}",
                entries + 1
            ))
        )
    );
    intact(&view);

    // A file removed.
    tamper(&tree, None, || {
        fs::remove_file(tree.join("gone.txt")).unwrap();
    });
    let (need, _, resend) = deliver_run(Verify::Default);
    assert_eq!(
        (need, resend),
        (
            b.report.bundle_bytes,
            failed(&format!(
                "it has {} entries, the revision has {entries}",
                entries - 1
            ))
        )
    );
    intact(&view);

    // A mode changed (the read-only bit undone).
    tamper(&tree.join("d"), None, || {
        fs::set_permissions(&file, fs::Permissions::from_mode(0o644)).unwrap();
    });
    let (need, _, resend) = deliver_run(Verify::Default);
    assert_eq!((need, resend), resent);
    assert_eq!(fs::metadata(&file).unwrap().mode() & 0o777, 0o444);

    // Same size, other content: the default check cannot see it, full does.
    tamper(&tree.join("d"), Some(&file), || {
        fs::write(&file, b"ORIGINAL").unwrap();
    });
    assert_eq!(
        deliver_run(Verify::Default).0,
        0,
        "default verify trusts sizes"
    );
    let (need, _, resend) = deliver_run(Verify::Full);
    assert_eq!(
        (need, resend),
        (
            b.report.bundle_bytes,
            failed("the content of a file differs")
        )
    );
    intact(&view);
    // And the restored dir verifies fully again.
    let (need, _, resend) = deliver_run(Verify::Full);
    assert_eq!((need, resend), (0, None));
    sb.assert_no_staging();
}

fn hostile_file_names(sh: &Shell) {
    let sb = Sandbox::new();
    let names = [
        "it's.txt",
        "$(touch pwned).txt",
        "`touch pwned2`",
        "with space",
        "new\nline",
        "-rf",
        "*",
        "..dots",
        ".hidden",
        "dir with 'quotes'/$HOME;x|y&z",
        "é ü 日本",
    ];
    let files: Vec<(&str, &[u8])> = names.iter().map(|n| (*n, n.as_bytes())).collect();
    let b = bundle(&files);
    let r1 = request(&sb, SCOPE_A, "wl", "r1", &b, Verify::Full);
    let (path, _) = deliver(sh, &sb, &r1, &b.bytes).done();
    for n in names {
        assert_eq!(
            fs::read(Path::new(&path).join(n)).unwrap(),
            n.as_bytes(),
            "{n:?}"
        );
    }
    // The scan handles them on the hit path, with both checks.
    for (run, verify) in [("r2", Verify::Default), ("r3", Verify::Full)] {
        let req = request(&sb, SCOPE_A, "wl", run, &b, verify);
        assert_eq!(deliver(sh, &sb, &req, &b.bytes).need(), 0, "{verify:?}");
    }
    // The manifests recorded at publish (one walk) must equal what a later
    // full check computes, or that check fails on an intact tree.
    let plain = bundle(&[
        ("a b", b"1"),
        ("c'd", b"2"),
        ("e", b"3"),
        ("$f;g", b"4"),
        ("h/i", b"5"),
    ]);
    let cold = request(&sb, SCOPE_A, "wl2", "s1", &plain, Verify::Default);
    assert!(!deliver(sh, &sb, &cold, &plain.bytes).done().1);
    let hit = request(&sb, SCOPE_A, "wl2", "s2", &plain, Verify::Full);
    assert_eq!(deliver(sh, &sb, &hit, &plain.bytes).need(), 0);
    for dir in [sb.dir.path().to_owned(), sb.cache_dir(SCOPE_A, &b)] {
        let found: Vec<String> = names_recursive(&dir)
            .into_iter()
            .filter(|n| n.ends_with("pwned") || n.ends_with("pwned2"))
            .collect();
        assert!(found.is_empty(), "a name was executed: {found:?}");
    }
}

fn names_recursive(dir: &Path) -> Vec<String> {
    let mut out = Vec::new();
    if let Ok(rd) = fs::read_dir(dir) {
        for e in rd.flatten() {
            let p = e.path();
            out.push(p.display().to_string());
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                out.extend(names_recursive(&p));
            }
        }
    }
    out
}

fn scopes_are_separate(sh: &Shell) {
    let sb = Sandbox::new();
    let b = bundle(&[("same.txt", b"same bytes")]);
    let a = request(&sb, SCOPE_A, "wl", "run", &b, Verify::Default);
    let z = request(&sb, SCOPE_B, "wl", "run", &b, Verify::Default);
    let (pa, _) = deliver(sh, &sb, &a, &b.bytes).done();
    // Same revision, same workload and run id, other owner: its own copy.
    let other = deliver(sh, &sb, &z, &b.bytes);
    assert_eq!(
        other.need(),
        b.report.bundle_bytes,
        "no sharing across scopes"
    );
    let (pz, _) = other.done();
    assert_ne!(pa, pz);
    assert_ne!(
        fs::canonicalize(&pa).unwrap(),
        fs::canonicalize(&pz).unwrap()
    );
    assert_eq!(sb.cache_entries().len(), 2);
    assert!(release(sh, &sb, &release_request(&sb, SCOPE_A, "wl", "run", 0)).released());
    assert_eq!(
        fs::read(Path::new(&pz).join("same.txt")).unwrap(),
        b"same bytes"
    );
    assert!(!sb.cache_dir(SCOPE_A, &b).exists());
    assert!(sb.cache_dir(SCOPE_B, &b).exists());
}

fn concurrent_deliveries_transfer_once(sh: &Shell) {
    let sb = Sandbox::new();
    let b = bundle(&[("big.bin", &noise(2 << 20, 3)), ("s.txt", b"s")]);
    let script = |i: usize| {
        script_for(
            sh,
            &request(&sb, SCOPE_A, "wl", &format!("run-{i}"), &b, Verify::Default),
        )
    };
    let scripts: Vec<String> = (0..8).map(script).collect();
    let barrier = Barrier::new(8);
    let runs: Vec<Run> = thread::scope(|s| {
        let handles: Vec<_> = scripts
            .iter()
            .map(|script| {
                let (sb, b, barrier) = (&sb, &b, &barrier);
                s.spawn(move || {
                    barrier.wait();
                    exec(sh, script, sb.dir.path(), &b.bytes, false)
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let transfers = runs.iter().filter(|r| r.need() > 0).count();
    assert_eq!(transfers, 1, "exactly one transfer");
    for (i, run) in runs.iter().enumerate() {
        let (path, cached) = run.done();
        assert_eq!(cached, run.need() == 0);
        assert!(path.ends_with(&format!("/run-{i}")));
        assert_eq!(fs::read(Path::new(&path).join("s.txt")).unwrap(), b"s");
    }
    assert_eq!(sb.cache_entries().len(), 1);
}

/// Unmounts the tmpfs when the test ends, however it ends.
struct Mount(PathBuf);

impl Drop for Mount {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.0).status();
    }
}

fn disk_full(sh: &Shell) {
    assert!(
        is_root(),
        "the disk-full test mounts a 2 MiB tmpfs and must run as root"
    );
    let sb = Sandbox::new();
    let mnt = sb.dir.path().join("small");
    fs::create_dir(&mnt).unwrap();
    // With an agent, room for it too: it is sent before the first delivery.
    let agent_kib = sh.agent.as_ref().map_or(0, |a| a.bytes.len() / 1024 + 64);
    let out = Command::new("mount")
        .args(["-t", "tmpfs", "-o"])
        .arg(format!("size={}k,mode=0755", 2048 + agent_kib))
        .arg("tmpfs")
        .arg(&mnt)
        .output()
        .expect("run mount");
    assert!(
        out.status.success(),
        "cannot mount a tmpfs for the disk-full test (needs root with CAP_SYS_ADMIN): {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let _mount = Mount(mnt.clone());
    sb.give_to_sandbox_user(&mnt);
    let root = mnt.join("ctx");
    if sh.expects_agent() {
        let tiny = bundle(&[("t", b"t")]);
        let mut req = request(&sb, SCOPE_A, "wl", "r0", &tiny, Verify::Default);
        req.root = root.display().to_string();
        assert!(deliver(sh, &sb, &req, &tiny.bytes).agent_sent);
        let mut rel = release_request(&sb, SCOPE_A, "wl", "r0", 0);
        rel.root = req.root.clone();
        assert!(release(sh, &sb, &rel).released());
    }

    // 3 MiB of noise cannot fit: refused before a byte is sent. The script
    // keeps the bundle and its tar side by side; the agent only the tree.
    let big = bundle(&[("noise.bin", &noise(3 << 20, 4))]);
    let mut req = request(&sb, SCOPE_A, "wl", "r1", &big, Verify::Default);
    req.root = root.display().to_string();
    let run = deliver(sh, &sb, &req, &big.bytes);
    assert_eq!(run.lines.len(), 1, "no NEED: {:?}", run.lines);
    let (code, reason) = run.error();
    assert_eq!(code, "disk_full");
    let needs = if sh.expects_agent() {
        big.report.inflated_bytes
    } else {
        big.report.bundle_bytes + big.report.inflated_bytes
    };
    let want = format!("the delivery needs at least {needs} bytes, ");
    assert!(
        reason.starts_with(&want)
            && reason.ends_with(&format!(" are available under {}", req.root)),
        "{reason}"
    );

    // 1,000 one-byte files pass that estimate (a 1 MiB tar) but need a page
    // each on tmpfs: the disk fills up while extracting.
    let contents: Vec<(String, Vec<u8>)> = (0..1000)
        .map(|i| (format!("f{i:04}"), vec![b'x']))
        .collect();
    let files: Vec<(&str, &[u8])> = contents
        .iter()
        .map(|(p, d)| (p.as_str(), d.as_slice()))
        .collect();
    let small_files = bundle(&files);
    let mut req = request(&sb, SCOPE_A, "wl", "r1", &small_files, Verify::Default);
    req.root = root.display().to_string();
    let run = deliver(sh, &sb, &req, &small_files.bytes);
    assert_eq!(run.need(), small_files.report.bundle_bytes);
    let (code, reason) = run.error();
    assert_eq!(code, "disk_full", "{reason}\n{}", run.stderr);
    assert_eq!(
        reason,
        "no space left on device while extracting the bundle"
    );
    let left: Vec<String> = names(&root.join("cache"));
    assert!(left.is_empty(), "left behind {left:?}");

    // Space is back: a small delivery works.
    let small = bundle(&[("ok.txt", b"ok")]);
    let mut req = request(&sb, SCOPE_A, "wl", "r2", &small, Verify::Default);
    req.root = root.display().to_string();
    deliver(sh, &sb, &req, &small.bytes).done();
}

fn long_pax_paths(sh: &Shell) {
    let sb = Sandbox::new();
    let long_component = "c".repeat(200);
    let deep = (0..30)
        .map(|i| format!("dir{i:02}"))
        .collect::<Vec<_>>()
        .join("/");
    let max = "m".repeat(255);
    let p1 = format!("{long_component}/file.txt");
    let p2 = format!("{deep}/leaf.txt");
    let p3 = format!("x/{max}");
    let b = bundle(&[(&p1, b"one"), (&p2, b"two"), (&p3, b"three")]);
    assert!(p2.len() > 100 && p3.len() > 255);
    // The service's own reader takes the canonical PAX headers back.
    let again = context_service::bundle::inspect(b.bytes.as_slice(), &Limits::default())
        .expect("canonical bundle re-inspects");
    assert_eq!(again.revision, b.report.revision);
    let req = request(&sb, SCOPE_A, "wl", "r1", &b, Verify::Default);
    let (path, _) = deliver(sh, &sb, &req, &b.bytes).done();
    let view = Path::new(&path);
    assert_eq!(fs::read(view.join(&p1)).unwrap(), b"one");
    assert_eq!(fs::read(view.join(&p2)).unwrap(), b"two");
    assert_eq!(fs::read(view.join(&p3)).unwrap(), b"three");
    let again = request(&sb, SCOPE_A, "wl", "r2", &b, Verify::Full);
    assert_eq!(deliver(sh, &sb, &again, &b.bytes).need(), 0);
}

fn many_files_verify_on_hit(sh: &Shell) {
    let sb = Sandbox::new();
    let contents: Vec<(String, Vec<u8>)> = (0..2000)
        .map(|i| {
            (
                format!("d{:02}/f{i:04}.txt", i % 40),
                format!("file {i}").into_bytes(),
            )
        })
        .collect();
    let files: Vec<(&str, &[u8])> = contents
        .iter()
        .map(|(p, d)| (p.as_str(), d.as_slice()))
        .collect();
    let b = bundle(&files);
    assert_eq!(b.report.entries, 2040);
    let cold = deliver(
        sh,
        &sb,
        &request(&sb, SCOPE_A, "wl", "r0", &b, Verify::Default),
        &b.bytes,
    );
    assert!(!cold.done().1);
    for (run, verify) in [("r1", Verify::Default), ("r2", Verify::Full)] {
        let hit = deliver(
            sh,
            &sb,
            &request(&sb, SCOPE_A, "wl", run, &b, verify),
            &b.bytes,
        );
        assert!(hit.done().1, "{verify:?} hit");
        println!(
            "{}: 2,000 files ({} entries): cold {:?}, hit with {verify:?} verify {:?}",
            sh.name, b.report.entries, cold.elapsed, hit.elapsed
        );
    }
}

fn stale_staging_is_removed(sh: &Shell) {
    let sb = Sandbox::new();
    let b = bundle(&[("a.txt", b"a")]);
    let req = request(&sb, SCOPE_A, "wl", "r1", &b, Verify::Default);
    deliver(sh, &sb, &req, &b.bytes).done();
    // A crashed (killed) delivery left a read-only staging dir behind.
    let stale = sb.root.join("cache/.staging.99999");
    fs::create_dir_all(stale.join("tree/sub")).unwrap();
    fs::write(stale.join("tree/sub/f"), b"f").unwrap();
    if is_root() {
        for p in [&stale, &stale.join("tree"), &stale.join("tree/sub")] {
            std::os::unix::fs::chown(p, Some(SANDBOX_UID), Some(0)).unwrap();
        }
        std::os::unix::fs::chown(stale.join("tree/sub/f"), Some(SANDBOX_UID), Some(0)).unwrap();
    }
    for p in [stale.join("tree/sub"), stale.join("tree")] {
        fs::set_permissions(p, fs::Permissions::from_mode(0o555)).unwrap();
    }
    let run = deliver(
        sh,
        &sb,
        &request(&sb, SCOPE_A, "wl", "r2", &b, Verify::Default),
        &[],
    );
    assert!(run.done().1);
    sb.assert_no_staging();
}

/// The shell and everything it started die mid-transfer (SIGKILL: no trap
/// runs). The lock dies with them, and the next delivery removes the
/// staging dir that was left and delivers normally.
fn killed_mid_transfer(sh: &Shell) {
    let sb = Sandbox::new();
    let b = bundle(&[("big.bin", &noise(1 << 20, 5))]);
    let req = request(&sb, SCOPE_A, "wl", "r1", &b, Verify::Default);
    if sh.expects_agent() {
        // The agent in place first, so the kill hits the agent itself.
        let warm = request(
            &sb,
            SCOPE_A,
            "wl",
            "warm",
            &bundle(&[("w", b"w")]),
            Verify::Default,
        );
        let small = bundle(&[("w", b"w")]);
        deliver(sh, &sb, &warm, &small.bytes).done();
    }
    let mut child = command(sh, &script_for(sh, &req), sb.dir.path())
        .spawn()
        .expect("spawn");
    let mut stdin = child.stdin.take().expect("stdin");
    let mut out = BufReader::new(child.stdout.take().expect("stdout"));
    let mut first = String::new();
    loop {
        first.clear();
        out.read_line(&mut first).expect("read NEED");
        if !first.starts_with("TRANSPORT ") {
            break;
        }
    }
    assert_eq!(
        parse_line(&first),
        Ok(ScriptLine::Need(b.report.bundle_bytes))
    );
    stdin
        .write_all(&b.bytes[..b.bytes.len() / 2])
        .expect("write half");
    // The script keeps the bundle in the staging dir; the agent extracts
    // as the bytes come (the launcher execs it: the same pid).
    let staging = sb.root.join(format!("cache/.staging.{}", child.id()));
    let busy = if sh.expects_agent() {
        staging.join("tree/big.bin")
    } else {
        staging.join("bundle.gz")
    };
    let deadline = Instant::now() + Duration::from_secs(30);
    while !busy.exists() {
        assert!(Instant::now() < deadline, "the staging dir never appeared");
        thread::sleep(Duration::from_millis(10));
    }
    let killed = Command::new("kill")
        .args(["-KILL", "--", &format!("-{}", child.id())])
        .status()
        .expect("kill");
    assert!(killed.success());
    child.wait().expect("wait");
    drop(stdin);
    assert!(staging.exists(), "SIGKILL leaves the staging dir");

    let run = deliver(sh, &sb, &req, &b.bytes);
    assert!(!run.done().1);
    sb.assert_no_staging();
    assert!(sb.cache_dir(SCOPE_A, &b).exists());
}

fn run_conflict_and_retry(sh: &Shell) {
    let sb = Sandbox::new();
    let v1 = bundle(&[("v", b"1")]);
    let v2 = bundle(&[("v", b"2")]);
    let req = request(&sb, SCOPE_A, "wl", "r1", &v1, Verify::Default);
    deliver(sh, &sb, &req, &v1.bytes).done();
    // The same run again (a retried request) is a hit and keeps one view.
    let (path, cached) = deliver(sh, &sb, &req, &v1.bytes).done();
    assert!(cached);
    assert_eq!(fs::read(Path::new(&path).join("v")).unwrap(), b"1");
    // The same run id with another revision is refused before any transfer.
    let other = request(&sb, SCOPE_A, "wl", "r1", &v2, Verify::Default);
    let run = deliver(sh, &sb, &other, &v2.bytes);
    assert_eq!(run.lines.len(), 1, "refused before NEED: {:?}", run.lines);
    let (code, reason) = run.error();
    assert_eq!(code, "run_conflict");
    assert_eq!(
        reason,
        "run r1 of workload wl is registered with another revision"
    );
    assert!(!sb.cache_dir(SCOPE_A, &v2).exists());
    // One release undoes the retried delivery completely.
    assert!(release(sh, &sb, &release_request(&sb, SCOPE_A, "wl", "r1", 0)).released());
    assert!(sb.cache_entries().is_empty());
}

// ---------------------------------------------------------------------------
// Single-shell tests

/// A root relative to the exec's working directory (the e2e suite on kwok,
/// and `local`): the printed path is absolute, hits and releases find the
/// same tree, and a working directory the JSON line cannot carry is refused.
fn relative_root(sh: &Shell) {
    let sb = Sandbox::new();
    let b = bundle(&[("a.txt", b"relative")]);
    let mut req = request(&sb, SCOPE_A, "wl", "r1", &b, Verify::Default);
    req.root = "ctx".into();
    let first = deliver(sh, &sb, &req, &b.bytes);
    let (path, cached) = first.done();
    assert!(!cached);
    assert!(path.starts_with('/'), "{path}");
    assert_eq!(PathBuf::from(&path), sb.view(SCOPE_A, "wl", "r1"));
    assert_eq!(
        fs::read(Path::new(&path).join("a.txt")).unwrap(),
        b"relative"
    );
    req.run_id = "r2".into();
    let second = deliver(sh, &sb, &req, &[]);
    assert_eq!(second.need(), 0);
    assert_eq!(PathBuf::from(second.done().0), sb.view(SCOPE_A, "wl", "r2"));
    for run in ["r1", "r2"] {
        let mut rel = release_request(&sb, SCOPE_A, "wl", run, 0);
        rel.root = "ctx".into();
        assert!(release(sh, &sb, &rel).released());
    }
    assert!(sb.cache_entries().is_empty());

    let odd = sb.dir.path().join("a \"b");
    fs::create_dir(&odd).unwrap();
    sb.give_to_sandbox_user(&odd);
    let run = exec(sh, &script_for(sh, &req), &odd, &b.bytes, false);
    assert_eq!(
        run.error(),
        (
            "bad_root".into(),
            "the working directory has characters a delivery path cannot hold".into()
        )
    );
    assert!(!odd.join("ctx").exists());
}

#[test]
fn missing_tool_is_named() {
    let sh = Shell::busybox_without(&["flock"]);
    let sb = Sandbox::new();
    let b = bundle(&[("a", b"a")]);
    let run = deliver(
        &sh,
        &sb,
        &request(&sb, SCOPE_A, "wl", "r", &b, Verify::Default),
        &[],
    );
    assert_eq!(run.lines.len(), 1);
    assert_eq!(
        run.error(),
        ("missing_tool".into(), "flock not found on PATH".into())
    );
    let run = release(&sh, &sb, &release_request(&sb, SCOPE_A, "wl", "r", 0));
    assert_eq!(run.error().0, "missing_tool");
    assert!(!sb.root.exists(), "nothing created before the tool check");
}

#[test]
fn unusable_root_is_reported() {
    let sh = Shell::dash();
    let sb = Sandbox::new();
    // A root below a regular file can never be created.
    let blocker = sb.dir.path().join("file");
    fs::write(&blocker, b"x").unwrap();
    let b = bundle(&[("a", b"a")]);
    let mut req = request(&sb, SCOPE_A, "wl", "r", &b, Verify::Default);
    req.root = blocker.join("ctx").display().to_string();
    let run = deliver(&sh, &sb, &req, &[]);
    assert_eq!(
        run.error(),
        (
            "bad_root".into(),
            format!("cannot create or write the delivery root {}", req.root)
        )
    );
    // Releasing under a root that does not exist: no such run.
    let mut rel = release_request(&sb, SCOPE_A, "wl", "r", 0);
    rel.root = req.root.clone();
    assert!(!release(&sh, &sb, &rel).released());
}

#[test]
fn hostile_values_are_refused_by_the_renderer() {
    let sb = Sandbox::new();
    let b = bundle(&[("a", b"a")]);
    let good = request(&sb, SCOPE_A, "wl", "r", &b, Verify::Default);
    render_deliver(&good).expect("the baseline renders");
    let hostile = [
        "a'b",
        "a b",
        "$(reboot)",
        "`reboot`",
        "a\nb",
        "..",
        "a;b",
        "a\"b",
        "",
        "A",
    ];
    for v in hostile {
        let mut cases: Vec<(&str, DeliverRequest)> = vec![
            (
                "runId",
                DeliverRequest {
                    run_id: v.into(),
                    ..good.clone()
                },
            ),
            (
                "workload",
                DeliverRequest {
                    workload: v.into(),
                    ..good.clone()
                },
            ),
            (
                "scope",
                DeliverRequest {
                    scope: v.into(),
                    ..good.clone()
                },
            ),
            (
                "revision",
                DeliverRequest {
                    revision: v.into(),
                    ..good.clone()
                },
            ),
            (
                "bundleDigest",
                DeliverRequest {
                    bundle_digest: v.into(),
                    ..good.clone()
                },
            ),
        ];
        // Upper case is fine in a root path.
        if v != "A" {
            cases.push((
                "root",
                DeliverRequest {
                    root: format!("/tmp/{v}"),
                    ..good.clone()
                },
            ));
        }
        for (field, req) in cases {
            let err: ScriptError =
                render_deliver(&req).expect_err(&format!("{field} = {v:?} must be refused"));
            assert_eq!(err.field(), field, "{v:?}");
            let msg = err.to_string();
            assert!(msg.starts_with(&format!("{field} is invalid: ")), "{msg}");
            // The message names the rule, never echoes the value.
            if v.contains(['$', '`', '\n', '\'', ';']) {
                assert!(!msg.contains(v), "{msg}");
            }
        }
        let rel = ReleaseRequest {
            run_id: v.into(),
            ..release_request(&sb, SCOPE_A, "wl", "r", 0)
        };
        assert_eq!(render_release(&rel).unwrap_err().field(), "runId");
    }
    // `..` and `.` components, empty and trailing-slash roots (a relative
    // root is fine: see `relative_root`).
    for root in [
        "/a/../b", "/a/./b", "../a", "./a", "a/", "", "/a/", "/", "/a//b",
    ] {
        let req = DeliverRequest {
            root: root.into(),
            ..good.clone()
        };
        assert_eq!(render_deliver(&req).unwrap_err().field(), "root", "{root}");
    }
    // 64-character run ids and hex in upper case are refused too.
    let req = DeliverRequest {
        run_id: "a".repeat(64),
        ..good.clone()
    };
    assert_eq!(render_deliver(&req).unwrap_err().field(), "runId");
    let req = DeliverRequest {
        revision: good.revision.to_uppercase(),
        ..good.clone()
    };
    assert_eq!(render_deliver(&req).unwrap_err().field(), "revision");
    // Sizes the shell cannot do arithmetic on, and an empty bundle.
    for (field, req) in [
        (
            "bundleBytes",
            DeliverRequest {
                bundle_bytes: 0,
                ..good.clone()
            },
        ),
        (
            "bundleBytes",
            DeliverRequest {
                bundle_bytes: u64::MAX,
                ..good.clone()
            },
        ),
        (
            "inflatedBytes",
            DeliverRequest {
                inflated_bytes: i64::MAX as u64,
                ..good.clone()
            },
        ),
        (
            "entries",
            DeliverRequest {
                entries: u64::MAX,
                ..good.clone()
            },
        ),
    ] {
        assert_eq!(render_deliver(&req).unwrap_err().field(), field);
    }
}

/// Not a pass/fail check: prints cold and warm times of a 64 MiB bundle
/// (target for warm, default verify: under 100 ms).
#[test]
fn measure_64_mib() {
    let sh = Shell::dash();
    let sb = Sandbox::new();
    let chunk = 1 << 20;
    let data = noise(64 * chunk, 9);
    let files: Vec<(String, &[u8])> = data
        .chunks(chunk)
        .enumerate()
        .map(|(i, c)| (format!("part{i:02}.bin"), c))
        .collect();
    let files: Vec<(&str, &[u8])> = files.iter().map(|(p, d)| (p.as_str(), *d)).collect();
    let b = bundle(&files);
    let cold = deliver(
        &sh,
        &sb,
        &request(&sb, SCOPE_A, "wl", "cold", &b, Verify::Default),
        &b.bytes,
    );
    assert!(!cold.done().1);
    let mut warm = Vec::new();
    for i in 0..5 {
        let run = deliver(
            &sh,
            &sb,
            &request(&sb, SCOPE_A, "wl", &format!("w{i}"), &b, Verify::Default),
            &[],
        );
        assert!(run.done().1);
        warm.push(run.elapsed);
    }
    let full = deliver(
        &sh,
        &sb,
        &request(&sb, SCOPE_A, "wl", "full", &b, Verify::Full),
        &[],
    );
    assert!(full.done().1);
    warm.sort();
    println!(
        "dash/GNU, {:.1} MiB bundle ({} files): cold {:?}, warm (default verify) median {:?} \
         (min {:?}, max {:?}), warm (full verify) {:?}",
        b.bytes.len() as f64 / (1 << 20) as f64,
        b.report.files,
        cold.elapsed,
        warm[2],
        warm[0],
        warm[4],
        full.elapsed
    );
}

// ---------------------------------------------------------------------------
// The agent only: injection, reuse, tampering, fallbacks, interplay

/// Where the launcher keeps `offered` in `sb`.
fn installed(sb: &Sandbox, offered: &Offered) -> PathBuf {
    sb.root.join("bin").join(&offered.sha).join("context-agent")
}

#[test]
fn the_agent_is_injected_once_and_reused() {
    let sh = Shell::agent();
    let offered = sh.agent.clone().unwrap();
    let sb = Sandbox::new();
    let b = bundle(&[("a.txt", b"a")]);
    let first = deliver(
        &sh,
        &sb,
        &request(&sb, SCOPE_A, "wl", "r1", &b, Verify::Default),
        &b.bytes,
    );
    assert!(first.agent_sent, "sent on first use");
    assert!(!first.done().1);
    let bin = installed(&sb, &offered);
    let meta = fs::metadata(&bin).expect("the agent is kept");
    assert_eq!(meta.mode() & 0o7777, 0o555);
    assert_eq!(fs::read(&bin).unwrap(), offered.bytes);
    let bin_dir = sb.root.join("bin");
    assert_eq!(
        names(&bin_dir),
        vec![offered.sha.clone()],
        "no stray upload left"
    );

    // Later deliveries (a hit, a miss, a release) run the same file.
    let second = deliver(
        &sh,
        &sb,
        &request(&sb, SCOPE_A, "wl", "r2", &b, Verify::Full),
        &[],
    );
    assert!(!second.agent_sent, "not sent again");
    assert!(second.done().1);
    let other = bundle(&[("b.txt", b"b")]);
    let third = deliver(
        &sh,
        &sb,
        &request(&sb, SCOPE_B, "wl", "r3", &other, Verify::Default),
        &other.bytes,
    );
    assert!(!third.agent_sent);
    assert!(!third.done().1);
    let again = fs::metadata(&bin).unwrap();
    assert_eq!(
        (again.ino(), again.mtime()),
        (meta.ino(), meta.mtime()),
        "the same file"
    );
}

#[test]
fn a_tampered_or_missing_agent_is_sent_again() {
    let sh = Shell::agent();
    let offered = sh.agent.clone().unwrap();
    let sb = Sandbox::new();
    let b = bundle(&[("a.txt", b"a")]);
    let mut n = 0;
    let mut run = || {
        n += 1;
        deliver(
            &sh,
            &sb,
            &request(&sb, SCOPE_A, "wl", &format!("r{n}"), &b, Verify::Default),
            &b.bytes,
        )
    };
    assert!(run().agent_sent);
    let bin = installed(&sb, &offered);
    // Same size, one byte changed: only the digest can tell.
    tamper(bin.parent().unwrap(), Some(&bin), || {
        let mut bytes = fs::read(&bin).unwrap();
        let last = bytes.len() - 1;
        bytes[last] ^= 0xff;
        fs::write(&bin, &bytes).unwrap();
    });
    let r = run();
    assert!(r.agent_sent, "a tampered agent is replaced\n{}", r.stderr);
    r.done();
    assert_eq!(fs::read(&bin).unwrap(), offered.bytes);
    assert_eq!(fs::metadata(&bin).unwrap().mode() & 0o7777, 0o555);
    // A missing one, and a symlink in its place, too.
    tamper(bin.parent().unwrap(), None, || {
        fs::remove_file(&bin).unwrap();
    });
    assert!(run().agent_sent);
    tamper(bin.parent().unwrap(), None, || {
        fs::remove_file(&bin).unwrap();
        symlink(&agent().binary, &bin).unwrap();
    });
    assert!(run().agent_sent, "a symlink is not the agent");
    assert!(!fs::symlink_metadata(&bin).unwrap().file_type().is_symlink());
    assert!(!run().agent_sent);
}

/// An agent that arrives damaged is dropped before it is made executable
/// or run; the script delivers, and the bundle bytes after it are intact.
#[test]
fn a_corrupted_agent_transfer_falls_back_to_the_script() {
    let mut offered = Offered::built();
    let mut bad = offered.bytes.clone();
    bad[1000] ^= 0x01;
    offered.send_instead = Some(bad);
    let sh = Shell::offering(offered.clone());
    let sb = Sandbox::new();
    let b = bundle(&[("a.txt", &noise(10_000, 7))]);
    let req = request(&sb, SCOPE_A, "wl", "r1", &b, Verify::Default);
    let run = exec(&sh, &script_for(&sh, &req), sb.dir.path(), &b.bytes, false);
    assert!(run.agent_sent);
    assert_eq!(run.transport, Some(DeliveredBy::Script), "{}", run.stderr);
    assert!(!run.done().1);
    assert!(
        run.stderr.contains("the agent did not arrive intact"),
        "{}",
        run.stderr
    );
    assert!(!installed(&sb, &offered).exists());
    assert!(names(&sb.root.join("bin")).is_empty(), "nothing kept");
}

/// `uname -m` names an arch the gateway has no agent for (a fake `uname`
/// first on PATH): the script delivers, nothing is sent or kept.
#[test]
fn an_unknown_arch_falls_back_to_the_script() {
    let fake = tempfile::tempdir().unwrap();
    let uname = fake.path().join("uname");
    fs::write(&uname, "#!/bin/sh\necho riscv64\n").unwrap();
    fs::set_permissions(&uname, fs::Permissions::from_mode(0o755)).unwrap();
    fs::set_permissions(fake.path(), fs::Permissions::from_mode(0o755)).unwrap();
    let mut sh = Shell::agent();
    sh.path = format!("{}:{}", fake.path().display(), sh.path);
    let sb = Sandbox::new();
    let b = bundle(&[("a.txt", b"a")]);
    let req = request(&sb, SCOPE_A, "wl", "r1", &b, Verify::Default);
    let run = exec(&sh, &script_for(&sh, &req), sb.dir.path(), &b.bytes, false);
    assert!(!run.agent_sent);
    assert_eq!(run.transport, Some(DeliveredBy::Script));
    assert!(!run.done().1);
    assert!(!sb.root.join("bin").exists());
}

/// A binary this kernel cannot run (offered for this arch, but not an
/// executable at all) is kept — it is what the gateway sent — but its
/// probe fails, so the script delivers, every time, without sending again.
#[test]
fn an_agent_that_cannot_run_falls_back_to_the_script() {
    let offered = Offered::of(agent().arch, noise(4096, 11));
    let sh = Shell::offering(offered);
    let sb = Sandbox::new();
    let b = bundle(&[("a.txt", b"a")]);
    for (i, sent) in [(1, true), (2, false)] {
        let req = request(&sb, SCOPE_A, "wl", &format!("r{i}"), &b, Verify::Default);
        let run = exec(&sh, &script_for(&sh, &req), sb.dir.path(), &b.bytes, false);
        assert_eq!(run.agent_sent, sent);
        assert_eq!(run.transport, Some(DeliveredBy::Script), "{}", run.stderr);
        assert!(
            run.stderr.contains("the agent cannot run here"),
            "{}",
            run.stderr
        );
        run.done();
    }
}

/// A root on a filesystem mounted `noexec`: the agent is sent and kept,
/// cannot be executed (126), and the script delivers.
#[test]
fn a_noexec_root_falls_back_to_the_script() {
    assert!(
        is_root(),
        "the noexec test mounts a tmpfs and must run as root"
    );
    let sh = Shell::agent();
    let sb = Sandbox::new();
    let out = Command::new("mount")
        .args(["-t", "tmpfs", "-o", "size=64m,mode=0755,noexec", "tmpfs"])
        .arg(sb.dir.path())
        .output()
        .expect("run mount");
    assert!(
        out.status.success(),
        "cannot mount a noexec tmpfs (needs root with CAP_SYS_ADMIN): {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let _mount = Mount(sb.dir.path().to_owned());
    sb.give_to_sandbox_user(sb.dir.path());
    let b = bundle(&[("a.txt", b"a"), ("run.sh", b"#!/bin/sh\n")]);
    for (i, sent) in [(1, true), (2, false)] {
        let req = request(&sb, SCOPE_A, "wl", &format!("r{i}"), &b, Verify::Default);
        let run = exec(&sh, &script_for(&sh, &req), sb.dir.path(), &b.bytes, false);
        assert_eq!(run.agent_sent, sent);
        assert_eq!(run.transport, Some(DeliveredBy::Script), "{}", run.stderr);
        assert!(run.stderr.contains("exit 126"), "{}", run.stderr);
        assert_eq!(run.done().1, i == 2);
    }
}

/// Agent and script share one sandbox: each finds the other's published
/// tree as a verified hit, and one release (the script's) undoes both.
#[test]
fn agent_and_script_interoperate() {
    let agent_sh = Shell::agent();
    let script_sh = Shell::busybox();
    let sb = Sandbox::new();
    let b = bundle_exec(&[
        ("bin/x", b"#!/bin/sh\n", true),
        ("d/e/f.txt", b"f", false),
        (".h", b"h", false),
    ]);
    let by_script = deliver(
        &script_sh,
        &sb,
        &request(&sb, SCOPE_A, "wl", "s1", &b, Verify::Full),
        &b.bytes,
    );
    assert!(!by_script.done().1);
    let hit = deliver(
        &agent_sh,
        &sb,
        &request(&sb, SCOPE_A, "wl", "a1", &b, Verify::Full),
        &[],
    );
    assert!(
        hit.done().1,
        "the agent verifies the script's tree\n{}",
        hit.stderr
    );

    let other = bundle_exec(&[("bin/y", b"y", true), ("z", b"z", false)]);
    let by_agent = deliver(
        &agent_sh,
        &sb,
        &request(&sb, SCOPE_B, "wl", "a2", &other, Verify::Full),
        &other.bytes,
    );
    assert!(!by_agent.done().1);
    let hit = deliver(
        &script_sh,
        &sb,
        &request(&sb, SCOPE_B, "wl", "s2", &other, Verify::Full),
        &[],
    );
    assert!(
        hit.done().1,
        "the script verifies the agent's tree\n{}",
        hit.stderr
    );

    for (scope, run) in [
        (SCOPE_A, "s1"),
        (SCOPE_A, "a1"),
        (SCOPE_B, "a2"),
        (SCOPE_B, "s2"),
    ] {
        assert!(release(&script_sh, &sb, &release_request(&sb, scope, "wl", run, 0)).released());
    }
    assert!(sb.cache_entries().is_empty());
    sb.assert_no_staging();
}

/// Not a pass/fail check: the script and the agent side by side on the
/// same 64 MiB bundle (cold), printed with their ratio. For the static
/// release agent: `cargo build -p context-agent --profile agent --target
/// x86_64-unknown-linux-musl`, then run this test with
/// `CONTEXT_SERVICE_TEST_AGENT=<target>/x86_64-unknown-linux-musl/agent/context-agent`.
#[test]
fn measure_64_mib_agent_vs_script() {
    let chunk = 1 << 20;
    let data = noise(64 * chunk, 9);
    let files: Vec<(String, &[u8])> = data
        .chunks(chunk)
        .enumerate()
        .map(|(i, c)| (format!("part{i:02}.bin"), c))
        .collect();
    let files: Vec<(&str, &[u8])> = files.iter().map(|(p, d)| (p.as_str(), *d)).collect();
    let b = bundle(&files);
    let mut cold = Vec::new();
    let mut injection = None;
    for sh in [Shell::dash(), Shell::agent()] {
        let sb = Sandbox::new();
        if sh.expects_agent() {
            // A small cold delivery that injects the agent, then another
            // (of other bytes) with the agent present: the cost of injection.
            let tiny = |i: u64| bundle(&[("t", &noise(1000, i))]);
            let (first, second) = (tiny(1), tiny(2));
            let with = deliver(
                &sh,
                &sb,
                &request(&sb, SCOPE_A, "wl", "i1", &first, Verify::Default),
                &first.bytes,
            );
            assert!(with.agent_sent);
            let without = deliver(
                &sh,
                &sb,
                &request(&sb, SCOPE_A, "wl", "i2", &second, Verify::Default),
                &second.bytes,
            );
            assert!(!without.agent_sent && !without.done().1);
            injection = Some((with.elapsed, without.elapsed));
        }
        let run = deliver(
            &sh,
            &sb,
            &request(&sb, SCOPE_A, "wl", "cold", &b, Verify::Default),
            &b.bytes,
        );
        assert!(!run.done().1);
        cold.push(run.elapsed);
    }
    let (with, without) = injection.expect("measured");
    println!(
        "small cold delivery with the agent's injection {with:?}, with the agent present {without:?} \
         ({} agent bytes)",
        fs::metadata(&agent().binary).map(|m| m.len()).unwrap_or(0)
    );
    println!(
        "{:.1} MiB bundle, cold: script (dash/GNU) {:?}, agent ({}) {:?}, ratio {:.2}",
        b.bytes.len() as f64 / (1 << 20) as f64,
        cold[0],
        agent().binary.display(),
        cold[1],
        cold[0].as_secs_f64() / cold[1].as_secs_f64()
    );
}

/// The `aarch64` build, run under `qemu-aarch64` (Debian `qemu-user`; no
/// binfmt registration is needed: qemu is called by name, so the launcher
/// is left out and the agent is started the way the launcher starts it):
/// a cold delivery, hits with both checks, the script's hit on its tree,
/// a corrupted transfer and a tampered cache.
#[test]
fn the_aarch64_agent_delivers_under_qemu() {
    let qemu = which("qemu-aarch64")
        .expect("qemu-aarch64 is not installed (Debian: apt-get install -y qemu-user)");
    let bin = crate::common::agent::aarch64_agent();
    let sh = Shell::dash();
    let sb = Sandbox::new();
    let b = bundle_exec(&[
        ("bin/run", b"#!/bin/sh\n", true),
        ("d/e.txt", &noise(300_000, 21), false),
        (".h", b"h", false),
    ]);
    let start = |req: &DeliverRequest| {
        let m = &req.manifest;
        let verify = match req.verify {
            Verify::Default => "default",
            Verify::Full => "full",
        };
        format!(
            "exec '{}' '{}' deliver root={} scope={} workload={} run={} revision={} digest={} \
             size={} inflated={} entries={} verify={verify} names={} modes={} content={}",
            qemu.display(),
            bin.display(),
            req.root,
            req.scope,
            req.workload,
            req.run_id,
            req.revision,
            req.bundle_digest,
            req.bundle_bytes,
            req.inflated_bytes,
            req.entries,
            m.names,
            m.modes,
            m.content
        )
    };
    let cold = request(&sb, SCOPE_A, "wl", "r1", &b, Verify::Default);
    let mut bad = b.bytes.clone();
    bad[200] ^= 0x10;
    let run = exec(&sh, &start(&cold), sb.dir.path(), &bad, false);
    assert_eq!(run.error().0, "digest_mismatch", "{}", run.stderr);
    sb.assert_no_staging();
    let run = exec(&sh, &start(&cold), sb.dir.path(), &b.bytes, false);
    let (path, cached) = run.done();
    assert!(!cached, "{}", run.stderr);
    assert_eq!(
        fs::read(Path::new(&path).join("d/e.txt")).unwrap(),
        noise(300_000, 21)
    );
    assert_eq!(
        fs::metadata(Path::new(&path).join("bin/run"))
            .unwrap()
            .mode()
            & 0o777,
        0o555
    );
    for (run_id, verify) in [("r2", Verify::Default), ("r3", Verify::Full)] {
        let req = request(&sb, SCOPE_A, "wl", run_id, &b, verify);
        assert!(exec(&sh, &start(&req), sb.dir.path(), &[], false).done().1);
    }
    // The script verifies what the aarch64 agent published, fully.
    let hit = deliver(
        &sh,
        &sb,
        &request(&sb, SCOPE_A, "wl", "r4", &b, Verify::Full),
        &[],
    );
    assert!(hit.done().1);
    // A tampered byte: the full check sends it again.
    let tree = sb.cache_dir(SCOPE_A, &b).join("tree");
    let file = tree.join("d/e.txt");
    tamper(&tree.join("d"), Some(&file), || {
        let mut bytes = fs::read(&file).unwrap();
        bytes[0] ^= 1;
        fs::write(&file, bytes).unwrap();
    });
    let req = request(&sb, SCOPE_A, "wl", "r5", &b, Verify::Full);
    let run = exec(&sh, &start(&req), sb.dir.path(), &b.bytes, false);
    assert_eq!(run.need(), b.report.bundle_bytes);
    assert!(!run.done().1);
}

/// SIGTERM mid-transfer: the agent says `ERROR interrupted` (the script's
/// trap) and exits; the next delivery removes what it left and succeeds.
#[test]
fn a_terminated_agent_says_interrupted() {
    let sh = Shell::agent();
    let sb = Sandbox::new();
    let b = bundle(&[("big.bin", &noise(1 << 20, 5))]);
    let warm = bundle(&[("w", b"w")]);
    deliver(
        &sh,
        &sb,
        &request(&sb, SCOPE_A, "wl", "warm", &warm, Verify::Default),
        &warm.bytes,
    )
    .done();
    let req = request(&sb, SCOPE_A, "wl", "r1", &b, Verify::Default);
    let mut child = command(&sh, &script_for(&sh, &req), sb.dir.path())
        .spawn()
        .expect("spawn");
    let mut stdin = child.stdin.take().expect("stdin");
    let mut out = BufReader::new(child.stdout.take().expect("stdout"));
    let mut lines = Vec::new();
    loop {
        let mut line = String::new();
        out.read_line(&mut line).expect("read");
        let parsed = parse_line(&line).expect("a protocol line");
        let need = matches!(parsed, ScriptLine::Need(_));
        lines.push(parsed);
        if need {
            break;
        }
    }
    stdin
        .write_all(&b.bytes[..b.bytes.len() / 2])
        .expect("write half");
    let staging = sb.root.join(format!("cache/.staging.{}", child.id()));
    let deadline = Instant::now() + Duration::from_secs(30);
    while !staging.join("tree/big.bin").exists() {
        assert!(Instant::now() < deadline, "the extraction never started");
        thread::sleep(Duration::from_millis(10));
    }
    let term = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .expect("kill");
    assert!(term.success());
    let mut rest = String::new();
    out.read_to_string(&mut rest).expect("read the rest");
    let status = child.wait().expect("wait");
    drop(stdin);
    assert_eq!(status.code(), Some(1));
    assert_eq!(
        parse_line(rest.trim_end()),
        Ok(ScriptLine::Error {
            code: "interrupted".into(),
            reason: "delivery interrupted by a signal".into()
        })
    );
    assert_eq!(
        lines.first(),
        Some(&ScriptLine::Transport(DeliveredBy::Agent))
    );
    assert!(!deliver(&sh, &sb, &req, &b.bytes).done().1);
    sb.assert_no_staging();
}
