//! The delivery, step for step as `src/delivery/deliver.sh` does it (same
//! layout, lock, references, views and messages), with the transfer done in
//! one pass ([`crate::receive`]).

use std::fs::{self, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};

use crate::args::{Request, Verify};
use crate::fail::{io_failure, Fail};
use crate::fsops::{chmod, free_bytes, lock, mkdir_p, remove_tree, writable};
use crate::receive::receive_and_extract;
use crate::scan::scan;

fn write_failed(what: impl Into<String>) -> Fail {
    Fail::new("write_failed", what)
}

/// Removes a staging dir that was not published, however the delivery
/// ends (short of SIGKILL: the next delivery removes what is left).
struct Staging(Option<PathBuf>);

impl Drop for Staging {
    fn drop(&mut self) {
        if let Some(p) = self.0.take() {
            let _ = remove_tree(&p);
        }
    }
}

/// Does `tree` match the revision's manifest? `Err(why)` when not, with
/// the entries scanned (`None`: the scan failed).
fn tree_matches(tree: &Path, req: &Request, verify: Verify) -> Result<(), (Option<u64>, String)> {
    match fs::symlink_metadata(tree) {
        Ok(m) if m.is_dir() => {}
        _ => return Err((None, "its tree is not a directory".into())),
    }
    let s = scan(tree, verify).map_err(|e| {
        eprintln!("context delivery: scanning {}: {e}", tree.display());
        (None, "the tree could not be scanned".to_owned())
    })?;
    let n = Some(s.count);
    if s.count != req.entries {
        return Err((
            n,
            format!(
                "it has {} entries, the revision has {}",
                s.count, req.entries
            ),
        ));
    }
    if s.names != req.names {
        return Err((n, "its paths or entry kinds differ".into()));
    }
    if s.modes != req.modes {
        return Err((n, "its file modes or sizes differ".into()));
    }
    if verify == Verify::Full && s.content != req.content {
        return Err((n, "the content of a file differs".into()));
    }
    Ok(())
}

/// Names in `dir` (none when it cannot be read).
fn names_in(dir: &Path) -> Vec<String> {
    fs::read_dir(dir)
        .map(|rd| {
            rd.filter_map(|e| e.ok())
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default()
}

fn exists(p: &Path) -> bool {
    fs::symlink_metadata(p).is_ok()
}

/// Delivers `req`; the final JSON line on success.
pub(crate) fn run(req: &Request) -> Result<String, Fail> {
    let root = Path::new(&req.root);
    let _ = mkdir_p(root);
    let is_dir = fs::metadata(root).is_ok_and(|m| m.is_dir());
    if !is_dir || !writable(root) {
        return Err(Fail::new(
            "bad_root",
            format!("cannot create or write the delivery root {}", req.root),
        ));
    }
    let _lock = lock(&root.join(".lock")).map_err(|e| {
        eprintln!("context delivery: locking: {e}");
        Fail::new("lock_failed", format!("cannot lock {}/.lock", req.root))
    })?;

    for d in ["cache", "refs", "runs"] {
        mkdir_p(&root.join(d)).map_err(|_| {
            write_failed(format!("cannot create the cache layout under {}", req.root))
        })?;
    }
    // Only a crashed delivery can have left staging dirs: live ones hold
    // the lock.
    let cache = root.join("cache");
    for name in names_in(&cache) {
        if name.starts_with(".staging.") {
            let stale = cache.join(&name);
            remove_tree(&stale).map_err(|_| {
                write_failed(format!(
                    "cannot remove the stale staging dir {}",
                    stale.display()
                ))
            })?;
        }
    }

    let key = format!("{}-{}", req.scope, req.revision);
    let cdir = cache.join(&key);
    let refs = root.join("refs");
    let reference = refs.join(&key).join(&req.workload).join(&req.run);
    let view = root
        .join("runs")
        .join(&req.scope)
        .join(&req.workload)
        .join(&req.run);

    // A run is registered once, with one revision.
    let prefix = format!("{}-", req.scope);
    for other in names_in(&refs) {
        if other.starts_with(&prefix)
            && other != key
            && exists(&refs.join(&other).join(&req.workload).join(&req.run))
        {
            return Err(Fail::new(
                "run_conflict",
                format!(
                    "run {} of workload {} is registered with another revision",
                    req.run, req.workload
                ),
            ));
        }
    }

    let mut cached = false;
    // Why the bytes are sent again where the sandbox held the revision: the
    // gateway logs it (the script's `RESEND` line, same words).
    let mut resend = None;
    match fs::symlink_metadata(&cdir) {
        Ok(m) if m.is_dir() => match tree_matches(&cdir.join("tree"), req, req.verify) {
            Ok(()) => cached = true,
            Err((_, why)) => {
                eprintln!(
                    "context delivery: cache dir {key} failed verification: {why}; delivering it again"
                );
                resend = Some(format!("the cache dir failed verification: {why}"));
                remove_tree(&cdir).map_err(|_| {
                    write_failed(format!("cannot remove the damaged cache dir {key}"))
                })?;
            }
        },
        Ok(_) => {
            resend = Some("the cache dir is not a directory".to_owned());
            remove_tree(&cdir)
                .map_err(|_| write_failed(format!("cannot remove the damaged cache dir {key}")))?
        }
        Err(_) => {}
    }

    let mut out = io::stdout().lock();
    if let Some(reason) = &resend {
        say(&mut out, &format!("RESEND {reason}"))?;
    }
    if cached {
        say(&mut out, "NEED 0")?;
    } else {
        // The tree needs about the inflated size; refuse before any byte
        // is sent when that cannot fit.
        if let Some(free) = free_bytes(root) {
            if free < req.inflated {
                return Err(Fail::new(
                    "disk_full",
                    format!(
                        "the delivery needs at least {} bytes, {free} are available under {}",
                        req.inflated, req.root
                    ),
                ));
            }
        }
        say(&mut out, &format!("NEED {}", req.size))?;
        drop(out);
        let staging_dir = cache.join(format!(".staging.{}", std::process::id()));
        let mut staging = Staging(None);
        fs::create_dir(&staging_dir).map_err(|_| write_failed("cannot create the staging dir"))?;
        staging.0 = Some(staging_dir.clone());
        let tree = staging_dir.join("tree");
        fs::create_dir(&tree).map_err(|_| write_failed("cannot create the staging dir"))?;
        let dirs = receive_and_extract(req, &tree)?;
        // Files were made read-only as they were written; the directories
        // now, innermost first.
        for d in dirs.iter().rev().chain([&tree]) {
            chmod(d, 0o555).map_err(|_| write_failed("cannot make the tree read-only"))?;
        }
        if let Err((scanned, why)) = tree_matches(&tree, req, Verify::Default) {
            let Some(n) = scanned else {
                return Err(write_failed("cannot scan the extracted tree"));
            };
            if n > req.entries {
                return Err(Fail::new(
                    "too_many_entries",
                    format!(
                        "the bundle has {n} entries, more than the recorded {}",
                        req.entries
                    ),
                ));
            }
            if n < req.entries {
                return Err(Fail::new(
                    "extract_failed",
                    format!("extracted {n} of {} entries", req.entries),
                ));
            }
            return Err(Fail::new(
                "extract_failed",
                format!("the extracted tree does not match the revision's manifest: {why}"),
            ));
        }
        chmod(&staging_dir, 0o555)
            .map_err(|_| write_failed("cannot make the cache dir read-only"))?;
        if exists(&cdir) {
            return Err(write_failed(format!(
                "{} appeared while the lock was held",
                cdir.display()
            )));
        }
        fs::rename(&staging_dir, &cdir).map_err(|e| {
            io_failure(&e, "publishing the cache dir", free_bytes(root));
            write_failed("cannot publish the cache dir")
        })?;
        staging.0 = None;
    }

    // --- register the run
    let made = mkdir_p(&refs.join(&key).join(&req.workload))
        .and_then(|()| mkdir_p(&root.join("runs").join(&req.scope).join(&req.workload)));
    made.map_err(|_| write_failed("cannot create the run's directories"))?;
    OpenOptions::new()
        .append(true)
        .create(true)
        .open(&reference)
        .map_err(|_| write_failed("cannot record the run's reference"))?;
    if exists(&view) {
        remove_tree(&view).map_err(|_| write_failed("cannot replace the run's view"))?;
    }
    symlink(format!("../../../cache/{key}/tree"), &view)
        .map_err(|_| write_failed("cannot create the run's view"))?;
    // A referenced revision is no longer a candidate for retention pruning.
    let idle = root.join("idle").join(&req.scope);
    let suffix = format!("-{}", req.revision);
    for marker in names_in(&idle) {
        if marker.ends_with(&suffix) {
            let _ = fs::remove_file(idle.join(marker));
        }
    }
    Ok(format!(
        "{{\"path\":\"{}\",\"revision\":\"{}\",\"cached\":{cached}}}",
        view.display(),
        req.revision
    ))
}

fn say(out: &mut impl Write, line: &str) -> Result<(), Fail> {
    writeln!(out, "{line}")
        .and_then(|()| out.flush())
        .map_err(|_| write_failed("cannot write to the gateway"))
}
