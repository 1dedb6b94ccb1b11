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
        let value = table.get(key.as_str()).map_err(db_err)?;
        value.map(|v| decode(&key, v.value())).transpose()
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
        let value = table.get(key.as_str()).map_err(db_err)?;
        value.map(|v| decode(&key, v.value())).transpose()
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
            let current: Option<RunRecord> = table
                .get(key.as_str())
                .map_err(db_err)?
                .map(|v| decode(&key, v.value()))
                .transpose()?;
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
            let current: Option<RunRecord> = table
                .get(key.as_str())
                .map_err(db_err)?
                .map(|v| decode(&key, v.value()))
                .transpose()?;
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
mod tests {
    //! The transactions themselves, synchronously; the async face is
    //! covered by the store conformance tests.
    use super::*;
    use crate::store::WorkloadStatus;

    fn record(owner: &str, name: &str) -> WorkloadRecord {
        WorkloadRecord {
            owner: owner.into(),
            name: name.into(),
            uid: format!("uid-{owner}-{name}"),
            kind: "workspace".into(),
            status: WorkloadStatus::AwaitingUpload,
            candidate: None,
            active: None,
            failure: None,
            created_at_ms: 1,
            updated_at_ms: 1,
            version: 0,
        }
    }

    fn grant(id: &str, rec: &WorkloadRecord, expires_at_ms: u64) -> GrantRecord {
        GrantRecord {
            id: id.into(),
            token_sha256: "00".into(),
            owner: rec.owner.clone(),
            name: rec.name.clone(),
            workload_uid: rec.uid.clone(),
            expires_at_ms,
        }
    }

    #[test]
    fn owners_never_see_each_others_keys() {
        let dir = tempfile::tempdir().unwrap();
        let store = RedbStore::open(&dir.path().join("m.redb")).unwrap().tables;
        // "a" + "b/x" must not collide with "a/b" + "x" or prefix-match "ab".
        for (owner, name) in [("a", "x"), ("ab", "x"), ("a/b", "x"), ("b", "y")] {
            let r = record(owner, name);
            store
                .insert_workload(&r, &grant(&format!("g{owner}{name}"), &r, 10), 20)
                .unwrap();
        }
        let names = |o: &str| -> Vec<String> {
            store
                .workloads_of(o)
                .unwrap()
                .into_iter()
                .map(|r| format!("{}:{}", r.owner, r.name))
                .collect()
        };
        assert_eq!(names("a"), vec!["a:x"]);
        assert_eq!(names("ab"), vec!["ab:x"]);
        assert_eq!(names("a/b"), vec!["a/b:x"]);
        assert_eq!(store.all_workloads().unwrap().len(), 4);
        assert!(store.workload("a", "y").unwrap().is_none());
    }

    #[test]
    fn quota_name_and_compare_and_swap() {
        let dir = tempfile::tempdir().unwrap();
        let store = RedbStore::open(&dir.path().join("m.redb")).unwrap().tables;
        let r1 = record("o", "one");
        store
            .insert_workload(&r1, &grant("g1", &r1, 10), 2)
            .unwrap();
        assert!(matches!(
            store.insert_workload(&r1, &grant("g1b", &r1, 10), 2),
            Err(StoreError::NameTaken)
        ));
        let r2 = record("o", "two");
        store
            .insert_workload(&r2, &grant("g2", &r2, 10), 2)
            .unwrap();
        let r3 = record("o", "three");
        assert!(matches!(
            store.insert_workload(&r3, &grant("g3", &r3, 10), 2),
            Err(StoreError::QuotaExceeded(2))
        ));
        let current = store.workload("o", "one").unwrap().unwrap();
        assert_eq!(current.version, 1);
        let next = store.replace_workload(&current, Some("g1")).unwrap();
        assert_eq!(next.version, 2);
        // Stale version and used grant are both refused.
        assert!(matches!(
            store.replace_workload(&current, None),
            Err(StoreError::Conflict)
        ));
        assert!(matches!(
            store.replace_workload(&next, Some("g1")),
            Err(StoreError::GrantUsed)
        ));
        store.remove_workload("o", "two", 1).unwrap();
        assert!(store.grant("g2").unwrap().is_none(), "grants go with it");
        assert!(store.workload("o", "two").unwrap().is_none());
    }

    #[test]
    fn owners_migrate_once_with_their_keys_and_grants() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("m.redb");
        {
            let store = RedbStore::open(&path).unwrap().tables;
            assert_eq!(store.schema_version().unwrap(), SCHEMA_OWNER_KINDS);
            // Pretend a version-1 store: bare owners, no version recorded.
            let r = record("alice", "w");
            store.insert_workload(&r, &grant("g", &r, 50), 20).unwrap();
            let txn = store.db.begin_write().unwrap();
            txn.open_table(META).unwrap().remove(SCHEMA_KEY).unwrap();
            txn.commit().unwrap();
        }
        let store = RedbStore::open(&path).unwrap().tables;
        assert_eq!(store.schema_version().unwrap(), 1);
        let map = |o: &str| format!("sub:{o}");
        let done = store.migrate_owners(SCHEMA_OWNER_KINDS, map).unwrap();
        assert_eq!(
            done,
            Some(OwnerMigration {
                from_version: 1,
                workloads: 1,
                grants: 1
            })
        );
        assert!(store.workload("alice", "w").unwrap().is_none());
        let migrated = store.workload("sub:alice", "w").unwrap().unwrap();
        assert_eq!(
            (migrated.owner.as_str(), migrated.version),
            ("sub:alice", 1)
        );
        assert_eq!(store.grant("g").unwrap().unwrap().owner, "sub:alice");
        // Again: nothing to do, nothing prefixed twice.
        assert_eq!(store.migrate_owners(SCHEMA_OWNER_KINDS, map).unwrap(), None);
        assert_eq!(store.workloads_of("sub:alice").unwrap().len(), 1);
        assert_eq!(store.schema_version().unwrap(), SCHEMA_OWNER_KINDS);
    }

    #[test]
    fn expired_grants_are_purged_and_data_survives_reopen() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("m.redb");
        {
            let store = RedbStore::open(&path).unwrap().tables;
            let r = record("o", "w");
            store.insert_workload(&r, &grant("old", &r, 5), 20).unwrap();
            store.insert_grant(&grant("new", &r, 50)).unwrap();
            assert_eq!(store.purge_expired_grants(10).unwrap(), 1);
        }
        let store = RedbStore::open(&path).unwrap().tables;
        assert!(store.grant("old").unwrap().is_none());
        assert!(store.grant("new").unwrap().is_some());
        assert_eq!(store.workload("o", "w").unwrap().unwrap().version, 1);
    }

    fn run(owner: &str, workload: &str, id: &str, sandboxes: &[&str]) -> RunRecord {
        RunRecord {
            owner: owner.into(),
            workload: workload.into(),
            run_id: id.into(),
            revision: "r".repeat(64),
            scope: "s".repeat(32),
            sandboxes: sandboxes
                .iter()
                .map(|s| crate::store::RunSandbox {
                    sandbox: (*s).into(),
                    pod: None,
                    root: ".context".into(),
                    path: format!("/x/{s}/{id}"),
                })
                .collect(),
            created_at_ms: 1,
        }
    }

    #[test]
    fn runs_merge_conflict_shrink_and_survive_reopen() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("m.redb");
        {
            let store = RedbStore::open(&path).unwrap().tables;
            store.add_to_run(&run("o", "w", "a", &["s2"])).unwrap();
            let merged = store
                .add_to_run(&run("o", "w", "a", &["s1", "s2"]))
                .unwrap();
            let names: Vec<_> = merged
                .sandboxes
                .iter()
                .map(|s| s.sandbox.as_str())
                .collect();
            assert_eq!(names, ["s1", "s2"]);
            let mut other = run("o", "w", "a", &["s3"]);
            other.revision = "q".repeat(64);
            assert!(matches!(
                store.add_to_run(&other),
                Err(StoreError::Conflict)
            ));
            // Same run id for another owner or workload: separate runs.
            store.add_to_run(&run("o2", "w", "a", &["s1"])).unwrap();
            store.add_to_run(&run("o", "w2", "a", &["s1"])).unwrap();
            store.add_to_run(&run("o", "w", "b", &["s1"])).unwrap();
        }
        let store = RedbStore::open(&path).unwrap().tables;
        let ids: Vec<_> = store
            .runs_of("o", "w")
            .unwrap()
            .into_iter()
            .map(|r| r.run_id)
            .collect();
        assert_eq!(ids, ["a", "b"]);
        let left = store
            .remove_from_run("o", "w", "a", &["s1".into()])
            .unwrap()
            .unwrap();
        assert_eq!(left.sandboxes.len(), 1);
        assert!(store
            .remove_from_run("o", "w", "a", &["s2".into()])
            .unwrap()
            .is_none());
        assert!(store.run("o", "w", "a").unwrap().is_none());
        assert!(store.run("o2", "w", "a").unwrap().is_some());
        assert!(store
            .remove_from_run("o", "w", "zz", &[])
            .unwrap()
            .is_none());
    }
}
