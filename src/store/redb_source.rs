//! The embedded store opened read-only, as the source of
//! `context-service migrate`: its records exactly as stored (the JSON bytes
//! beside their decoded form), without ever writing to the file.
//!
//! redb's read-only open refuses a file a writer holds (a running service)
//! and a file that needs repair (it would have to write to repair it); while
//! it is open, a service cannot open the file either, so the records read
//! are the last ones.

use std::path::{Path, PathBuf};

use redb::{ReadOnlyDatabase, ReadableDatabase, ReadableTable, TableDefinition, TableError};
use serde::de::DeserializeOwned;

use super::redb_store::{GRANTS, META, RUNS, SCHEMA_KEY, WORKLOADS};
use super::{GrantRecord, RunRecord, WorkloadRecord};

/// Why the embedded store could not be read.
#[derive(Debug, thiserror::Error)]
pub enum SourceError {
    /// No database file there.
    #[error("no embedded store at {0}")]
    Missing(PathBuf),
    /// Another process (a running service) holds the file.
    #[error(
        "the embedded store {0} is in use (a context-service still runs on it?): \
         stop it first; migrate must be the file's only user"
    )]
    InUse(PathBuf),
    /// The file was not closed cleanly; repairing it would modify it.
    #[error(
        "the embedded store {0} was not closed cleanly: start and stop \
         `context-service serve` on it once (that repairs it), then migrate"
    )]
    NeedsRepair(PathBuf),
    /// Reading failed, or a record does not decode.
    #[error("reading the embedded store {path}: {detail}")]
    Read {
        /// The database file.
        path: PathBuf,
        /// What failed.
        detail: String,
    },
}

/// One stored record: its bytes as stored, and what they decode to.
#[derive(Debug, Clone)]
pub struct SourceRecord<T> {
    /// The JSON exactly as the embedded store holds it.
    pub raw: Vec<u8>,
    /// The decoded record.
    pub record: T,
}

/// A read-only handle on an embedded store's file.
pub struct RedbSource {
    db: ReadOnlyDatabase,
    path: PathBuf,
}

impl std::fmt::Debug for RedbSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedbSource")
            .field("path", &self.path)
            .finish_non_exhaustive()
    }
}

impl RedbSource {
    /// Opens the existing database file at `path` without writing to it.
    pub fn open(path: &Path) -> Result<Self, SourceError> {
        if !path.is_file() {
            return Err(SourceError::Missing(path.to_owned()));
        }
        match ReadOnlyDatabase::open(path) {
            Ok(db) => Ok(Self {
                db,
                path: path.to_owned(),
            }),
            Err(redb::DatabaseError::DatabaseAlreadyOpen) => {
                Err(SourceError::InUse(path.to_owned()))
            }
            Err(redb::DatabaseError::RepairAborted) => {
                Err(SourceError::NeedsRepair(path.to_owned()))
            }
            Err(e) => Err(SourceError::Read {
                path: path.to_owned(),
                detail: e.to_string(),
            }),
        }
    }

    fn read_err(&self, e: impl std::fmt::Display) -> SourceError {
        SourceError::Read {
            path: self.path.clone(),
            detail: e.to_string(),
        }
    }

    /// The records' schema version (1 when none is recorded).
    pub fn schema_version(&self) -> Result<u64, SourceError> {
        let txn = self.db.begin_read().map_err(|e| self.read_err(e))?;
        let meta = match txn.open_table(META) {
            Ok(t) => t,
            Err(TableError::TableDoesNotExist(_)) => return Ok(1),
            Err(e) => return Err(self.read_err(e)),
        };
        Ok(meta
            .get(SCHEMA_KEY)
            .map_err(|e| self.read_err(e))?
            .map_or(1, |v| v.value()))
    }

    fn all<T: DeserializeOwned>(
        &self,
        table: TableDefinition<&str, &[u8]>,
    ) -> Result<Vec<SourceRecord<T>>, SourceError> {
        let txn = self.db.begin_read().map_err(|e| self.read_err(e))?;
        let table = match txn.open_table(table) {
            Ok(t) => t,
            // A store no service finished opening holds no records.
            Err(TableError::TableDoesNotExist(_)) => return Ok(Vec::new()),
            Err(e) => return Err(self.read_err(e)),
        };
        let mut out = Vec::new();
        for item in table.iter().map_err(|e| self.read_err(e))? {
            let (k, v) = item.map_err(|e| self.read_err(e))?;
            let raw = v.value().to_vec();
            let record = serde_json::from_slice(&raw).map_err(|e| SourceError::Read {
                path: self.path.clone(),
                detail: format!("record {:?} does not decode: {e}", k.value()),
            })?;
            out.push(SourceRecord { raw, record });
        }
        Ok(out)
    }

    /// Every workload record, in key order.
    pub fn workloads(&self) -> Result<Vec<SourceRecord<WorkloadRecord>>, SourceError> {
        self.all(WORKLOADS)
    }

    /// Every grant record (expired ones included), by id.
    pub fn grants(&self) -> Result<Vec<SourceRecord<GrantRecord>>, SourceError> {
        self.all(GRANTS)
    }

    /// Every delivery run record, in key order.
    pub fn runs(&self) -> Result<Vec<SourceRecord<RunRecord>>, SourceError> {
        self.all(RUNS)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::{MetadataStore, RedbStore, WorkloadStatus};

    #[tokio::test]
    async fn reads_verbatim_refuses_a_held_file_and_never_writes() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("meta.redb");
        assert!(matches!(
            RedbSource::open(&path),
            Err(SourceError::Missing(_))
        ));
        let store = RedbStore::open(&path).unwrap();
        let record = WorkloadRecord {
            owner: "sub:a".into(),
            name: "w".into(),
            uid: "u".into(),
            kind: "workspace".into(),
            status: WorkloadStatus::AwaitingUpload,
            candidate: None,
            active: None,
            failure: None,
            created_at_ms: 1,
            updated_at_ms: 1,
            version: 0,
        };
        let grant = GrantRecord {
            id: "g".into(),
            token_sha256: "00".into(),
            owner: "sub:a".into(),
            name: "w".into(),
            workload_uid: "u".into(),
            expires_at_ms: 9,
        };
        store.insert_workload(&record, &grant, 20).await.unwrap();
        assert!(matches!(
            RedbSource::open(&path),
            Err(SourceError::InUse(_))
        ));
        drop(store);
        let before = std::fs::read(&path).unwrap();
        let source = RedbSource::open(&path).unwrap();
        let workloads = source.workloads().unwrap();
        assert_eq!(workloads.len(), 1);
        assert_eq!(workloads[0].record.version, 1);
        assert_eq!(
            serde_json::from_slice::<WorkloadRecord>(&workloads[0].raw).unwrap(),
            workloads[0].record
        );
        assert_eq!(source.grants().unwrap()[0].record, grant);
        assert!(source.runs().unwrap().is_empty());
        assert_eq!(
            source.schema_version().unwrap(),
            crate::store::SCHEMA_OWNER_KINDS
        );
        // While it is read, a service cannot open the file for writing.
        assert!(RedbStore::open(&path).is_err());
        drop(source);
        assert_eq!(
            std::fs::read(&path).unwrap(),
            before,
            "the file is unchanged"
        );
    }
}
