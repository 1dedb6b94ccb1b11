//! Workload round trips with metadata on PostgreSQL versus the embedded
//! store, on the same machine.
//!
//! For each store, starts the service on 127.0.0.1 (fresh data dir; for
//! PostgreSQL a throwaway cluster on loopback, `tests/common/postgres.rs`)
//! and times one round trip over real HTTP: create a workload, upload a
//! bundle (PUT, 32 small files), activate it, download it. Prints p50/p99
//! of each store, with 1 and with 8 concurrent clients, and the ratio
//! PostgreSQL / embedded.
//!
//! Run: `cargo bench --bench metadata_store` (`METADATA_BENCH_SCALE=0.2` for
//! a quick run). Needs the `postgresql` package (as the tests do).

#[allow(dead_code)]
#[path = "../tests/common/postgres.rs"]
mod postgres;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use context_service::auth::dev::DevIssuer;
use context_service::auth::Scope;
use context_service::config::ServeConfig;
use context_service::server::Server;
use context_service::store::DatabaseUrl;
use flate2::write::GzEncoder;
use serde_json::{json, Value};

const MEDIA: &str = "application/vnd.rossoctl.context";

struct Bench {
    base: String,
    token: String,
    http: reqwest::Client,
}

impl Bench {
    /// One round trip on workload `name`; its duration.
    async fn round_trip(&self, name: &str, bundle: &[u8]) -> Duration {
        let start = Instant::now();
        let resp = self
            .http
            .post(format!("{}/v1/workloads", self.base))
            .bearer_auth(&self.token)
            .json(&json!({ "name": name }))
            .send()
            .await
            .expect("create");
        assert_eq!(
            resp.status().as_u16(),
            201,
            "create: {:?}",
            resp.text().await
        );
        let resp = self
            .http
            .put(format!("{}/v1/workloads/{name}/bundle", self.base))
            .bearer_auth(&self.token)
            .header("content-type", MEDIA)
            .body(bundle.to_vec())
            .send()
            .await
            .expect("upload");
        assert_eq!(resp.status().as_u16(), 201, "upload");
        let revision: Value = resp.json().await.expect("revision");
        let revision = revision["revision"].as_str().expect("revision").to_owned();
        let resp = self
            .http
            .post(format!("{}/v1/workloads/{name}/activate", self.base))
            .bearer_auth(&self.token)
            .json(&json!({ "revision": revision }))
            .send()
            .await
            .expect("activate");
        assert_eq!(resp.status().as_u16(), 200, "activate");
        let _ = resp.bytes().await;
        let resp = self
            .http
            .get(format!(
                "{}/v1/workloads/{name}/revisions/{revision}/bundle",
                self.base
            ))
            .bearer_auth(&self.token)
            .send()
            .await
            .expect("download");
        assert_eq!(resp.status().as_u16(), 200, "download");
        let body = resp.bytes().await.expect("bundle bytes");
        assert!(!body.is_empty());
        start.elapsed()
    }
}

fn bundle() -> Vec<u8> {
    let mut builder = tar::Builder::new(GzEncoder::new(Vec::new(), flate2::Compression::fast()));
    for i in 0..32 {
        let data = format!("file {i}\n").repeat(64);
        let mut header = tar::Header::new_gnu();
        header.set_size(data.len() as u64);
        header.set_mode(0o644);
        header.set_entry_type(tar::EntryType::Regular);
        header.set_mtime(1_700_000_000);
        builder
            .append_data(&mut header, format!("docs/{i}.md"), data.as_bytes())
            .expect("tar");
    }
    builder.into_inner().expect("tar").finish().expect("gzip")
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let idx = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[idx.min(sorted.len() - 1)]
}

/// p50 and p99 of `samples`, printed under `label`.
fn report(label: &str, mut samples: Vec<Duration>, wall: Duration) -> (Duration, Duration) {
    samples.sort();
    let (p50, p99) = (percentile(&samples, 0.50), percentile(&samples, 0.99));
    let ms = |d: Duration| d.as_secs_f64() * 1000.0;
    println!(
        "{label:<40} n={:<4} p50={:>7.2}ms p99={:>7.2}ms  {:>6.1} round trips/s",
        samples.len(),
        ms(p50),
        ms(p99),
        samples.len() as f64 / wall.as_secs_f64()
    );
    (p50, p99)
}

/// Runs `clients` clients of `per_client` round trips each on a fresh
/// service; (p50, p99).
async fn measure(
    label: &str,
    database: Option<DatabaseUrl>,
    clients: usize,
    per_client: usize,
) -> (Duration, Duration) {
    let dir = tempfile::tempdir().expect("tempdir");
    let listen: SocketAddr = "127.0.0.1:0".parse().expect("addr");
    let mut config = ServeConfig::with_defaults(dir.path().to_owned(), listen);
    config.database_url = database;
    config.workload_quota = 100_000;
    // Every client uploads as the one bench owner.
    config.upload_max_per_owner = 16;
    config.shutdown_grace = Duration::ZERO;
    let server = Server::bind(&config).await.expect("server starts");
    let addr = server.local_addr().expect("addr");
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    let task = tokio::spawn(server.run(async move {
        let _ = rx.await;
    }));
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
    let bundle = Arc::new(bundle());
    // Warm-up: connections, caches.
    for i in 0..3 {
        bench.round_trip(&format!("warm-{i}"), &bundle).await;
    }
    let start = Instant::now();
    let tasks: Vec<_> = (0..clients)
        .map(|c| {
            let (bench, bundle) = (bench.clone(), bundle.clone());
            tokio::spawn(async move {
                let mut samples = Vec::with_capacity(per_client);
                for i in 0..per_client {
                    samples.push(bench.round_trip(&format!("w-{c}-{i}"), &bundle).await);
                }
                samples
            })
        })
        .collect();
    let mut samples = Vec::new();
    for t in tasks {
        samples.extend(t.await.expect("client"));
    }
    let result = report(label, samples, start.elapsed());
    let _ = tx.send(());
    let _ = tokio::time::timeout(Duration::from_secs(10), task).await;
    result
}

#[tokio::main]
async fn main() {
    let scale: f64 = std::env::var("METADATA_BENCH_SCALE")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(1.0);
    let n = |base: usize| ((base as f64 * scale).ceil() as usize).max(1);
    context_service::client::install_crypto_provider();
    // fsync on, like the embedded store.
    let cluster = postgres::Cluster::start_durable();
    println!("round trip = create + upload (32 files) + activate + download");
    for (clients, per_client) in [(1, n(200)), (8, n(40))] {
        let embedded = measure(
            &format!("embedded (redb), {clients} client(s)"),
            None,
            clients,
            per_client,
        )
        .await;
        let pg = measure(
            &format!("PostgreSQL, {clients} client(s)"),
            Some(cluster.create_database()),
            clients,
            per_client,
        )
        .await;
        let ratio = |a: Duration, b: Duration| a.as_secs_f64() / b.as_secs_f64();
        println!(
            "ratio PostgreSQL / embedded, {clients} client(s): p50 {:.2}x  p99 {:.2}x",
            ratio(pg.0, embedded.0),
            ratio(pg.1, embedded.1)
        );
    }
}
