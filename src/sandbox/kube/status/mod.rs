//! Pool status from plain objects: phase (`provisioning | ready | failed`)
//! with reason and message from the Sandbox / SandboxClaim / Pod conditions,
//! ready count, members, and the workspace description.
//!
//! Pure functions over objects already selected for one pool, so they are
//! unit-testable without a cluster; the watch caches feed them. This
//! module finds the members of warm and direct pools; `conditions` says
//! why a member is not ready and what phase that gives the pool;
//! `workspace` reads back a direct pool's workspace and strategy.
//!
//! A create records on its objects until when it may still add members
//! (`creating-until`) and on its first object whether it finished
//! (`created`, [`create_mark`]): within the window a create is
//! `provisioning` on every replica; after it, one that never marked its
//! completion is `failed` (`CreateAbandoned`, [`abandoned`]) and the reaper
//! deletes it, while a finished one's missing member is `failed`
//! (`SandboxMissing`) and stays.

mod conditions;
mod workspace;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::ResourceExt;

use k8s_openapi::jiff::{SignedDuration, Timestamp};

use crate::pool::model::{Member, PoolPhase, PoolStatus, Strategy, WorkspaceView};
use crate::pool::names;

use super::crd::{Condition, Sandbox, SandboxClaim};
use super::objects::{Kind, StrategyKind, ANN_POD_NAME, ANN_STRATEGY, OPERATING_MODE_SUSPENDED};
use conditions::{condition, finish, is_true, Problem, DEPENDENCIES_NOT_READY};
use workspace::{direct_workspace, infer_strategy, requested_strategy};

/// Label the claim controller puts on the Sandbox it binds to a claim.
const LABEL_CLAIM_UID: &str = "agents.x-k8s.io/claim-uid";

/// The objects of one pool, as selected by its pool label, plus the
/// Sandboxes its claims are bound to (they carry the controller's labels,
/// not ours, after a warm adoption).
#[derive(Debug, Clone, Default)]
pub struct PoolObjects {
    /// SandboxClaims with the pool label.
    pub claims: Vec<Arc<SandboxClaim>>,
    /// Sandboxes with the pool label (direct strategies).
    pub sandboxes: Vec<Arc<Sandbox>>,
    /// Managed PVCs with the pool label.
    pub pvcs: Vec<Arc<PersistentVolumeClaim>>,
    /// Pods of the pool's sandboxes.
    pub pods: Vec<Arc<Pod>>,
    /// Sandboxes bound to the pool's claims, found by `status.sandbox.name`.
    pub bound_sandboxes: Vec<Arc<Sandbox>>,
}

impl PoolObjects {
    /// No claim, Sandbox or PVC carries the pool label: there is no pool.
    pub fn is_empty(&self) -> bool {
        self.claims.is_empty() && self.sandboxes.is_empty() && self.pvcs.is_empty()
    }

    /// The kind and metadata of every labelled object: claims, Sandboxes,
    /// then PVCs.
    fn metadata(&self) -> impl Iterator<Item = (Kind, &ObjectMeta)> {
        let claims = self.claims.iter().map(|c| (Kind::Claim, &c.metadata));
        let sandboxes = self.sandboxes.iter().map(|s| (Kind::Sandbox, &s.metadata));
        let pvcs = self.pvcs.iter().map(|p| (Kind::Pvc, &p.metadata));
        claims.chain(sandboxes).chain(pvcs)
    }
}

/// The status of pool `name`, or `None` when no object of it exists.
/// `creating` says this process is creating the pool right now, so missing
/// members are expected rather than a failure (and it is not abandoned,
/// however long it takes).
pub fn pool_status(name: &str, objects: &PoolObjects, creating: bool) -> Option<PoolStatus> {
    if objects.is_empty() {
        return None;
    }
    let now = Timestamp::now();
    // Maybe another replica of the service is creating it.
    let pending = creating || create_pending(objects, now);
    let mut status = if objects.claims.is_empty() {
        direct_status(name, objects, pending)
    } else {
        warm_status(name, objects, pending)
    };
    if !creating && abandoned(objects, now).is_some() {
        status.phase = PoolPhase::Failed;
        status.reason = Some(CREATE_ABANDONED.to_owned());
        status.message = Some(format!(
            "the create stopped at {} of {} sandboxes: the replica making it went away; \
             its objects are being deleted",
            status.members.len(),
            status.replicas
        ));
    }
    Some(status)
}

/// Reason of a pool whose create was abandoned half-way ([`abandoned`]).
pub const CREATE_ABANDONED: &str = "CreateAbandoned";

/// Where a create stands, from its completion mark
/// ([`names::CREATED_ANNOTATION`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MarkState {
    /// Still making objects (or dead before the mark).
    Pending,
    /// Every object was made (any value but pending or abandoned reads so:
    /// never reaped).
    Done,
    /// A reaper claimed it and is deleting what it made.
    Abandoned,
}

/// A create's completion mark, as its anchor carries it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CreateMark {
    /// Kind of the anchor.
    pub kind: Kind,
    /// Name of the anchor.
    pub name: String,
    /// The mark.
    pub state: MarkState,
    /// The end of that create's window, from the anchor.
    pub until: Option<Timestamp>,
    /// When the create finished, if done and recorded (earlier versions
    /// wrote no time).
    pub done_at: Option<Timestamp>,
}

/// The completion mark of the pool's create, from the one object carrying
/// it; `None` for pools of older versions and for a pool whose anchor was
/// deleted since.
pub fn create_mark(objects: &PoolObjects) -> Option<CreateMark> {
    objects.metadata().find_map(|(kind, meta)| {
        let annotations = meta.annotations.as_ref()?;
        let value = annotations.get(names::CREATED_ANNOTATION)?;
        let state = match value.as_str() {
            names::CREATED_PENDING => MarkState::Pending,
            names::CREATED_ABANDONED => MarkState::Abandoned,
            _ => MarkState::Done,
        };
        Some(CreateMark {
            kind,
            name: meta.name.clone().unwrap_or_default(),
            state,
            until: window_end(annotations),
            done_at: value.parse().ok().filter(|_| state == MarkState::Done),
        })
    })
}

/// The mark of a create that was abandoned at `now`: still pending after
/// its window (the replica making it died half-way), or already claimed
/// by a reaper. Its objects are to be deleted.
pub fn abandoned(objects: &PoolObjects, now: Timestamp) -> Option<CreateMark> {
    create_mark(objects).filter(|mark| match mark.state {
        MarkState::Abandoned => true,
        MarkState::Pending => mark.until.is_some_and(|until| until <= now),
        MarkState::Done => false,
    })
}

/// Status of a warm pool: claim → bound Sandbox → pod (agent-sandbox §3.1).
fn warm_status(name: &str, objects: &PoolObjects, creating: bool) -> PoolStatus {
    let mut claims: Vec<&SandboxClaim> = objects.claims.iter().map(Arc::as_ref).collect();
    claims.sort_by_key(|claim| index_key(&claim.name_any()));
    let first = claims[0];
    let replicas = replicas_from(first.annotations()).unwrap_or(claims.len() as u32);
    // The pods the caches hold with this pool's label: what the pool's
    // selector matches.
    let labelled: BTreeSet<&str> = objects
        .pods
        .iter()
        .filter_map(|pod| pod.metadata.name.as_deref())
        .collect();
    let mut members = Vec::with_capacity(claims.len());
    let mut problems = Vec::new();
    for claim in &claims {
        let ready_condition = claim
            .status
            .as_ref()
            .and_then(|status| condition(&status.conditions, "Ready"));
        let terminating = claim.metadata.deletion_timestamp.is_some();
        let claim_ready = is_true(ready_condition) && !terminating;
        let bound = claim
            .status
            .as_ref()
            .and_then(|status| status.sandbox.as_ref())
            .map(|sandbox| sandbox.name.as_str())
            .filter(|name| !name.is_empty());
        let (member_name, pod) = match bound {
            Some(sandbox_name) => {
                let sandbox = bound_sandbox(claim, sandbox_name, &objects.bound_sandboxes);
                // Pod name = the controller's annotation, falling back to the
                // Sandbox name (the SDKs' rule); unknown until the Sandbox is
                // seen or the claim reports ready.
                let pod = match sandbox {
                    Some(sandbox) => Some(pod_name(sandbox)),
                    None if claim_ready => Some(sandbox_name.to_string()),
                    None => None,
                };
                (sandbox_name.to_string(), pod)
            }
            None => (claim.name_any(), None),
        };
        // The controller copies the claim's pod label onto the adopted pod
        // a moment after the claim turns ready: until then the pool's
        // selector does not find the member, so it is not ready yet.
        let unlabelled = claim_ready
            && asks_pool_label(claim, name)
            && !pod.as_deref().is_some_and(|pod| labelled.contains(pod));
        if terminating {
            problems.push(Problem::terminating(&claim.name_any()));
        } else if !claim_ready {
            problems.push(Problem::from_condition(&claim.name_any(), ready_condition));
        } else if unlabelled {
            problems.push(Problem::pod_unlabelled(
                &claim.name_any(),
                pod.as_deref().unwrap_or(&member_name),
            ));
        }
        members.push(Member {
            name: member_name,
            pod,
            ready: claim_ready && !unlabelled,
        });
    }
    let strategy = Strategy::Warm {
        pool: first.spec.warm_pool_ref.name.clone(),
    };
    let mut status = finish(
        name,
        replicas,
        strategy,
        WorkspaceView::default(),
        members,
        problems,
        creating,
        owner_of(first.labels()),
    );
    status.expires_at = expires_at(first.annotations());
    status
}

/// The claim asks the controller to put pool `pool`'s label on its pod (as
/// the service's claims do unless `--kube-claim-pod-label` is off).
fn asks_pool_label(claim: &SandboxClaim, pool: &str) -> bool {
    claim
        .spec
        .additional_pod_metadata
        .as_ref()
        .and_then(|metadata| metadata.labels.get(names::POOL_LABEL))
        .is_some_and(|value| value == pool)
}

/// The Sandbox a claim is bound to, only if it really belongs to that claim
/// (its claim-UID label or an owner reference names the claim), so a
/// same-named foreign Sandbox is never reported as a member.
fn bound_sandbox<'a>(
    claim: &SandboxClaim,
    sandbox_name: &str,
    candidates: &'a [Arc<Sandbox>],
) -> Option<&'a Sandbox> {
    let uid = claim.uid()?;
    candidates
        .iter()
        .map(Arc::as_ref)
        .filter(|sandbox| sandbox.name_any() == sandbox_name)
        .find(|sandbox| {
            sandbox.labels().get(LABEL_CLAIM_UID) == Some(&uid)
                || sandbox
                    .owner_references()
                    .iter()
                    .any(|owner| owner.uid == uid)
        })
}

/// Status of a direct pool (dedicated, shared, existing).
fn direct_status(name: &str, objects: &PoolObjects, creating: bool) -> PoolStatus {
    let mut sandboxes: Vec<&Sandbox> = objects.sandboxes.iter().map(Arc::as_ref).collect();
    sandboxes.sort_by_key(|sandbox| index_key(&sandbox.name_any()));
    let mut pvcs: Vec<&PersistentVolumeClaim> = objects.pvcs.iter().map(Arc::as_ref).collect();
    pvcs.sort_by_key(|pvc| index_key(&pvc.name_any()));
    let first_sandbox = sandboxes.first().copied();
    let first_pvc = pvcs.first().copied();

    let annotations = first_sandbox
        .map(|s| s.annotations().clone())
        .unwrap_or_default();
    let replicas = replicas_from(&annotations)
        .or_else(|| first_pvc.and_then(|pvc| replicas_from(pvc.labels())))
        .unwrap_or(sandboxes.len() as u32);
    let claim_name = annotations
        .get(names::WORKSPACE_CLAIM_ANNOTATION)
        .filter(|claim| !claim.is_empty())
        .cloned();
    let kind = annotations
        .get(ANN_STRATEGY)
        .and_then(|value| StrategyKind::parse(value))
        .filter(|kind| *kind != StrategyKind::Warm)
        .unwrap_or_else(|| infer_strategy(claim_name.is_some(), &pvcs));
    let workspace = direct_workspace(&annotations, claim_name, first_pvc);
    let strategy = requested_strategy(kind, &annotations, &workspace);

    let pods: BTreeMap<String, &Pod> = objects
        .pods
        .iter()
        .map(|pod| (pod.name_any(), pod.as_ref()))
        .collect();
    let mut members = Vec::with_capacity(sandboxes.len());
    let mut problems = Vec::new();
    let mut suspended = false;
    for sandbox in &sandboxes {
        // The desired state decides: a suspended Sandbox whose pod is still
        // going away is not usable any more.
        let paused = is_suspended(sandbox);
        suspended |= paused;
        let conditions = sandbox
            .status
            .as_ref()
            .map(|status| status.conditions.as_slice())
            .unwrap_or_default();
        let ready_condition = condition(conditions, "Ready");
        let terminating = sandbox.metadata.deletion_timestamp.is_some();
        let expected_pod = pod_name(sandbox);
        let pod = pods.get(&expected_pod).copied();
        let ready = (is_true(ready_condition) || pod_makes_ready(sandbox, ready_condition, pod))
            && !terminating
            && !paused;
        let known_pod = sandbox.annotations().contains_key(ANN_POD_NAME) || pod.is_some();
        if terminating {
            problems.push(Problem::terminating(&sandbox.name_any()));
        } else if !ready && !paused {
            // A paused member is no problem: the pool reads `suspended`.
            let problem = pod
                .and_then(|pod| Problem::from_pod(&sandbox.name_any(), pod))
                .unwrap_or_else(|| {
                    Problem::from_sandbox(&sandbox.name_any(), conditions, ready_condition)
                });
            problems.push(problem);
        }
        members.push(Member {
            name: sandbox.name_any(),
            pod: known_pod.then_some(expected_pod),
            ready,
        });
    }
    for pvc in &pvcs {
        if pvc.metadata.deletion_timestamp.is_some() {
            problems.push(Problem::terminating(&pvc.name_any()));
        }
        let lost = pvc
            .status
            .as_ref()
            .and_then(|status| status.phase.as_deref())
            == Some("Lost");
        if lost {
            problems.push(Problem::workspace_lost(&pvc.name_any()));
        }
    }
    let owner = first_sandbox
        .map(|s| owner_of(s.labels()))
        .or_else(|| first_pvc.map(|p| owner_of(p.labels())))
        .unwrap_or_default();
    let mut status = finish(
        name, replicas, strategy, workspace, members, problems, creating, owner,
    );
    status.expires_at = first_sandbox
        .and_then(|s| expires_at(s.annotations()))
        .or_else(|| first_pvc.and_then(|p| expires_at(p.annotations())));
    if suspended && status.phase != PoolPhase::Failed {
        status.phase = PoolPhase::Suspended;
        status.reason = None;
        status.message = None;
    }
    status
}

/// The Sandbox controller's own readiness rule, read off the pod it runs:
/// the pod this Sandbox controls is `Running`, `Ready` and has an IP. The
/// controller writes that same verdict onto the Sandbox one API round trip
/// later (≈ 30–40 ms on a busy control plane), and a harness waits on the
/// slowest member, so the pod's word is taken as soon as it is in. Only
/// while the Sandbox reads as merely pending (no `Ready` yet, or
/// `DependenciesNotReady`): any other reason (several pods, a reconcile
/// error, a finished pod) is the controller's to lift. A Sandbox asking
/// for a Service also needs that Service, which these caches do not
/// watch, so it waits for the controller.
fn pod_makes_ready(sandbox: &Sandbox, ready: Option<&Condition>, pod: Option<&Pod>) -> bool {
    let pending = ready.is_none_or(|ready| ready.reason == DEPENDENCIES_NOT_READY);
    if !pending || sandbox.spec.service == Some(true) {
        return false;
    }
    let Some(pod) = pod else {
        return false;
    };
    let controlled = sandbox.uid().is_some_and(|uid| {
        pod.owner_references()
            .iter()
            .any(|owner| owner.controller == Some(true) && owner.uid == uid)
    });
    let Some(status) = pod.status.as_ref() else {
        return false;
    };
    let pod_ready = status
        .conditions
        .iter()
        .flatten()
        .any(|c| c.type_ == "Ready" && c.status == "True");
    controlled
        && pod.metadata.deletion_timestamp.is_none()
        && status.phase.as_deref() == Some("Running")
        && pod_ready
        && status.pod_ips.as_ref().is_some_and(|ips| !ips.is_empty())
}

/// Whether the Sandbox is asked to be suspended (`spec.operatingMode`).
pub fn is_suspended(sandbox: &Sandbox) -> bool {
    sandbox.spec.operating_mode.as_deref() == Some(OPERATING_MODE_SUSPENDED)
}

/// The latest end of a create recorded on the pool's objects
/// ([`names::CREATING_UNTIL_ANNOTATION`]), if any.
pub fn creating_until(objects: &PoolObjects) -> Option<Timestamp> {
    objects
        .metadata()
        .filter_map(|(_, meta)| window_end(meta.annotations.as_ref()?))
        .max()
}

/// The [`names::CREATING_UNTIL_ANNOTATION`] in `annotations`, if readable.
pub fn window_end(annotations: &BTreeMap<String, String>) -> Option<Timestamp> {
    annotations
        .get(names::CREATING_UNTIL_ANNOTATION)?
        .parse()
        .ok()
}

/// The names of a finished warm pool's claims, when the caches hold all of
/// them: its create's mark is done and the claim of every index below
/// `replicas` (`claim-<pool>-<i>`) is cached, and no other. A create makes
/// no member after its mark is done, so no claim of the pool can then exist
/// that these caches do not show. `None` otherwise.
pub fn finished_claims(pool: &str, objects: &PoolObjects, replicas: u32) -> Option<Vec<String>> {
    if create_mark(objects)?.state != MarkState::Done {
        return None;
    }
    let mut cached: Vec<String> = objects.claims.iter().map(|c| c.name_any()).collect();
    cached.sort_unstable();
    let mut expected: Vec<String> = (0..replicas).map(|i| names::claim(pool, i)).collect();
    expected.sort_unstable();
    (cached == expected).then_some(expected)
}

/// How long after a create finished another replica's caches may still
/// miss some of its members: each kind has its own watch, so the mark on
/// the first PVC can arrive before the last Sandboxes.
pub const CACHE_LAG: SignedDuration = SignedDuration::from_secs(5);

/// Whether a create recorded on the objects may still be adding members at
/// `now` (so missing members are expected, not a failure): its window has
/// not ended, no reaper claimed it as abandoned, and
/// - its mark is pending (members arrive in any order: they are made
///   concurrently), or
/// - it finished less than [`CACHE_LAG`] ago (these caches may lag), or
/// - its mark is not seen yet, and could not have been: the anchor is a PVC
///   (dedicated and shared pools) and no PVC of the pool is cached yet.
///   A warm or existing pool's anchor is its first member, made before the
///   others and watched with them, so there a missing mark means that
///   member was deleted, which is a failure at once.
pub fn create_pending(objects: &PoolObjects, now: Timestamp) -> bool {
    pending_until(objects, now).is_some()
}

/// When a create found pending at `now` ([`create_pending`]) stops being
/// so, if no watch event comes first; `None` when it is not pending.
pub fn pending_until(objects: &PoolObjects, now: Timestamp) -> Option<Timestamp> {
    let window_end = creating_until(objects).filter(|until| *until > now)?;
    let until = match create_mark(objects) {
        Some(mark) => match mark.state {
            MarkState::Pending => window_end,
            MarkState::Abandoned => return None,
            MarkState::Done => mark
                .done_at
                .and_then(|at| at.checked_add(CACHE_LAG).ok())
                .filter(|lag_end| now < *lag_end)?
                .min(window_end),
        },
        None if objects.pvcs.is_empty() && objects.claims.is_empty() && pvc_anchored(objects) => {
            window_end
        }
        None => return None,
    };
    Some(until)
}

/// Whether the pool's Sandboxes record a strategy whose anchor is a PVC.
fn pvc_anchored(objects: &PoolObjects) -> bool {
    objects.sandboxes.iter().any(|sandbox| {
        sandbox
            .annotations()
            .get(ANN_STRATEGY)
            .and_then(|value| StrategyKind::parse(value))
            .is_some_and(|kind| matches!(kind, StrategyKind::Dedicated | StrategyKind::Shared))
    })
}

/// The expiry annotation, when present and readable.
fn expires_at(annotations: &BTreeMap<String, String>) -> Option<Timestamp> {
    annotations.get(names::EXPIRES_AT_ANNOTATION)?.parse().ok()
}

/// A Sandbox outside any pool (e.g. a shared one an operator selects) as a
/// delivery target: its pod, and ready while its `Ready` condition is true
/// and it is not being deleted.
pub fn sandbox_member(sandbox: &Sandbox) -> Member {
    let ready_condition = sandbox
        .status
        .as_ref()
        .and_then(|status| condition(&status.conditions, "Ready"));
    Member {
        name: sandbox.name_any(),
        pod: Some(pod_name(sandbox)),
        ready: is_true(ready_condition)
            && sandbox.metadata.deletion_timestamp.is_none()
            && !is_suspended(sandbox),
    }
}

/// Pod of a Sandbox: the controller's pod-name annotation, else the Sandbox name.
fn pod_name(sandbox: &Sandbox) -> String {
    sandbox
        .annotations()
        .get(ANN_POD_NAME)
        .filter(|name| !name.is_empty())
        .cloned()
        .unwrap_or_else(|| sandbox.name_any())
}

/// The replica count annotation or label.
fn replicas_from(map: &BTreeMap<String, String>) -> Option<u32> {
    map.get(names::REPLICAS_KEY)?.parse().ok()
}

/// The owner label, or empty.
fn owner_of(labels: &BTreeMap<String, String>) -> String {
    labels.get(names::OWNER_LABEL).cloned().unwrap_or_default()
}

/// Sort key putting `x-2` before `x-10`: the trailing index, then the name.
fn index_key(name: &str) -> (u64, String) {
    let index = name
        .rsplit('-')
        .next()
        .and_then(|tail| tail.parse().ok())
        .unwrap_or(u64::MAX);
    (index, name.to_string())
}

#[cfg(test)]
mod tests;
