//! Pool creation: the record goes `creating`, several threads make the
//! objects, the directories are synced, the record goes `created`. A
//! failure half-way rolls back what this call made.

use std::collections::BTreeMap;
use std::io;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Mutex, PoisonError};

use crate::fsutil;
use crate::pool::model::{AccessMode, PoolSpec, PoolStatus, Strategy};
use crate::pool::{names, BackendError};

use super::layout::{
    create_new_dir, internal, remove_dir, remove_file, write_json, SANDBOX_FILE, VOLUME_FILE,
};
use super::plan::Plan;
use super::records::{ClaimMeta, ObjectMeta, PoolRecord, RecordState, SandboxMeta, VolumeMeta};
use super::Inner;

/// Runs `work` over `items` on up to [`WORKERS`] threads (the file system
/// overlaps their fsyncs); stops at the first error and returns it.
pub(super) fn parallel<T: Sync>(
    items: &[T],
    work: impl Fn(usize, &T) -> Result<(), BackendError> + Sync,
) -> Result<(), BackendError> {
    if items.len() <= 1 {
        return items.iter().enumerate().try_for_each(|(i, t)| work(i, t));
    }
    let next = AtomicUsize::new(0);
    let stop = AtomicBool::new(false);
    let failure = Mutex::new(None);
    std::thread::scope(|scope| {
        for _ in 0..WORKERS.min(items.len()) {
            scope.spawn(|| {
                while !stop.load(Ordering::Relaxed) {
                    let index = next.fetch_add(1, Ordering::Relaxed);
                    let Some(item) = items.get(index) else { break };
                    if let Err(e) = work(index, item) {
                        stop.store(true, Ordering::Relaxed);
                        failure
                            .lock()
                            .unwrap_or_else(PoisonError::into_inner)
                            .get_or_insert(e);
                        break;
                    }
                }
            });
        }
    });
    match failure.into_inner().unwrap_or_else(PoisonError::into_inner) {
        Some(e) => Err(e),
        None => Ok(()),
    }
}

/// Threads that create the objects of one pool.
pub(super) const WORKERS: usize = 8;

/// What one create call made so far, to undo it on failure.
#[derive(Debug, Default)]
pub(super) struct Created {
    pub(super) volumes: Vec<String>,
    pub(super) sandboxes: Vec<String>,
    pub(super) claims: Vec<String>,
}

impl Inner {
    /// The labels of every object of the pool.
    pub(super) fn labels(&self, spec: &PoolSpec) -> BTreeMap<String, String> {
        BTreeMap::from([
            (names::POOL_LABEL.to_owned(), spec.name.clone()),
            (
                names::MANAGED_BY_LABEL.to_owned(),
                names::MANAGED_BY_VALUE.to_owned(),
            ),
            (names::OWNER_LABEL.to_owned(), spec.owner_scope.clone()),
        ])
    }

    /// Creates the pool, or rolls back what it made and returns the error.
    pub(super) fn create_pool(&self, spec: &PoolSpec) -> Result<PoolStatus, BackendError> {
        let (plan, _reserved) = self.reserve_for_create(spec)?;
        self.write_record(&PoolRecord {
            spec: spec.clone(),
            state: RecordState::Creating,
        })?;
        self.notify();
        let created = Mutex::new(Created::default());
        let result = self
            .create_objects(spec, &plan, &created)
            .and_then(|()| self.sync_object_dirs())
            .and_then(|()| {
                self.write_record(&PoolRecord {
                    spec: spec.clone(),
                    state: RecordState::Created,
                })
            });
        if let Err(err) = result {
            let created = created.into_inner().unwrap_or_else(PoisonError::into_inner);
            self.rollback(spec, &created);
            self.notify();
            return Err(err);
        }
        self.notify();
        self.status(&PoolRecord {
            spec: spec.clone(),
            state: RecordState::Created,
        })
    }

    /// Test hook: fails the creation of the object named in `fail_on`.
    pub(super) fn fault(&self, object: &str, what: &str) -> Result<(), BackendError> {
        #[cfg(test)]
        if let Ok(f) = self.fail_on.lock() {
            if f.as_deref() == Some(object) {
                return Err(BackendError::internal(
                    what.to_owned(),
                    io::Error::other("injected failure"),
                ));
            }
        }
        let _ = (object, what);
        Ok(())
    }

    /// Makes the new entries of the object directories durable before the
    /// record says `created`.
    pub(super) fn sync_object_dirs(&self) -> Result<(), BackendError> {
        let ns = self.ns_dir(&self.namespace);
        for dir in ["volumes", "sandboxes", "claims"] {
            match fsutil::sync_dir(&ns.join(dir)) {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                Err(e) => return Err(BackendError::internal(format!("sync {dir}"), e)),
            }
        }
        Ok(())
    }

    /// Makes the plan's volumes, then sandboxes, then claims, recording each
    /// in `created` for a rollback.
    pub(super) fn create_objects(
        &self,
        spec: &PoolSpec,
        plan: &Plan,
        created: &Mutex<Created>,
    ) -> Result<(), BackendError> {
        let labels = self.labels(spec);
        let pool_annotations = names::expiry_annotations(spec.expires_at);
        let record = |f: &dyn Fn(&mut Created)| {
            f(&mut created.lock().unwrap_or_else(PoisonError::into_inner));
        };
        parallel(&plan.volumes, |_, volume| {
            let what = format!("create workspace PVC {volume}");
            self.fault(volume, &what)?;
            let (size, access_mode, storage_class) = match &spec.strategy {
                Strategy::Dedicated {
                    size,
                    storage_class,
                } => (size, AccessMode::ReadWriteOnce, storage_class),
                Strategy::Shared {
                    size,
                    storage_class,
                } => (size, AccessMode::ReadWriteMany, storage_class),
                _ => return Ok(()),
            };
            let mut volume_labels = labels.clone();
            volume_labels.insert(names::REPLICAS_KEY.to_owned(), spec.replicas.to_string());
            let meta = VolumeMeta {
                meta: ObjectMeta {
                    name: volume.clone(),
                    labels: volume_labels,
                    annotations: pool_annotations.clone(),
                },
                size: size.clone(),
                access_mode,
                storage_class: storage_class.clone(),
            };
            let dir = self.volume_dir(&self.namespace, volume);
            create_new_dir(&dir).map_err(internal(what.clone()))?;
            record(&|c| c.volumes.push(volume.clone()));
            fsutil::ensure_dir(&dir.join("data"), 0o755).map_err(internal(what.clone()))?;
            write_json(&dir.join(VOLUME_FILE), &meta).map_err(internal(what))
        })?;
        let read_only = matches!(
            spec.strategy,
            Strategy::Existing {
                read_only: true,
                ..
            }
        );
        parallel(&plan.sandboxes, |index, sandbox| {
            let what = format!("create sandbox {index}");
            self.fault(sandbox, &what)?;
            let volume = plan.volume_for(spec, index);
            let mut annotations = pool_annotations.clone();
            annotations.extend([
                (
                    names::WORKSPACE_READ_ONLY_ANNOTATION.to_owned(),
                    read_only.to_string(),
                ),
                (names::REPLICAS_KEY.to_owned(), spec.replicas.to_string()),
            ]);
            if let Strategy::Existing { claim_name, .. } = &spec.strategy {
                annotations.insert(
                    names::WORKSPACE_CLAIM_ANNOTATION.to_owned(),
                    claim_name.clone(),
                );
            }
            let meta = SandboxMeta {
                meta: ObjectMeta {
                    name: sandbox.clone(),
                    labels: labels.clone(),
                    annotations,
                },
                volume,
                read_only,
                warm_pool: None,
                suspended: false,
            };
            // Recorded first: a failure half-way leaves a directory to remove.
            record(&|c| c.sandboxes.push(sandbox.clone()));
            self.make_sandbox(&meta).map_err(internal(what))
        })?;
        if let Strategy::Warm { pool } = &spec.strategy {
            parallel(&plan.claims, |index, claim| {
                let what = format!("create sandbox claim {index}");
                self.fault(claim, &what)?;
                let sandbox = plan.warm_sandboxes.get(index).cloned().ok_or_else(|| {
                    BackendError::internal(what.clone(), io::Error::other("no sandbox planned"))
                })?;
                let meta = SandboxMeta {
                    meta: ObjectMeta {
                        name: sandbox.clone(),
                        labels: BTreeMap::from([
                            (names::POOL_LABEL.to_owned(), spec.name.clone()),
                            (names::OWNER_LABEL.to_owned(), spec.owner_scope.clone()),
                        ]),
                        annotations: BTreeMap::new(),
                    },
                    volume: None,
                    read_only: false,
                    warm_pool: Some(pool.clone()),
                    suspended: false,
                };
                let claim_meta = ClaimMeta {
                    meta: ObjectMeta {
                        name: claim.clone(),
                        labels: labels.clone(),
                        annotations: pool_annotations.clone(),
                    },
                    warm_pool: pool.clone(),
                    sandbox: sandbox.clone(),
                };
                // The claim first, so a rollback always finds the sandbox.
                write_json(&self.claim_path(claim), &claim_meta).map_err(internal(what.clone()))?;
                record(&|c| c.claims.push(claim.clone()));
                self.make_sandbox(&meta).map_err(internal(what))
            })?;
        }
        Ok(())
    }

    /// A sandbox directory with its metadata and its workspace (a link to
    /// the mounted volume, or an empty directory).
    pub(super) fn make_sandbox(&self, meta: &SandboxMeta) -> io::Result<()> {
        let dir = self.sandbox_dir(&meta.meta.name);
        create_new_dir(&dir)?;
        let workspace = dir.join("workspace");
        match &meta.volume {
            // Relative, so the tree can be moved as a whole.
            Some(volume) => std::os::unix::fs::symlink(
                Path::new("../../volumes").join(volume).join("data"),
                &workspace,
            )?,
            None => fsutil::ensure_dir(&workspace, 0o755)?,
        }
        write_json(&dir.join(SANDBOX_FILE), meta)
    }

    /// Best effort: removes what this create call made, newest first. Errors
    /// are logged; the record stays `creating` if anything is left, so the
    /// next start finishes the job.
    pub(super) fn rollback(&self, spec: &PoolSpec, created: &Created) {
        let mut clean = true;
        for claim in created.claims.iter().rev() {
            clean &= self.remove_claim(claim, &spec.name).is_ok();
        }
        for sandbox in created.sandboxes.iter().rev() {
            clean &= remove_dir(&self.sandbox_dir(sandbox)).is_ok();
        }
        for volume in created.volumes.iter().rev() {
            clean &= remove_dir(&self.volume_dir(&self.namespace, volume)).is_ok();
        }
        if clean {
            if let Err(e) = remove_file(&self.record_path(&spec.name)) {
                tracing::error!(pool = %spec.name, error = %e, "rollback: cannot remove the pool record");
            }
        } else {
            tracing::error!(pool = %spec.name, "rollback incomplete; it finishes at the next start or delete");
        }
    }
}
