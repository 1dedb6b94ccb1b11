//! `context-service migrate`: copies a single replica's embedded store (redb
//! metadata and content-addressed blob files under its data dir) into the
//! scale-out stores, PostgreSQL (`--database-url`) and object storage
//! (`--blob-url`).
//!
//! * The source is opened read-only and only while no service holds it
//!   ([`RedbSource`]; the data dir's lock is held throughout); nothing under
//!   the data dir is written.
//! * Per workload, in this order: each bundle it names (candidate, active)
//!   is hashed and checked against the record, uploaded unless an object of
//!   that size is there, and read back and checked again; only then the
//!   record is inserted, then its unexpired grants and its delivery runs. A
//!   workload with a bad or missing bundle is not named in the target at
//!   all, so an interrupted or failed run leaves nothing half-copied that a
//!   service would serve.
//! * Records go in verbatim and only where the target has none under the
//!   key: running it again copies nothing, and a record that differs in the
//!   target is a conflict, reported and left alone.

use std::collections::{BTreeMap, HashSet};
use std::io;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use serde::de::DeserializeOwned;

use crate::clock::now_ms;
use crate::fsutil::lock::{DataDirLock, LockError};
use crate::store::{
    hash_file, is_digest, DatabaseUrl, GrantRecord, MetadataStore, ObjectBlobs, ObjectError,
    PostgresStore, PutOutcome, RedbSource, RevisionRecord, SourceRecord, StoreError,
    WorkloadRecord, WorkloadStatus, SCHEMA_OWNER_KINDS,
};

/// Settings of `context-service migrate`.
#[derive(Debug, Clone, clap::Args)]
pub struct MigrateConfig {
    /// Data dir of the single-replica service to copy from (its
    /// `store/meta.redb`, `blobs/` and `auth/server-secret`). Stop the
    /// service first; nothing in it is modified.
    #[arg(long, value_name = "DIR")]
    pub from_data_dir: PathBuf,

    /// The PostgreSQL database to copy the metadata into, as for `serve`.
    #[arg(long, env = "CS_DATABASE_URL")]
    pub database_url: DatabaseUrl,

    /// The object storage to copy the bundles into, `s3://<bucket>[/<prefix>]`,
    /// as for `serve` (endpoint and credentials from `AWS_*` variables).
    #[arg(long, env = "CS_BLOB_URL")]
    pub blob_url: String,

    /// Write the owner-scope key the replicas must share to FILE (mode
    /// 0600; `hex:` and the source's `auth/server-secret`), ready for
    /// `--owner-scope-secret-file`. Unset: print how to put it in the
    /// Secret of the HA overlay.
    #[arg(long, value_name = "FILE")]
    pub write_owner_scope_key: Option<PathBuf>,
}

/// Counts of one kind of record.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Counts {
    /// Inserted into the target.
    pub copied: usize,
    /// Already in the target, the same.
    pub already: usize,
    /// In the target and different: left alone.
    pub conflicts: usize,
}

/// What a run did.
#[derive(Debug, Default)]
pub struct Report {
    /// Workload records.
    pub workloads: Counts,
    /// Unexpired grants of copied workloads.
    pub grants: Counts,
    /// Delivery run records.
    pub runs: Counts,
    /// Bundle objects uploaded.
    pub blobs_copied: usize,
    /// Bundle objects found in object storage already (and checked).
    pub blobs_already: usize,
    /// Bytes uploaded.
    pub bytes_copied: u64,
    /// One line per record or bundle not copied (conflicts included).
    pub problems: Vec<String>,
}

impl Report {
    /// Whether nothing was written to the target.
    pub fn copied_nothing(&self) -> bool {
        self.workloads.copied + self.grants.copied + self.runs.copied + self.blobs_copied == 0
    }
}

/// Why the migration stopped before the end.
#[derive(Debug, thiserror::Error)]
pub enum MigrateError {
    /// The source could not be read.
    #[error(transparent)]
    Source(#[from] crate::store::SourceError),
    /// The metadata database failed.
    #[error("{0}")]
    Database(String),
    /// The object storage failed as a whole (unreachable, refused).
    #[error("{0}")]
    Storage(String),
    /// Anything else (the key file, the schema).
    #[error("{0}")]
    Other(String),
}

fn db_err(e: StoreError) -> MigrateError {
    MigrateError::Database(format!("--database-url/CS_DATABASE_URL: {e}"))
}

/// Where the embedded store's owner-scope key lives.
fn server_secret_path(data_dir: &Path) -> PathBuf {
    data_dir.join("auth").join("server-secret")
}

/// Runs `context-service migrate` and prints its summary; the exit code
/// (`0` everything is in the target, `1` something is not).
pub fn run_cli(config: &MigrateConfig) -> ExitCode {
    // One worker is plenty: the copy is sequential.
    let result = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .map_err(|e| MigrateError::Other(format!("starting a runtime: {e}")))
        .and_then(|runtime| {
            let owned = config.clone();
            crate::runtime::run_to_end(&runtime, async move { run(&owned).await })
                .unwrap_or_else(|e| Err(MigrateError::Other(format!("{e:#}"))))
        });
    match result {
        Ok(report) => {
            print_summary(config, &report);
            for line in &report.problems {
                eprintln!("context-service: {line}");
            }
            if report.problems.is_empty() {
                ExitCode::SUCCESS
            } else {
                ExitCode::FAILURE
            }
        }
        Err(e) => {
            eprintln!("context-service: {e}");
            ExitCode::FAILURE
        }
    }
}

fn print_summary(config: &MigrateConfig, r: &Report) {
    let counts = |c: &Counts| {
        format!(
            "{} copied, {} already there, {} conflicts",
            c.copied, c.already, c.conflicts
        )
    };
    println!(
        "migrated {} into {} and {}",
        config.from_data_dir.display(),
        config.database_url,
        config.blob_url
    );
    println!("workloads: {}", counts(&r.workloads));
    println!("grants:    {}", counts(&r.grants));
    println!("runs:      {}", counts(&r.runs));
    println!(
        "blobs:     {} copied ({} bytes), {} already there",
        r.blobs_copied, r.bytes_copied, r.blobs_already
    );
    if r.copied_nothing() && r.problems.is_empty() {
        println!("nothing to copy: the target already holds everything");
    }
    let secret = server_secret_path(&config.from_data_dir);
    match &config.write_owner_scope_key {
        Some(path) => println!(
            "owner-scope key written to {}: start every replica with \
             --owner-scope-secret-file {}",
            path.display(),
            path.display()
        ),
        None => println!(
            "next: put the owner-scope key into the HA overlay's Secret \
             (deploy/overlays/ha): kubectl -n context-service create secret generic \
             context-service-owner-scope --from-literal=key=\"hex:$(cat {})\"",
            secret.display()
        ),
    }
}

/// Copies everything; problems with single records are in the report,
/// failures of a whole store end it early.
pub async fn run(config: &MigrateConfig) -> Result<Report, MigrateError> {
    let dir = &config.from_data_dir;
    // Held to the end: no service may start on the source meanwhile.
    let _lock = DataDirLock::acquire_existing(dir).map_err(|e| match e {
        LockError::InUse { .. } => {
            MigrateError::Other(format!("{e}: stop it first; migrate must be its only user"))
        }
        LockError::Io { .. } => MigrateError::Other(e.to_string()),
    })?;
    let secret = read_server_secret(dir)?;
    let source = RedbSource::open(&dir.join("store").join("meta.redb"))?;
    let version = source.schema_version()?;
    if version != SCHEMA_OWNER_KINDS {
        return Err(MigrateError::Other(format!(
            "the embedded store in {} is at schema version {version}, this build copies \
             version {SCHEMA_OWNER_KINDS}: start and stop `context-service serve` of this \
             version on it once, then migrate",
            dir.display()
        )));
    }
    let workloads = source.workloads()?;
    let grants = source.grants()?;
    let runs = source.runs()?;
    let blobs = dir.join("blobs").join("sha256");
    let objects = ObjectBlobs::from_url(&config.blob_url)
        .map_err(|e| MigrateError::Storage(format!("--blob-url/CS_BLOB_URL: {e}")))?;
    let target = PostgresStore::connect(&config.database_url)
        .await
        .map_err(db_err)?;
    let mut report = Report::default();
    let now_ms = now_ms();
    // Workloads whose records (or lack of them) keep their grants and runs
    // out of the target.
    let mut held_back: HashSet<(String, String)> = HashSet::new();
    // Grants go in with their workload only: a grant missing beside a
    // workload already there may have been used or revoked on a replica,
    // and must not come back.
    let mut grants_of: BTreeMap<&str, Vec<&SourceRecord<GrantRecord>>> = BTreeMap::new();
    for g in &grants {
        // Expired grants are useless.
        if g.record.expires_at_ms >= now_ms {
            grants_of
                .entry(g.record.workload_uid.as_str())
                .or_default()
                .push(g);
        }
    }
    for w in &workloads {
        let rec = &w.record;
        let label = format!("workload {}/{}", rec.owner, rec.name);
        if rec.status == WorkloadStatus::Deleting {
            // Being deleted: a service would finish the delete at start.
            held_back.insert((rec.owner.clone(), rec.name.clone()));
            continue;
        }
        let copied_blobs = copy_blobs(&blobs, &objects, rec, &label).await;
        match copied_blobs {
            Ok(done) => {
                report.blobs_copied += done.copied;
                report.blobs_already += done.already;
                report.bytes_copied += done.bytes;
            }
            Err(BlobProblem::Fatal(e)) => return Err(e),
            Err(BlobProblem::Refused(line)) => {
                report.problems.push(line);
                held_back.insert((rec.owner.clone(), rec.name.clone()));
                continue;
            }
        }
        let existing = target.import_workload(rec, &w.raw).await.map_err(db_err)?;
        let inserted = match classify(existing, w) {
            Outcome::Copied => {
                report.workloads.copied += 1;
                true
            }
            Outcome::Same => {
                report.workloads.already += 1;
                false
            }
            Outcome::Differs(detail) => {
                report.workloads.conflicts += 1;
                report.problems.push(format!(
                    "conflict: {label} is in the target already and differs ({detail}); \
                     left alone"
                ));
                held_back.insert((rec.owner.clone(), rec.name.clone()));
                continue;
            }
        };
        for g in grants_of.get(rec.uid.as_str()).into_iter().flatten() {
            let outcome = if inserted {
                let existing = target
                    .import_grant(&g.record, &g.raw)
                    .await
                    .map_err(db_err)?;
                classify(existing, g)
            } else {
                match target.grant(&g.record.id).await.map_err(db_err)? {
                    // Used or revoked there: not brought back, not counted.
                    None => continue,
                    Some(there) => classify(Some(encode_grant(&there)?), g),
                }
            };
            match outcome {
                Outcome::Copied => report.grants.copied += 1,
                Outcome::Same => report.grants.already += 1,
                Outcome::Differs(_) => {
                    report.grants.conflicts += 1;
                    report.problems.push(format!(
                        "conflict: upload grant {} of {label} is in the target already \
                         and differs; left alone",
                        g.record.id
                    ));
                }
            }
        }
    }
    for r in &runs {
        let rec = &r.record;
        if held_back.contains(&(rec.owner.clone(), rec.workload.clone())) {
            continue;
        }
        let existing = target.import_run(rec, &r.raw).await.map_err(db_err)?;
        match classify(existing, r) {
            Outcome::Copied => report.runs.copied += 1,
            Outcome::Same => report.runs.already += 1,
            Outcome::Differs(_) => {
                report.runs.conflicts += 1;
                report.problems.push(format!(
                    "conflict: delivery run {} of workload {}/{} is in the target already \
                     and differs; left alone",
                    rec.run_id, rec.owner, rec.workload
                ));
            }
        }
    }
    if let Some(path) = &config.write_owner_scope_key {
        if let Some(secret) = &secret {
            crate::fsutil::write_atomic(path, format!("hex:{secret}\n").as_bytes(), 0o600)
                .map_err(|e| {
                    MigrateError::Other(format!("--write-owner-scope-key {}: {e}", path.display()))
                })?;
        }
    }
    Ok(report)
}

/// The source's owner-scope key as its hex text, checked the way the
/// service reads it; `None` when the data dir has none.
fn read_server_secret(dir: &Path) -> Result<Option<String>, MigrateError> {
    let path = server_secret_path(dir);
    let text = match std::fs::read_to_string(&path) {
        Ok(t) => t,
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            if dir.join("store").join("meta.redb").is_file() {
                return Err(MigrateError::Other(format!(
                    "{} is missing: without it the replicas cannot keep the owners' \
                     scopes (if the service ran with --owner-scope-secret-file, keep \
                     using that file; copy it to {} to migrate)",
                    path.display(),
                    path.display()
                )));
            }
            return Ok(None);
        }
        Err(e) => return Err(MigrateError::Other(format!("{}: {e}", path.display()))),
    };
    let hex_text = text.trim().to_owned();
    match hex::decode(&hex_text) {
        Ok(bytes) if bytes.len() >= 16 => Ok(Some(hex_text)),
        _ => Err(MigrateError::Other(format!(
            "{}: not a hex key of at least 16 bytes",
            path.display()
        ))),
    }
}

enum Outcome {
    Copied,
    Same,
    Differs(String),
}

fn encode_grant(grant: &GrantRecord) -> Result<Vec<u8>, MigrateError> {
    serde_json::to_vec(grant).map_err(|e| MigrateError::Other(format!("encoding a grant: {e}")))
}

/// What the target held under the record's key: nothing (now the copy),
/// the same record, or another one.
fn classify<T: DeserializeOwned + PartialEq + Versioned>(
    existing: Option<Vec<u8>>,
    source: &SourceRecord<T>,
) -> Outcome {
    let Some(bytes) = existing else {
        return Outcome::Copied;
    };
    if bytes == source.raw {
        return Outcome::Same;
    }
    match serde_json::from_slice::<T>(&bytes) {
        Ok(there) if there == source.record => Outcome::Same,
        Ok(there) => Outcome::Differs(match (there.version(), source.record.version()) {
            (Some(t), Some(s)) => format!("version {t} there, {s} here"),
            _ => "other contents".to_owned(),
        }),
        Err(_) => Outcome::Differs("the target's record does not decode".to_owned()),
    }
}

/// A record's compare-and-swap version, where it has one.
trait Versioned {
    fn version(&self) -> Option<u64>;
}

impl Versioned for WorkloadRecord {
    fn version(&self) -> Option<u64> {
        Some(self.version)
    }
}

impl Versioned for GrantRecord {
    fn version(&self) -> Option<u64> {
        None
    }
}

impl Versioned for crate::store::RunRecord {
    fn version(&self) -> Option<u64> {
        None
    }
}

#[derive(Default)]
struct BlobsDone {
    copied: usize,
    already: usize,
    bytes: u64,
}

enum BlobProblem {
    /// This workload's bundle: the workload is not copied.
    Refused(String),
    /// The object storage as a whole: the run stops.
    Fatal(MigrateError),
}

/// Copies and checks the bundles `rec` names (blob files under `blobs`,
/// the source's `blobs/sha256`).
async fn copy_blobs(
    blobs: &Path,
    objects: &ObjectBlobs,
    rec: &WorkloadRecord,
    label: &str,
) -> Result<BlobsDone, BlobProblem> {
    let mut done = BlobsDone::default();
    let revisions: BTreeMap<&str, &RevisionRecord> = rec
        .candidate
        .iter()
        .chain(rec.active.iter())
        .map(|r| (r.bundle_digest.as_str(), r))
        .collect();
    for (digest, rev) in revisions {
        let refused = |why: String| {
            BlobProblem::Refused(format!(
                "{label}: bundle {digest} {why}; workload not copied"
            ))
        };
        if !is_digest(digest) {
            return Err(refused("is not a sha256 digest".to_owned()));
        }
        // The blob store's layout, read in place (opening it would create
        // directories in the source).
        let path = blobs.join(&digest[..2]).join(digest);
        let file = path.clone();
        let hashed = tokio::task::spawn_blocking(move || hash_file(&file))
            .await
            .map_err(|e| refused(format!("hashing failed: {e}")))?;
        let (size, sha) = match hashed {
            Ok(found) => found,
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                if rec.status == WorkloadStatus::Failed {
                    // Recovery found it missing before: the record says so.
                    continue;
                }
                return Err(refused(format!("is missing ({})", path.display())));
            }
            Err(e) => return Err(refused(format!("cannot be read: {e}"))),
        };
        if size != rev.bytes || sha != digest {
            return Err(refused(format!(
                "does not match its record: {} holds {size} bytes with sha256 {sha}, \
                 the record names {} bytes",
                path.display(),
                rev.bytes
            )));
        }
        let object = |e: ObjectError| match e {
            ObjectError::Unavailable(why) => BlobProblem::Fatal(MigrateError::Storage(format!(
                "--blob-url/CS_BLOB_URL {}: object storage is unavailable: {why}",
                objects.url()
            ))),
            other => refused(format!("in object storage: {other}")),
        };
        let outcome = objects
            .put_file(&path, digest, rev.bytes)
            .await
            .map_err(object)?;
        // Read back what object storage now holds, and check it again.
        let scratch = tempfile::tempfile().map_err(|e| refused(format!("temp file: {e}")))?;
        objects
            .fetch_into(digest, rev.bytes, scratch)
            .await
            .map_err(object)?;
        match outcome {
            PutOutcome::Written => {
                done.copied += 1;
                done.bytes += rev.bytes;
            }
            PutOutcome::Existing => done.already += 1,
        }
    }
    Ok(done)
}
