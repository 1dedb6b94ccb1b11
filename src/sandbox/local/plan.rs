//! What a pool spec creates: the names of its volumes, sandboxes and
//! claims, in creation order (the names of the Kubernetes backend).

use crate::pool::model::{PoolSpec, Strategy};
use crate::pool::names;

/// The objects a spec creates, in creation order.
#[derive(Debug, Default)]
pub(super) struct Plan {
    pub(super) volumes: Vec<String>,
    pub(super) sandboxes: Vec<String>,
    pub(super) claims: Vec<String>,
    /// The sandboxes the claims adopt (chosen at creation only).
    pub(super) warm_sandboxes: Vec<String>,
}

impl Plan {
    /// The plan of `spec`.
    pub(super) fn of(spec: &PoolSpec) -> Self {
        let n = spec.replicas;
        let name = spec.name.as_str();
        let sandboxes = || (0..n).map(|i| names::sandbox(name, i)).collect();
        match &spec.strategy {
            Strategy::Dedicated { .. } => Plan {
                volumes: (0..n)
                    .map(|i| names::dedicated_workspace(name, i))
                    .collect(),
                sandboxes: sandboxes(),
                ..Plan::default()
            },
            Strategy::Shared { .. } => Plan {
                volumes: vec![names::shared_workspace(name)],
                sandboxes: sandboxes(),
                ..Plan::default()
            },
            Strategy::Existing { .. } => Plan {
                sandboxes: sandboxes(),
                ..Plan::default()
            },
            Strategy::Warm { .. } => Plan {
                claims: (0..n).map(|i| names::claim(name, i)).collect(),
                ..Plan::default()
            },
        }
    }

    /// The volume sandbox `index` mounts.
    pub(super) fn volume_for(&self, spec: &PoolSpec, index: usize) -> Option<String> {
        match &spec.strategy {
            Strategy::Dedicated { .. } => self.volumes.get(index).cloned(),
            Strategy::Shared { .. } => self.volumes.first().cloned(),
            Strategy::Existing { claim_name, .. } => Some(claim_name.clone()),
            Strategy::Warm { .. } => None,
        }
    }
}
