//! [`RunStore`] on PostgreSQL: delivery runs, one row each.

use super::{
    col, decode, encode, lock, lock_key, pg_err, run_key, timed, PostgresStore, RunRecord,
    RunStore, StoreError, LOCK_RUN,
};

#[async_trait::async_trait]
impl RunStore for PostgresStore {
    async fn run(
        &self,
        owner: &str,
        workload: &str,
        run_id: &str,
    ) -> Result<Option<RunRecord>, StoreError> {
        timed(async {
            let client = self.client().await?;
            let row = client
                .query_opt(
                    "SELECT record FROM cs_delivery_runs
                     WHERE owner = $1 AND workload = $2 AND run_id = $3",
                    &[&owner, &workload, &run_id],
                )
                .await
                .map_err(pg_err)?;
            row.map(|r| decode(&run_key(owner, workload, run_id), col(&r, 0)?))
                .transpose()
        })
        .await
    }

    async fn runs_of(&self, owner: &str, workload: &str) -> Result<Vec<RunRecord>, StoreError> {
        timed(async {
            let client = self.client().await?;
            let rows = client
                .query(
                    "SELECT run_id, record FROM cs_delivery_runs
                     WHERE owner = $1 AND workload = $2 ORDER BY run_id",
                    &[&owner, &workload],
                )
                .await
                .map_err(pg_err)?;
            rows.iter()
                .map(|r| decode(&run_key(owner, workload, col(r, 0)?), col(r, 1)?))
                .collect()
        })
        .await
    }

    async fn add_to_run(&self, run: &RunRecord) -> Result<RunRecord, StoreError> {
        timed(async {
            let mut client = self.client().await?;
            let tx = client.transaction().await.map_err(pg_err)?;
            // Serialises two replicas creating the same run.
            lock(
                &tx,
                lock_key(LOCK_RUN, &[&run.owner, &run.workload, &run.run_id]),
            )
            .await?;
            let key = run_key(&run.owner, &run.workload, &run.run_id);
            let row = tx
                .query_opt(
                    "SELECT record FROM cs_delivery_runs
                     WHERE owner = $1 AND workload = $2 AND run_id = $3 FOR UPDATE",
                    &[&run.owner, &run.workload, &run.run_id],
                )
                .await
                .map_err(pg_err)?;
            let current: Option<RunRecord> = row.map(|r| decode(&key, col(&r, 0)?)).transpose()?;
            let stored = RunRecord::merged(current, run)?;
            let body = encode(&stored)?;
            tx.execute(
                "INSERT INTO cs_delivery_runs (owner, workload, run_id, revision, record)
                 VALUES ($1, $2, $3, $4, $5)
                 ON CONFLICT (owner, workload, run_id) DO UPDATE SET record = EXCLUDED.record",
                &[
                    &stored.owner,
                    &stored.workload,
                    &stored.run_id,
                    &stored.revision,
                    &body,
                ],
            )
            .await
            .map_err(pg_err)?;
            tx.commit().await.map_err(pg_err)?;
            Ok(stored)
        })
        .await
    }

    async fn remove_from_run(
        &self,
        owner: &str,
        workload: &str,
        run_id: &str,
        sandboxes: &[String],
    ) -> Result<Option<RunRecord>, StoreError> {
        timed(async {
            let mut client = self.client().await?;
            let tx = client.transaction().await.map_err(pg_err)?;
            let key = run_key(owner, workload, run_id);
            let row = tx
                .query_opt(
                    "SELECT record FROM cs_delivery_runs
                     WHERE owner = $1 AND workload = $2 AND run_id = $3 FOR UPDATE",
                    &[&owner, &workload, &run_id],
                )
                .await
                .map_err(pg_err)?;
            let Some(row) = row else {
                return Ok(None);
            };
            let current: RunRecord = decode(&key, col(&row, 0)?)?;
            let left = current.without(sandboxes);
            match &left {
                None => tx
                    .execute(
                        "DELETE FROM cs_delivery_runs
                         WHERE owner = $1 AND workload = $2 AND run_id = $3",
                        &[&owner, &workload, &run_id],
                    )
                    .await
                    .map_err(pg_err)?,
                Some(rest) => tx
                    .execute(
                        "UPDATE cs_delivery_runs SET record = $4
                         WHERE owner = $1 AND workload = $2 AND run_id = $3",
                        &[&owner, &workload, &run_id, &encode(rest)?],
                    )
                    .await
                    .map_err(pg_err)?,
            };
            tx.commit().await.map_err(pg_err)?;
            Ok(left)
        })
        .await
    }
}
