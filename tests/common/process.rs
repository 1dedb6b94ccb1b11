//! A real `context-service serve` child process with JSON logs on stderr,
//! for tests that signal or kill it (shutdown, crash recovery).

use std::io::{BufRead as _, BufReader};
use std::net::SocketAddr;
use std::path::Path;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rustix::process::{kill_process, Pid, Signal};
use serde_json::Value;

/// A `context-service serve` child with JSON logs on stderr.
pub(crate) struct Process {
    pub(crate) child: Child,
    pub(crate) addr: SocketAddr,
    /// Every stderr line so far.
    lines: Arc<Mutex<Vec<String>>>,
    /// The thread reading stderr; it ends at EOF, once the process is gone.
    reader: Option<std::thread::JoinHandle<()>>,
}

impl Process {
    /// Starts the binary on `data_dir` with `args` and waits for its
    /// "listening" line.
    pub(crate) fn start(data_dir: &Path, args: &[&str]) -> Self {
        Self::spawn(Self::command(data_dir, args))
    }

    /// [`Process::start`] with its open-file limit (soft and hard, so the
    /// service cannot raise it) set to `nofile`.
    pub(crate) fn start_with_open_file_limit(data_dir: &Path, args: &[&str], nofile: u64) -> Self {
        use std::os::unix::process::CommandExt as _;
        let mut command = Self::command(data_dir, args);
        // SAFETY: the closure makes one system call (`setrlimit`), which
        // is async-signal-safe, and touches no memory shared with the
        // parent.
        unsafe {
            command.pre_exec(move || {
                let limit = rustix::process::Rlimit {
                    current: Some(nofile),
                    maximum: Some(nofile),
                };
                rustix::process::setrlimit(rustix::process::Resource::Nofile, limit)
                    .map_err(std::io::Error::from)
            });
        }
        Self::spawn(command)
    }

    fn command(data_dir: &Path, args: &[&str]) -> Command {
        let mut command = Command::new(env!("CARGO_BIN_EXE_context-service"));
        command
            .args(["serve", "--listen", "127.0.0.1:0", "--log-format", "json"])
            .arg("--data-dir")
            .arg(data_dir)
            .args(args)
            .env("RUST_LOG", "info")
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        command
    }

    fn spawn(mut command: Command) -> Self {
        let mut child = command.spawn().expect("context-service starts");
        let stderr = child.stderr.take().expect("stderr");
        let lines = Arc::new(Mutex::new(Vec::new()));
        let (tx, rx) = std::sync::mpsc::channel();
        let sink = lines.clone();
        let reader = std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                let _ = tx.send(line.clone());
                sink.lock().unwrap().push(line);
            }
        });
        let deadline = Instant::now() + Duration::from_secs(60);
        let addr = loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let line = rx.recv_timeout(left).unwrap_or_else(|e| {
                panic!(
                    "no `listening` line: {e}; stderr: {:?}",
                    lines.lock().unwrap()
                )
            });
            let Ok(log) = serde_json::from_str::<Value>(&line) else {
                continue;
            };
            if log["fields"]["message"] == "listening" {
                break log["fields"]["addr"]
                    .as_str()
                    .expect("addr")
                    .parse()
                    .expect("a socket address");
            }
        };
        Self {
            child,
            addr,
            lines,
            reader: Some(reader),
        }
    }

    pub(crate) fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    /// `GET path` with `token` on a connection of its own; the JSON body.
    pub(crate) async fn get_json(&self, path: &str, token: &str) -> Value {
        let resp = fresh_client()
            .get(self.url(path))
            .bearer_auth(token)
            .send()
            .await
            .unwrap_or_else(|e| panic!("GET {path}: {e}"));
        resp.json()
            .await
            .unwrap_or_else(|e| panic!("GET {path}: not JSON: {e}"))
    }

    pub(crate) fn signal(&self, signal: Signal) {
        let pid = Pid::from_raw(i32::try_from(self.child.id()).unwrap()).unwrap();
        kill_process(pid, signal).unwrap();
    }

    /// Waits up to `limit` for the process to exit.
    pub(crate) fn wait(&mut self, limit: Duration) -> ExitStatus {
        let deadline = Instant::now() + limit;
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                // The last lines may still be in the pipe: read them all.
                if let Some(reader) = self.reader.take() {
                    reader.join().expect("stderr reader");
                }
                return status;
            }
            assert!(Instant::now() < deadline, "still running after {limit:?}");
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    pub(crate) fn logs(&self) -> Vec<String> {
        self.lines.lock().unwrap().clone()
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A client that opens a new connection for every request (a process that
/// is stopped and started again answers on a new port, or not at all).
pub(crate) fn fresh_client() -> reqwest::Client {
    context_service::client::install_crypto_provider();
    reqwest::Client::builder()
        .pool_max_idle_per_host(0)
        .build()
        .expect("client")
}
