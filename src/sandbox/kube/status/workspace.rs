//! The workspace and the strategy of a direct pool, read back from its
//! Sandboxes' annotations and its managed PVC.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::PersistentVolumeClaim;

use crate::pool::model::{Strategy, WorkspaceView};
use crate::pool::names;

use super::super::objects::{
    StrategyKind, ANN_WORKSPACE_ACCESS_MODE, ANN_WORKSPACE_SIZE, ANN_WORKSPACE_STORAGE_CLASS,
};

/// The strategy as requested: the size and class recorded on the Sandboxes
/// at creation (the PVC may report a canonicalised size or a defaulted
/// class), else what the workspace shows.
pub(super) fn requested_strategy(
    kind: StrategyKind,
    annotations: &BTreeMap<String, String>,
    workspace: &WorkspaceView,
) -> Strategy {
    let size = annotations
        .get(ANN_WORKSPACE_SIZE)
        .filter(|size| !size.is_empty())
        .cloned()
        .unwrap_or_else(|| workspace.size.clone());
    let storage_class = if annotations.contains_key(ANN_WORKSPACE_SIZE) {
        annotations.get(ANN_WORKSPACE_STORAGE_CLASS).cloned()
    } else {
        workspace.storage_class.clone()
    };
    match kind {
        StrategyKind::Shared => Strategy::Shared {
            size,
            storage_class,
        },
        StrategyKind::Existing => Strategy::Existing {
            claim_name: workspace.claim_name.clone().unwrap_or_default(),
            read_only: workspace.read_only.unwrap_or(false),
        },
        // Warm pools never reach here (they have claims); treat an odd
        // annotation like the default topology.
        StrategyKind::Dedicated | StrategyKind::Warm => Strategy::Dedicated {
            size,
            storage_class,
        },
    }
}

/// Dedicated vs shared vs existing for objects without our strategy
/// annotation (made by the Go prototype).
pub(super) fn infer_strategy(has_claim: bool, pvcs: &[&PersistentVolumeClaim]) -> StrategyKind {
    if has_claim {
        return StrategyKind::Existing;
    }
    let shared = pvcs
        .first()
        .map(|pvc| first_access_mode(pvc) == "ReadWriteMany")
        .unwrap_or(false);
    if shared {
        StrategyKind::Shared
    } else {
        StrategyKind::Dedicated
    }
}

/// The workspace of a direct pool: the managed PVC's values (canonical, as
/// upstream) when it is cached, else what the Sandboxes recorded.
pub(super) fn direct_workspace(
    annotations: &BTreeMap<String, String>,
    claim_name: Option<String>,
    pvc: Option<&PersistentVolumeClaim>,
) -> WorkspaceView {
    let recorded = |key: &str| annotations.get(key).cloned().unwrap_or_default();
    let read_only = claim_name.as_ref().map(|_| {
        annotations
            .get(names::WORKSPACE_READ_ONLY_ANNOTATION)
            .map(|value| parse_go_bool(value))
            .unwrap_or(false)
    });
    match pvc.filter(|_| claim_name.is_none()) {
        Some(pvc) => {
            let spec = pvc.spec.as_ref();
            WorkspaceView {
                size: spec
                    .and_then(|spec| spec.resources.as_ref())
                    .and_then(|resources| resources.requests.as_ref())
                    .and_then(|requests| requests.get("storage"))
                    .map(|quantity| quantity.0.clone())
                    .unwrap_or_else(|| recorded(ANN_WORKSPACE_SIZE)),
                access_mode: first_access_mode(pvc),
                storage_class: spec
                    .and_then(|spec| spec.storage_class_name.clone())
                    .filter(|class| !class.is_empty()),
                claim_name: None,
                read_only: None,
            }
        }
        None => WorkspaceView {
            size: recorded(ANN_WORKSPACE_SIZE),
            access_mode: recorded(ANN_WORKSPACE_ACCESS_MODE),
            storage_class: annotations
                .get(ANN_WORKSPACE_STORAGE_CLASS)
                .filter(|class| !class.is_empty())
                .cloned(),
            claim_name,
            read_only,
        },
    }
}

/// First access mode of a PVC's spec, or empty.
pub(super) fn first_access_mode(pvc: &PersistentVolumeClaim) -> String {
    pvc.spec
        .as_ref()
        .and_then(|spec| spec.access_modes.as_ref())
        .and_then(|modes| modes.first())
        .cloned()
        .unwrap_or_default()
}

/// Go's `strconv.ParseBool` truth values (what upstream wrote and read).
pub(super) fn parse_go_bool(value: &str) -> bool {
    matches!(value, "1" | "t" | "T" | "TRUE" | "true" | "True")
}
