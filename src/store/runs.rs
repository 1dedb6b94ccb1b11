//! The run registry's records: which delivery runs exist, of which
//! revision, and which sandboxes they reached. Kept in the metadata
//! database so runs survive a restart and can still be released.

use serde::{Deserialize, Serialize};

use super::StoreError;

/// One sandbox a run reached.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RunSandbox {
    /// The sandbox's name.
    pub sandbox: String,
    /// Its pod at delivery time (`None` on the local backend).
    pub pod: Option<String>,
    /// The delivery root the run was placed under (the setting may change
    /// between deliver and release).
    pub root: String,
    /// The run's read-only view inside the sandbox.
    pub path: String,
}

/// A delivery run of one owner's workload.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RunRecord {
    /// The owner (token subject). Never shown by the API.
    pub owner: String,
    /// The workload's name.
    pub workload: String,
    /// The run id the caller chose.
    pub run_id: String,
    /// The revision delivered.
    pub revision: String,
    /// The owner scope the run's directories are named with.
    pub scope: String,
    /// The sandboxes the run reached, by name.
    pub sandboxes: Vec<RunSandbox>,
    /// When the run was first registered (ms since the epoch).
    pub created_at_ms: u64,
}

impl RunRecord {
    /// What a store keeps when `run` is added to the stored `current`
    /// (every store applies this one rule): a run of another revision or
    /// scope is a [`StoreError::Conflict`]; each sandbox of `run` replaces
    /// the one of its name; sandboxes are kept sorted by name.
    pub fn merged(current: Option<RunRecord>, run: &RunRecord) -> Result<RunRecord, StoreError> {
        let mut merged = match current {
            Some(c) if c.revision != run.revision || c.scope != run.scope => {
                return Err(StoreError::Conflict)
            }
            Some(mut c) => {
                for s in &run.sandboxes {
                    c.sandboxes.retain(|old| old.sandbox != s.sandbox);
                    c.sandboxes.push(s.clone());
                }
                c
            }
            None => run.clone(),
        };
        merged.sandboxes.sort_by(|a, b| a.sandbox.cmp(&b.sandbox));
        Ok(merged)
    }

    /// What a store keeps when `sandboxes` are removed from this run
    /// (every store applies this one rule): the rest, or `None` once none
    /// is left (the run goes).
    pub fn without(mut self, sandboxes: &[String]) -> Option<RunRecord> {
        self.sandboxes.retain(|s| !sandboxes.contains(&s.sandbox));
        (!self.sandboxes.is_empty()).then_some(self)
    }
}

/// Storage of delivery runs. Every method is one transaction.
#[async_trait::async_trait]
pub trait RunStore: Send + Sync + std::fmt::Debug {
    /// The owner's run `run_id` of workload `workload`.
    async fn run(
        &self,
        owner: &str,
        workload: &str,
        run_id: &str,
    ) -> Result<Option<RunRecord>, StoreError>;

    /// The owner's runs of `workload`, by run id.
    async fn runs_of(&self, owner: &str, workload: &str) -> Result<Vec<RunRecord>, StoreError>;

    /// Registers `run`: creates it, or adds its sandboxes to the stored run
    /// (replacing entries of the same sandbox). A stored run of another
    /// revision is left alone: [`StoreError::Conflict`]. Returns the stored
    /// record.
    async fn add_to_run(&self, run: &RunRecord) -> Result<RunRecord, StoreError>;

    /// Removes `sandboxes` from the run, and the run once none is left.
    /// Returns what is left (`None`: the run is gone, or never existed).
    async fn remove_from_run(
        &self,
        owner: &str,
        workload: &str,
        run_id: &str,
        sandboxes: &[String],
    ) -> Result<Option<RunRecord>, StoreError>;
}
