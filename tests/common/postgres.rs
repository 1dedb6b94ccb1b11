//! A real, throwaway PostgreSQL for tests: one cluster per test process on
//! a temp dir and a free loopback port ([`Cluster::shared`]), and a fresh
//! database per test ([`Cluster::create_database`]). Tests that stop the
//! server start their own ([`Cluster::start`]).
//!
//! The server refuses to run as root: as root, every server command runs as
//! the `postgres` user (`runuser`). A watchdog process stops the cluster by
//! its PID and removes its directory once the test process is gone, so a
//! panicking or aborted test run leaves nothing behind; an owned cluster
//! is also stopped on drop.
//!
//! Set `CONTEXT_SERVICE_TEST_DATABASE=postgres` to make every [`TestServer`]
//! keep its metadata in a fresh database of the shared cluster.
//!
//! [`TestServer`]: super::TestServer

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use context_service::store::DatabaseUrl;

/// The variable that runs the API tests' services on PostgreSQL.
pub(crate) const TEST_DATABASE_ENV: &str = "CONTEXT_SERVICE_TEST_DATABASE";

/// Whether spawned services should use PostgreSQL (see the module doc).
pub(crate) fn requested() -> bool {
    match std::env::var(TEST_DATABASE_ENV) {
        Ok(v) if v == "postgres" => true,
        Ok(v) if v.is_empty() || v == "embedded" => false,
        Ok(v) => panic!("{TEST_DATABASE_ENV}={v:?}: expected postgres or embedded"),
        Err(_) => false,
    }
}

/// The shared cluster's database for services on `data_dir` (created on
/// first use).
pub(crate) fn database_for(data_dir: &Path) -> DatabaseUrl {
    static BY_DIR: Mutex<BTreeMap<PathBuf, DatabaseUrl>> = Mutex::new(BTreeMap::new());
    let mut map = BY_DIR
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    map.entry(data_dir.to_owned())
        .or_insert_with(|| Cluster::shared().create_database())
        .clone()
}

/// A running PostgreSQL cluster.
pub(crate) struct Cluster {
    /// Holds `data/`, the socket and the log; owned by the server's user.
    dir: PathBuf,
    port: u16,
    bin: PathBuf,
    /// Stop and remove it on drop (the shared one is left to the watchdog).
    owned: bool,
    /// fsync on (benchmarks); tests run without it.
    durable: bool,
    /// Serves TLS with `server.crt` / `server.key` in `dir`.
    tls: bool,
}

/// A throwaway CA and a server certificate it signed for `127.0.0.1` and
/// `localhost`: (CA certificate, server certificate, server key), in PEM.
pub(crate) fn test_certificates() -> (String, String, String) {
    let mut ca_params = rcgen::CertificateParams::new(Vec::<String>::new()).expect("CA params");
    ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    ca_params
        .distinguished_name
        .push(rcgen::DnType::CommonName, "context-service test CA");
    let ca_key = rcgen::KeyPair::generate().expect("CA key");
    let ca = rcgen::CertifiedIssuer::self_signed(ca_params, ca_key).expect("CA certificate");
    let server_params =
        rcgen::CertificateParams::new(vec!["127.0.0.1".to_owned(), "localhost".to_owned()])
            .expect("server params");
    let server_key = rcgen::KeyPair::generate().expect("server key");
    let server = server_params
        .signed_by(&server_key, &ca)
        .expect("server certificate");
    (ca.pem(), server.pem(), server_key.serialize_pem())
}

static SHARED: OnceLock<Cluster> = OnceLock::new();
static NEXT_DB: AtomicU64 = AtomicU64::new(0);

impl Cluster {
    /// The process's shared cluster, started on first use.
    pub(crate) fn shared() -> &'static Cluster {
        SHARED.get_or_init(|| {
            let mut c = Self::start();
            c.owned = false;
            c
        })
    }

    /// A new cluster of its own (stopped on drop).
    pub(crate) fn start() -> Cluster {
        Self::start_with(false, None)
    }

    /// A new cluster of its own that syncs its commits to disk, as a
    /// production server does (for benchmarks against the embedded store,
    /// which does too).
    pub(crate) fn start_durable() -> Cluster {
        Self::start_with(true, None)
    }

    /// A new cluster of its own that also serves TLS with the PEM
    /// `certificate` and `key` (see [`test_certificates`]).
    pub(crate) fn start_tls(certificate: &str, key: &str) -> Cluster {
        Self::start_with(false, Some((certificate, key)))
    }

    fn start_with(durable: bool, tls: Option<(&str, &str)>) -> Cluster {
        let bin = server_bin_dir();
        let dir = make_dir();
        let cluster = Cluster {
            dir,
            port: 0,
            bin,
            owned: true,
            durable,
            tls: tls.is_some(),
        };
        cluster.init();
        if let Some((certificate, key)) = tls {
            cluster.install_tls(certificate, key);
        }
        watchdog(&cluster.dir);
        let mut cluster = cluster;
        // A port found free can be taken before the server binds it: retry.
        let mut last = String::new();
        for _ in 0..5 {
            cluster.port = free_port();
            match cluster.pg_ctl_start() {
                Ok(()) => return cluster,
                Err(e) => last = e,
            }
        }
        panic!("PostgreSQL did not start: {last}");
    }

    /// `postgres://cs@127.0.0.1:<port>/<db>`.
    pub(crate) fn url(&self, db: &str) -> DatabaseUrl {
        format!("postgres://cs@127.0.0.1:{}/{db}", self.port)
            .parse()
            .expect("database URL")
    }

    /// A new, empty database; its URL.
    pub(crate) fn create_database(&self) -> DatabaseUrl {
        let n = NEXT_DB.fetch_add(1, Ordering::Relaxed);
        let name = format!("cs_test_{}_{n}", std::process::id());
        self.psql("postgres", &format!("CREATE DATABASE {name}"));
        self.url(&name)
    }

    /// Runs `sql` in database `db` with `psql`; its output (unaligned,
    /// tuples only). Panics on failure.
    pub(crate) fn psql(&self, db: &str, sql: &str) -> String {
        let own = self.bin.join("psql");
        let psql = if own.is_file() {
            own
        } else {
            PathBuf::from("psql")
        };
        let out = Command::new(psql)
            .args(["-X", "-q", "-A", "-t", "-v", "ON_ERROR_STOP=1"])
            .args(["-h", "127.0.0.1", "-p", &self.port.to_string(), "-U", "cs"])
            .args(["-d", db, "-c", sql])
            .output()
            .expect("running psql");
        assert!(
            out.status.success(),
            "psql {sql:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).trim().to_owned()
    }

    /// Stops the server (fast shutdown: connections are cut), by its PID.
    pub(crate) fn stop(&self) {
        let Some(pid) = self.postmaster_pid() else {
            return;
        };
        let _ = Command::new("kill")
            .args(["-INT", &pid.to_string()])
            .status();
        let deadline = Instant::now() + Duration::from_secs(30);
        while Path::new(&format!("/proc/{pid}")).exists() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Starts a stopped server again on the same port.
    pub(crate) fn restart(&self) {
        let mut last = String::new();
        // The old socket may linger for a moment after the stop.
        for _ in 0..20 {
            match self.pg_ctl_start() {
                Ok(()) => return,
                Err(e) => last = e,
            }
            std::thread::sleep(Duration::from_millis(250));
        }
        panic!("PostgreSQL did not start again: {last}");
    }

    fn postmaster_pid(&self) -> Option<u32> {
        let text = std::fs::read_to_string(self.dir.join("data/postmaster.pid")).ok()?;
        text.lines().next()?.trim().parse().ok()
    }

    fn init(&self) {
        let data = self.dir.join("data");
        let out = as_server_user(&self.bin.join("initdb"))
            .args(["-D", path(&data), "-A", "trust", "-U", "cs", "-E", "UTF8"])
            .args(["--no-sync", "--locale=C"])
            .stdout(Stdio::null())
            .output()
            .expect("running initdb");
        assert!(
            out.status.success(),
            "initdb: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// Writes the server's certificate and key where `pg_ctl_start` points
    /// the server, owned by its user (it refuses a key others can read).
    fn install_tls(&self, certificate: &str, key: &str) {
        use std::os::unix::fs::PermissionsExt;
        for (name, contents) in [("server.crt", certificate), ("server.key", key)] {
            let file = self.dir.join(name);
            std::fs::write(&file, contents).expect("writing TLS files");
            std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o600)).expect("chmod");
            give_to_server_user(&file);
        }
    }

    fn pg_ctl_start(&self) -> Result<(), String> {
        let mut options = format!(
            "-p {} -k {} -c listen_addresses=127.0.0.1 -c max_connections=400",
            self.port,
            path(&self.dir)
        );
        if self.tls {
            options.push_str(&format!(
                " -c ssl=on -c ssl_cert_file={} -c ssl_key_file={}",
                path(&self.dir.join("server.crt")),
                path(&self.dir.join("server.key"))
            ));
        }
        if !self.durable {
            // A throwaway cluster: nothing to keep across a power cut.
            options.push_str(" -c fsync=off -c synchronous_commit=off -c full_page_writes=off");
        }
        let out = as_server_user(&self.bin.join("pg_ctl"))
            .args(["-D", path(&self.dir.join("data"))])
            .args(["-o", &options, "-l", path(&self.dir.join("log"))])
            .args(["-w", "-t", "60", "start"])
            .stdout(Stdio::null())
            .output()
            .map_err(|e| format!("running pg_ctl: {e}"))?;
        if out.status.success() {
            return Ok(());
        }
        let log = std::fs::read_to_string(self.dir.join("log")).unwrap_or_default();
        let tail: Vec<&str> = log.lines().rev().take(5).collect();
        Err(format!(
            "pg_ctl start on port {}: {}; log: {}",
            self.port,
            String::from_utf8_lossy(&out.stderr).trim(),
            tail.join(" | ")
        ))
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        if self.owned {
            self.stop();
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

fn path(p: &Path) -> &str {
    p.to_str().expect("UTF-8 path")
}

fn is_root() -> bool {
    rustix::process::geteuid().is_root()
}

/// `program` run as the server's user: `postgres` when we are root.
fn as_server_user(program: &Path) -> Command {
    if is_root() {
        let mut c = Command::new("runuser");
        c.args(["-u", "postgres", "--"]).arg(program);
        c
    } else {
        Command::new(program)
    }
}

/// Where `initdb` and `pg_ctl` are: on `PATH`, else the newest of Debian's
/// `/usr/lib/postgresql/<major>/bin`.
fn server_bin_dir() -> PathBuf {
    if let Some(paths) = std::env::var_os("PATH") {
        for dir in std::env::split_paths(&paths) {
            if dir.join("initdb").is_file() && dir.join("pg_ctl").is_file() {
                return dir;
            }
        }
    }
    let mut found: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let major = e.file_name().to_str()?.parse().ok()?;
            let bin = e.path().join("bin");
            bin.join("initdb").is_file().then_some((major, bin))
        })
        .collect();
    found.sort();
    found.pop().map(|(_, bin)| bin).unwrap_or_else(|| {
        panic!("no PostgreSQL server (initdb): install the `postgresql` package (.ci/run does)")
    })
}

/// A new directory the server's user owns.
fn make_dir() -> PathBuf {
    let dir = tempfile::Builder::new()
        .prefix("cs-postgres-")
        .tempdir()
        .expect("tempdir")
        .keep();
    give_to_server_user(&dir);
    dir
}

/// Makes `file` the server's user's (`postgres`) when we are root.
fn give_to_server_user(file: &Path) {
    if is_root() {
        let status = Command::new("chown")
            .args(["postgres:postgres", path(file)])
            .status()
            .expect("chown");
        assert!(status.success(), "chown postgres {}", file.display());
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port()
}

/// Starts a process that waits for this one to exit, then stops the
/// cluster in `dir` by its PID and removes `dir`.
fn watchdog(dir: &Path) {
    // In the background of a shell we wait for: the watchdog is nobody's
    // child, so it outlives this process and leaves no zombie.
    let script = r#"(
        while kill -0 "$1" 2>/dev/null; do sleep 0.5; done
        pid=$(head -n 1 "$2/data/postmaster.pid" 2>/dev/null)
        if [ -n "$pid" ]; then
            kill -INT "$pid" 2>/dev/null
            i=0
            while kill -0 "$pid" 2>/dev/null && [ $i -lt 100 ]; do sleep 0.1; i=$((i+1)); done
            kill -KILL "$pid" 2>/dev/null
        fi
        rm -rf "$2"
    ) &"#;
    let status = Command::new("sh")
        .args(["-c", script, "cs-postgres-watchdog"])
        .arg(std::process::id().to_string())
        .arg(dir)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .expect("starting the PostgreSQL watchdog");
    assert!(
        status.success(),
        "starting the PostgreSQL watchdog: {status}"
    );
}
