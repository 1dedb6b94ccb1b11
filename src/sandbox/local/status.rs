//! Pool status from the tree: members, readiness, and the first problem
//! found (a sandbox, workspace volume or claim gone missing).

use std::collections::BTreeMap;

use crate::pool::model::{
    AccessMode, Member, PoolPhase, PoolSpec, PoolStatus, Strategy, WorkspaceView,
};
use crate::pool::{BackendError, LabelSelector};

use super::layout::{internal, write_json, SANDBOX_FILE};
use super::plan::Plan;
use super::records::{PoolRecord, RecordState};
use super::Inner;

impl Inner {
    /// The pool's status; `None` without a record.
    pub(super) fn get_pool(&self, name: &str) -> Result<Option<PoolStatus>, BackendError> {
        match self.read_record(name)? {
            Some(record) => self.status(&record).map(Some),
            None => Ok(None),
        }
    }

    /// Every pool's status, sorted by name.
    pub(super) fn list_pools(&self) -> Result<Vec<PoolStatus>, BackendError> {
        let mut out = Vec::new();
        for name in self.record_names()? {
            // A pool deleted between listing and reading is simply gone.
            if let Some(status) = self.get_pool(&name)? {
                out.push(status);
            }
        }
        Ok(out)
    }

    /// The status of the pool `record` describes, from what is on disk.
    pub(super) fn status(&self, record: &PoolRecord) -> Result<PoolStatus, BackendError> {
        let spec = &record.spec;
        let plan = Plan::of(spec);
        let mut members = Vec::with_capacity(spec.replicas as usize);
        // The first problem found explains a failed pool.
        let mut problem: Option<(&'static str, String)> = None;
        let mut volume_ok = BTreeMap::<String, bool>::new();
        let mut volume_exists = |name: &str| -> Result<bool, BackendError> {
            if let Some(ok) = volume_ok.get(name) {
                return Ok(*ok);
            }
            let ok = self.read_volume(&self.namespace, name)?.is_some();
            volume_ok.insert(name.to_owned(), ok);
            Ok(ok)
        };
        let mut suspended = false;
        for (index, sandbox) in plan.sandboxes.iter().enumerate() {
            let meta = self.read_sandbox(sandbox)?;
            let exists = meta.is_some();
            let paused = meta.is_some_and(|m| m.suspended);
            suspended |= paused;
            let volume = plan.volume_for(spec, index);
            let mounted = match &volume {
                Some(v) => volume_exists(v)?,
                None => true,
            };
            if problem.is_none() {
                if !exists {
                    problem = Some((
                        "SandboxMissing",
                        format!("sandbox {sandbox} does not exist"),
                    ));
                } else if let (false, Some(v)) = (mounted, &volume) {
                    problem = Some((
                        "WorkspaceMissing",
                        format!("workspace volume {v} does not exist"),
                    ));
                }
            }
            members.push(Member {
                name: sandbox.clone(),
                pod: None,
                ready: exists && mounted && !paused,
            });
        }
        for claim in &plan.claims {
            match self.read_claim(claim)? {
                Some(meta) => {
                    let exists = self.sandbox_dir(&meta.sandbox).join(SANDBOX_FILE).is_file();
                    if !exists && problem.is_none() {
                        problem = Some((
                            "SandboxMissing",
                            format!("sandbox {} of claim {claim} does not exist", meta.sandbox),
                        ));
                    }
                    members.push(Member {
                        name: meta.sandbox,
                        pod: None,
                        ready: exists,
                    });
                }
                None => {
                    if problem.is_none() {
                        problem = Some((
                            "ClaimMissing",
                            format!("sandbox claim {claim} does not exist"),
                        ));
                    }
                    members.push(Member {
                        name: claim.clone(),
                        pod: None,
                        ready: false,
                    });
                }
            }
        }
        let ready_replicas = members.iter().filter(|m| m.ready).count() as u32;
        let workspace = self.workspace_view(spec)?;
        let (phase, reason, message) = match (record.state, problem) {
            (RecordState::Creating, _) => (PoolPhase::Provisioning, None, None),
            (RecordState::Created, None) if suspended => (PoolPhase::Suspended, None, None),
            (RecordState::Created, None) => (PoolPhase::Ready, None, None),
            (RecordState::Created, Some((reason, message))) => {
                (PoolPhase::Failed, Some(reason.to_owned()), Some(message))
            }
        };
        Ok(PoolStatus {
            name: spec.name.clone(),
            replicas: spec.replicas,
            strategy: spec.strategy.clone(),
            workspace,
            phase,
            ready_replicas,
            reason,
            message,
            members,
            owner_scope: spec.owner_scope.clone(),
            expires_at: spec.expires_at,
        })
    }

    /// Marks every sandbox of direct pool `name` suspended or running (the
    /// directories stay); `None` without a pool. Serialised with creations
    /// and deletions of the pool.
    pub(super) fn set_suspended(
        &self,
        name: &str,
        suspended: bool,
    ) -> Result<Option<PoolStatus>, BackendError> {
        let _reserved = self.reserve_pool(name);
        let Some(record) = self.read_record(name)? else {
            return Ok(None);
        };
        for sandbox in &Plan::of(&record.spec).sandboxes {
            let Some(mut meta) = self.read_sandbox(sandbox)? else {
                continue;
            };
            if meta.suspended == suspended || !meta.meta.belongs_to(name) {
                continue;
            }
            meta.suspended = suspended;
            write_json(&self.sandbox_dir(sandbox).join(SANDBOX_FILE), &meta)
                .map_err(internal(format!("update sandbox {sandbox}")))?;
        }
        self.notify();
        self.status(&record).map(Some)
    }

    /// Every sandbox whose recorded labels match `selector`, sorted by
    /// name. Ready when its record is readable and its volume (if any)
    /// exists, as in [`Inner::status`].
    pub(super) fn list_sandboxes(
        &self,
        selector: &LabelSelector,
    ) -> Result<Vec<Member>, BackendError> {
        let dir = self.ns_dir(&self.namespace).join("sandboxes");
        let entries = match std::fs::read_dir(&dir) {
            Ok(e) => e,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(BackendError::internal("list sandboxes", e)),
        };
        let mut out = Vec::new();
        for entry in entries {
            let entry = entry.map_err(|e| BackendError::internal("list sandboxes", e))?;
            let Some(name) = entry.file_name().to_str().map(str::to_owned) else {
                continue;
            };
            // A sandbox removed between listing and reading is simply gone.
            let Some(meta) = self.read_sandbox(&name)? else {
                continue;
            };
            if !selector.matches(&meta.meta.labels) {
                continue;
            }
            let mounted = match &meta.volume {
                Some(v) => self.read_volume(&self.namespace, v)?.is_some(),
                None => true,
            };
            out.push(Member {
                name,
                pod: None,
                ready: mounted && !meta.suspended,
            });
        }
        out.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(out)
    }

    /// The workspace as upstream reports it.
    pub(super) fn workspace_view(&self, spec: &PoolSpec) -> Result<WorkspaceView, BackendError> {
        Ok(match &spec.strategy {
            Strategy::Dedicated {
                size,
                storage_class,
            } => WorkspaceView {
                size: size.clone(),
                access_mode: AccessMode::ReadWriteOnce.as_str().to_owned(),
                storage_class: storage_class.clone(),
                ..WorkspaceView::default()
            },
            Strategy::Shared {
                size,
                storage_class,
            } => WorkspaceView {
                size: size.clone(),
                access_mode: AccessMode::ReadWriteMany.as_str().to_owned(),
                storage_class: storage_class.clone(),
                ..WorkspaceView::default()
            },
            Strategy::Existing {
                claim_name,
                read_only,
            } => {
                // Upstream reports the existing volume's own properties.
                let volume = self.read_volume(&self.namespace, claim_name)?;
                WorkspaceView {
                    size: volume.as_ref().map(|v| v.size.clone()).unwrap_or_default(),
                    access_mode: volume
                        .as_ref()
                        .map(|v| v.access_mode.as_str().to_owned())
                        .unwrap_or_default(),
                    storage_class: volume.and_then(|v| v.storage_class),
                    claim_name: Some(claim_name.clone()),
                    read_only: Some(*read_only),
                }
            }
            Strategy::Warm { .. } => WorkspaceView::default(),
        })
    }
}
