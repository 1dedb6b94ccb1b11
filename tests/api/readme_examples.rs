//! The docs' shell examples, run: every fenced `sh` block of README.md or a
//! page under `docs/` that follows a `<!-- tested ... -->` line runs under
//! `bash -e` against a local service, with the built `contextctl` first on
//! `PATH`, so the docs cannot drift from the CLI. A block marked
//! `<!-- tested, same shell -->` continues the one before it, in the same
//! shell (its variables and working directory), as in a reader's terminal.
//! The `#> ` lines of a block show what its commands print, and are
//! compared with it (`shown`). Also: every relative link between the pages
//! resolves, to a file and a heading.

mod shown;

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::common::TestServer;

/// The documentation pages, in the order their examples run: README.md,
/// then every `docs/*.md` by name (later pages reuse no state of earlier
/// ones but the running service). Also read by the other tests that run a
/// marked block (`scale_out`).
pub(crate) fn doc_pages() -> Vec<(PathBuf, String)> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut paths: Vec<PathBuf> = std::fs::read_dir(root.join("docs"))
        .expect("docs/")
        .map(|e| e.expect("a docs/ entry").path())
        .filter(|p| p.extension().is_some_and(|x| x == "md"))
        .collect();
    paths.sort();
    paths.insert(0, root.join("README.md"));
    paths
        .into_iter()
        .map(|p| {
            let text =
                std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
            (p, text)
        })
        .collect()
}

/// The `sh` block after the first line of any doc page that starts with
/// `marker` (e.g. `<!-- scale-out:`).
pub(crate) fn marked_block(marker: &str) -> String {
    for (_, text) in doc_pages() {
        let mut lines = text.lines();
        if lines.by_ref().any(|l| l.starts_with(marker)) {
            assert_eq!(
                lines.next(),
                Some("```sh"),
                "{marker} must precede a ```sh block"
            );
            return lines
                .take_while(|l| *l != "```")
                .collect::<Vec<_>>()
                .join("\n");
        }
    }
    panic!("no doc page has the marker {marker:?}");
}

/// The blocks marked as tested, in page order; a `same shell` block is
/// joined to the one before it.
fn tested_blocks(readme: &str) -> Vec<String> {
    let mut blocks: Vec<String> = Vec::new();
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
        let body = lines
            .by_ref()
            .take_while(|l| *l != "```")
            .collect::<Vec<_>>()
            .join("\n");
        match blocks.last_mut() {
            Some(before) if line.starts_with("<!-- tested, same shell") => {
                before.push('\n');
                before.push_str(&body);
            }
            None if line.starts_with("<!-- tested, same shell") => {
                panic!("a `same shell` block continues no block:\n{body}")
            }
            _ => blocks.push(body),
        }
    }
    blocks
}

/// The directory the examples start in, as a reader's is: the repository's
/// (`target/release` holds the built `contextctl`, `data` is the service's
/// data dir), with the files the pages under `docs/` name (`./src`,
/// `./my-workload`; the README tour makes its own) and a `tmp` for
/// `mktemp`.
fn workdir(dir: &Path, bin_dir: &Path, data_dir: &Path) {
    for sub in ["src", "my-workload"] {
        std::fs::create_dir_all(dir.join(sub).join("docs")).unwrap();
        std::fs::write(dir.join(sub).join("docs/guide.md"), "guide\n").unwrap();
        std::fs::write(dir.join(sub).join("README.md"), "# example\n").unwrap();
    }
    std::fs::create_dir_all(dir.join("target")).unwrap();
    std::os::unix::fs::symlink(bin_dir, dir.join("target/release")).unwrap();
    std::os::unix::fs::symlink(data_dir, dir.join("data")).unwrap();
    std::fs::create_dir(dir.join("tmp")).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readme_examples_run() {
    let mut blocks = Vec::new();
    let mut marked = 0;
    for (path, text) in doc_pages() {
        let found = tested_blocks(&text);
        let here = text
            .lines()
            .filter(|l| l.starts_with("<!-- tested"))
            .count();
        eprintln!(
            "{}: {here} tested blocks, {} shells",
            path.display(),
            found.len()
        );
        marked += here;
        let readme = path.ends_with("README.md");
        blocks.extend(found.into_iter().map(|b| (readme, b)));
    }
    // At least as many as README.md held before the pages under docs/ took
    // most of them: moving a block must not drop it.
    assert!(marked >= 6, "found {marked} tested blocks");
    let commands = blocks
        .iter()
        .flat_map(|(_, b)| b.lines())
        .filter(|l| l.trim_start().starts_with("contextctl "))
        .count();
    eprintln!("{marked} tested blocks, {commands} contextctl examples");
    assert!(commands >= 39, "only {commands} contextctl examples");

    // The warm pool the pool examples claim from.
    let server =
        TestServer::start_with(|c| c.local_warm_pools = vec!["research-agents".into()]).await;
    let work = tempfile::tempdir().unwrap();
    let bin_dir = Path::new(env!("CARGO_BIN_EXE_contextctl"))
        .parent()
        .expect("bin dir");
    workdir(work.path(), bin_dir, &server.data_dir);
    let blocks: Vec<(bool, shown::Checked)> = blocks
        .iter()
        .map(|(readme, b)| (*readme, shown::Checked::new(b)))
        .collect();
    // The README tour shows what it prints: taking the `#>` lines out
    // would silently stop checking it.
    let shown_lines: usize = blocks.iter().map(|(_, b)| b.shown_lines()).sum();
    assert!(
        shown_lines >= 40,
        "only {shown_lines} lines of shown output"
    );
    let system_path = std::env::var("PATH").unwrap_or_default();
    let path = format!("{}:{system_path}", bin_dir.display());
    for (readme, block) in blocks {
        // The README tour puts `target/release` on `PATH` itself, as its
        // reader does: that line is tested too.
        let path = if readme { &system_path } else { &path };
        let out = tokio::process::Command::from({
            let mut cmd = Command::new("bash");
            cmd.arg("-ec")
                .arg(&block.script)
                .current_dir(work.path())
                .env("TMPDIR", work.path().join("tmp"))
                .env("PATH", path)
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
            "doc block failed ({}):\n{}\n--- stdout\n{}\n--- stderr\n{}",
            out.status,
            block.script,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        if let Err(diff) = block.verify(&String::from_utf8_lossy(&out.stdout)) {
            panic!("a doc block's shown output is wrong: {diff}");
        }
    }
}

/// The anchors GitHub gives a page's headings: lowercase, punctuation
/// dropped but `-` and `_`, spaces to `-`; a repeated heading gets `-1`, `-2`...
fn anchors(page: &str) -> Vec<String> {
    let mut seen: Vec<String> = Vec::new();
    let mut fenced = false;
    for line in page.lines() {
        if line.starts_with("```") {
            fenced = !fenced;
        }
        let Some(heading) = line.strip_prefix('#') else {
            continue;
        };
        if fenced {
            continue;
        }
        let Some(text) = heading.trim_start_matches('#').strip_prefix(' ') else {
            continue;
        };
        let slug: String = text
            .trim()
            .to_lowercase()
            .chars()
            .filter(|c| c.is_alphanumeric() || matches!(c, '-' | '_' | ' '))
            .map(|c| if c == ' ' { '-' } else { c })
            .collect();
        let n = seen.iter().filter(|s| **s == slug).count();
        seen.push(if n == 0 { slug } else { format!("{slug}-{n}") });
    }
    seen
}

/// Every relative link of README.md, ARCHITECTURE.md and `docs/*.md` names a
/// file that exists and, with `#anchor`, a heading of it: what moved between
/// the pages keeps its links.
#[test]
fn doc_links_resolve() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut pages = doc_pages();
    let architecture = root.join("ARCHITECTURE.md");
    let text = std::fs::read_to_string(&architecture).expect("ARCHITECTURE.md");
    pages.push((architecture, text));
    let mut checked = 0;
    let mut broken = Vec::new();
    for (path, text) in &pages {
        let dir = path.parent().expect("a page's directory");
        for (at, _) in text.match_indices("](") {
            let rest = &text[at + 2..];
            let Some(end) = rest.find(')') else { continue };
            let link = &rest[..end];
            if link.contains("://") || link.contains(' ') {
                continue;
            }
            let (file, anchor) = link.split_once('#').unwrap_or((link, ""));
            let target = if file.is_empty() {
                path.clone()
            } else {
                dir.join(file)
            };
            checked += 1;
            if !target.exists() {
                broken.push(format!("{}: {link} (no such file)", path.display()));
                continue;
            }
            if anchor.is_empty() || target.extension().is_none_or(|x| x != "md") {
                continue;
            }
            let page = std::fs::read_to_string(&target).expect("a linked page");
            if !anchors(&page).iter().any(|a| a == anchor) {
                broken.push(format!("{}: {link} (no such heading)", path.display()));
            }
        }
    }
    assert!(checked >= 30, "only {checked} links found");
    assert!(broken.is_empty(), "broken links:\n{}", broken.join("\n"));
}
