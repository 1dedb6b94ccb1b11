//! The goose scenarios: the workload lifecycle (create → upload → activate
//! → download → delete), readers downloading others' active workloads,
//! deliveries and releases on `local` sandboxes, pool create/delete, and
//! hostile uploads that must be refused with a documented `4xx`.
//!
//! Every request is recorded in the [`Ledger`] with the outcome the step
//! expects. Answers the service documents as "try again" (`503`/`429` with
//! `Retry-After`) are retried after the advertised delay, as a client
//! would; idempotent steps are retried after a broken connection too.
//! Workloads, grants and pools go through the balancer; a `local` sandbox
//! lives in one replica's data dir, so pools and deliveries go to that
//! replica directly.

use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use goose::prelude::*;
use serde_json::{json, Value};
use sha2::{Digest as _, Sha256};

use crate::ledger::{Active, Entry, Ledger, Outcome, Target, Upload};

/// The bundle media type uploads declare.
pub(crate) const MEDIA: &str = "application/vnd.rossoctl.context";

/// The error codes the API documents for a refused upload.
const UPLOAD_REFUSALS: [&str; 6] = [
    "bundle_rejected",
    "inflated_too_large",
    "unsupported_media_type",
    "upload_too_large",
    "too_many_entries",
    "file_too_large",
];

/// What the scenarios share.
pub(crate) struct LoadCtx {
    pub(crate) ledger: Arc<Ledger>,
    /// One owner (token subject) per virtual user.
    pub(crate) tokens: Vec<String>,
    /// `http://<replica A>`, `http://<replica B>`.
    pub(crate) replicas: [String; 2],
    /// Above the service's inflated-size limit, compressed to little.
    pub(crate) bomb_bytes: u64,
}

static CTX: OnceLock<Arc<LoadCtx>> = OnceLock::new();

/// Installs the shared context (once, before the attack).
pub(crate) fn install(ctx: Arc<LoadCtx>) {
    let _ = CTX.set(ctx);
}

fn ctx() -> Result<Arc<LoadCtx>, Box<TransactionError>> {
    CTX.get()
        .cloned()
        .ok_or_else(|| "load context not installed".into())
}

/// The scenarios, weighted for a mixed workload.
pub(crate) fn scenarios() -> Result<Vec<Scenario>, GooseError> {
    let ms = Duration::from_millis;
    Ok(vec![
        scenario!("lifecycle")
            .set_weight(8)?
            .set_wait_time(ms(500), ms(2000))?
            .register_transaction(transaction!(lifecycle).set_name("lifecycle")),
        scenario!("readers")
            .set_weight(4)?
            .set_wait_time(ms(200), ms(1000))?
            .register_transaction(transaction!(reader).set_name("read")),
        scenario!("deliveries")
            .set_weight(2)?
            .set_wait_time(ms(500), ms(2000))?
            .register_transaction(transaction!(delivery).set_name("deliver")),
        scenario!("pools")
            .set_weight(1)?
            .set_wait_time(ms(1000), ms(3000))?
            .register_transaction(transaction!(pool_churn).set_name("pool")),
        scenario!("hostile")
            .set_weight(1)?
            .set_wait_time(ms(1000), ms(3000))?
            .register_transaction(transaction!(hostile).set_name("hostile")),
    ])
}

/// A request to make.
struct Spec<'a> {
    op: &'static str,
    target: Target,
    method: GooseMethod,
    url: String,
    token: &'a str,
    json: Option<Value>,
    body: Option<(bytes::Bytes, &'static str)>,
    /// Hash the (streamed) body instead of parsing it.
    hash: bool,
}

impl<'a> Spec<'a> {
    fn new(
        op: &'static str,
        target: Target,
        method: GooseMethod,
        url: String,
        token: &'a str,
    ) -> Self {
        Self {
            op,
            target,
            method,
            url,
            token,
            json: None,
            body: None,
            hash: false,
        }
    }

    fn json(mut self, v: Value) -> Self {
        self.json = Some(v);
        self
    }
}

/// What came back.
struct Answer {
    outcome: Outcome,
    json: Value,
    retry_after: Option<Duration>,
    /// sha256 of the body, for `hash` requests that got one whole.
    sha256: Option<String>,
    etag: Option<String>,
}

impl Answer {
    fn code(&self) -> Option<u16> {
        match self.outcome {
            Outcome::Status { code, .. } => Some(code),
            _ => None,
        }
    }

    fn error(&self) -> Option<&str> {
        match &self.outcome {
            Outcome::Status { error, .. } => error.as_deref(),
            _ => None,
        }
    }

    fn is(&self, code: u16) -> bool {
        self.code() == Some(code)
    }

    /// `503`/`429` with `Retry-After`: the documented "try again".
    fn retryable(&self) -> bool {
        matches!(self.code(), Some(503 | 429)) && self.retry_after.is_some()
    }

    fn transport(&self) -> bool {
        matches!(self.outcome, Outcome::Transport(_))
    }

    fn str(&self, pointer: &str) -> String {
        self.json
            .pointer(pointer)
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_owned()
    }
}

fn transport_kind(e: &reqwest::Error) -> &'static str {
    if e.is_connect() {
        "refused"
    } else if e.is_timeout() {
        "timeout"
    } else {
        "reset"
    }
}

/// Sends `spec` through goose (its metrics) and reads the whole answer.
async fn send(user: &mut GooseUser, spec: &Spec<'_>) -> Result<Answer, Box<TransactionError>> {
    let mut rb = user
        .get_request_builder(&spec.method, &spec.url)?
        .bearer_auth(spec.token);
    if let Some(v) = &spec.json {
        rb = rb.json(v);
    }
    if let Some((body, media)) = &spec.body {
        rb = rb.header("content-type", *media).body(body.clone());
    }
    let request = GooseRequest::builder()
        .method(spec.method)
        .path(spec.url.as_str())
        .name(spec.op)
        .set_request_builder(rb)
        .build();
    let goose = user.request(request).await?;
    let mut answer = Answer {
        outcome: Outcome::Transport("reset"),
        json: Value::Null,
        retry_after: None,
        sha256: None,
        etag: None,
    };
    match goose.response {
        Err(e) => answer.outcome = Outcome::Transport(transport_kind(&e)),
        Ok(mut resp) => {
            let code = resp.status().as_u16();
            answer.retry_after = resp
                .headers()
                .get("retry-after")
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.parse().ok())
                .map(Duration::from_secs);
            answer.etag = resp
                .headers()
                .get("etag")
                .and_then(|v| v.to_str().ok())
                .map(str::to_owned);
            let mut hasher = Sha256::new();
            let mut body = Vec::new();
            let mut broken = None;
            loop {
                match resp.chunk().await {
                    Ok(Some(chunk)) if spec.hash && code == 200 => hasher.update(&chunk),
                    Ok(Some(chunk)) => {
                        if body.len() < 1 << 20 {
                            body.extend_from_slice(&chunk);
                        }
                    }
                    Ok(None) => break,
                    Err(e) => {
                        broken = Some(transport_kind(&e));
                        break;
                    }
                }
            }
            if let Some(kind) = broken {
                answer.outcome = Outcome::Transport(kind);
            } else {
                answer.json = serde_json::from_slice(&body).unwrap_or(Value::Null);
                if spec.hash && code == 200 {
                    answer.sha256 = Some(hex::encode(hasher.finalize()));
                }
                answer.outcome = Outcome::Status {
                    code,
                    error: answer
                        .json
                        .get("error")
                        .and_then(Value::as_str)
                        .map(str::to_owned),
                    retry_after: answer.retry_after.is_some(),
                };
            }
        }
    }
    Ok(answer)
}

/// Records `answer` for `spec`, sent at `start`.
fn record(
    spec: &Spec<'_>,
    start: Duration,
    answer: &Answer,
    expected: bool,
) -> Result<(), Box<TransactionError>> {
    let ledger = ctx()?.ledger.clone();
    ledger.record(Entry {
        op: spec.op,
        target: spec.target,
        start,
        end: ledger.now(),
        outcome: answer.outcome.clone(),
        expected,
    });
    Ok(())
}

/// How long a step keeps retrying documented "try again" answers.
const RETRY_BUDGET: Duration = Duration::from_secs(150);

/// Sends `spec` until the answer is not a documented "try again" (and, for
/// `idempotent` steps, not a broken connection), within [`RETRY_BUDGET`].
/// Every attempt is recorded; `ok` says which answers the step expects.
async fn step(
    user: &mut GooseUser,
    spec: &Spec<'_>,
    idempotent: bool,
    ok: impl Fn(&Answer, u32) -> bool,
) -> Result<Answer, Box<TransactionError>> {
    let began = Instant::now();
    let mut attempt = 0;
    loop {
        let start = ctx()?.ledger.now();
        let answer = send(user, spec).await?;
        let expected = ok(&answer, attempt);
        record(spec, start, &answer, expected)?;
        let again = answer.retryable() || (idempotent && answer.transport());
        if expected || !again || began.elapsed() > RETRY_BUDGET {
            return Ok(answer);
        }
        let pause = answer
            .retry_after
            .unwrap_or(Duration::from_secs(1))
            .min(Duration::from_secs(5));
        tokio::time::sleep(pause).await;
        attempt += 1;
    }
}

fn owner(user: &GooseUser) -> Result<(usize, String), Box<TransactionError>> {
    let ctx = ctx()?;
    let i = user.weighted_users_index % ctx.tokens.len();
    Ok((i, ctx.tokens[i].clone()))
}

/// A `.tar.gz` of a README naming `tag` and `size` random bytes.
fn bundle(tag: &str, size: usize) -> bytes::Bytes {
    let mut data = vec![0u8; size];
    rand::fill(&mut data[..]);
    let readme = format!("soak bundle {tag}\n");
    // Random bytes do not compress: do not spend CPU trying on big ones.
    let level = if size > 1 << 20 {
        flate2::Compression::none()
    } else {
        flate2::Compression::fast()
    };
    let gz = flate2::write::GzEncoder::new(Vec::with_capacity(size + 4096), level);
    let mut tar = tar::Builder::new(gz);
    for (path, bytes) in [("README.md", readme.as_bytes()), ("data.bin", &data[..])] {
        let mut h = tar::Header::new_gnu();
        h.set_size(bytes.len() as u64);
        h.set_mode(0o644);
        h.set_mtime(0);
        h.set_cksum();
        // Writing into memory cannot fail.
        let _ = tar.append_data(&mut h, path, bytes);
    }
    let gz = tar.into_inner().unwrap_or_else(|_| unreachable_gz());
    bytes::Bytes::from(gz.finish().unwrap_or_default())
}

#[cold]
fn unreachable_gz() -> flate2::write::GzEncoder<Vec<u8>> {
    flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::none())
}

/// Upload sizes: mostly small, some MiBs, a few up to 64 MiB.
fn upload_size() -> usize {
    let roll: f64 = rand::random();
    if roll < 0.70 {
        rand::random_range(1 << 10..256 << 10)
    } else if roll < 0.95 {
        rand::random_range(256 << 10..8 << 20)
    } else {
        rand::random_range(8 << 20..64 << 20)
    }
}

fn unique(prefix: &str) -> String {
    format!("{prefix}{:08x}", rand::random::<u32>())
}

/// create → upload → activate → download (digest checked) → delete.
async fn lifecycle(user: &mut GooseUser) -> TransactionResult {
    let ctx = ctx()?;
    let (owner, token) = owner(user)?;
    let name = unique("w");
    let created = create_workload(user, &token, &name).await?;
    let Some(mut grant) = created else {
        return Ok(());
    };
    let size = upload_size();
    let body = tokio::task::spawn_blocking({
        let tag = name.clone();
        move || bundle(&tag, size)
    })
    .await
    .map_err(|e| format!("making a bundle: {e}"))?;

    let Some((revision, digest, bytes)) = upload(user, &token, &name, &mut grant, body).await?
    else {
        return abandon(user, owner, &token, &name, None).await;
    };
    ctx.ledger.uploaded(
        owner,
        &name,
        &revision,
        Upload {
            bytes,
            ..Upload::default()
        },
    );

    let url = format!("/v1/workloads/{name}/activate");
    let spec = Spec::new("activate", Target::Balancer, GooseMethod::Post, url, &token)
        .json(json!({ "revision": revision }));
    if !step(user, &spec, true, |a, _| a.is(200)).await?.is(200) {
        return abandon(user, owner, &token, &name, Some(&revision)).await;
    }
    ctx.ledger
        .update_upload(owner, &name, &revision, |u| u.activated = true);
    ctx.ledger.add_active(Active {
        owner,
        name: name.clone(),
        revision: revision.clone(),
        digest: digest.clone(),
        deleting: false,
    });

    let url = format!("/v1/workloads/{name}/revisions/{revision}/bundle");
    let mut spec = Spec::new("download", Target::Balancer, GooseMethod::Get, url, &token);
    spec.hash = true;
    let want_etag = format!("\"sha256:{digest}\"");
    let got = step(user, &spec, true, |a, _| {
        a.is(200) && a.sha256.as_deref() == Some(&digest) && a.etag.as_deref() == Some(&want_etag)
    })
    .await?;
    if got.is(200) && got.sha256.as_deref() != Some(&digest) {
        mismatch(&spec)?;
    }
    if got.is(200) && got.sha256.as_deref() == Some(&digest) {
        ctx.ledger
            .update_upload(owner, &name, &revision, |u| u.verified = true);
    }

    // Readers download it meanwhile.
    tokio::time::sleep(Duration::from_millis(rand::random_range(2000..6000))).await;
    delete_workload(user, owner, &token, &name).await
}

/// A `200` whose bytes did not hash to the digest: recorded as such.
fn mismatch(spec: &Spec<'_>) -> Result<(), Box<TransactionError>> {
    let ledger = ctx()?.ledger.clone();
    let now = ledger.now();
    ledger.record(Entry {
        op: spec.op,
        target: spec.target,
        start: now,
        end: now,
        outcome: Outcome::DigestMismatch,
        expected: false,
    });
    Ok(())
}

/// An upload grant: its URL and token.
struct Grant {
    url: String,
    token: String,
}

/// `POST /v1/workloads`; the grant, or `None` when it failed (nothing
/// was created then).
async fn create_workload(
    user: &mut GooseUser,
    token: &str,
    name: &str,
) -> Result<Option<Grant>, Box<TransactionError>> {
    let began = Instant::now();
    loop {
        let spec = Spec::new(
            "create",
            Target::Balancer,
            GooseMethod::Post,
            "/v1/workloads".to_owned(),
            token,
        )
        .json(json!({ "name": name }));
        let a = step(user, &spec, false, |a, _| a.is(201)).await?;
        if a.is(201) {
            return Ok(grant_of(&a));
        }
        if !a.transport() || began.elapsed() > RETRY_BUDGET {
            return Ok(None);
        }
        // The create may have happened before the connection broke: a
        // fresh grant tells (`404`: it did not, so create again).
        match fresh_grant(user, token, name, true).await? {
            Regrant::Grant(g) => return Ok(Some(g)),
            Regrant::Absent => continue,
            Regrant::Failed => return Ok(None),
        }
    }
}

/// The grant in a `201` answer (`upload: {url, token}`).
fn grant_of(a: &Answer) -> Option<Grant> {
    let (url, token) = (a.str("/upload/url"), a.str("/upload/token"));
    (!url.is_empty() && !token.is_empty()).then_some(Grant { url, token })
}

/// What asking for a fresh grant gave.
enum Regrant {
    Grant(Grant),
    /// `404 workload_not_found` (expected only when `absent_ok`).
    Absent,
    Failed,
}

/// `POST /v1/workloads/{name}/uploads`.
async fn fresh_grant(
    user: &mut GooseUser,
    token: &str,
    name: &str,
    absent_ok: bool,
) -> Result<Regrant, Box<TransactionError>> {
    let url = format!("/v1/workloads/{name}/uploads");
    let spec = Spec::new("grant", Target::Balancer, GooseMethod::Post, url, token);
    let a = step(user, &spec, true, |a, _| {
        a.is(201) || (absent_ok && a.is(404) && a.error() == Some("workload_not_found"))
    })
    .await?;
    if a.is(201) {
        return Ok(grant_of(&a).map_or(Regrant::Failed, Regrant::Grant));
    }
    if absent_ok && a.is(404) {
        return Ok(Regrant::Absent);
    }
    Ok(Regrant::Failed)
}

/// Uploads `body` with `grant` (a fresh one after a broken connection,
/// which may have consumed it); `(revision, bundleDigest, bytes)`.
async fn upload(
    user: &mut GooseUser,
    token: &str,
    name: &str,
    grant: &mut Grant,
    body: bytes::Bytes,
) -> Result<Option<(String, String, u64)>, Box<TransactionError>> {
    let began = Instant::now();
    loop {
        let mut spec = Spec::new(
            "upload",
            Target::Balancer,
            GooseMethod::Put,
            grant.url.clone(),
            &grant.token,
        );
        spec.body = Some((body.clone(), MEDIA));
        let a = step(user, &spec, false, |a, _| a.is(201)).await?;
        if a.is(201) {
            return Ok(Some((
                a.str("/revision"),
                a.str("/bundleDigest"),
                a.json["bytes"].as_u64().unwrap_or_default(),
            )));
        }
        // After a broken connection the grant may be used up (`401`).
        let regrant = a.transport() || a.error() == Some("token_invalid");
        if !regrant || began.elapsed() > RETRY_BUDGET {
            return Ok(None);
        }
        match fresh_grant(user, token, name, false).await? {
            Regrant::Grant(g) => *grant = g,
            _ => return Ok(None),
        }
    }
}

/// Gives up on a workload after an error: deletes it (best effort).
async fn abandon(
    user: &mut GooseUser,
    owner: usize,
    token: &str,
    name: &str,
    revision: Option<&str>,
) -> TransactionResult {
    let ledger = ctx()?.ledger.clone();
    if let Some(rev) = revision {
        ledger.update_upload(owner, name, rev, |u| u.abandoned = true);
    }
    delete_workload(user, owner, token, name).await
}

/// `DELETE /v1/workloads/{name}`: `204`, or `404` once a retry follows a
/// broken connection (the first attempt may have deleted it) or the
/// create never happened.
async fn delete_workload(
    user: &mut GooseUser,
    owner: usize,
    token: &str,
    name: &str,
) -> TransactionResult {
    let ledger = ctx()?.ledger.clone();
    ledger.deleting(owner, name);
    let url = format!("/v1/workloads/{name}");
    let spec = Spec::new("delete", Target::Balancer, GooseMethod::Delete, url, token);
    step(user, &spec, true, |a, attempt| {
        a.is(204) || (attempt > 0 && a.is(404) && a.error() == Some("workload_not_found"))
    })
    .await?;
    ledger.deleted(owner, name);
    Ok(())
}

/// Downloads an active workload of some owner, as one of its readers.
async fn reader(user: &mut GooseUser) -> TransactionResult {
    let ctx = ctx()?;
    let Some(w) = ctx.ledger.pick_active() else {
        tokio::time::sleep(Duration::from_millis(500)).await;
        return Ok(());
    };
    let token = ctx.tokens[w.owner].clone();
    let url = format!("/v1/workloads/{}/revisions/{}/bundle", w.name, w.revision);
    let mut spec = Spec::new("read", Target::Balancer, GooseMethod::Get, url, &token);
    spec.hash = true;
    let ledger = ctx.ledger.clone();
    let got = step(user, &spec, true, |a, _| {
        (a.is(200) && a.sha256.as_deref() == Some(&w.digest))
            // Its owner deleted it meanwhile.
            || (a.is(404) && !ledger.is_live(w.owner, &w.name))
    })
    .await?;
    if got.is(200) && got.sha256.as_deref() != Some(&w.digest) {
        mismatch(&spec)?;
    }
    Ok(())
}

/// A delivery user's state: its pool on its replica, its workload.
#[derive(Clone, Default)]
struct Deliverer {
    pool: bool,
    /// Workload name and the README it delivers.
    workload: Option<(String, String)>,
    runs: u64,
}

fn pool_body(name: &str) -> Value {
    json!({"name": name, "replicas": 1,
        "workspace": {"size": "1Gi", "accessMode": "ReadWriteOnce"}})
}

/// Delivers its workload into its pool's sandbox on its replica, checks
/// the delivered file, releases the run; every tenth run, a fresh workload.
async fn delivery(user: &mut GooseUser) -> TransactionResult {
    let ctx = ctx()?;
    let (owner, token) = owner(user)?;
    let (target, base) = if owner % 2 == 0 {
        (Target::A, ctx.replicas[0].clone())
    } else {
        (Target::B, ctx.replicas[1].clone())
    };
    if user.get_session_data::<Deliverer>().is_none() {
        user.set_session_data(Deliverer::default());
    }
    let pool = format!("d{owner}");
    if !user.get_session_data_unchecked::<Deliverer>().pool {
        let spec = Spec::new(
            "pool-create",
            target,
            GooseMethod::Post,
            format!("{base}/v1/sandbox-pools"),
            &token,
        )
        .json(pool_body(&pool));
        let a = step(user, &spec, true, |a, attempt| {
            a.is(201) || (attempt > 0 && a.is(409))
        })
        .await?;
        if !(a.is(201) || a.is(409)) {
            return Ok(());
        }
        user.get_session_data_unchecked_mut::<Deliverer>().pool = true;
    }
    let current = user
        .get_session_data_unchecked::<Deliverer>()
        .workload
        .clone();
    let (name, readme) = match current {
        Some(w) => w,
        None => {
            let name = unique("dw");
            let Some(mut grant) = create_workload(user, &token, &name).await? else {
                return Ok(());
            };
            let body = bundle(&name, 4096);
            let Some((revision, _, _)) = upload(user, &token, &name, &mut grant, body).await?
            else {
                return abandon(user, owner, &token, &name, None).await;
            };
            let spec = Spec::new(
                "activate",
                Target::Balancer,
                GooseMethod::Post,
                format!("/v1/workloads/{name}/activate"),
                &token,
            )
            .json(json!({ "revision": revision }));
            if !step(user, &spec, true, |a, _| a.is(200)).await?.is(200) {
                return abandon(user, owner, &token, &name, None).await;
            }
            let w = (name.clone(), format!("soak bundle {name}\n"));
            user.get_session_data_unchecked_mut::<Deliverer>().workload = Some(w.clone());
            w
        }
    };
    let state = user.get_session_data_unchecked_mut::<Deliverer>();
    state.runs += 1;
    let run = format!("r{}", state.runs);
    let spec = Spec::new(
        "deliver",
        target,
        GooseMethod::Post,
        format!("{base}/v1/workloads/{name}/deliveries"),
        &token,
    )
    .json(json!({"runId": run, "sandbox": format!("sandbox-{pool}-0")}));
    // Delivering a run again with the same revision is idempotent.
    let a = step(user, &spec, true, |a, _| a.is(201)).await?;
    if a.is(201) {
        let path = a.str("/deliveries/0/path");
        let delivered = std::fs::read_to_string(std::path::Path::new(&path).join("README.md"));
        if delivered.ok().as_deref() != Some(readme.as_str()) {
            mismatch(&spec)?;
        }
        let spec = Spec::new(
            "release",
            target,
            GooseMethod::Delete,
            format!("{base}/v1/workloads/{name}/deliveries/{run}"),
            &token,
        );
        step(user, &spec, true, |a, attempt| {
            a.is(204) || (attempt > 0 && a.error() == Some("run_not_found"))
        })
        .await?;
    }
    if !a.is(201) || user.get_session_data_unchecked::<Deliverer>().runs % 10 == 0 {
        user.get_session_data_unchecked_mut::<Deliverer>().workload = None;
        delete_workload(user, owner, &token, &name).await?;
    }
    Ok(())
}

/// Creates a pool on one replica and deletes it again.
async fn pool_churn(user: &mut GooseUser) -> TransactionResult {
    let ctx = ctx()?;
    let (owner, token) = owner(user)?;
    let (target, base) = if rand::random::<bool>() {
        (Target::A, ctx.replicas[0].clone())
    } else {
        (Target::B, ctx.replicas[1].clone())
    };
    let name = unique(&format!("c{owner}-"));
    let spec = Spec::new(
        "pool-create",
        target,
        GooseMethod::Post,
        format!("{base}/v1/sandbox-pools"),
        &token,
    )
    .json(pool_body(&name));
    let a = step(user, &spec, true, |a, attempt| {
        a.is(201) || (attempt > 0 && a.is(409))
    })
    .await?;
    if a.is(201) || a.is(409) {
        let spec = Spec::new(
            "pool-delete",
            target,
            GooseMethod::Delete,
            format!("{base}/v1/sandbox-pools/{name}"),
            &token,
        );
        step(user, &spec, true, |a, attempt| {
            a.is(204) || (attempt > 0 && a.is(404))
        })
        .await?;
    }
    Ok(())
}

/// Makes the hostile bodies (the bomb takes a few seconds), before the
/// attack starts.
pub(crate) fn prepare(bomb_bytes: u64) {
    hostile_bodies(bomb_bytes);
}

/// The hostile uploads: (label, body, media type).
fn hostile_bodies(bomb_bytes: u64) -> &'static [(&'static str, bytes::Bytes, &'static str)] {
    static BODIES: OnceLock<Vec<(&'static str, bytes::Bytes, &'static str)>> = OnceLock::new();
    BODIES.get_or_init(|| {
        use std::io::Write as _;
        let gz = |tar: &[u8]| {
            let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
            let _ = e.write_all(tar);
            bytes::Bytes::from(e.finish().unwrap_or_default())
        };
        // A tar entry climbing out of the tree (set in the raw header: the
        // tar crate refuses to write `..`).
        let mut h = tar::Header::new_old();
        let path = b"../escaped.txt";
        h.as_old_mut().name[..path.len()].copy_from_slice(path);
        h.set_size(3);
        h.set_mode(0o644);
        h.set_cksum();
        let mut traversal = h.as_bytes().to_vec();
        traversal.extend_from_slice(&[b'x'; 3]);
        traversal.resize(512 + 512, 0);
        traversal.extend_from_slice(&[0; 1024]);
        // One file of zeros inflating past the service's limit.
        let mut bomb = tar::Builder::new(flate2::write::GzEncoder::new(
            Vec::new(),
            flate2::Compression::best(),
        ));
        let mut h = tar::Header::new_gnu();
        h.set_size(bomb_bytes);
        h.set_mode(0o644);
        h.set_cksum();
        let _ = bomb.append_data(
            &mut h,
            "zeros.bin",
            std::io::Read::take(std::io::repeat(0), bomb_bytes),
        );
        let bomb = bomb
            .into_inner()
            .ok()
            .and_then(|e| e.finish().ok())
            .unwrap_or_default();
        let good = bundle("hostile", 2048);
        let truncated = good.slice(..good.len() / 2);
        let mut garbage = vec![0u8; 4096];
        rand::fill(&mut garbage[..]);
        vec![
            ("traversal", gz(&traversal), MEDIA),
            ("bomb", bytes::Bytes::from(bomb), MEDIA),
            ("truncated", truncated, MEDIA),
            ("garbage", bytes::Bytes::from(garbage), MEDIA),
            ("wrong-media-type", good, "application/zip"),
        ]
    })
}

/// A hostile upload: must be refused with a documented `4xx`, and leave a
/// workload that deletes cleanly.
async fn hostile(user: &mut GooseUser) -> TransactionResult {
    let ctx = ctx()?;
    let (owner, token) = owner(user)?;
    let bodies = hostile_bodies(ctx.bomb_bytes);
    let (_, body, media) = &bodies[rand::random_range(0..bodies.len())];
    let name = unique("h");
    let Some(grant) = create_workload(user, &token, &name).await? else {
        return Ok(());
    };
    let mut spec = Spec::new(
        "hostile-upload",
        Target::Balancer,
        GooseMethod::Put,
        grant.url.clone(),
        &grant.token,
    );
    spec.body = Some((body.clone(), media));
    step(user, &spec, false, |a, _| {
        matches!(a.code(), Some(400..=499))
            && a.error().is_some_and(|e| UPLOAD_REFUSALS.contains(&e))
    })
    .await?;
    delete_workload(user, owner, &token, &name).await
}
