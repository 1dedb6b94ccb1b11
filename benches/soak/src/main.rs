//! A soak with faults on the scale-out stack (issue 37): two replicas on
//! PostgreSQL + SeaweedFS behind a round-robin balancer, under a mixed
//! goose load, while replica A is killed with `SIGKILL` and restarted,
//! PostgreSQL restarts and S3 is unreachable for 30 s; then the invariants,
//! from the stores themselves, and a one-screen summary.
//!
//! ```sh
//! benches/soak.sh [--users N] [--duration 10m]     # builds, then runs this
//! ```
//!
//! Exit status: 0 every invariant holds, 1 one does not (or the stack
//! failed), 2 a usage error.

mod balancer;
mod checks;
mod ledger;
mod load;
mod report;
mod stack;

use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, Context as _};
use goose::config::{GooseConfiguration, GooseDefault, GooseDefaultType as _};
use goose::GooseAttack;

use crate::ledger::Ledger;
use crate::stack::{Replica, Stack};

/// How long unnamed objects must be before the sweep deletes them
/// (`--blob-gc-grace`); short, so the sweep runs within the soak.
const GC_GRACE: Duration = Duration::from_secs(60);
/// How long after a fault its effects still count as the fault.
const SETTLE: Duration = Duration::from_secs(15);
/// The S3 outage.
const S3_OUTAGE: Duration = Duration::from_secs(30);
/// The service's inflated-size limit in the soak, and the bomb above it.
const INFLATED_MAX: u64 = 256 << 20;
const BOMB_BYTES: u64 = 300 << 20;

struct Args {
    users: usize,
    duration: Duration,
    repo: PathBuf,
    bin_dir: PathBuf,
    work: PathBuf,
    summary: Option<PathBuf>,
    keep: bool,
}

const USAGE: &str =
    "usage: context-service-soak [--users N] [--duration 10m|180s] [--bin-dir DIR] \
[--repo DIR] [--work-dir DIR] [--summary FILE] [--keep]";

fn parse_duration(s: &str) -> Option<Duration> {
    let (num, unit) = s.split_at(s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len()));
    let n: u64 = num.parse().ok()?;
    match unit {
        "" | "s" => Some(Duration::from_secs(n)),
        "m" => Some(Duration::from_secs(n * 60)),
        _ => None,
    }
}

fn args() -> Result<Args, String> {
    let exe = std::env::current_exe().map_err(|e| format!("current exe: {e}"))?;
    let mut a = Args {
        users: 50,
        duration: Duration::from_secs(600),
        repo: Path::new(env!("CARGO_MANIFEST_DIR")).join("../.."),
        bin_dir: exe.parent().map(Path::to_owned).unwrap_or_default(),
        work: std::env::temp_dir().join(format!("cs-soak-{}", std::process::id())),
        summary: None,
        keep: false,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        if flag == "--keep" {
            a.keep = true;
            continue;
        }
        let value = it.next().ok_or_else(|| format!("{flag} needs a value"))?;
        match flag.as_str() {
            "--users" => {
                a.users = value
                    .parse()
                    .ok()
                    .filter(|n| *n > 0)
                    .ok_or_else(|| format!("--users {value}: not a positive number"))?;
            }
            "--duration" => {
                a.duration = parse_duration(&value)
                    .filter(|d| *d >= Duration::from_secs(60))
                    .ok_or_else(|| {
                        format!("--duration {value}: expected e.g. 10m or 180s, at least 60 s")
                    })?;
            }
            "--bin-dir" => a.bin_dir = value.into(),
            "--repo" => a.repo = value.into(),
            "--work-dir" => a.work = value.into(),
            "--summary" => a.summary = Some(value.into()),
            other => return Err(format!("unknown flag {other}")),
        }
    }
    Ok(a)
}

#[tokio::main]
async fn main() -> ExitCode {
    let args = match args() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("context-service-soak: {e}\n{USAGE}");
            return ExitCode::from(2);
        }
    };
    match run(&args).await {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("context-service-soak: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// Mints a token for `sub` with replica A's development key.
fn mint(bin_dir: &Path, data_dir: &Path, sub: &str) -> anyhow::Result<String> {
    let out = Command::new(bin_dir.join("contextctl"))
        .args(["token", "mint", "--sub", sub, "--ttl", "6h", "--data-dir"])
        .arg(data_dir)
        .output()
        .context("running contextctl token mint")?;
    if !out.status.success() {
        bail!(
            "contextctl token mint: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_owned())
}

/// Copies the auth dir (signing and owner-scope keys): the replicas must
/// accept the same tokens and agree on owners.
fn share_auth(from: &Path, to: &Path) -> anyhow::Result<()> {
    let (src, dst) = (from.join("auth"), to.join("auth"));
    std::fs::create_dir_all(&dst)?;
    for entry in std::fs::read_dir(&src).with_context(|| format!("reading {}", src.display()))? {
        let entry = entry?;
        std::fs::copy(entry.path(), dst.join(entry.file_name()))?;
    }
    Ok(())
}

async fn run(args: &Args) -> anyhow::Result<bool> {
    std::fs::create_dir_all(&args.work)?;
    let work = args.work.canonicalize()?;
    eprintln!("soak: state and logs in {}", work.display());
    let stack = Arc::new(Stack::up(&args.repo, &work)?);
    let result = soak(args, &work, stack.clone()).await;
    stack.down();
    if !args.keep {
        for dir in ["replica-a", "replica-b"] {
            let _ = std::fs::remove_dir_all(work.join(dir));
        }
    }
    result
}

async fn soak(args: &Args, work: &Path, stack: Arc<Stack>) -> anyhow::Result<bool> {
    let extra: Vec<String> = [
        "--blob-gc-grace",
        &format!("{}s", GC_GRACE.as_secs()),
        // A small cache fills early: RSS reaches its plateau in the first
        // quarter, so growth after it means a leak.
        "--cache-bytes",
        &(64u64 << 20).to_string(),
        "--bundle-max-inflated-bytes",
        &INFLATED_MAX.to_string(),
        // Every client comes from 127.0.0.1 through the balancer.
        "--max-connections-per-ip",
        "1024",
    ]
    .iter()
    .map(|s| (*s).to_owned())
    .collect();
    let service = args.bin_dir.join("context-service");
    let mut a = Replica::new("A", &service, work, &stack, &extra)?;
    let mut b = Replica::new("B", &service, work, &stack, &extra)?;
    a.start().await?;
    share_auth(&a.data_dir, &b.data_dir)?;
    b.start().await?;
    let (a_addr, b_addr) = (a.addr, b.addr);
    let data_dirs = [a.data_dir.clone(), b.data_dir.clone()];
    let tokens = (0..args.users)
        .map(|i| mint(&args.bin_dir, &data_dirs[0], &format!("soak-{i}")))
        .collect::<anyhow::Result<Vec<_>>>()?;
    let lb = balancer::start(vec![a_addr, b_addr]).await?;
    eprintln!("soak: replicas A {a_addr}, B {b_addr}; balancer {lb}");
    load::prepare(BOMB_BYTES);

    let started = Instant::now();
    let ledger = Arc::new(Ledger::new(started));
    load::install(Arc::new(load::LoadCtx {
        ledger: ledger.clone(),
        tokens,
        replicas: [format!("http://{a_addr}"), format!("http://{b_addr}")],
        bomb_bytes: BOMB_BYTES,
    }));
    let replicas: stack::Replicas = Arc::new(tokio::sync::Mutex::new(vec![a, b]));
    let rss = Arc::new(Mutex::new(Vec::new()));
    let stop = Arc::new(AtomicBool::new(false));
    let sampler = tokio::spawn(stack::sample_rss(
        replicas.clone(),
        started,
        Duration::from_secs(5),
        rss.clone(),
        stop.clone(),
    ));
    let faults = tokio::spawn(stack::inject_faults(
        stack.clone(),
        replicas.clone(),
        started,
        args.duration,
        S3_OUTAGE,
    ));

    let mut attack = GooseAttack::initialize_with_config(GooseConfiguration::default())?;
    for s in load::scenarios()? {
        attack = attack.register_scenario(s);
    }
    let report_file = work.join("goose-report.html");
    let increase_rate = (args.users / 10).max(1).to_string();
    attack
        .set_default(GooseDefault::Host, format!("http://{lb}").as_str())?
        .set_default(GooseDefault::Users, args.users)?
        .set_default(GooseDefault::IncreaseRate, increase_rate.as_str())?
        .set_default(GooseDefault::RunTime, args.duration.as_secs() as usize)?
        // Uploads of 64 MiB on a loaded machine.
        .set_default(GooseDefault::Timeout, "180")?
        .set_default(GooseDefault::NoGzip, true)?
        .set_default(GooseDefault::NoTelnet, true)?
        .set_default(GooseDefault::NoPrintMetrics, true)?
        .set_default(
            GooseDefault::ReportFile,
            report_file.to_string_lossy().as_ref(),
        )?
        .execute()
        .await
        .context("the goose attack")?;
    let load_time = started.elapsed();
    eprintln!("soak: load done after {:.0} s", load_time.as_secs_f64());

    let windows = faults.await.context("the fault injector")??;
    // Every replica up again (A restarted) before the checks.
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let _ = sampler.await;
    let dirs: Vec<&Path> = data_dirs.iter().map(PathBuf::as_path).collect();
    let stores = checks::stores(
        &stack.database_url,
        &stack.blob_url,
        &dirs,
        GC_GRACE + Duration::from_secs(30),
    )
    .await?;
    for r in replicas.lock().await.iter_mut() {
        r.stop();
    }
    let entries = ledger.entries();
    let uploads = ledger.uploads();
    let rss = rss.lock().map(|r| r.clone()).unwrap_or_default();
    let run = report::Run {
        users: args.users,
        duration: load_time,
        settle: SETTLE,
        entries: &entries,
        faults: &windows,
        uploads: &uploads,
        rss: &rss,
        stores: &stores,
    };
    let (summary, ok) = run.summary();
    println!("{summary}");
    eprintln!("soak: goose's report: {}", report_file.display());
    if let Some(path) = &args.summary {
        std::fs::write(path, &summary).with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(ok)
}

#[cfg(test)]
mod tests {
    use super::parse_duration;
    use std::time::Duration;

    #[test]
    fn durations_are_seconds_or_minutes() {
        assert_eq!(parse_duration("180s"), Some(Duration::from_secs(180)));
        assert_eq!(parse_duration("90"), Some(Duration::from_secs(90)));
        assert_eq!(parse_duration("10m"), Some(Duration::from_secs(600)));
        assert_eq!(parse_duration("10h"), None);
        assert_eq!(parse_duration("m"), None);
    }
}
