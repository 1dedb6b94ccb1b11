//! Load test of the sandbox-pool API on the `local` backend.
//!
//! Starts the service on 127.0.0.1 with a fresh data dir and drives it over
//! real HTTP with tokio tasks:
//! 1. `POST /v1/sandbox-pools` latency (p50/p99) with 1 client and with 50
//!    concurrent clients (dedicated pools of one sandbox);
//! 2. time from create to `ready` (POST, then `GET ?wait=ready`) for a pool
//!    of 100 replicas, for each strategy.
//!
//! Run: `cargo bench --bench pools` (set `POOLS_BENCH_SCALE=0.2` for a
//! quick run).

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use context_service::auth::dev::DevIssuer;
use context_service::auth::Scope;
use context_service::config::ServeConfig;
use context_service::server::Server;
use serde_json::{json, Value};

struct Bench {
    base: String,
    token: String,
    http: reqwest::Client,
}

impl Bench {
    async fn create(&self, body: &Value) -> Duration {
        let start = Instant::now();
        let resp = self
            .http
            .post(format!("{}/v1/sandbox-pools", self.base))
            .bearer_auth(&self.token)
            .json(body)
            .send()
            .await
            .expect("POST");
        let status = resp.status();
        let _ = resp.bytes().await;
        assert_eq!(status.as_u16(), 201, "create failed");
        start.elapsed()
    }

    async fn wait_ready(&self, name: &str) -> Value {
        self.http
            .get(format!(
                "{}/v1/sandbox-pools/{name}?wait=ready&timeout=60s",
                self.base
            ))
            .bearer_auth(&self.token)
            .send()
            .await
            .expect("GET")
            .json()
            .await
            .expect("JSON")
    }

    async fn delete(&self, name: &str) {
        let resp = self
            .http
            .delete(format!("{}/v1/sandbox-pools/{name}", self.base))
            .bearer_auth(&self.token)
            .send()
            .await
            .expect("DELETE");
        assert_eq!(resp.status().as_u16(), 204);
    }
}

fn dedicated(name: &str, replicas: u32) -> Value {
    json!({"name": name, "replicas": replicas, "workspace": {"size": "1Gi", "accessMode": "ReadWriteOnce"}})
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let idx = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[idx.min(sorted.len() - 1)]
}

/// Prints percentiles of `samples`, and the request rate when `wall` (the
/// time the samples took together) is given.
fn report(label: &str, mut samples: Vec<Duration>, wall: Option<Duration>) {
    samples.sort();
    let ms = |d: Duration| d.as_secs_f64() * 1000.0;
    let rate = wall
        .map(|w| format!("  {:>7.1} req/s", samples.len() as f64 / w.as_secs_f64()))
        .unwrap_or_default();
    println!(
        "{label:<44} n={:<5} p50={:>8.2}ms p99={:>8.2}ms max={:>8.2}ms{rate}",
        samples.len(),
        ms(percentile(&samples, 0.50)),
        ms(percentile(&samples, 0.99)),
        ms(*samples.last().unwrap_or(&Duration::ZERO)),
    );
}

async fn run_clients(bench: &Arc<Bench>, clients: usize, per_client: usize, tag: &str) {
    let start = Instant::now();
    let mut tasks = Vec::new();
    for c in 0..clients {
        let bench = bench.clone();
        let tag = tag.to_owned();
        tasks.push(tokio::spawn(async move {
            let mut samples = Vec::with_capacity(per_client);
            for i in 0..per_client {
                samples.push(bench.create(&dedicated(&format!("{tag}-{c}-{i}"), 1)).await);
            }
            samples
        }));
    }
    let mut all = Vec::new();
    for t in tasks {
        all.extend(t.await.expect("client task"));
    }
    report(
        &format!("POST /v1/sandbox-pools, {clients} client(s)"),
        all,
        Some(start.elapsed()),
    );
}

#[tokio::main]
async fn main() {
    // `cargo bench` passes `--bench`; nothing else to parse.
    let scale: f64 = std::env::var("POOLS_BENCH_SCALE")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(1.0);
    let n = |base: usize| ((base as f64 * scale).ceil() as usize).max(1);

    let dir = tempfile::tempdir().expect("tempdir");
    let listen: SocketAddr = "127.0.0.1:0".parse().expect("addr");
    let mut config = ServeConfig::with_defaults(dir.path().to_owned(), listen);
    config.local_warm_pools = vec!["agents".into()];
    // One owner creates every pool here: measure throughput, not quotas.
    config.pool_replica_quota = 0;
    let server = Server::bind(&config).await.expect("server starts");
    let addr = server.local_addr().expect("addr");
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    let task = tokio::spawn(server.run(async move {
        let _ = rx.await;
    }));
    context_service::client::install_crypto_provider();
    let token = DevIssuer::load(dir.path())
        .expect("dev key")
        .mint(
            &config.token_policy(),
            "bench",
            &Scope::user_scopes(),
            Duration::from_secs(3600),
        )
        .expect("token");
    let bench = Arc::new(Bench {
        base: format!("http://{addr}"),
        token,
        http: reqwest::Client::builder()
            .pool_max_idle_per_host(64)
            .build()
            .expect("http client"),
    });
    println!("data dir: {} (local backend)", dir.path().display());

    // Warm-up: connections, page cache, directories.
    run_clients(&bench, 4, n(10), "warm").await;
    println!("---");
    run_clients(&bench, 1, n(300), "seq").await;
    run_clients(&bench, 50, n(20), "par").await;

    println!("---");
    let ctx = json!({"name": "bench-shared", "namespace": "default", "type": "workspace",
        "storage": {"backend": "pvc", "size": "10Gi", "accessMode": "ReadWriteMany"}});
    let resp = bench
        .http
        .post(format!("{}/v1/contexts", bench.base))
        .bearer_auth(&bench.token)
        .json(&ctx)
        .send()
        .await
        .expect("POST context");
    assert_eq!(resp.status().as_u16(), 201);
    let strategies: [(&str, Value); 4] = [
        ("dedicated", dedicated("big", 100)),
        (
            "shared",
            json!({"name": "big", "replicas": 100, "workspace": {"size": "1Gi", "accessMode": "ReadWriteMany"}}),
        ),
        (
            "existing",
            json!({"name": "big", "replicas": 100, "workspace": {"claimName": "context-bench-shared", "readOnly": true}}),
        ),
        (
            "warm",
            json!({"name": "big", "replicas": 100, "warmPoolRef": "agents"}),
        ),
    ];
    for (label, body) in strategies {
        let mut samples = Vec::new();
        for _ in 0..n(10) {
            let t0 = Instant::now();
            bench.create(&body).await;
            let pool = bench.wait_ready("big").await;
            assert_eq!(pool["status"], "ready", "{pool}");
            assert_eq!(pool["readyReplicas"], 100);
            samples.push(t0.elapsed());
            bench.delete("big").await;
        }
        report(
            &format!("create → ready, 100 replicas, {label}"),
            samples,
            None,
        );
    }

    let _ = tx.send(());
    let _ = tokio::time::timeout(Duration::from_secs(10), task).await;
}
