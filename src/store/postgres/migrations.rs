//! The PostgreSQL schema, as numbered migrations applied at start.
//!
//! A migration is never edited once released: a change is a new entry. All
//! pending migrations run in one transaction under a transaction-level
//! advisory lock, so replicas starting together apply each exactly once
//! (the others wait on the lock, then find nothing to do), and a failed
//! start leaves the schema as it was.

use tokio_postgres::Client;

use super::pg_err;
use crate::store::StoreError;

/// Advisory lock key held while migrating (`"csmigrat"` in ASCII).
const MIGRATION_LOCK: i64 = 0x6373_6d69_6772_6174;

/// The migrations, by version (1, 2, ...).
const MIGRATIONS: &[(i32, &str, &str)] = &[(
    1,
    "workloads, grants, delivery runs",
    // Text keys use the "C" collation so that order is byte order, as in
    // the embedded store. `record` holds the record's JSON exactly as the
    // embedded store encodes it (so records copy verbatim between them);
    // the other columns are what queries select on.
    r#"
    CREATE TABLE cs_workloads (
        owner   text COLLATE "C" NOT NULL,
        name    text COLLATE "C" NOT NULL,
        uid     text NOT NULL,
        version bigint NOT NULL,
        record  bytea NOT NULL,
        PRIMARY KEY (owner, name)
    );
    CREATE TABLE cs_grants (
        id            text COLLATE "C" PRIMARY KEY,
        owner         text COLLATE "C" NOT NULL,
        name          text COLLATE "C" NOT NULL,
        workload_uid  text NOT NULL,
        expires_at_ms bigint NOT NULL,
        record        bytea NOT NULL
    );
    CREATE INDEX cs_grants_workload_uid ON cs_grants (workload_uid);
    CREATE INDEX cs_grants_expires_at_ms ON cs_grants (expires_at_ms);
    CREATE TABLE cs_delivery_runs (
        owner    text COLLATE "C" NOT NULL,
        workload text COLLATE "C" NOT NULL,
        run_id   text COLLATE "C" NOT NULL,
        revision text NOT NULL,
        record   bytea NOT NULL,
        PRIMARY KEY (owner, workload, run_id)
    );
    -- Store-wide facts; schema_version is the records' schema
    -- (crate::store::SCHEMA_OWNER_KINDS = 2 when this store was added: a
    -- new database holds no bare owners).
    CREATE TABLE cs_meta (
        key   text PRIMARY KEY,
        value bigint NOT NULL
    );
    INSERT INTO cs_meta (key, value) VALUES ('schema_version', 2);
    "#,
)];

/// The newest migration this build knows.
pub(super) fn latest() -> i32 {
    MIGRATIONS.last().map_or(0, |m| m.0)
}

/// Applies the pending migrations; returns the versions applied.
pub(super) async fn migrate(client: &mut Client) -> Result<Vec<i32>, StoreError> {
    let tx = client.transaction().await.map_err(pg_err)?;
    // Before anything else: two replicas creating the table below at once
    // would collide even with IF NOT EXISTS.
    tx.execute("SELECT pg_advisory_xact_lock($1)", &[&MIGRATION_LOCK])
        .await
        .map_err(pg_err)?;
    tx.batch_execute(
        "CREATE TABLE IF NOT EXISTS cs_schema_migrations (
             version    integer PRIMARY KEY,
             name       text NOT NULL,
             applied_at timestamptz NOT NULL DEFAULT now()
         )",
    )
    .await
    .map_err(pg_err)?;
    let row = tx
        .query_one(
            "SELECT COALESCE(MAX(version), 0) FROM cs_schema_migrations",
            &[],
        )
        .await
        .map_err(pg_err)?;
    let current: i32 = row
        .try_get(0)
        .map_err(|e| StoreError::Database(format!("reading the schema version: {e}")))?;
    if current > latest() {
        return Err(StoreError::Database(format!(
            "the database schema is at version {current}, newer than this build knows ({}); \
             run a newer context-service",
            latest()
        )));
    }
    let mut applied = Vec::new();
    for (version, name, sql) in MIGRATIONS.iter().filter(|m| m.0 > current) {
        tx.batch_execute(sql).await.map_err(|e| {
            StoreError::Database(format!("applying migration {version} ({name}): {e}"))
        })?;
        tx.execute(
            "INSERT INTO cs_schema_migrations (version, name) VALUES ($1, $2)",
            &[version, name],
        )
        .await
        .map_err(pg_err)?;
        applied.push(*version);
    }
    tx.commit().await.map_err(pg_err)?;
    Ok(applied)
}
