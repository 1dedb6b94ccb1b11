//! `bench_pools`, run by `benches/k8s_pools.sh`: the `kube` backend through
//! the HTTP API against the test control plane, every row repeated
//! `BENCH_REPS` times (default 3), each repetition in a fresh namespace
//! with a fresh service.
//!
//! Besides the client's view (POST latency, POST → `?wait=ready`
//! answered), the bench watches the members itself from before the POST
//! and records when each was first seen `Ready=True`: the *wake lag* is
//! the `?wait=ready` answer minus the moment the last member was seen
//! ready, i.e. what the long poll adds over watching the API directly
//! (`lastTransitionTime` has one-second resolution, too coarse for this).
//! Negative when the service answers first: a direct member is ready when
//! its pod is, before the controller writes `Ready=True` on the Sandbox.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use futures::StreamExt as _;
use kube::api::{ApiResource, DynamicObject};
use kube::runtime::watcher;

use super::*;

/// Repetitions of every row.
fn reps() -> usize {
    std::env::var("BENCH_REPS")
        .ok()
        .and_then(|v| v.parse().ok())
        .filter(|n| *n > 0)
        .unwrap_or(3)
}

/// The strategies to run: `BENCH_STRATEGIES` (comma-separated), else all.
fn strategies() -> Vec<&'static str> {
    let all = ["warm", "shared", "dedicated"];
    match std::env::var("BENCH_STRATEGIES") {
        Ok(list) => all
            .into_iter()
            .filter(|s| list.split(',').any(|asked| asked.trim() == *s))
            .collect(),
        Err(_) => all.to_vec(),
    }
}

/// The pool sizes of the one-pool rows: `BENCH_REPLICAS`
/// (comma-separated), else 1, 10 and 50.
fn sizes() -> Vec<u32> {
    let asked: Vec<u32> = std::env::var("BENCH_REPLICAS")
        .map(|list| {
            list.split(',')
                .filter_map(|n| n.trim().parse().ok())
                .collect()
        })
        .unwrap_or_default();
    if asked.is_empty() {
        vec![1, 10, 50]
    } else {
        asked
    }
}

/// Whether to run the 20-concurrent rows (`BENCH_CONCURRENT=0` skips them).
fn concurrent_rows() -> bool {
    std::env::var("BENCH_CONCURRENT").map_or(true, |v| v != "0")
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let idx = ((sorted.len() as f64 * p).ceil() as usize).clamp(1, sorted.len()) - 1;
    sorted[idx]
}

fn millis(d: Duration) -> String {
    format!("{:.0}", d.as_secs_f64() * 1000.0)
}

/// Signed milliseconds: the service may answer before the bench's own
/// watch delivers the last event.
fn signed_millis(ms: f64) -> String {
    format!("{ms:.0}")
}

/// The create body of `strategy` for pool `name` of `replicas`; managed
/// workspaces on `BENCH_STORAGE_CLASS` when set (else the default class).
fn bench_body(strategy: &str, name: &str, replicas: u32) -> serde_json::Value {
    let mode = match strategy {
        "warm" => return json!({"name": name, "replicas": replicas, "warmPoolRef": "bench"}),
        "shared" => "ReadWriteMany",
        _ => "ReadWriteOnce",
    };
    let mut workspace = json!({"size": "1Gi", "accessMode": mode});
    if let Ok(class) = std::env::var("BENCH_STORAGE_CLASS") {
        workspace["storageClass"] = json!(class);
    }
    json!({"name": name, "replicas": replicas, "workspace": workspace})
}

/// When each object of one kind in the namespace was first seen with
/// `Ready=True`, from a watch of the bench's own; for warm pools also when
/// each pod was first seen with a pool label (the controller copies it from
/// the claim a moment after the claim is ready, and only then does the
/// pool's selector find the member).
struct ReadyWatch {
    seen: Arc<Mutex<HashMap<String, Instant>>>,
    /// Pool → pod → first seen with that pool's label.
    labelled: Arc<Mutex<HashMap<String, HashMap<String, Instant>>>>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl ReadyWatch {
    /// Watches the claims (warm pools: a claim's `Ready` is the member's)
    /// and pool-labelled pods, or the Sandboxes, of `env`'s namespace;
    /// answers once the first lists are in, so nothing created afterwards
    /// is missed.
    async fn start(env: &Env, strategy: &str) -> Result<Self> {
        let seen = Arc::new(Mutex::new(HashMap::new()));
        let labelled: Arc<Mutex<HashMap<String, HashMap<String, Instant>>>> = Arc::default();
        let resource = if strategy == "warm" {
            claims()
        } else {
            sandboxes()
        };
        let record = seen.clone();
        let mut watches = vec![watch_from(
            env.dyn_api(&resource),
            watcher::Config::default(),
            move |object, at| {
                if is_ready(&object) {
                    let mut seen = record.lock().unwrap();
                    seen.entry(object.name_any()).or_insert(at);
                }
            },
        )];
        if strategy == "warm" {
            let record = labelled.clone();
            watches.push(watch_from(
                env.dyn_api(&ApiResource::erase::<Pod>(&())),
                watcher::Config::default().labels(context_service::pool::names::POOL_LABEL),
                move |object, at| {
                    let Some(pool) = object
                        .labels()
                        .get(context_service::pool::names::POOL_LABEL)
                    else {
                        return;
                    };
                    let mut labelled = record.lock().unwrap();
                    labelled
                        .entry(pool.clone())
                        .or_default()
                        .entry(object.name_any())
                        .or_insert(at);
                },
            ));
        }
        let mut tasks = Vec::new();
        for (task, synced) in watches {
            tasks.push(task);
            tokio::time::timeout(Duration::from_secs(30), synced)
                .await
                .context("the bench's watch did not sync")??;
        }
        Ok(Self {
            seen,
            labelled,
            tasks,
        })
    }

    /// When the last member of pool `name` (`names` as the watch knows
    /// them) was first seen ready, and for a warm pool also labelled.
    fn last_ready(&self, strategy: &str, name: &str, replicas: u32) -> Result<Instant> {
        let names = member_names(strategy, name, replicas);
        let seen = self.seen.lock().unwrap();
        let mut last: Option<Instant> = None;
        for member in &names {
            let at = seen
                .get(member)
                .copied()
                .with_context(|| format!("{member} was never seen ready"))?;
            last = Some(last.map_or(at, |l| l.max(at)));
        }
        if strategy == "warm" {
            let pods: Vec<Instant> = self
                .labelled
                .lock()
                .unwrap()
                .get(name)
                .map(|pods| pods.values().copied().collect())
                .unwrap_or_default();
            anyhow::ensure!(
                pods.len() >= replicas as usize,
                "{} of {replicas} pods of {name} seen labelled",
                pods.len()
            );
            last = last.into_iter().chain(pods).max();
        }
        last.context("no members")
    }
}

/// Watches `api` with `config`, calling `record` with every object applied
/// and when it arrived; answers the task and a receiver that fires once the
/// first list is in.
fn watch_from(
    api: kube::Api<DynamicObject>,
    config: watcher::Config,
    record: impl Fn(DynamicObject, Instant) + Send + 'static,
) -> (
    tokio::task::JoinHandle<()>,
    tokio::sync::oneshot::Receiver<()>,
) {
    let (synced, on_sync) = tokio::sync::oneshot::channel();
    let task = tokio::spawn(async move {
        let mut synced = Some(synced);
        let mut events = std::pin::pin!(watcher(api, config));
        while let Some(event) = events.next().await {
            let at = Instant::now();
            match event {
                Ok(watcher::Event::Apply(object) | watcher::Event::InitApply(object)) => {
                    record(object, at);
                }
                Ok(watcher::Event::InitDone) => {
                    if let Some(synced) = synced.take() {
                        let _ = synced.send(());
                    }
                }
                Ok(_) => {}
                Err(error) => eprintln!("bench watch: {error}"),
            }
        }
    });
    (task, on_sync)
}

impl Drop for ReadyWatch {
    fn drop(&mut self) {
        for task in &self.tasks {
            task.abort();
        }
    }
}

fn is_ready(object: &DynamicObject) -> bool {
    object.data["status"]["conditions"]
        .as_array()
        .into_iter()
        .flatten()
        .any(|c| c["type"] == "Ready" && c["status"] == "True")
}

/// The names of the members of pool `name` as the bench watches them.
fn member_names(strategy: &str, name: &str, replicas: u32) -> Vec<String> {
    (0..replicas)
        .map(|i| {
            if strategy == "warm" {
                context_service::pool::names::claim(name, i)
            } else {
                context_service::pool::names::sandbox(name, i)
            }
        })
        .collect()
}

/// One pool's figures.
struct Timed {
    /// POST answered.
    created: Duration,
    /// POST → `?wait=ready` answered.
    ready: Duration,
    /// `?wait=ready` answered minus the last member seen ready (ms).
    lag_ms: f64,
}

/// `POST`, then `?wait=ready`, timed, with the wake lag from `watch`.
async fn create_until_ready(
    env: &Env,
    watch: &ReadyWatch,
    strategy: &str,
    name: &str,
    replicas: u32,
) -> Result<Timed> {
    let t0 = Instant::now();
    env.create_pool(&bench_body(strategy, name, replicas))
        .await?;
    let created = t0.elapsed();
    env.wait_ready(name).await?;
    let answered = Instant::now();
    // The bench's watch may deliver the last event a moment after the
    // service's did.
    let mut last = watch.last_ready(strategy, name, replicas);
    for _ in 0..100 {
        if last.is_ok() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
        last = watch.last_ready(strategy, name, replicas);
    }
    let last = last?;
    let lag_ms = if answered >= last {
        answered.duration_since(last).as_secs_f64() * 1000.0
    } else {
        -(last.duration_since(answered).as_secs_f64() * 1000.0)
    };
    Ok(Timed {
        created,
        ready: answered.duration_since(t0),
        lag_ms,
    })
}

/// Deletes every sandbox object of `env`'s namespace and waits until its
/// pods are gone (untimed). A namespace deleted with Sandboxes and warm
/// pools still in it keeps the agent-sandbox controller retrying pod
/// creates there (thousands of `403`s: the namespace is terminating),
/// which loads the API server during the next repetition.
async fn settle(env: &Env) -> Result<()> {
    let everything = kube::api::ListParams::default();
    for resource in [claims(), warm_pools(), sandboxes()] {
        env.dyn_api(&resource)
            .delete_collection(&DeleteParams::background(), &everything)
            .await?;
    }
    env.api::<PersistentVolumeClaim>()
        .delete_collection(&DeleteParams::background(), &everything)
        .await?;
    let pods = env.api::<Pod>();
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let left = pods.list(&everything).await?.items.len()
            + env
                .dyn_api(&sandboxes())
                .list(&everything)
                .await?
                .items
                .len();
        if left == 0 {
            return Ok(());
        }
        ensure!(
            Instant::now() < deadline,
            "{left} pods and Sandboxes left after 120 s"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// A fresh namespace and service: the warm pool filled for `fill`
/// claims, the caches synced, the bench's watch running; then `body`.
async fn fresh<F, Fut, T>(strategy: &'static str, fill: u32, body: F) -> T
where
    F: FnOnce(Arc<Env>, Arc<ReadyWatch>) -> Fut + Send + 'static,
    Fut: std::future::Future<Output = Result<T>> + Send + 'static,
    T: Send + 'static,
{
    let (tx, rx) = tokio::sync::oneshot::channel();
    with_env("e2e-bench", move |env| async move {
        if strategy == "warm" {
            env.warm_pool("bench", "bench", i64::from(fill)).await?;
        }
        env.warm_up().await?;
        let watch = Arc::new(ReadyWatch::start(&env, strategy).await?);
        let env = Arc::new(env);
        let out = body(env.clone(), watch).await?;
        settle(&env).await?;
        let _ = tx.send((out, env.kube.clone(), env.ns.clone()));
        Ok(())
    })
    .await;
    let (out, kube, ns) = rx.await.expect("the bench body answered");
    namespace_gone(kube, &ns).await;
    out
}

/// Waits (untimed) until the namespace controller has removed `ns`: its
/// sweep of every resource type loaded the API server during the next
/// repetition's creates and deletes.
async fn namespace_gone(kube: kube::Client, ns: &str) {
    let namespaces = kube::Api::<k8s_openapi::api::core::v1::Namespace>::all(kube);
    if let Err(error) = wait_deleted(&namespaces, ns).await {
        eprintln!("bench: {error:#}");
    }
}

/// Time from `POST /v1/sandbox-pools` to `ready` for 1, 10 and 50 replicas
/// of every strategy (warm pool filled to the replica count beforehand;
/// dedicated with fresh RWO PVCs, shared with one fresh RWX PVC), then 20
/// concurrent creates of one-replica pools and their 20 concurrent deletes
/// (until `204`). p50 and max over the repetitions; per repetition of the
/// concurrent rows p50 and p99 of 20 (p99 of 20 = max).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "benchmark: run by benches/k8s_pools.sh"]
async fn bench_pools() {
    let reps = reps();
    let strategies = strategies();
    let mut single = Vec::new();
    for strategy in strategies.iter().copied() {
        for replicas in sizes() {
            let mut runs = Vec::new();
            for _ in 0..reps {
                let timed = fresh(strategy, replicas, move |env, watch| async move {
                    create_until_ready(&env, &watch, strategy, "p", replicas).await
                })
                .await;
                runs.push(timed);
            }
            let mut created: Vec<Duration> = runs.iter().map(|t| t.created).collect();
            let mut ready: Vec<Duration> = runs.iter().map(|t| t.ready).collect();
            let mut after: Vec<Duration> = runs.iter().map(|t| t.ready - t.created).collect();
            let mut lag: Vec<f64> = runs.iter().map(|t| t.lag_ms).collect();
            created.sort();
            ready.sort();
            after.sort();
            lag.sort_by(f64::total_cmp);
            let row = format!(
                "| {strategy:9} | {replicas:8} | {:>10} | {:>10} | {:>10} | {:>10} | {:>10} | {:>10} | {:>8} | {:>8} |",
                millis(percentile(&created, 0.5)),
                millis(created[created.len() - 1]),
                millis(percentile(&ready, 0.5)),
                millis(ready[ready.len() - 1]),
                millis(percentile(&after, 0.5)),
                millis(after[after.len() - 1]),
                signed_millis(lag[(lag.len() - 1) / 2]),
                signed_millis(lag[lag.len() - 1]),
            );
            println!("{row}");
            single.push(row);
        }
    }
    let mut concurrent = Vec::new();
    let concurrent_strategies = if concurrent_rows() {
        strategies.clone()
    } else {
        Vec::new()
    };
    for strategy in concurrent_strategies {
        let mut worst_ready_p99 = Duration::ZERO;
        for rep in 1..=reps {
            let row = fresh(strategy, 20, move |env, watch| async move {
                let tasks: Vec<_> = (0..20)
                    .map(|i| {
                        let (env, watch) = (env.clone(), watch.clone());
                        tokio::spawn(async move {
                            create_until_ready(&env, &watch, strategy, &format!("c{i}"), 1).await
                        })
                    })
                    .collect();
                let mut runs = Vec::new();
                for task in tasks {
                    runs.push(task.await??);
                }
                // Then the 20 ready pools deleted at once: DELETE until 204.
                let tasks: Vec<_> = (0..20)
                    .map(|i| {
                        let env = env.clone();
                        tokio::spawn(async move {
                            let t0 = Instant::now();
                            env.delete_pool(&format!("c{i}")).await?;
                            Ok::<_, anyhow::Error>(t0.elapsed())
                        })
                    })
                    .collect();
                let mut deleted = Vec::new();
                for task in tasks {
                    deleted.push(task.await??);
                }
                Ok((runs, deleted))
            })
            .await;
            let (runs, mut deleted) = row;
            let mut created: Vec<Duration> = runs.iter().map(|t| t.created).collect();
            let mut ready: Vec<Duration> = runs.iter().map(|t| t.ready).collect();
            let lag_max = runs.iter().map(|t| t.lag_ms).fold(f64::MIN, f64::max);
            created.sort();
            ready.sort();
            deleted.sort();
            worst_ready_p99 = worst_ready_p99.max(percentile(&ready, 0.99));
            let row = format!(
                "| {strategy:9} | {rep:3} | {:>10} | {:>10} | {:>10} | {:>10} | {:>8} | {:>10} | {:>10} |",
                millis(percentile(&created, 0.5)),
                millis(percentile(&created, 0.99)),
                millis(percentile(&ready, 0.5)),
                millis(percentile(&ready, 0.99)),
                signed_millis(lag_max),
                millis(percentile(&deleted, 0.5)),
                millis(percentile(&deleted, 0.99)),
            );
            println!("{row}");
            concurrent.push(row);
        }
        let summary = format!(
            "| {strategy:9} | max | ready p99 over {reps} repetitions: {} ms (target <= 2000) |",
            millis(worst_ready_p99)
        );
        println!("{summary}");
        concurrent.push(summary);
    }
    println!(
        "\nPOST /v1/sandbox-pools -> ready, one pool ({reps} repetitions; ms; after = ready - \
         POST answered, the time after the API accepted every object; wake lag = \
         ?wait=ready answered - last member seen Ready by the bench's own watch)\n"
    );
    println!("| strategy  | replicas | create p50 | create max | ready p50  | ready max  | after p50  | after max  | lag p50  | lag max  |");
    println!("|-----------|----------|------------|------------|------------|------------|------------|------------|----------|----------|");
    for row in &single {
        println!("{row}");
    }
    println!("\n20 concurrent creates, then 20 concurrent deletes, of one-replica pools (ms; p99 of 20 = max)\n");
    println!("| strategy  | rep | create p50 | create p99 | ready p50  | ready p99  | lag max  | delete p50 | delete p99 |");
    println!("|-----------|-----|------------|------------|------------|------------|----------|------------|------------|");
    for row in &concurrent {
        println!("{row}");
    }
}
