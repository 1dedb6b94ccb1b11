//! The delivery agent (`agent/`, crate `context-agent`) for tests: built
//! once per test process with cargo (a dev build for this host, in its own
//! target directory so the build never waits for the lock of the `cargo
//! test` that runs us), and laid out as an agent directory
//! (`context-agent-x86_64` or `-aarch64`, whichever this host is) for
//! `--delivery-agent-dir`. `CONTEXT_SERVICE_TEST_AGENT=<binary>` uses a
//! prebuilt agent instead (e.g. the static release build, to measure it).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use sha2::{Digest, Sha256};

/// The agent binary and the directory holding it under its arch name.
pub(crate) struct BuiltAgent {
    /// The binary cargo built.
    pub(crate) binary: PathBuf,
    /// A directory with `context-agent-<arch>` (a copy of `binary`).
    pub(crate) dir: PathBuf,
    /// This host's arch as the agent directory names it.
    pub(crate) arch: &'static str,
}

/// This host's architecture, as agents are named.
pub(crate) fn host_arch() -> &'static str {
    match std::env::consts::ARCH {
        "x86_64" => "x86_64",
        "aarch64" => "aarch64",
        other => panic!("no delivery agent is built for {other}"),
    }
}

fn target_dir() -> PathBuf {
    let base = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("target"));
    base.join("agent-tests")
}

/// The agent, built on first use.
pub(crate) fn agent() -> &'static BuiltAgent {
    static AGENT: OnceLock<BuiltAgent> = OnceLock::new();
    AGENT.get_or_init(|| {
        let target = target_dir();
        if let Some(prebuilt) = std::env::var_os("CONTEXT_SERVICE_TEST_AGENT") {
            return lay_out(PathBuf::from(prebuilt), &target);
        }
        let out = Command::new(env!("CARGO"))
            .args(["build", "--quiet", "-p", "context-agent", "--target-dir"])
            .arg(&target)
            .current_dir(env!("CARGO_MANIFEST_DIR"))
            .output()
            .expect("run cargo to build the delivery agent");
        assert!(
            out.status.success(),
            "building the delivery agent failed:\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        lay_out(target.join("debug/context-agent"), &target)
    })
}

/// The `aarch64` agent (static musl, a dev build; `rustup target add
/// aarch64-unknown-linux-musl`, linked with rust-lld by
/// `.cargo/config.toml`), built on first use.
pub(crate) fn aarch64_agent() -> &'static Path {
    static AGENT: OnceLock<PathBuf> = OnceLock::new();
    AGENT.get_or_init(|| {
        let target = target_dir();
        let out = Command::new(env!("CARGO"))
            .args(["build", "--quiet", "-p", "context-agent"])
            .args(["--target", "aarch64-unknown-linux-musl", "--target-dir"])
            .arg(&target)
            .current_dir(env!("CARGO_MANIFEST_DIR"))
            .output()
            .expect("run cargo to build the aarch64 agent");
        assert!(
            out.status.success(),
            "building the aarch64 agent failed (rustup target add aarch64-unknown-linux-musl):\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        target.join("aarch64-unknown-linux-musl/debug/context-agent")
    })
}

/// `binary` and an agent directory holding it under this host's arch.
fn lay_out(binary: PathBuf, target: &Path) -> BuiltAgent {
    let arch = host_arch();
    // Named by the binary's digest (a static is never dropped, so it
    // lives in the target dir, not in /tmp): test processes running at
    // once share it, and a rebuilt agent gets a new one.
    let bytes = std::fs::read(&binary).expect("read the agent");
    let sha = hex::encode(Sha256::digest(&bytes));
    let dir = target.join(format!("agent-dir-{}", &sha[..16]));
    if !dir.join(format!("context-agent-{arch}")).exists() {
        let tmp = target.join(format!(".agent-dir-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&tmp);
        std::fs::create_dir_all(&tmp).expect("agent dir");
        std::fs::write(tmp.join(format!("context-agent-{arch}")), &bytes).expect("copy the agent");
        // Another process may have won the race: its copy is the same.
        if std::fs::rename(&tmp, &dir).is_err() {
            let _ = std::fs::remove_dir_all(&tmp);
        }
    }
    BuiltAgent { binary, dir, arch }
}
