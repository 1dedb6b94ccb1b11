//! Inserting records verbatim (`context-service migrate`): each record's
//! JSON goes in exactly as the embedded store holds it, and only where the
//! target has no record under its key. A record already there is never
//! overwritten, whatever its version: the caller gets its bytes back to
//! tell "the same" from a conflict.

use tokio_postgres::types::ToSql;

use super::{
    big, col, pg_err, timed, GrantRecord, PostgresStore, RunRecord, StoreError, WorkloadRecord,
};

/// Parameters of one statement.
type Params<'a> = &'a [&'a (dyn ToSql + Sync)];

impl PostgresStore {
    /// Inserts the workload `record`, stored as `raw` (its JSON), unless
    /// the owner has a workload of that name: then `Some(bytes)` of the
    /// record there, left as it is. No quota applies (the records exist).
    pub async fn import_workload(
        &self,
        record: &WorkloadRecord,
        raw: &[u8],
    ) -> Result<Option<Vec<u8>>, StoreError> {
        self.insert_or_existing(
            "INSERT INTO cs_workloads (owner, name, uid, version, record)
             VALUES ($1, $2, $3, $4, $5) ON CONFLICT (owner, name) DO NOTHING",
            &[
                &record.owner,
                &record.name,
                &record.uid,
                &big(record.version),
                &raw,
            ],
            "SELECT record FROM cs_workloads WHERE owner = $1 AND name = $2",
            &[&record.owner, &record.name],
        )
        .await
    }

    /// Inserts `grant`, stored as `raw`, unless a grant of that id exists:
    /// then `Some(bytes)` of that one, left as it is.
    pub async fn import_grant(
        &self,
        grant: &GrantRecord,
        raw: &[u8],
    ) -> Result<Option<Vec<u8>>, StoreError> {
        self.insert_or_existing(
            "INSERT INTO cs_grants (id, owner, name, workload_uid, expires_at_ms, record)
             VALUES ($1, $2, $3, $4, $5, $6) ON CONFLICT (id) DO NOTHING",
            &[
                &grant.id,
                &grant.owner,
                &grant.name,
                &grant.workload_uid,
                &big(grant.expires_at_ms),
                &raw,
            ],
            "SELECT record FROM cs_grants WHERE id = $1",
            &[&grant.id],
        )
        .await
    }

    /// Inserts the delivery `run`, stored as `raw`, unless that run exists:
    /// then `Some(bytes)` of that one, left as it is.
    pub async fn import_run(
        &self,
        run: &RunRecord,
        raw: &[u8],
    ) -> Result<Option<Vec<u8>>, StoreError> {
        self.insert_or_existing(
            "INSERT INTO cs_delivery_runs (owner, workload, run_id, revision, record)
             VALUES ($1, $2, $3, $4, $5) ON CONFLICT (owner, workload, run_id) DO NOTHING",
            &[&run.owner, &run.workload, &run.run_id, &run.revision, &raw],
            "SELECT record FROM cs_delivery_runs
             WHERE owner = $1 AND workload = $2 AND run_id = $3",
            &[&run.owner, &run.workload, &run.run_id],
        )
        .await
    }

    /// Runs `insert` (an `ON CONFLICT DO NOTHING`); when it inserted
    /// nothing, the `record` column `existing` selects.
    async fn insert_or_existing(
        &self,
        insert: &str,
        insert_params: Params<'_>,
        existing: &str,
        existing_params: Params<'_>,
    ) -> Result<Option<Vec<u8>>, StoreError> {
        timed(async {
            let client = self.client().await?;
            let inserted = client
                .execute(insert, insert_params)
                .await
                .map_err(pg_err)?;
            if inserted == 1 {
                return Ok(None);
            }
            let row = client
                .query_one(existing, existing_params)
                .await
                .map_err(pg_err)?;
            Ok(Some(col::<Vec<u8>>(&row, 0)?))
        })
        .await
    }
}
