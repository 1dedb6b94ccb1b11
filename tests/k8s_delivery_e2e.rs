//! Deliveries through `pods/exec` into kwok pods on the real control plane
//! of `tests/k8s/testenv.sh`, driven only through the service's HTTP API.
//!
//! kwok runs each exec as a local process in the working directory of the
//! pod's `Exec` rule (`$CONTEXT_SERVICE_TESTENV_EXEC_ROOT/<ns>/<pod>`), so the
//! delivery root is relative (`.context`) and lands inside that directory,
//! where the tests check the files on disk.
//!
//! Run with the environment up:
//! `eval "$(tests/k8s/testenv.sh env)" && cargo test --features e2e --test k8s_delivery_e2e`

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{anyhow, ensure, Context as _, Result};
use futures::{SinkExt, StreamExt};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{ApiResource, AttachParams, GroupVersionKind, PostParams};
use kube::Client;
use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio_tungstenite::tungstenite::Message;

mod common;

use common::k8s::{
    apply, dyn_api, member_pods, start_server_with, wait_for, with_namespace, Env, USER,
};
use common::workload_bundles::{noise, sha256, tgz};
use common::{assert_error, TestServer};

/// The delivery root: relative, so that it lands in each pod's kwok
/// working directory instead of this host's `/workspace`.
const ROOT: &str = ".context";

/// A fresh namespace and a service delivering into `ROOT`, with `adjust`
/// applied to its settings.
async fn with_delivery_env<F, Fut>(
    prefix: &str,
    adjust: impl FnOnce(&mut context_service::config::ServeConfig) + Send + 'static,
    body: F,
) where
    F: FnOnce(Env) -> Fut + Send + 'static,
    Fut: std::future::Future<Output = Result<()>> + Send + 'static,
{
    with_namespace(prefix, |kube, ns| async move {
        let server = start_server_with(&ns, |cfg| {
            cfg.delivery_root = ROOT.to_owned();
            adjust(cfg);
        })
        .await;
        body(Env::new(kube, ns, server)).await
    })
    .await;
}

/// The kwok `Exec` rules.
fn execs() -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("kwok.x-k8s.io", "v1alpha1", "Exec"),
        "execs",
    )
}

/// The working directory kwok runs `pod`'s execs in (created here).
fn workdir_of(ns: &str, pod: &str) -> Result<PathBuf> {
    let root = std::env::var_os("CONTEXT_SERVICE_TESTENV_EXEC_ROOT")
        .map(PathBuf::from)
        .unwrap_or_else(std::env::temp_dir);
    let dir = root.join(ns).join(pod);
    std::fs::create_dir_all(&dir).with_context(|| format!("create {}", dir.display()))?;
    Ok(dir)
}

/// Adds a kwok `Exec` rule that runs `pod`'s execs (any container) as local
/// processes in its working directory; returns that directory.
async fn allow_exec(kube: &Client, ns: &str, pod: &str, container: &str) -> Result<PathBuf> {
    let dir = workdir_of(ns, pod)?;
    let ar = execs();
    apply(
        &dyn_api(kube, ns, &ar),
        &ar,
        pod,
        json!({"spec": {"execs": [{"containers": [container], "local": {"workDir": dir}}]}}),
    )
    .await?;
    Ok(dir)
}

/// A plain running pod with one container `main` and an exec rule.
async fn plain_pod(kube: &Client, ns: &str, name: &str) -> Result<PathBuf> {
    let pods: kube::Api<Pod> = kube::Api::namespaced(kube.clone(), ns);
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": name},
        "spec": {"containers": [{"name": "main", "image": "busybox:stable"}]}
    }))?;
    pods.create(&PostParams::default(), &pod).await?;
    let dir = allow_exec(kube, ns, name, "main").await?;
    wait_for(
        &pods,
        name,
        "pod Running",
        kube::runtime::wait::conditions::is_pod_running(),
    )
    .await?;
    Ok(dir)
}

// --- how fast stdin goes through pods/exec ------------------------------------

/// MB/s of `n` bytes of stdin into `head -c n | sha256sum` through kube-rs's
/// `AttachedProcess` (the service's exec port).
async fn through_attached(kube: &Client, ns: &str, pod: &str, data: &[u8]) -> Result<f64> {
    use context_service::sandbox::kube::exec::KubeExec;
    let exec = KubeExec::new(kube.clone(), ns, None);
    let argv = vec![
        "sh".to_string(),
        "-c".to_string(),
        format!("head -c {} | sha256sum", data.len()),
    ];
    let started = Instant::now();
    let mut session = exec.start(pod, &argv).await?;
    let mut out = String::new();
    let (written, read) = tokio::join!(
        session.stdin.write_all(data),
        session.stdout.read_to_string(&mut out)
    );
    written?;
    read?;
    ensure!(session.done.await? == 0, "exit status");
    let elapsed = started.elapsed();
    ensure!(
        out.starts_with(&common::workload_bundles::sha256(data)),
        "digest {out}"
    );
    Ok(data.len() as f64 / elapsed.as_secs_f64() / 1e6)
}

/// The same through a bare WebSocket with `frame`-byte stdin messages.
async fn through_frames(
    kube: &Client,
    ns: &str,
    pod: &str,
    data: &[u8],
    frame: usize,
) -> Result<f64> {
    let params = AttachParams::default()
        .container("main")
        .stdin(true)
        .stdout(true)
        .stderr(false);
    let command = ["sh", "-c", &format!("head -c {} | sha256sum", data.len())];
    let request = kube::core::Request::new(format!("/api/v1/namespaces/{ns}/pods"))
        .exec(pod, command, &params)?;
    let started = Instant::now();
    let connection = kube.connect(request).await?;
    let (mut send, mut receive) = connection.into_stream().split();
    let write = async {
        for chunk in data.chunks(frame) {
            let mut message = Vec::with_capacity(chunk.len() + 1);
            message.push(0u8);
            message.extend_from_slice(chunk);
            send.send(Message::binary(message)).await?;
        }
        Ok::<_, anyhow::Error>(send)
    };
    let read = async {
        let mut out = Vec::new();
        while let Some(message) = receive.next().await {
            if let Message::Binary(bin) = message? {
                match bin.first() {
                    Some(1) => out.extend_from_slice(&bin[1..]),
                    Some(3) => return Ok(out),
                    _ => {}
                }
            }
        }
        Err(anyhow!("no status"))
    };
    let (send, out) = tokio::try_join!(write, read)?;
    drop(send);
    let elapsed = started.elapsed();
    ensure!(
        String::from_utf8_lossy(&out).starts_with(&common::workload_bundles::sha256(data)),
        "digest"
    );
    Ok(data.len() as f64 / elapsed.as_secs_f64() / 1e6)
}

/// Prints stdin throughput of `pods/exec`: [`KubeExec`] (up to 1 MiB stdin
/// messages), and bare WebSockets sending 4 KiB (kube-rs's `AttachedProcess`)
/// against larger ones). Ignored: a measurement, not a check.
/// `cargo test --release --features e2e --test k8s_delivery_e2e -- --ignored --nocapture exec_stdin_throughput`
#[tokio::test]
#[ignore = "measurement; run explicitly (see the doc comment)"]
async fn exec_stdin_throughput() {
    with_namespace("e2e-exec-rate", |kube, ns| async move {
        plain_pod(&kube, &ns, "rate").await?;
        let data = common::workload_bundles::noise(64 << 20, 7);
        println!("64 MiB of stdin into `head -c N | sha256sum`, MB/s (3 runs)");
        for round in 0..3 {
            let attached = through_attached(&kube, &ns, "rate", &data).await?;
            let mut row = format!("run {round}: KubeExec {attached:.0}");
            for frame in [4 << 10, 64 << 10, 1 << 20] {
                let rate = through_frames(&kube, &ns, "rate", &data, frame).await?;
                row.push_str(&format!(", {} KiB messages {rate:.0}", frame >> 10));
            }
            println!("{row}");
        }
        Ok(())
    })
    .await;
}

// --- fixtures ----------------------------------------------------------------

/// Files of about `total` bytes, half incompressible noise and half text,
/// in a few directories.
fn mixed_tree(total: usize, seed: u64) -> Vec<(String, Vec<u8>)> {
    const FILE: usize = 4 << 20;
    let mut files = vec![("README.md".to_string(), b"# fixture\n".to_vec())];
    let mut made = 0;
    let mut i = 0u64;
    while made < total {
        let size = FILE.min(total - made);
        let (path, data) = if i % 2 == 0 {
            (format!("blobs/part-{i:03}.bin"), noise(size, seed + i))
        } else {
            let mut text = Vec::with_capacity(size);
            let mut line = 0u64;
            while text.len() < size {
                text.extend_from_slice(
                    format!("{seed}:{i}:{line} the quick brown fox jumps over the lazy dog\n")
                        .as_bytes(),
                );
                line += 1;
            }
            text.truncate(size);
            (format!("docs/chapter-{i:03}.txt"), text)
        };
        made += data.len();
        files.push((path, data));
        i += 1;
    }
    files
}

fn bundle_of(files: &[(String, Vec<u8>)]) -> Vec<u8> {
    let refs: Vec<(&str, &[u8])> = files
        .iter()
        .map(|(path, data)| (path.as_str(), data.as_slice()))
        .collect();
    tgz(&refs)
}

/// Creates, uploads and activates workload `name` as [`USER`]; returns the
/// bundle's size.
async fn ready_workload(server: &TestServer, name: &str, bundle: Vec<u8>) -> Result<u64> {
    let client = server.client(USER);
    client.create_workload(Some(name), None).await?;
    let revision = client.upload_bundle(name, bundle).await?;
    client
        .activate_workload(name, &revision.revision)
        .await
        .context("activate")?;
    Ok(revision.bytes)
}

/// A ready pool `name` of `replicas` sandboxes whose pods accept execs;
/// returns (sandbox, pod, working directory) per member.
async fn exec_pool(env: &Env, name: &str, replicas: u32) -> Result<Vec<(String, String, PathBuf)>> {
    env.create_pool(&json!({"name": name, "replicas": replicas,
                           "workspace": {"size": "1Gi", "accessMode": "ReadWriteMany"}}))
        .await?;
    let pool = env.wait_ready(name).await?;
    let mut members = Vec::new();
    for sandbox in &pool.sandboxes {
        let pod = sandbox.pod.clone().context("member without a pod")?;
        let dir = allow_exec(&env.kube, &env.ns, &pod, "sandbox").await?;
        members.push((sandbox.name.clone(), pod, dir));
    }
    ensure!(members.len() == replicas as usize, "{pool:#?}");
    Ok(members)
}

async fn post_delivery(env: &Env, workload: &str, body: Value) -> Result<reqwest::Response> {
    Ok(env
        .request(
            reqwest::Method::POST,
            &format!("/v1/workloads/{workload}/deliveries"),
        )
        .json(&body)
        .timeout(Duration::from_secs(600))
        .send()
        .await?)
}

/// Delivers and expects `201`; returns the answer.
async fn deliver(env: &Env, workload: &str, body: Value) -> Result<Value> {
    let resp = post_delivery(env, workload, body).await?;
    let status = resp.status().as_u16();
    let text = resp.text().await?;
    ensure!(status == 201, "deliver answered {status}: {text}");
    Ok(serde_json::from_str(&text)?)
}

async fn release(env: &Env, workload: &str, run: &str) -> Result<reqwest::Response> {
    Ok(env
        .request(
            reqwest::Method::DELETE,
            &format!("/v1/workloads/{workload}/deliveries/{run}"),
        )
        .send()
        .await?)
}

/// Every regular file under `dir` (following the view's links), relative
/// path → contents.
fn files_under(dir: &Path) -> Result<Vec<(String, Vec<u8>)>> {
    fn walk(base: &Path, dir: &Path, out: &mut Vec<(String, Vec<u8>)>) -> Result<()> {
        for entry in std::fs::read_dir(dir).with_context(|| format!("read {}", dir.display()))? {
            let path = entry?.path();
            let meta = std::fs::metadata(&path)?;
            if meta.is_dir() {
                walk(base, &path, out)?;
            } else {
                let relative = path.strip_prefix(base)?.to_string_lossy().into_owned();
                out.push((relative, std::fs::read(&path)?));
            }
        }
        Ok(())
    }
    let mut out = Vec::new();
    walk(dir, dir, &mut out)?;
    out.sort();
    Ok(out)
}

/// Checks that the run's view at `path` (as the service reported it) lies
/// in `workdir` and holds exactly `files`, read-only.
fn assert_view(path: &str, workdir: &Path, files: &[(String, Vec<u8>)]) -> Result<()> {
    let workdir = std::fs::canonicalize(workdir)?;
    ensure!(
        Path::new(path).starts_with(&workdir),
        "view {path} is not inside the pod's working directory {}",
        workdir.display()
    );
    let got = files_under(Path::new(path))?;
    let mut want: Vec<(String, Vec<u8>)> = files.to_vec();
    want.sort();
    ensure!(
        got.len() == want.len(),
        "{} files in the view, {} in the bundle",
        got.len(),
        want.len()
    );
    for ((got_path, got_data), (want_path, want_data)) in got.iter().zip(&want) {
        ensure!(got_path == want_path, "{got_path} != {want_path}");
        ensure!(
            sha256(got_data) == sha256(want_data),
            "{got_path} differs ({} bytes, want {})",
            got_data.len(),
            want_data.len()
        );
        let mode = std::fs::metadata(Path::new(path).join(got_path))?.permissions();
        ensure!(mode.readonly(), "{got_path} is writable");
    }
    Ok(())
}

/// Names in `<workdir>/<ROOT>/cache` (empty when it does not exist).
fn cached_revisions(workdir: &Path) -> Result<Vec<String>> {
    let dir = workdir.join(ROOT).join("cache");
    match std::fs::read_dir(&dir) {
        Ok(entries) => entries
            .map(|e| Ok(e?.file_name().to_string_lossy().into_owned()))
            .collect(),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Vec::new()),
        Err(e) => Err(e.into()),
    }
}

fn outcome<'a>(answer: &'a Value, sandbox: &str) -> Result<&'a Value> {
    answer["deliveries"]
        .as_array()
        .and_then(|all| all.iter().find(|d| d["sandbox"] == sandbox))
        .ok_or_else(|| anyhow!("no outcome for {sandbox} in {answer}"))
}

// --- the lifecycle -------------------------------------------------------------

#[tokio::test]
async fn delivery_lifecycle_through_kube_exec() {
    with_delivery_env(
        "e2e-deliver",
        |_| {},
        |env| async move {
            let files = vec![
                ("README.md".to_string(), b"# hello\n".to_vec()),
                ("src/main.rs".to_string(), b"fn main() {}\n".to_vec()),
                ("data/blob.bin".to_string(), noise(300_001, 3)),
            ];
            let bytes = ready_workload(&env.server, "wl", bundle_of(&files)).await?;
            env.create_pool(&json!({"name": "one", "replicas": 1,
                               "workspace": {"size": "1Gi", "accessMode": "ReadWriteOnce"}}))
                .await?;
            let pool = env.wait_ready("one").await?;
            let sandbox = pool.sandboxes[0].name.clone();
            let pod = member_pods(&pool)?.remove(0);

            // Without an exec rule kwok cannot run anything in the pod: the
            // exec fails, and the client sees a one-line reason, not stderr.
            let resp =
                post_delivery(&env, "wl", json!({"runId": "early", "sandbox": sandbox})).await?;
            assert_error(resp, 502, "delivery_failed", "exec_failed").await;

            let workdir = allow_exec(&env.kube, &env.ns, &pod, "sandbox").await?;
            let first = deliver(&env, "wl", json!({"runId": "run-1", "sandbox": sandbox})).await?;
            let d = outcome(&first, &sandbox)?;
            ensure!(d["pod"] == pod.as_str(), "{first}");
            ensure!(d["cached"] == false, "{first}");
            ensure!(d["bytesSent"] == bytes, "{first}");
            let path1 = d["path"].as_str().context("path")?.to_owned();
            ensure!(path1.ends_with("/wl/run-1"), "{path1}");
            assert_view(&path1, &workdir, &files)?;

            // Another run of the same revision: a verified hit, nothing sent.
            let second = deliver(&env, "wl", json!({"runId": "run-2", "sandbox": sandbox})).await?;
            let d = outcome(&second, &sandbox)?;
            ensure!(d["cached"] == true && d["bytesSent"] == 0, "{second}");
            let path2 = d["path"].as_str().context("path")?.to_owned();
            assert_view(&path2, &workdir, &files)?;
            ensure!(
                cached_revisions(&workdir)?.len() == 1,
                "one cache dir for two runs"
            );
            // `verify: full` rehashes every file and still sends nothing.
            let full = deliver(
                &env,
                "wl",
                json!({"runId": "run-3", "sandbox": sandbox, "verify": "full"}),
            )
            .await?;
            ensure!(outcome(&full, &sandbox)?["bytesSent"] == 0, "{full}");

            let listed = env
                .request(reqwest::Method::GET, "/v1/workloads/wl/deliveries")
                .send()
                .await?;
            ensure!(listed.status().as_u16() == 200);
            let listed: Value = listed.json().await?;
            let runs: Vec<&str> = listed["deliveries"]
                .as_array()
                .context("deliveries")?
                .iter()
                .filter_map(|r| r["runId"].as_str())
                .collect();
            ensure!(runs == ["run-1", "run-2", "run-3"], "{listed}");
            ensure!(
                listed["deliveries"][0]["sandboxes"][0]["pod"] == pod.as_str(),
                "{listed}"
            );

            // Releasing one run keeps the others' views and the cache.
            ensure!(release(&env, "wl", "run-1").await?.status().as_u16() == 204);
            ensure!(!Path::new(&path1).exists(), "run-1's view is gone");
            assert_view(&path2, &workdir, &files)?;
            ensure!(release(&env, "wl", "run-3").await?.status().as_u16() == 204);
            // The last release removes the unreferenced revision (retention 0).
            ensure!(release(&env, "wl", "run-2").await?.status().as_u16() == 204);
            ensure!(!Path::new(&path2).exists(), "run-2's view is gone");
            let left = cached_revisions(&workdir)?;
            ensure!(left.is_empty(), "cache left behind: {left:?}");
            let resp = release(&env, "wl", "run-2").await?;
            assert_error(resp, 404, "run_not_found", "run-2").await;

            // A sandbox that does not exist is answered like one of another owner.
            let resp =
                post_delivery(&env, "wl", json!({"runId": "x", "sandbox": "nobody"})).await?;
            assert_error(resp, 404, "sandbox_not_found", "nobody").await;
            Ok(())
        },
    )
    .await;
}

#[tokio::test]
async fn a_64_mib_bundle_arrives_intact() {
    with_delivery_env(
        "e2e-deliver-big",
        |_| {},
        |env| async move {
            let files = mixed_tree(64 << 20, 11);
            let bytes = ready_workload(&env.server, "big", bundle_of(&files)).await?;
            let members = exec_pool(&env, "big", 1).await?;
            let (sandbox, _, workdir) = &members[0];
            let started = Instant::now();
            let answer = deliver(&env, "big", json!({"runId": "r", "sandbox": sandbox})).await?;
            let took = started.elapsed();
            let d = outcome(&answer, sandbox)?;
            ensure!(d["cached"] == false && d["bytesSent"] == bytes, "{answer}");
            assert_view(d["path"].as_str().context("path")?, workdir, &files)?;
            println!("64 MiB tree ({bytes} bundle bytes) delivered in {took:?}");
            ensure!(release(&env, "big", "r").await?.status().as_u16() == 204);
            ensure!(cached_revisions(workdir)?.is_empty());
            Ok(())
        },
    )
    .await;
}

#[tokio::test]
async fn pool_wide_delivery_reaches_three_sandboxes() {
    with_delivery_env(
        "e2e-deliver-pool",
        |_| {},
        |env| async move {
            let files = mixed_tree(2 << 20, 5);
            let bytes = ready_workload(&env.server, "fan", bundle_of(&files)).await?;
            let members = exec_pool(&env, "trio", 3).await?;
            let answer = deliver(&env, "fan", json!({"runId": "all", "pool": "trio"})).await?;
            ensure!(
                answer["deliveries"].as_array().map(Vec::len) == Some(3),
                "{answer}"
            );
            let mut paths = Vec::new();
            for (sandbox, pod, workdir) in &members {
                let d = outcome(&answer, sandbox)?;
                ensure!(d["pod"] == pod.as_str(), "{answer}");
                ensure!(d["cached"] == false && d["bytesSent"] == bytes, "{answer}");
                let path = d["path"].as_str().context("path")?.to_owned();
                assert_view(&path, workdir, &files)?;
                paths.push(path);
            }
            // Again for the pool: every sandbox is a hit.
            let again = deliver(&env, "fan", json!({"runId": "again", "pool": "trio"})).await?;
            for (sandbox, _, _) in &members {
                ensure!(outcome(&again, sandbox)?["bytesSent"] == 0, "{again}");
            }
            // One release reaches every sandbox of the run.
            ensure!(release(&env, "fan", "all").await?.status().as_u16() == 204);
            ensure!(release(&env, "fan", "again").await?.status().as_u16() == 204);
            for ((_, _, workdir), path) in members.iter().zip(&paths) {
                ensure!(!Path::new(path).exists(), "{path} left behind");
                ensure!(cached_revisions(workdir)?.is_empty());
            }
            Ok(())
        },
    )
    .await;
}

#[tokio::test]
async fn shared_sandboxes_are_targets_for_every_owner() {
    with_delivery_env(
        "e2e-deliver-shared",
        |cfg| cfg.delivery_shared_selector = Some("tier=shared".to_owned()),
        |env| async move {
            let files = vec![("notes.txt".to_string(), b"shared\n".to_vec())];
            let bytes = ready_workload(&env.server, "wl", bundle_of(&files)).await?;
            // Platform-owned Sandboxes, made outside the service.
            let ar = common::k8s::sandboxes();
            let api = env.dyn_api(&ar);
            for (name, tier) in [("platform-0", "shared"), ("private-0", "private")] {
                apply(
                    &api,
                    &ar,
                    name,
                    json!({
                        "metadata": {"labels": {"tier": tier}},
                        "spec": {"podTemplate": {"spec": {"containers": [
                            {"name": "work", "image": common::k8s::IMAGE}
                        ]}}},
                    }),
                )
                .await?;
            }
            let pods: kube::Api<Pod> = env.api();
            for name in ["platform-0", "private-0"] {
                wait_for(
                    &pods,
                    name,
                    "sandbox pod Running",
                    kube::runtime::wait::conditions::is_pod_running(),
                )
                .await?;
            }
            let workdir = allow_exec(&env.kube, &env.ns, "platform-0", "work").await?;
            allow_exec(&env.kube, &env.ns, "private-0", "work").await?;

            let answer =
                deliver(&env, "wl", json!({"runId": "r1", "sandbox": "platform-0"})).await?;
            let d = outcome(&answer, "platform-0")?;
            ensure!(
                d["pod"] == "platform-0" && d["bytesSent"] == bytes,
                "{answer}"
            );
            assert_view(d["path"].as_str().context("path")?, &workdir, &files)?;

            // Not selected and not in a pool of the caller: like a missing one.
            let resp =
                post_delivery(&env, "wl", json!({"runId": "r2", "sandbox": "private-0"})).await?;
            assert_error(resp, 404, "sandbox_not_found", "private-0").await;
            ensure!(release(&env, "wl", "r1").await?.status().as_u16() == 204);
            ensure!(cached_revisions(&workdir)?.is_empty());
            Ok(())
        },
    )
    .await;
}
