//! The scale-out stack under test: PostgreSQL and SeaweedFS from the
//! repo's scripts (tests/scale/), two `context-service serve` replicas on
//! them sharing the auth dir (signing and owner-scope keys), the faults the
//! soak injects, and an RSS sampler.

use std::collections::HashMap;
use std::net::{SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, Context as _};

/// Where the stack's pieces live.
pub(crate) struct Stack {
    repo: PathBuf,
    /// Environment for the scripts (their state dirs) and the replicas
    /// (`AWS_*` of the S3 server).
    env: HashMap<String, String>,
    pub(crate) database_url: String,
    pub(crate) blob_url: String,
}

impl Stack {
    /// Starts PostgreSQL and SeaweedFS with state under `work`.
    pub(crate) fn up(repo: &Path, work: &Path) -> anyhow::Result<Self> {
        let mut env = HashMap::new();
        env.insert(
            "CONTEXT_SERVICE_POSTGRES_STATE".to_owned(),
            work.join("postgres").display().to_string(),
        );
        env.insert(
            "CONTEXT_SERVICE_SEAWEEDFS_STATE".to_owned(),
            work.join("seaweedfs").display().to_string(),
        );
        // Deleted objects free their volume space only when SeaweedFS
        // vacuums: ten minutes of uploads fill its default 5 x 64 MiB.
        env.insert(
            "CONTEXT_SERVICE_SEAWEEDFS_VOLUMES".to_owned(),
            "100".to_owned(),
        );
        let mut stack = Self {
            repo: repo.to_owned(),
            env,
            database_url: String::new(),
            blob_url: String::new(),
        };
        stack.script("seaweedfs.sh", "build")?;
        stack.script("postgres.sh", "up")?;
        stack.database_url = stack.script("postgres.sh", "url")?.trim().to_owned();
        stack.script("seaweedfs.sh", "up")?;
        let exports = stack.script("seaweedfs.sh", "env")?;
        let mut bucket = String::new();
        for line in exports.lines() {
            let Some((k, v)) = line.trim_start_matches("export ").split_once('=') else {
                continue;
            };
            if k == "CONTEXT_SERVICE_TEST_S3_BUCKET" {
                bucket = v.to_owned();
            }
            if k.starts_with("AWS_") {
                stack.env.insert(k.to_owned(), v.to_owned());
                // This process reads the bucket too (checks.rs).
                std::env::set_var(k, v);
            }
        }
        if bucket.is_empty() {
            bail!("seaweedfs.sh env named no bucket:\n{exports}");
        }
        stack.blob_url = format!("s3://{bucket}/soak");
        Ok(stack)
    }

    /// Runs `tests/scale/<script> <verb>`; its stdout.
    pub(crate) fn script(&self, script: &str, verb: &str) -> anyhow::Result<String> {
        let path = self.repo.join("tests/scale").join(script);
        let out = Command::new(&path)
            .arg(verb)
            .envs(&self.env)
            .stdin(Stdio::null())
            .output()
            .with_context(|| format!("running {}", path.display()))?;
        if !out.status.success() {
            bail!(
                "{script} {verb} failed ({}): {}",
                out.status,
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// Stops everything the scripts started and removes their state.
    pub(crate) fn down(&self) {
        for (script, verb) in [("seaweedfs.sh", "down"), ("postgres.sh", "down")] {
            if let Err(e) = self.script(script, verb) {
                eprintln!("soak: {e}");
            }
        }
    }

    pub(crate) fn env(&self) -> &HashMap<String, String> {
        &self.env
    }
}

/// A free loopback port (bound, then released for the replica to take).
pub(crate) fn free_port() -> anyhow::Result<u16> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

/// One `context-service serve` replica on a fixed port, so it comes back
/// where the balancer looks for it after a kill.
pub(crate) struct Replica {
    pub(crate) name: &'static str,
    pub(crate) addr: SocketAddr,
    pub(crate) data_dir: PathBuf,
    binary: PathBuf,
    args: Vec<String>,
    env: HashMap<String, String>,
    log: PathBuf,
    child: Option<Child>,
}

impl Replica {
    pub(crate) fn new(
        name: &'static str,
        binary: &Path,
        work: &Path,
        stack: &Stack,
        extra: &[String],
    ) -> anyhow::Result<Self> {
        let addr: SocketAddr = ([127, 0, 0, 1], free_port()?).into();
        let data_dir = work.join(format!("replica-{name}"));
        let mut args: Vec<String> = vec![
            "serve".into(),
            "--listen".into(),
            addr.to_string(),
            "--data-dir".into(),
            data_dir.display().to_string(),
            "--database-url".into(),
            stack.database_url.clone(),
            "--blob-url".into(),
            stack.blob_url.clone(),
            "--log-format".into(),
            "json".into(),
        ];
        args.extend(extra.iter().cloned());
        Ok(Self {
            name,
            addr,
            log: work.join(format!("replica-{name}.log")),
            data_dir,
            binary: binary.to_owned(),
            args,
            env: stack.env().clone(),
            child: None,
        })
    }

    /// Starts it and waits until `/healthz` answers `200`.
    pub(crate) async fn start(&mut self) -> anyhow::Result<()> {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .with_context(|| format!("opening {}", self.log.display()))?;
        let child = Command::new(&self.binary)
            .args(&self.args)
            .envs(&self.env)
            .env("RUST_LOG", "warn")
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()
            .with_context(|| format!("starting {}", self.binary.display()))?;
        self.child = Some(child);
        let url = format!("http://{}/healthz", self.addr);
        let http = reqwest::Client::new();
        let deadline = Instant::now() + Duration::from_secs(90);
        loop {
            if let Some(child) = self.child.as_mut() {
                if let Some(status) = child.try_wait()? {
                    bail!(
                        "replica {} exited at start ({status}); see {}",
                        self.name,
                        self.log.display()
                    );
                }
            }
            if let Ok(r) = http.get(&url).send().await {
                if r.status().is_success() {
                    return Ok(());
                }
            }
            if Instant::now() > deadline {
                bail!("replica {} not healthy within 90 s", self.name);
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// `kill -9`, and reaps it.
    pub(crate) fn kill9(&mut self) -> anyhow::Result<()> {
        if let Some(mut child) = self.child.take() {
            child.kill()?;
            child.wait()?;
        }
        Ok(())
    }

    /// `SIGTERM` (a graceful stop) and waits up to 40 s, then `kill -9`.
    pub(crate) fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = Command::new("kill")
                .args(["-TERM", &child.id().to_string()])
                .status();
            let deadline = Instant::now() + Duration::from_secs(40);
            while Instant::now() < deadline {
                if let Ok(Some(_)) = child.try_wait() {
                    return;
                }
                std::thread::sleep(Duration::from_millis(100));
            }
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    pub(crate) fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }
}

impl Drop for Replica {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// A fault's window: from its injection until the component is back.
#[derive(Clone, Debug)]
pub(crate) struct FaultWindow {
    pub(crate) name: &'static str,
    pub(crate) start: Duration,
    pub(crate) end: Duration,
}

/// One RSS sample: seconds into the run, replica, pid, resident KiB.
#[derive(Clone, Debug)]
pub(crate) struct RssSample {
    pub(crate) at: Duration,
    pub(crate) replica: &'static str,
    pub(crate) pid: u32,
    pub(crate) kib: u64,
}

/// `VmRSS` of `pid` in KiB.
pub(crate) fn rss_kib(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
}

/// The replicas, shared by the fault injector and the sampler.
pub(crate) type Replicas = Arc<tokio::sync::Mutex<Vec<Replica>>>;

/// Samples both replicas' RSS every `every` until `stop` is set.
pub(crate) async fn sample_rss(
    replicas: Replicas,
    started: Instant,
    every: Duration,
    out: Arc<Mutex<Vec<RssSample>>>,
    stop: Arc<std::sync::atomic::AtomicBool>,
) {
    while !stop.load(std::sync::atomic::Ordering::Relaxed) {
        let pids: Vec<(&'static str, Option<u32>)> = replicas
            .lock()
            .await
            .iter()
            .map(|r| (r.name, r.pid()))
            .collect();
        for (replica, pid) in pids {
            if let Some((pid, kib)) = pid.and_then(|p| rss_kib(p).map(|k| (p, k))) {
                let sample = RssSample {
                    at: started.elapsed(),
                    replica,
                    pid,
                    kib,
                };
                out.lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner)
                    .push(sample);
            }
        }
        tokio::time::sleep(every).await;
    }
}

/// Injects the three faults at their share of `duration`: `kill -9` of
/// replica A (index 0) and its restart at 15%, a PostgreSQL restart at
/// 35%, SeaweedFS stopped for 30 s at 50%. Returns the windows.
pub(crate) async fn inject_faults(
    stack: Arc<Stack>,
    replicas: Replicas,
    started: Instant,
    duration: Duration,
    s3_outage: Duration,
) -> anyhow::Result<Vec<FaultWindow>> {
    let at = |share: f64| started + duration.mul_f64(share);
    let mut windows = Vec::new();

    tokio::time::sleep_until(at(0.15).into()).await;
    let start = started.elapsed();
    eprintln!(
        "soak: fault: kill -9 replica A at {:.0} s",
        start.as_secs_f64()
    );
    {
        let mut reps = replicas.lock().await;
        reps[0].kill9()?;
    }
    // Down for a moment, as a crash-looping pod would be, then back.
    tokio::time::sleep(Duration::from_secs(3)).await;
    {
        let mut reps = replicas.lock().await;
        reps[0].start().await?;
    }
    windows.push(FaultWindow {
        name: "kill-A",
        start,
        end: started.elapsed(),
    });

    tokio::time::sleep_until(at(0.35).into()).await;
    let start = started.elapsed();
    eprintln!(
        "soak: fault: PostgreSQL restart at {:.0} s",
        start.as_secs_f64()
    );
    let s = stack.clone();
    tokio::task::spawn_blocking(move || s.script("postgres.sh", "restart")).await??;
    windows.push(FaultWindow {
        name: "pg-restart",
        start,
        end: started.elapsed(),
    });

    tokio::time::sleep_until(at(0.50).into()).await;
    let start = started.elapsed();
    eprintln!(
        "soak: fault: S3 unreachable for {} s at {:.0} s",
        s3_outage.as_secs(),
        start.as_secs_f64()
    );
    let s = stack.clone();
    tokio::task::spawn_blocking(move || s.script("seaweedfs.sh", "stop")).await??;
    tokio::time::sleep(s3_outage).await;
    let s = stack.clone();
    tokio::task::spawn_blocking(move || s.script("seaweedfs.sh", "up")).await??;
    windows.push(FaultWindow {
        name: "s3-down",
        start,
        end: started.elapsed(),
    });
    Ok(windows)
}
