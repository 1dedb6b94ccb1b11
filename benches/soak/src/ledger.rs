//! What the load saw: every answer (operation, target, timing, outcome),
//! every upload that answered `201` and what became of it, and the
//! workloads readers may download meanwhile. The report classifies the
//! answers by phase afterwards, from the fault windows.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Where a request went.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Target {
    /// The round-robin balancer in front of both replicas.
    Balancer,
    /// Replica A directly (its own `local` sandboxes).
    A,
    /// Replica B directly.
    B,
}

/// How a request ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Outcome {
    /// An HTTP answer: status, the body's `error` code if any, and whether
    /// it carried `Retry-After`.
    Status {
        code: u16,
        error: Option<String>,
        retry_after: bool,
    },
    /// No (complete) answer: `refused` (nothing listening), `reset` (the
    /// connection broke, before or during the body), `timeout`.
    Transport(&'static str),
    /// A `200` download whose bytes do not hash to the bundle digest.
    DigestMismatch,
}

impl Outcome {
    /// A short label for the report (`201`, `503 storage_unavailable`,
    /// `reset`).
    pub(crate) fn label(&self) -> String {
        match self {
            Outcome::Status {
                code,
                error: Some(e),
                ..
            } => format!("{code} {e}"),
            Outcome::Status { code, .. } => code.to_string(),
            Outcome::Transport(kind) => (*kind).to_owned(),
            Outcome::DigestMismatch => "digest-mismatch".to_owned(),
        }
    }
}

/// One request and its answer.
#[derive(Clone, Debug)]
pub(crate) struct Entry {
    /// Operation name (`create`, `upload`, `download`, ...).
    pub(crate) op: &'static str,
    pub(crate) target: Target,
    /// Since the start of the run.
    pub(crate) start: Duration,
    pub(crate) end: Duration,
    pub(crate) outcome: Outcome,
    /// The answer the scenario expects at this step (success, or the
    /// documented refusal of a hostile upload, or a `404` for a workload
    /// its owner is deleting).
    pub(crate) expected: bool,
}

/// An upload that answered `201`, and what the scenario did with it next.
#[derive(Clone, Debug, Default)]
pub(crate) struct Upload {
    /// When the `201` came (since the start of the run).
    pub(crate) at: Duration,
    /// Size of the stored bundle.
    pub(crate) bytes: u64,
    pub(crate) activated: bool,
    /// Downloaded after activation with bytes that hash to the digest.
    pub(crate) verified: bool,
    /// The lifecycle gave up on it after an error (recorded in entries).
    pub(crate) abandoned: bool,
}

/// An active workload readers may download.
#[derive(Clone, Debug)]
pub(crate) struct Active {
    pub(crate) owner: usize,
    pub(crate) name: String,
    pub(crate) revision: String,
    pub(crate) digest: String,
    /// Its owner started deleting it: a `404` is then expected.
    pub(crate) deleting: bool,
}

/// Everything the load recorded.
pub(crate) struct Ledger {
    started: Instant,
    entries: Mutex<Vec<Entry>>,
    /// By (owner, workload name, revision).
    uploads: Mutex<HashMap<(usize, String, String), Upload>>,
    active: Mutex<Vec<Active>>,
}

impl Ledger {
    pub(crate) fn new(started: Instant) -> Self {
        Self {
            started,
            entries: Mutex::default(),
            uploads: Mutex::default(),
            active: Mutex::default(),
        }
    }

    /// Time since the start of the run.
    pub(crate) fn now(&self) -> Duration {
        self.started.elapsed()
    }

    pub(crate) fn record(&self, entry: Entry) {
        lock(&self.entries).push(entry);
    }

    pub(crate) fn entries(&self) -> Vec<Entry> {
        lock(&self.entries).clone()
    }

    pub(crate) fn uploaded(&self, owner: usize, name: &str, revision: &str, mut upload: Upload) {
        upload.at = self.now();
        lock(&self.uploads).insert((owner, name.to_owned(), revision.to_owned()), upload);
    }

    /// Applies `change` to the upload's record, if there is one.
    pub(crate) fn update_upload(
        &self,
        owner: usize,
        name: &str,
        revision: &str,
        change: impl FnOnce(&mut Upload),
    ) {
        if let Some(u) = lock(&self.uploads).get_mut(&(owner, name.to_owned(), revision.to_owned()))
        {
            change(u);
        }
    }

    pub(crate) fn uploads(&self) -> Vec<Upload> {
        lock(&self.uploads).values().cloned().collect()
    }

    pub(crate) fn add_active(&self, active: Active) {
        lock(&self.active).push(active);
    }

    /// Marks `(owner, name)` as being deleted (readers' `404`s expected).
    pub(crate) fn deleting(&self, owner: usize, name: &str) {
        for a in lock(&self.active).iter_mut() {
            if a.owner == owner && a.name == name {
                a.deleting = true;
            }
        }
    }

    /// Forgets `(owner, name)` once its delete answered.
    pub(crate) fn deleted(&self, owner: usize, name: &str) {
        lock(&self.active).retain(|a| !(a.owner == owner && a.name == name));
    }

    /// A random active workload not being deleted.
    pub(crate) fn pick_active(&self) -> Option<Active> {
        let active = lock(&self.active);
        let live: Vec<&Active> = active.iter().filter(|a| !a.deleting).collect();
        if live.is_empty() {
            return None;
        }
        Some(live[rand::random_range(0..live.len())].clone())
    }

    /// Whether `(owner, name)` is (still) listed and not being deleted.
    pub(crate) fn is_live(&self, owner: usize, name: &str) -> bool {
        lock(&self.active)
            .iter()
            .any(|a| a.owner == owner && a.name == name && !a.deleting)
    }
}

/// A poisoned lock only means a user task panicked mid-push: the data is
/// still a list of complete records.
fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}
