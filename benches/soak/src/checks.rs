//! The invariants, read from the stores themselves once the load stopped:
//! the workload records in PostgreSQL (decoded as the service decodes
//! them), the objects in the bucket (listed with the service's own
//! `ObjectBlobs`), and the replicas' data dirs.

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use context_service::store::{ObjectBlobs, WorkloadRecord};

/// What the stores hold after the run.
#[derive(Debug, Default)]
pub(crate) struct StoreFacts {
    /// Workload records left (cut off by the end of the run).
    pub(crate) workloads: usize,
    /// Digests the records name (candidate or active).
    pub(crate) named: usize,
    /// Objects in the bucket.
    pub(crate) objects: usize,
    /// Named digests with no object: a revision naming a missing blob.
    pub(crate) missing: Vec<String>,
    /// Objects nothing names, after the sweep had its chance.
    pub(crate) orphans: Vec<String>,
    /// How long the orphans took to go (the sweep).
    pub(crate) swept_after: Duration,
    /// Temp files and staging dirs under the replicas' data dirs.
    pub(crate) leftovers: Vec<PathBuf>,
}

/// The digests the workload records in `database_url` name; and how many
/// records there are.
async fn named_digests(database_url: &str) -> anyhow::Result<(usize, HashSet<String>)> {
    let (client, connection) = tokio_postgres::connect(database_url, tokio_postgres::NoTls)
        .await
        .context("connecting to PostgreSQL")?;
    let conn = tokio::spawn(connection);
    let rows = client
        .query("SELECT record FROM cs_workloads", &[])
        .await
        .context("reading cs_workloads")?;
    let mut named = HashSet::new();
    for row in &rows {
        let bytes: Vec<u8> = row.get(0);
        let record: WorkloadRecord =
            serde_json::from_slice(&bytes).context("decoding a workload record")?;
        for rev in [&record.candidate, &record.active].into_iter().flatten() {
            named.insert(rev.bundle_digest.clone());
        }
    }
    drop(client);
    conn.abort();
    Ok((rows.len(), named))
}

/// Reads the stores; waits up to `sweep_wait` for unnamed objects to be
/// swept (objects younger than the grace are legitimately kept).
pub(crate) async fn stores(
    database_url: &str,
    blob_url: &str,
    data_dirs: &[&Path],
    sweep_wait: Duration,
) -> anyhow::Result<StoreFacts> {
    let blobs = ObjectBlobs::from_url(blob_url).context("opening the bucket")?;
    let began = Instant::now();
    let mut facts = StoreFacts::default();
    loop {
        let (workloads, named) = named_digests(database_url).await?;
        let objects: HashSet<String> = blobs
            .list()
            .await
            .context("listing the bucket")?
            .into_iter()
            .map(|o| o.digest)
            .collect();
        facts.workloads = workloads;
        facts.named = named.len();
        facts.objects = objects.len();
        facts.missing = named.difference(&objects).cloned().collect();
        facts.orphans = objects.difference(&named).cloned().collect();
        facts.swept_after = began.elapsed();
        if facts.orphans.is_empty() || began.elapsed() > sweep_wait {
            break;
        }
        tokio::time::sleep(Duration::from_secs(5)).await;
    }
    for dir in data_dirs {
        leftovers(dir, &mut facts.leftovers);
        // The upload spool: empty when no upload runs.
        if let Ok(entries) = std::fs::read_dir(dir.join("tmp")) {
            facts.leftovers.extend(entries.flatten().map(|e| e.path()));
        }
    }
    Ok(facts)
}

/// Temp files (`.tmp-*`) and delivery staging dirs (`.staging.*`) under
/// `dir`.
fn leftovers(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        if name.starts_with(".tmp-") || name.starts_with(".staging.") {
            out.push(entry.path());
            continue;
        }
        if entry.file_type().is_ok_and(|t| t.is_dir()) {
            leftovers(&entry.path(), out);
        }
    }
}
