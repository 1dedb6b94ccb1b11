//! [`MetadataStore`] on redb: one file, ACID transactions, fsync on commit.

use std::path::Path;
use std::sync::Arc;

use redb::{Database, ReadableDatabase, ReadableTable, TableDefinition, TableHandle};

use super::{
    GrantRecord, MetadataStore, OwnerMigration, RunRecord, RunStore, StoreError, WorkloadRecord,
    SCHEMA_OWNER_KINDS,
};
use crate::fsutil;

/// Workloads by [`workload_key`]; values are JSON records.
pub(super) const WORKLOADS: TableDefinition<&str, &[u8]> = TableDefinition::new("workloads");
/// Grants by public id; values are JSON records.
pub(super) const GRANTS: TableDefinition<&str, &[u8]> = TableDefinition::new("grants");
/// Delivery runs by [`run_key`]; values are JSON records.
pub(super) const RUNS: TableDefinition<&str, &[u8]> = TableDefinition::new("delivery_runs");
/// Store-wide facts; [`SCHEMA_KEY`] is the records' schema version.
pub(super) const META: TableDefinition<&str, u64> = TableDefinition::new("meta");
pub(super) const SCHEMA_KEY: &str = "schema_version";

/// The redb-backed metadata store. redb blocks (file I/O, fsync on
/// commit), so each call runs its transaction on tokio's blocking pool.
#[derive(Debug, Clone)]
pub struct RedbStore {
    tables: Arc<Tables>,
}

/// The database and its synchronous transactions.
#[derive(Debug)]
struct Tables {
    db: Database,
}

fn db_err(e: impl std::fmt::Display) -> StoreError {
    StoreError::Database(e.to_string())
}

/// Owner prefix of a key: the owner's length first, so no owner's prefix is
/// a prefix of another owner's keys whatever characters names contain.
fn owner_prefix(owner: &str) -> String {
    format!("{:08x}{owner}", owner.len())
}

fn workload_key(owner: &str, name: &str) -> String {
    format!("{}/{name}", owner_prefix(owner))
}

/// Prefix of the keys of the owner's runs of `workload` (a workload name
/// holds no `/`).
fn runs_prefix(owner: &str, workload: &str) -> String {
    format!("{}/{workload}/", owner_prefix(owner))
}

fn run_key(owner: &str, workload: &str, run_id: &str) -> String {
    format!("{}{run_id}", runs_prefix(owner, workload))
}

/// The record stored under `key` in `table`, decoded.
fn read<T: serde::de::DeserializeOwned>(
    table: &impl ReadableTable<&'static str, &'static [u8]>,
    key: &str,
) -> Result<Option<T>, StoreError> {
    let value = table.get(key).map_err(db_err)?;
    value.map(|v| decode(key, v.value())).transpose()
}

fn decode<T: serde::de::DeserializeOwned>(key: &str, bytes: &[u8]) -> Result<T, StoreError> {
    serde_json::from_slice(bytes).map_err(|e| StoreError::Corrupt {
        key: key.to_owned(),
        detail: e.to_string(),
    })
}

fn encode<T: serde::Serialize>(value: &T) -> Result<Vec<u8>, StoreError> {
    serde_json::to_vec(value).map_err(db_err)
}

impl RedbStore {
    /// Opens (or creates) the database file at `path`. Blocking: call it
    /// from a blocking thread (or before the runtime serves anything).
    pub fn open(path: &Path) -> Result<Self, StoreError> {
        // redb would create the file with the umask's permissions: create
        // it (or narrow it) first; redb initialises an empty file.
        fsutil::open_private(path)
            .map_err(|e| StoreError::Database(format!("opening {}: {e}", path.display())))?;
        let db = Database::create(path).map_err(db_err)?;
        // Create the tables up front so read transactions never miss them.
        let txn = db.begin_write().map_err(db_err)?;
        let fresh = !txn
            .list_tables()
            .map_err(db_err)?
            .any(|t| t.name() == WORKLOADS.name());
        txn.open_table(WORKLOADS).map_err(db_err)?;
        txn.open_table(GRANTS).map_err(db_err)?;
        txn.open_table(RUNS).map_err(db_err)?;
        {
            let mut meta = txn.open_table(META).map_err(db_err)?;
            // A new database starts at the current schema; an existing one
            // without a version is version 1 until migrated.
            if fresh {
                meta.insert(SCHEMA_KEY, SCHEMA_OWNER_KINDS)
                    .map_err(db_err)?;
            }
        }
        txn.commit().map_err(db_err)?;
        Ok(Self {
            tables: Arc::new(Tables { db }),
        })
    }

    /// The records' schema version (1 when none is recorded).
    pub async fn schema_version(&self) -> Result<u64, StoreError> {
        self.blocking(Tables::schema_version).await
    }

    /// Runs `f` on the tables on tokio's blocking pool, in the caller's
    /// span (so its log lines name the request).
    async fn blocking<T: Send + 'static>(
        &self,
        f: impl FnOnce(&Tables) -> Result<T, StoreError> + Send + 'static,
    ) -> Result<T, StoreError> {
        let tables = self.tables.clone();
        let span = tracing::Span::current();
        tokio::task::spawn_blocking(move || span.in_scope(|| f(&tables)))
            .await
            .map_err(|e| StoreError::Database(format!("metadata task failed: {e}")))?
    }
}

impl Tables {
    fn schema_version(&self) -> Result<u64, StoreError> {
        let txn = self.db.begin_read().map_err(db_err)?;
        let meta = txn.open_table(META).map_err(db_err)?;
        Ok(meta
            .get(SCHEMA_KEY)
            .map_err(db_err)?
            .map_or(1, |v| v.value()))
    }

    fn scan(&self, prefix: &str) -> Result<Vec<WorkloadRecord>, StoreError> {
        let txn = self.db.begin_read().map_err(db_err)?;
        let table = txn.open_table(WORKLOADS).map_err(db_err)?;
        let mut out = Vec::new();
        for item in table.range::<&str>(prefix..).map_err(db_err)? {
            let (k, v) = item.map_err(db_err)?;
            if !k.value().starts_with(prefix) {
                break;
            }
            out.push(decode(k.value(), v.value())?);
        }
        Ok(out)
    }
}

impl Tables {
    fn insert_workload(
        &self,
        record: &WorkloadRecord,
        grant: &GrantRecord,
        quota: usize,
    ) -> Result<(), StoreError> {
        let key = workload_key(&record.owner, &record.name);
        let prefix = format!("{}/", owner_prefix(&record.owner));
        let txn = self.db.begin_write().map_err(db_err)?;
        {
            let mut table = txn.open_table(WORKLOADS).map_err(db_err)?;
            if table.get(key.as_str()).map_err(db_err)?.is_some() {
                return Err(StoreError::NameTaken);
            }
            let mut count = 0usize;
            for item in table.range::<&str>(prefix.as_str()..).map_err(db_err)? {
                let (k, _) = item.map_err(db_err)?;
                if !k.value().starts_with(prefix.as_str()) {
                    break;
                }
                count += 1;
            }
            if count >= quota {
                return Err(StoreError::QuotaExceeded(quota));
            }
            let mut stored = record.clone();
            stored.version = 1;
            table
                .insert(key.as_str(), encode(&stored)?.as_slice())
                .map_err(db_err)?;
            let mut grants = txn.open_table(GRANTS).map_err(db_err)?;
            grants
                .insert(grant.id.as_str(), encode(grant)?.as_slice())
                .map_err(db_err)?;
        }
        txn.commit().map_err(db_err)
    }

    fn workload(&self, owner: &str, name: &str) -> Result<Option<WorkloadRecord>, StoreError> {
        let key = workload_key(owner, name);
        let txn = self.db.begin_read().map_err(db_err)?;
        let table = txn.open_table(WORKLOADS).map_err(db_err)?;
        read(&table, &key)
    }

    fn workloads_of(&self, owner: &str) -> Result<Vec<WorkloadRecord>, StoreError> {
        self.scan(&format!("{}/", owner_prefix(owner)))
    }

    fn all_workloads(&self) -> Result<Vec<WorkloadRecord>, StoreError> {
        self.scan("")
    }

    fn replace_workload(
        &self,
        record: &WorkloadRecord,
        consume_grant: Option<&str>,
    ) -> Result<WorkloadRecord, StoreError> {
        let key = workload_key(&record.owner, &record.name);
        let txn = self.db.begin_write().map_err(db_err)?;
        let mut stored = record.clone();
        {
            let mut table = txn.open_table(WORKLOADS).map_err(db_err)?;
            let current: WorkloadRecord = match table.get(key.as_str()).map_err(db_err)? {
                None => return Err(StoreError::NotFound),
                Some(v) => decode(&key, v.value())?,
            };
            if current.version != record.version || current.uid != record.uid {
                return Err(StoreError::Conflict);
            }
            if let Some(id) = consume_grant {
                let mut grants = txn.open_table(GRANTS).map_err(db_err)?;
                if grants.remove(id).map_err(db_err)?.is_none() {
                    return Err(StoreError::GrantUsed);
                }
            }
            stored.version = current.version + 1;
            table
                .insert(key.as_str(), encode(&stored)?.as_slice())
                .map_err(db_err)?;
        }
        txn.commit().map_err(db_err)?;
        Ok(stored)
    }

    fn remove_workload(&self, owner: &str, name: &str, version: u64) -> Result<(), StoreError> {
        let key = workload_key(owner, name);
        let txn = self.db.begin_write().map_err(db_err)?;
        {
            let mut table = txn.open_table(WORKLOADS).map_err(db_err)?;
            let current: WorkloadRecord = match table.get(key.as_str()).map_err(db_err)? {
                None => return Err(StoreError::NotFound),
                Some(v) => decode(&key, v.value())?,
            };
            if current.version != version {
                return Err(StoreError::Conflict);
            }
            table.remove(key.as_str()).map_err(db_err)?;
            let mut grants = txn.open_table(GRANTS).map_err(db_err)?;
            grants
                .retain(|_, v| {
                    serde_json::from_slice::<GrantRecord>(v)
                        .map(|g| g.workload_uid != current.uid)
                        .unwrap_or(false)
                })
                .map_err(db_err)?;
        }
        txn.commit().map_err(db_err)
    }

    fn insert_grant(&self, grant: &GrantRecord) -> Result<(), StoreError> {
        let txn = self.db.begin_write().map_err(db_err)?;
        {
            let mut grants = txn.open_table(GRANTS).map_err(db_err)?;
            grants
                .insert(grant.id.as_str(), encode(grant)?.as_slice())
                .map_err(db_err)?;
        }
        txn.commit().map_err(db_err)
    }

    fn remove_grant(&self, id: &str) -> Result<bool, StoreError> {
        let txn = self.db.begin_write().map_err(db_err)?;
        let removed = {
            let mut grants = txn.open_table(GRANTS).map_err(db_err)?;
            let removed = grants.remove(id).map_err(db_err)?.is_some();
            removed
        };
        txn.commit().map_err(db_err)?;
        Ok(removed)
    }

    fn grant(&self, id: &str) -> Result<Option<GrantRecord>, StoreError> {
        let txn = self.db.begin_read().map_err(db_err)?;
        let table = txn.open_table(GRANTS).map_err(db_err)?;
        let value = table.get(id).map_err(db_err)?;
        value.map(|v| decode(id, v.value())).transpose()
    }

    fn migrate_owners(
        &self,
        version: u64,
        map: fn(&str) -> String,
    ) -> Result<Option<OwnerMigration>, StoreError> {
        let txn = self.db.begin_write().map_err(db_err)?;
        let mut done = OwnerMigration::default();
        {
            let mut meta = txn.open_table(META).map_err(db_err)?;
            let current = meta
                .get(SCHEMA_KEY)
                .map_err(db_err)?
                .map_or(1, |v| v.value());
            if current >= version {
                return Ok(None);
            }
            done.from_version = current;
            let mut table = txn.open_table(WORKLOADS).map_err(db_err)?;
            let mut records = Vec::new();
            for item in table.iter().map_err(db_err)? {
                let (k, v) = item.map_err(db_err)?;
                let record: WorkloadRecord = decode(k.value(), v.value())?;
                records.push((k.value().to_owned(), record));
            }
            for (old_key, mut record) in records {
                table.remove(old_key.as_str()).map_err(db_err)?;
                record.owner = map(&record.owner);
                let key = workload_key(&record.owner, &record.name);
                table
                    .insert(key.as_str(), encode(&record)?.as_slice())
                    .map_err(db_err)?;
                done.workloads += 1;
            }
            let mut grants = txn.open_table(GRANTS).map_err(db_err)?;
            let mut rewritten = Vec::new();
            for item in grants.iter().map_err(db_err)? {
                let (k, v) = item.map_err(db_err)?;
                let mut grant: GrantRecord = decode(k.value(), v.value())?;
                grant.owner = map(&grant.owner);
                rewritten.push(grant);
            }
            for grant in rewritten {
                grants
                    .insert(grant.id.as_str(), encode(&grant)?.as_slice())
                    .map_err(db_err)?;
                done.grants += 1;
            }
            meta.insert(SCHEMA_KEY, version).map_err(db_err)?;
        }
        txn.commit().map_err(db_err)?;
        Ok(Some(done))
    }

    fn purge_expired_grants(&self, now_ms: u64) -> Result<usize, StoreError> {
        let txn = self.db.begin_write().map_err(db_err)?;
        let mut removed = 0usize;
        {
            let mut grants = txn.open_table(GRANTS).map_err(db_err)?;
            grants
                .retain(|_, v| {
                    let keep = serde_json::from_slice::<GrantRecord>(v)
                        .map(|g| g.expires_at_ms >= now_ms)
                        .unwrap_or(false);
                    if !keep {
                        removed += 1;
                    }
                    keep
                })
                .map_err(db_err)?;
        }
        txn.commit().map_err(db_err)?;
        Ok(removed)
    }
}

impl Tables {
    fn run(
        &self,
        owner: &str,
        workload: &str,
        run_id: &str,
    ) -> Result<Option<RunRecord>, StoreError> {
        let key = run_key(owner, workload, run_id);
        let txn = self.db.begin_read().map_err(db_err)?;
        let table = txn.open_table(RUNS).map_err(db_err)?;
        read(&table, &key)
    }

    fn runs_of(&self, owner: &str, workload: &str) -> Result<Vec<RunRecord>, StoreError> {
        let prefix = runs_prefix(owner, workload);
        let txn = self.db.begin_read().map_err(db_err)?;
        let table = txn.open_table(RUNS).map_err(db_err)?;
        let mut out = Vec::new();
        for item in table.range::<&str>(prefix.as_str()..).map_err(db_err)? {
            let (k, v) = item.map_err(db_err)?;
            if !k.value().starts_with(prefix.as_str()) {
                break;
            }
            out.push(decode(k.value(), v.value())?);
        }
        Ok(out)
    }

    fn add_to_run(&self, run: &RunRecord) -> Result<RunRecord, StoreError> {
        let key = run_key(&run.owner, &run.workload, &run.run_id);
        let txn = self.db.begin_write().map_err(db_err)?;
        let stored = {
            let mut table = txn.open_table(RUNS).map_err(db_err)?;
            let current: Option<RunRecord> = read(&table, &key)?;
            let stored = RunRecord::merged(current, run)?;
            table
                .insert(key.as_str(), encode(&stored)?.as_slice())
                .map_err(db_err)?;
            stored
        };
        txn.commit().map_err(db_err)?;
        Ok(stored)
    }

    fn remove_from_run(
        &self,
        owner: &str,
        workload: &str,
        run_id: &str,
        sandboxes: &[String],
    ) -> Result<Option<RunRecord>, StoreError> {
        let key = run_key(owner, workload, run_id);
        let txn = self.db.begin_write().map_err(db_err)?;
        let left = {
            let mut table = txn.open_table(RUNS).map_err(db_err)?;
            let current: Option<RunRecord> = read(&table, &key)?;
            let Some(current) = current else {
                return Ok(None);
            };
            let left = current.without(sandboxes);
            match &left {
                None => {
                    table.remove(key.as_str()).map_err(db_err)?;
                }
                Some(rest) => {
                    table
                        .insert(key.as_str(), encode(rest)?.as_slice())
                        .map_err(db_err)?;
                }
            }
            left
        };
        txn.commit().map_err(db_err)?;
        Ok(left)
    }
}

#[async_trait::async_trait]
impl MetadataStore for RedbStore {
    async fn insert_workload(
        &self,
        record: &WorkloadRecord,
        grant: &GrantRecord,
        quota: usize,
    ) -> Result<(), StoreError> {
        let (record, grant) = (record.clone(), grant.clone());
        self.blocking(move |t| t.insert_workload(&record, &grant, quota))
            .await
    }

    async fn workload(
        &self,
        owner: &str,
        name: &str,
    ) -> Result<Option<WorkloadRecord>, StoreError> {
        let (owner, name) = (owner.to_owned(), name.to_owned());
        self.blocking(move |t| t.workload(&owner, &name)).await
    }

    async fn workloads_of(&self, owner: &str) -> Result<Vec<WorkloadRecord>, StoreError> {
        let owner = owner.to_owned();
        self.blocking(move |t| t.workloads_of(&owner)).await
    }

    async fn all_workloads(&self) -> Result<Vec<WorkloadRecord>, StoreError> {
        self.blocking(Tables::all_workloads).await
    }

    async fn replace_workload(
        &self,
        record: &WorkloadRecord,
        consume_grant: Option<&str>,
    ) -> Result<WorkloadRecord, StoreError> {
        let (record, grant) = (record.clone(), consume_grant.map(str::to_owned));
        self.blocking(move |t| t.replace_workload(&record, grant.as_deref()))
            .await
    }

    async fn remove_workload(
        &self,
        owner: &str,
        name: &str,
        version: u64,
    ) -> Result<(), StoreError> {
        let (owner, name) = (owner.to_owned(), name.to_owned());
        self.blocking(move |t| t.remove_workload(&owner, &name, version))
            .await
    }

    async fn insert_grant(&self, grant: &GrantRecord) -> Result<(), StoreError> {
        let grant = grant.clone();
        self.blocking(move |t| t.insert_grant(&grant)).await
    }

    async fn grant(&self, id: &str) -> Result<Option<GrantRecord>, StoreError> {
        let id = id.to_owned();
        self.blocking(move |t| t.grant(&id)).await
    }

    async fn remove_grant(&self, id: &str) -> Result<bool, StoreError> {
        let id = id.to_owned();
        self.blocking(move |t| t.remove_grant(&id)).await
    }

    async fn purge_expired_grants(&self, now_ms: u64) -> Result<usize, StoreError> {
        self.blocking(move |t| t.purge_expired_grants(now_ms)).await
    }

    async fn migrate_owners(
        &self,
        version: u64,
        map: for<'m> fn(&'m str) -> String,
    ) -> Result<Option<OwnerMigration>, StoreError> {
        self.blocking(move |t| t.migrate_owners(version, map)).await
    }
}

#[async_trait::async_trait]
impl RunStore for RedbStore {
    async fn run(
        &self,
        owner: &str,
        workload: &str,
        run_id: &str,
    ) -> Result<Option<RunRecord>, StoreError> {
        let key = (owner.to_owned(), workload.to_owned(), run_id.to_owned());
        self.blocking(move |t| t.run(&key.0, &key.1, &key.2)).await
    }

    async fn runs_of(&self, owner: &str, workload: &str) -> Result<Vec<RunRecord>, StoreError> {
        let (owner, workload) = (owner.to_owned(), workload.to_owned());
        self.blocking(move |t| t.runs_of(&owner, &workload)).await
    }

    async fn add_to_run(&self, run: &RunRecord) -> Result<RunRecord, StoreError> {
        let run = run.clone();
        self.blocking(move |t| t.add_to_run(&run)).await
    }

    async fn remove_from_run(
        &self,
        owner: &str,
        workload: &str,
        run_id: &str,
        sandboxes: &[String],
    ) -> Result<Option<RunRecord>, StoreError> {
        let key = (owner.to_owned(), workload.to_owned(), run_id.to_owned());
        let sandboxes = sandboxes.to_vec();
        self.blocking(move |t| t.remove_from_run(&key.0, &key.1, &key.2, &sandboxes))
            .await
    }
}

#[cfg(test)]
mod tests;
