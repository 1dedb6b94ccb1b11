//! [`MetadataStore`] and [`RunStore`] on PostgreSQL, shared by replicas.
//!
//! Client: `tokio-postgres` with a `deadpool-postgres` pool, on the
//! caller's runtime: the store traits are async, so each call is a plain
//! future and every operation is bounded by [`OPERATION_TIMEOUT`]. The
//! pool's connections are driven by tasks on the runtime that opened them,
//! so a store lives and dies with that runtime. The pool replaces closed
//! connections, so the store recovers by itself when the database comes
//! back.
//!
//! Every compare-and-swap is one transaction: rows are locked with
//! `SELECT ... FOR UPDATE` (read committed: a waiting transaction re-reads
//! the row the winner committed), and inserts that must see each other (an
//! owner's quota, a new run) serialise on a transaction-level advisory
//! lock. Records are stored as the same JSON as in [`RedbStore`]
//! (`record` column, verbatim bytes), with the fields queries select on
//! (owner, name, version, grant id, expiry) as columns beside it.
//!
//! Failures to reach the database (connect, pool wait, dropped connection,
//! server shutting down) are [`StoreError::Unavailable`]; the API answers
//! them `503 database_unavailable`.
//!
//! [`RedbStore`]: super::RedbStore

mod import;
mod migrations;
mod runs;
mod tls;
mod url;

pub use url::DatabaseUrl;

use std::future::Future;
use std::time::Duration;

use deadpool_postgres::{Manager, ManagerConfig, Object, Pool, RecyclingMethod, Runtime};
use sha2::{Digest, Sha256};
use tokio_postgres::{NoTls, Row};

use super::{
    GrantRecord, MetadataStore, OwnerMigration, RunRecord, RunStore, StoreError, WorkloadRecord,
};

/// Most connections one replica holds.
const POOL_SIZE: usize = 16;
/// Longest wait for a connection (from the pool or a new one).
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// Longest one store operation may take, queries included; past it the
/// database counts as unavailable (a request then answers 503 well before
/// its own deadline).
const OPERATION_TIMEOUT: Duration = Duration::from_secs(15);

/// Advisory lock namespaces (the first 8 bytes of sha256 of the namespace
/// and the key): an owner's workloads, a delivery run.
const LOCK_OWNER: &str = "owner-workloads";
const LOCK_RUN: &str = "delivery-run";

/// The PostgreSQL-backed metadata store and run registry.
pub struct PostgresStore {
    pool: Pool,
    url: DatabaseUrl,
}

impl std::fmt::Debug for PostgresStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PostgresStore")
            .field("url", &self.url)
            .finish_non_exhaustive()
    }
}

impl Drop for PostgresStore {
    fn drop(&mut self) {
        self.pool.close();
    }
}

/// A PostgreSQL error as a [`StoreError`]: failures to reach the server, or
/// the server shutting down or out of connections, are
/// [`StoreError::Unavailable`]; other server errors are
/// [`StoreError::Database`].
pub(super) fn pg_err(e: tokio_postgres::Error) -> StoreError {
    match e.code() {
        // 08: connection exception; 53: insufficient resources (too many
        // connections); 57P0x: admin or crash shutdown, cannot connect now.
        Some(code)
            if code.code().starts_with("08")
                || code.code().starts_with("53")
                || code.code().starts_with("57P") =>
        {
            StoreError::Unavailable(e.to_string())
        }
        Some(_) => StoreError::Database(format!("{e}: {}", db_detail(&e))),
        // No SQLSTATE: I/O, a closed connection, a failed connect. (Column
        // decoding errors are mapped by `col` instead.)
        None => StoreError::Unavailable(match std::error::Error::source(&e) {
            Some(source) => format!("{e}: {source}"),
            None => e.to_string(),
        }),
    }
}

fn db_detail(e: &tokio_postgres::Error) -> String {
    e.as_db_error()
        .map_or_else(String::new, |d| d.message().to_owned())
}

fn pool_err(e: deadpool_postgres::PoolError) -> StoreError {
    match e {
        deadpool_postgres::PoolError::Backend(e) => pg_err(e),
        other => StoreError::Unavailable(format!("connecting: {other}")),
    }
}

/// Reads column `idx` of `row`.
fn col<'a, T: tokio_postgres::types::FromSql<'a>>(
    row: &'a Row,
    idx: usize,
) -> Result<T, StoreError> {
    row.try_get(idx)
        .map_err(|e| StoreError::Database(format!("reading column {idx}: {e}")))
}

fn decode<T: serde::de::DeserializeOwned>(key: &str, bytes: &[u8]) -> Result<T, StoreError> {
    serde_json::from_slice(bytes).map_err(|e| StoreError::Corrupt {
        key: key.to_owned(),
        detail: e.to_string(),
    })
}

fn encode<T: serde::Serialize>(value: &T) -> Result<Vec<u8>, StoreError> {
    serde_json::to_vec(value).map_err(|e| StoreError::Database(e.to_string()))
}

/// A u64 as a `bigint` (values past `i64::MAX` never occur: versions count
/// writes, times are ms since the epoch; they saturate rather than wrap).
fn big(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

/// The advisory lock key of `key` in namespace `ns`.
fn lock_key(ns: &str, key: &[&str]) -> i64 {
    let mut h = Sha256::new();
    h.update(ns.as_bytes());
    for part in key {
        // Length-prefixed, so ("a", "b/c") and ("a/b", "c") differ.
        h.update((part.len() as u64).to_be_bytes());
        h.update(part.as_bytes());
    }
    let digest = h.finalize();
    let mut first = [0u8; 8];
    first.copy_from_slice(&digest[..8]);
    i64::from_be_bytes(first)
}

fn workload_key(owner: &str, name: &str) -> String {
    format!("{owner}/{name}")
}

fn run_key(owner: &str, workload: &str, run_id: &str) -> String {
    format!("{owner}/{workload}/{run_id}")
}

impl PostgresStore {
    /// Connects to `url` and applies pending migrations.
    pub async fn connect(url: &DatabaseUrl) -> Result<Self, StoreError> {
        let tls::Connection {
            mut config,
            transport,
        } = tls::parse(url.expose()).map_err(StoreError::Database)?;
        if config.get_connect_timeout().is_none() {
            config.connect_timeout(CONNECT_TIMEOUT);
        }
        if config.get_application_name().is_none() {
            config.application_name("context-service");
        }
        let manager_config = ManagerConfig {
            // A closed connection is dropped at checkout; an open one is
            // used without a probe (a server restart closes them).
            recycling_method: RecyclingMethod::Fast,
        };
        let manager = match &transport {
            tls::Transport::Plain => Manager::from_config(config, NoTls, manager_config),
            tls::Transport::Tls(roots) => {
                let connector = tls::connector(roots).map_err(StoreError::Database)?;
                Manager::from_config(config, connector, manager_config)
            }
        };
        let pool = Pool::builder(manager)
            .max_size(POOL_SIZE)
            .runtime(Runtime::Tokio1)
            .wait_timeout(Some(CONNECT_TIMEOUT))
            .create_timeout(Some(CONNECT_TIMEOUT))
            .recycle_timeout(Some(CONNECT_TIMEOUT))
            .build()
            .map_err(|e| StoreError::Database(format!("building the connection pool: {e}")))?;
        let store = Self {
            pool,
            url: url.clone(),
        };
        let applied = timed(async {
            let mut client = store.client().await?;
            migrations::migrate(&mut client).await
        })
        .await?;
        if !applied.is_empty() {
            tracing::info!(?applied, latest = migrations::latest(), "database migrated");
        }
        Ok(store)
    }

    /// The records' schema version (1 when none is recorded).
    pub async fn schema_version(&self) -> Result<u64, StoreError> {
        timed(async {
            let client = self.client().await?;
            let row = client
                .query_opt(
                    "SELECT value FROM cs_meta WHERE key = 'schema_version'",
                    &[],
                )
                .await
                .map_err(pg_err)?;
            match row {
                None => Ok(1),
                Some(r) => Ok(col::<i64>(&r, 0)?.max(0) as u64),
            }
        })
        .await
    }

    async fn client(&self) -> Result<Object, StoreError> {
        self.pool.get().await.map_err(pool_err)
    }
}

/// Runs `fut` bounded by [`OPERATION_TIMEOUT`]: past it the database
/// counts as unavailable.
async fn timed<T>(fut: impl Future<Output = Result<T, StoreError>>) -> Result<T, StoreError> {
    match tokio::time::timeout(OPERATION_TIMEOUT, fut).await {
        Ok(r) => r,
        Err(_) => Err(StoreError::Unavailable(format!(
            "no answer within {}s",
            OPERATION_TIMEOUT.as_secs()
        ))),
    }
}

/// Takes the advisory lock `key` until the transaction ends.
async fn lock(tx: &deadpool_postgres::Transaction<'_>, key: i64) -> Result<(), StoreError> {
    tx.execute("SELECT pg_advisory_xact_lock($1)", &[&key])
        .await
        .map_err(pg_err)?;
    Ok(())
}

/// Decodes workload rows `(owner, name, record)`.
fn workloads_of_rows(rows: &[Row]) -> Result<Vec<WorkloadRecord>, StoreError> {
    rows.iter()
        .map(|r| {
            let owner: &str = col(r, 0)?;
            let name: &str = col(r, 1)?;
            decode(&workload_key(owner, name), col(r, 2)?)
        })
        .collect()
}

#[async_trait::async_trait]
impl MetadataStore for PostgresStore {
    async fn insert_workload(
        &self,
        record: &WorkloadRecord,
        grant: &GrantRecord,
        quota: usize,
    ) -> Result<(), StoreError> {
        let mut stored = record.clone();
        stored.version = 1;
        let body = encode(&stored)?;
        let grant_body = encode(grant)?;
        timed(async {
            let mut client = self.client().await?;
            let tx = client.transaction().await.map_err(pg_err)?;
            // Two replicas creating for one owner at once must count each
            // other's insert.
            lock(&tx, lock_key(LOCK_OWNER, &[&record.owner])).await?;
            let row = tx
                .query_one(
                    "SELECT count(*), count(*) FILTER (WHERE name = $2)
                     FROM cs_workloads WHERE owner = $1",
                    &[&record.owner, &record.name],
                )
                .await
                .map_err(pg_err)?;
            let (count, taken): (i64, i64) = (col(&row, 0)?, col(&row, 1)?);
            if taken > 0 {
                return Err(StoreError::NameTaken);
            }
            if usize::try_from(count).unwrap_or(usize::MAX) >= quota {
                return Err(StoreError::QuotaExceeded(quota));
            }
            tx.execute(
                "INSERT INTO cs_workloads (owner, name, uid, version, record)
                 VALUES ($1, $2, $3, 1, $4)",
                &[&record.owner, &record.name, &record.uid, &body],
            )
            .await
            .map_err(pg_err)?;
            insert_grant(&tx, grant, &grant_body).await?;
            tx.commit().await.map_err(pg_err)
        })
        .await
    }

    async fn workload(
        &self,
        owner: &str,
        name: &str,
    ) -> Result<Option<WorkloadRecord>, StoreError> {
        timed(async {
            let client = self.client().await?;
            let row = client
                .query_opt(
                    "SELECT record FROM cs_workloads WHERE owner = $1 AND name = $2",
                    &[&owner, &name],
                )
                .await
                .map_err(pg_err)?;
            row.map(|r| decode(&workload_key(owner, name), col(&r, 0)?))
                .transpose()
        })
        .await
    }

    async fn workloads_of(&self, owner: &str) -> Result<Vec<WorkloadRecord>, StoreError> {
        timed(async {
            let client = self.client().await?;
            let rows = client
                .query(
                    "SELECT owner, name, record FROM cs_workloads WHERE owner = $1 ORDER BY name",
                    &[&owner],
                )
                .await
                .map_err(pg_err)?;
            workloads_of_rows(&rows)
        })
        .await
    }

    async fn all_workloads(&self) -> Result<Vec<WorkloadRecord>, StoreError> {
        timed(async {
            let client = self.client().await?;
            let rows = client
                .query(
                    "SELECT owner, name, record FROM cs_workloads ORDER BY owner, name",
                    &[],
                )
                .await
                .map_err(pg_err)?;
            workloads_of_rows(&rows)
        })
        .await
    }

    async fn replace_workload(
        &self,
        record: &WorkloadRecord,
        consume_grant: Option<&str>,
    ) -> Result<WorkloadRecord, StoreError> {
        timed(async {
            let mut client = self.client().await?;
            let tx = client.transaction().await.map_err(pg_err)?;
            let row = tx
                .query_opt(
                    "SELECT version, uid FROM cs_workloads
                     WHERE owner = $1 AND name = $2 FOR UPDATE",
                    &[&record.owner, &record.name],
                )
                .await
                .map_err(pg_err)?
                .ok_or(StoreError::NotFound)?;
            let (version, uid): (i64, &str) = (col(&row, 0)?, col(&row, 1)?);
            if version != big(record.version) || uid != record.uid {
                return Err(StoreError::Conflict);
            }
            if let Some(id) = consume_grant {
                // A concurrent consumer waits on the row, then deletes
                // nothing: exactly one upload uses the grant.
                let n = tx
                    .execute("DELETE FROM cs_grants WHERE id = $1", &[&id])
                    .await
                    .map_err(pg_err)?;
                if n == 0 {
                    return Err(StoreError::GrantUsed);
                }
            }
            let mut stored = record.clone();
            stored.version = record.version + 1;
            let body = encode(&stored)?;
            tx.execute(
                "UPDATE cs_workloads SET version = $3, record = $4
                 WHERE owner = $1 AND name = $2",
                &[&record.owner, &record.name, &big(stored.version), &body],
            )
            .await
            .map_err(pg_err)?;
            tx.commit().await.map_err(pg_err)?;
            Ok(stored)
        })
        .await
    }

    async fn remove_workload(
        &self,
        owner: &str,
        name: &str,
        version: u64,
    ) -> Result<(), StoreError> {
        timed(async {
            let mut client = self.client().await?;
            let tx = client.transaction().await.map_err(pg_err)?;
            let row = tx
                .query_opt(
                    "SELECT version, uid FROM cs_workloads
                     WHERE owner = $1 AND name = $2 FOR UPDATE",
                    &[&owner, &name],
                )
                .await
                .map_err(pg_err)?
                .ok_or(StoreError::NotFound)?;
            let (current, uid): (i64, &str) = (col(&row, 0)?, col(&row, 1)?);
            if current != big(version) {
                return Err(StoreError::Conflict);
            }
            tx.execute(
                "DELETE FROM cs_workloads WHERE owner = $1 AND name = $2",
                &[&owner, &name],
            )
            .await
            .map_err(pg_err)?;
            tx.execute("DELETE FROM cs_grants WHERE workload_uid = $1", &[&uid])
                .await
                .map_err(pg_err)?;
            tx.commit().await.map_err(pg_err)
        })
        .await
    }

    async fn insert_grant(&self, grant: &GrantRecord) -> Result<(), StoreError> {
        let body = encode(grant)?;
        timed(async {
            let mut client = self.client().await?;
            let tx = client.transaction().await.map_err(pg_err)?;
            insert_grant(&tx, grant, &body).await?;
            tx.commit().await.map_err(pg_err)
        })
        .await
    }

    async fn grant(&self, id: &str) -> Result<Option<GrantRecord>, StoreError> {
        timed(async {
            let client = self.client().await?;
            let row = client
                .query_opt("SELECT record FROM cs_grants WHERE id = $1", &[&id])
                .await
                .map_err(pg_err)?;
            row.map(|r| decode(id, col(&r, 0)?)).transpose()
        })
        .await
    }

    async fn remove_grant(&self, id: &str) -> Result<bool, StoreError> {
        timed(async {
            let client = self.client().await?;
            let n = client
                .execute("DELETE FROM cs_grants WHERE id = $1", &[&id])
                .await
                .map_err(pg_err)?;
            Ok(n > 0)
        })
        .await
    }

    async fn purge_expired_grants(&self, now_ms: u64) -> Result<usize, StoreError> {
        timed(async {
            let client = self.client().await?;
            let n = client
                .execute(
                    "DELETE FROM cs_grants WHERE expires_at_ms < $1",
                    &[&big(now_ms)],
                )
                .await
                .map_err(pg_err)?;
            Ok(usize::try_from(n).unwrap_or(usize::MAX))
        })
        .await
    }

    async fn migrate_owners(
        &self,
        version: u64,
        map: for<'m> fn(&'m str) -> String,
    ) -> Result<Option<OwnerMigration>, StoreError> {
        timed(async {
            let mut client = self.client().await?;
            let tx = client.transaction().await.map_err(pg_err)?;
            // The row lock makes a second replica wait, then find the new
            // version and do nothing.
            let row = tx
                .query_opt(
                    "SELECT value FROM cs_meta WHERE key = 'schema_version' FOR UPDATE",
                    &[],
                )
                .await
                .map_err(pg_err)?;
            let current = match row {
                Some(r) => col::<i64>(&r, 0)?.max(0) as u64,
                None => 1,
            };
            if current >= version {
                return Ok(None);
            }
            let mut done = OwnerMigration {
                from_version: current,
                ..OwnerMigration::default()
            };
            let rows = tx
                .query("SELECT owner, name, record FROM cs_workloads", &[])
                .await
                .map_err(pg_err)?;
            let records = workloads_of_rows(&rows)?;
            tx.execute("DELETE FROM cs_workloads", &[])
                .await
                .map_err(pg_err)?;
            for mut record in records {
                record.owner = map(&record.owner);
                let body = encode(&record)?;
                tx.execute(
                    "INSERT INTO cs_workloads (owner, name, uid, version, record)
                     VALUES ($1, $2, $3, $4, $5)",
                    &[
                        &record.owner,
                        &record.name,
                        &record.uid,
                        &big(record.version),
                        &body,
                    ],
                )
                .await
                .map_err(pg_err)?;
                done.workloads += 1;
            }
            let rows = tx
                .query("SELECT id, record FROM cs_grants", &[])
                .await
                .map_err(pg_err)?;
            for r in &rows {
                let id: &str = col(r, 0)?;
                let mut grant: GrantRecord = decode(id, col(r, 1)?)?;
                grant.owner = map(&grant.owner);
                let body = encode(&grant)?;
                tx.execute(
                    "UPDATE cs_grants SET owner = $2, record = $3 WHERE id = $1",
                    &[&id, &grant.owner, &body],
                )
                .await
                .map_err(pg_err)?;
                done.grants += 1;
            }
            tx.execute(
                "INSERT INTO cs_meta (key, value) VALUES ('schema_version', $1)
                 ON CONFLICT (key) DO UPDATE SET value = EXCLUDED.value",
                &[&big(version)],
            )
            .await
            .map_err(pg_err)?;
            tx.commit().await.map_err(pg_err)?;
            Ok(Some(done))
        })
        .await
    }
}

/// Inserts (or replaces) `grant` inside `tx`.
async fn insert_grant(
    tx: &deadpool_postgres::Transaction<'_>,
    grant: &GrantRecord,
    body: &[u8],
) -> Result<(), StoreError> {
    tx.execute(
        "INSERT INTO cs_grants (id, owner, name, workload_uid, expires_at_ms, record)
         VALUES ($1, $2, $3, $4, $5, $6)
         ON CONFLICT (id) DO UPDATE SET owner = EXCLUDED.owner, name = EXCLUDED.name,
             workload_uid = EXCLUDED.workload_uid, expires_at_ms = EXCLUDED.expires_at_ms,
             record = EXCLUDED.record",
        &[
            &grant.id,
            &grant.owner,
            &grant.name,
            &grant.workload_uid,
            &big(grant.expires_at_ms),
            &body,
        ],
    )
    .await
    .map_err(pg_err)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lock_keys_separate_namespaces_and_parts() {
        assert_ne!(lock_key(LOCK_OWNER, &["a"]), lock_key(LOCK_RUN, &["a"]));
        assert_ne!(
            lock_key(LOCK_RUN, &["a", "b/c"]),
            lock_key(LOCK_RUN, &["a/b", "c"])
        );
    }

    #[tokio::test]
    async fn unreachable_servers_are_unavailable_not_internal() {
        // Nothing listens on port 1 of loopback.
        let url: DatabaseUrl = "postgres://cs@127.0.0.1:1/cs".parse().unwrap();
        match PostgresStore::connect(&url).await {
            Err(StoreError::Unavailable(_)) => {}
            other => panic!("expected Unavailable, got {other:?}"),
        }
    }
}
