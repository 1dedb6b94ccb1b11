//! The Dockerfile, checked statically (no Docker engine here; `.ci/run` also
//! lints it with hadolint): two stages, a dependency layer built from stub
//! sources that cargo accepts, only the build inputs copied, OCI labels, and
//! a distroless runtime running as a numeric non-root user.

use std::path::Path;
use std::process::Command;

const ROOT: &str = env!("CARGO_MANIFEST_DIR");

/// One instruction: keyword and arguments, continuation lines joined.
#[derive(Debug)]
struct Instruction {
    keyword: String,
    args: String,
}

fn instructions() -> Vec<Instruction> {
    let text = std::fs::read_to_string(Path::new(ROOT).join("Dockerfile")).expect("Dockerfile");
    let mut out = Vec::new();
    let mut current = String::new();
    for line in text.lines() {
        let line = line.trim();
        if line.starts_with('#') || (line.is_empty() && current.is_empty()) {
            continue;
        }
        match line.strip_suffix('\\') {
            Some(part) => {
                current.push_str(part);
                current.push(' ');
            }
            None => {
                current.push_str(line);
                let (keyword, args) = current.split_once(' ').unwrap_or((&current, ""));
                out.push(Instruction {
                    keyword: keyword.to_uppercase(),
                    args: args.split_whitespace().collect::<Vec<_>>().join(" "),
                });
                current.clear();
            }
        }
    }
    out
}

/// The instructions of each stage, split at `FROM`.
fn stages() -> Vec<Vec<Instruction>> {
    let mut stages: Vec<Vec<Instruction>> = Vec::new();
    for i in instructions() {
        if i.keyword == "FROM" {
            stages.push(Vec::new());
        }
        stages.last_mut().expect("FROM first").push(i);
    }
    stages
}

#[test]
fn build_stage_caches_dependencies_and_copies_only_build_inputs() {
    let stages = stages();
    assert_eq!(stages.len(), 2, "multi-stage: build and runtime");
    let build = &stages[0];
    assert!(build[0].args.ends_with(" AS build"), "{:?}", build[0]);
    let copies: Vec<&str> = build
        .iter()
        .filter(|i| i.keyword == "COPY" || i.keyword == "ADD")
        .map(|i| i.args.as_str())
        .collect();
    assert_eq!(
        copies,
        [
            "Cargo.toml Cargo.lock ./",
            "agent/Cargo.toml ./agent/",
            ".cargo ./.cargo",
            "src ./src",
            "agent/src ./agent/src"
        ]
    );
    // The dependency build comes between the manifest and the sources.
    let pos = |k: &str, a: &str| {
        build
            .iter()
            .position(|i| i.keyword == k && i.args.starts_with(a))
            .unwrap_or_else(|| panic!("no {k} {a}"))
    };
    let manifest = pos("COPY", "Cargo.toml");
    let sources = pos("COPY", "src");
    let deps = build
        .iter()
        .position(|i| i.keyword == "RUN" && i.args.contains("cargo build"))
        .expect("a cargo build");
    assert!(manifest < deps && deps < sources, "{build:#?}");
    assert!(build[sources + 1..]
        .iter()
        .any(|i| i.keyword == "RUN" && i.args.contains("cargo build --release --locked")));
    // The image's revision is compiled in (`context_service_build_info`),
    // under the name src/metrics.rs reads.
    assert!(build[sources + 1..]
        .iter()
        .any(|i| i.keyword == "ARG" && i.args.starts_with("REVISION")));
    let commit = format!(
        "{}=\"${{REVISION}}\" cargo build --release --locked",
        context_service::metrics::GIT_COMMIT_ENV
    );
    assert!(
        build
            .iter()
            .any(|i| i.keyword == "RUN" && i.args.contains(&commit)),
        "{build:#?}"
    );
}

/// The stub step, run for real on a copy of the manifest: cargo must accept
/// the stub tree (every target the manifest declares exists), or the
/// dependency layer would fail to build.
#[test]
fn stub_sources_satisfy_cargo() {
    let stages = stages();
    let run = stages[0]
        .iter()
        .find(|i| i.keyword == "RUN" && i.args.contains("cargo build"))
        .expect("dependency RUN");
    let setup: Vec<&str> = run
        .args
        .split("&&")
        .map(str::trim)
        .take_while(|c| !c.starts_with("cargo "))
        .collect();
    assert!(!setup.is_empty(), "{run:?}");
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("agent")).unwrap();
    for f in ["Cargo.toml", "Cargo.lock", "agent/Cargo.toml"] {
        std::fs::copy(Path::new(ROOT).join(f), dir.path().join(f)).unwrap();
    }
    let status = Command::new("sh")
        .arg("-ec")
        .arg(setup.join(" && "))
        .current_dir(dir.path())
        .status()
        .unwrap();
    assert!(status.success(), "{setup:?}");
    // `fetch` loads every target of the manifest without compiling.
    let out = Command::new(env!("CARGO"))
        .args(["fetch", "--locked", "--offline", "--target", "host-tuple"])
        .current_dir(dir.path())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "cargo refuses the stub tree: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn runtime_is_distroless_nonroot_with_oci_labels() {
    let stages = stages();
    let runtime = &stages[1];
    assert!(
        runtime[0].args.starts_with("gcr.io/distroless/") && runtime[0].args.ends_with(":nonroot"),
        "{:?}",
        runtime[0]
    );
    let user = runtime.iter().rfind(|i| i.keyword == "USER").expect("USER");
    let uid = user.args.split(':').next().unwrap_or_default();
    assert!(
        uid.parse::<u32>().is_ok_and(|u| u != 0),
        "numeric non-root uid (runAsNonRoot checks it): {user:?}"
    );
    let labels: String = runtime
        .iter()
        .filter(|i| i.keyword == "LABEL")
        .map(|i| i.args.clone())
        .collect::<Vec<_>>()
        .join(" ");
    for key in [
        "title",
        "description",
        "licenses",
        "version",
        "revision",
        "created",
    ] {
        assert!(
            labels.contains(&format!("org.opencontainers.image.{key}=")),
            "label {key}: {labels}"
        );
    }
    let copies: Vec<&str> = runtime
        .iter()
        .filter(|i| i.keyword == "COPY" || i.keyword == "ADD")
        .map(|i| i.args.as_str())
        .collect();
    assert_eq!(
        copies,
        ["--from=build /out/context-service /out/contextctl /out/context-agent-x86_64 /out/context-agent-aarch64 /usr/local/bin/"]
    );
    assert!(runtime
        .iter()
        .any(|i| i.keyword == "ENTRYPOINT" && i.args.contains("context-service")));
}
