//! The JSON records on disk: the pool record (spec + state) and the
//! metadata of volumes, sandboxes and claims, with the labels and
//! annotations of the Kubernetes objects they stand for.

use std::collections::BTreeMap;
use std::fs;
use std::io;

use serde::{Deserialize, Serialize};

use super::layout::{internal, read_json, SANDBOX_FILE, VOLUME_FILE};
use super::Inner;
use crate::fsutil;
use crate::pool::model::{AccessMode, PoolSpec};
use crate::pool::{names, BackendError};

/// Where a pool's creation stands: `creating` until every object is made
/// and synced, so a crash in between is rolled back on open.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub(super) enum RecordState {
    /// Objects are being made.
    Creating,
    /// Every object was made.
    Created,
}

/// `pools/<pool>.json`: the spec as created, and how far creation got.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(super) struct PoolRecord {
    pub(super) spec: PoolSpec,
    pub(super) state: RecordState,
}

/// Name, labels and annotations, as on the Kubernetes object.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub(super) struct ObjectMeta {
    pub(super) name: String,
    pub(super) labels: BTreeMap<String, String>,
    #[serde(default)]
    pub(super) annotations: BTreeMap<String, String>,
}

impl ObjectMeta {
    /// The value of label `key`.
    pub(super) fn label(&self, key: &str) -> Option<&str> {
        self.labels.get(key).map(String::as_str)
    }

    /// Whether the object carries the pool label of `pool`.
    pub(super) fn belongs_to(&self, pool: &str) -> bool {
        self.label(names::POOL_LABEL) == Some(pool)
    }
}

/// `volumes/<pvc>/volume.json`: a workspace or context volume (a PVC).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(super) struct VolumeMeta {
    pub(super) meta: ObjectMeta,
    pub(super) size: String,
    pub(super) access_mode: AccessMode,
    pub(super) storage_class: Option<String>,
}

/// `sandboxes/<name>/sandbox.json`: a sandbox (a `Sandbox`).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(super) struct SandboxMeta {
    pub(super) meta: ObjectMeta,
    /// The mounted volume, for direct strategies.
    pub(super) volume: Option<String>,
    pub(super) read_only: bool,
    /// The warm pool it came from, for claimed sandboxes.
    pub(super) warm_pool: Option<String>,
    /// Suspended (as `operatingMode: Suspended`): the directory and its
    /// workspace stay, exec and delivery are refused.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub(super) suspended: bool,
}

/// `claims/<claim>.json`: a warm-pool claim (a `SandboxClaim`).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(super) struct ClaimMeta {
    pub(super) meta: ObjectMeta,
    pub(super) warm_pool: String,
    /// The sandbox adopted from the warm pool.
    pub(super) sandbox: String,
}

impl Inner {
    pub(super) fn read_record(&self, pool: &str) -> Result<Option<PoolRecord>, BackendError> {
        read_json(&self.record_path(pool)).map_err(internal(format!("read pool record {pool}")))
    }

    pub(super) fn write_record(&self, record: &PoolRecord) -> Result<(), BackendError> {
        let bytes = serde_json::to_vec_pretty(record)
            .map_err(|e| BackendError::internal("encode pool record", e))?;
        fsutil::write_atomic(&self.record_path(&record.spec.name), &bytes, 0o600)
            .map_err(internal(format!("write pool record {}", record.spec.name)))
    }

    pub(super) fn read_volume(
        &self,
        ns: &str,
        name: &str,
    ) -> Result<Option<VolumeMeta>, BackendError> {
        read_json(&self.volume_dir(ns, name).join(VOLUME_FILE))
            .map_err(internal(format!("read volume {ns}/{name}")))
    }

    pub(super) fn read_sandbox(&self, name: &str) -> Result<Option<SandboxMeta>, BackendError> {
        read_json(&self.sandbox_dir(name).join(SANDBOX_FILE))
            .map_err(internal(format!("read sandbox {name}")))
    }

    pub(super) fn read_claim(&self, name: &str) -> Result<Option<ClaimMeta>, BackendError> {
        read_json(&self.claim_path(name)).map_err(internal(format!("read sandbox claim {name}")))
    }

    /// Names of every pool record, sorted.
    pub(super) fn record_names(&self) -> Result<Vec<String>, BackendError> {
        let mut out = Vec::new();
        let entries = match fs::read_dir(self.pools_dir()) {
            Ok(e) => e,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(out),
            Err(e) => return Err(BackendError::internal("list pool records", e)),
        };
        for entry in entries {
            let entry = entry.map_err(internal("list pool records"))?;
            let file = entry.file_name();
            let Some(file) = file.to_str() else { continue };
            // Skips temp files of interrupted atomic writes.
            if file.starts_with(fsutil::TEMP_PREFIX) {
                continue;
            }
            if let Some(name) = file.strip_suffix(".json") {
                out.push(name.to_owned());
            }
        }
        out.sort();
        Ok(out)
    }
}

/// A volume that is another owner's managed volume is invisible.
pub(super) fn visible_to(meta: &ObjectMeta, owner_scope: &str) -> bool {
    match meta.label(names::OWNER_LABEL) {
        Some(owner) => owner == owner_scope,
        None => true,
    }
}
