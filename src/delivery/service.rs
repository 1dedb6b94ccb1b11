//! The delivery service: validates a request, resolves its sandboxes,
//! runs the deliver (or release) script in each with bounded parallelism,
//! and keeps the run registry.

use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt;

use super::agent::{AgentSet, Transport};
use super::error::{DeliveryError, DeliveryFailure, SandboxFailure};
use super::flight::KeyedLocks;
use super::payload::{InflightBudget, Payload};
use super::port::{ExecError, ExecTarget, SandboxExec};
use super::script::{
    is_valid_root, render_deliver, render_deliver_with_agent, render_release, AgentOffer,
    DeliverRequest, ReleaseRequest, RunId, Verify, DEFAULT_ROOT,
};
use super::session::{self, Failure};
use super::targets;
use super::view::{Delivered, RunPlace, RunView, SandboxOutcome};
use super::DeliveryMetrics;
use crate::auth::{Owner, OwnerScope};
use crate::clock::now_ms;
use crate::pool::validate::{is_dns1123_subdomain, is_pool_name};
use crate::pool::{LabelSelector, Member, PoolService};
use crate::store::{RunRecord, RunSandbox, RunStore, StoreError};
use crate::workload::{WorkloadError, WorkloadName, WorkloadService};

/// Tunables of the delivery service.
#[derive(Debug, Clone)]
pub struct DeliverySettings {
    /// The delivery root in every sandbox: absolute, or relative to the
    /// exec's working directory (the sandbox directory on `local`).
    pub root: String,
    /// Unreferenced revisions kept per scope in a sandbox (0: none).
    pub retention: u32,
    /// Longest one sandbox's exec may take.
    pub timeout: Duration,
    /// Most sandboxes served at once by one request.
    pub parallelism: usize,
    /// Process-wide budget of bundle bytes read from disk for deliveries.
    pub inflight_bytes: u64,
    /// Sandboxes every owner may target (operator-designated shared ones).
    pub shared_selector: Option<LabelSelector>,
    /// Whether deliveries try the agent ([`Transport::Script`]: never).
    pub transport: Transport,
    /// The agents offered to sandboxes (empty: the script always).
    pub agents: Arc<AgentSet>,
}

impl Default for DeliverySettings {
    fn default() -> Self {
        Self {
            root: DEFAULT_ROOT.to_owned(),
            retention: 0,
            timeout: Duration::from_secs(300),
            parallelism: 8,
            inflight_bytes: 512 * 1024 * 1024,
            shared_selector: None,
            transport: Transport::Auto,
            agents: Arc::new(AgentSet::default()),
        }
    }
}

/// Settings the service cannot work with.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid delivery settings: {0}")]
pub struct SettingsError(pub String);

impl DeliverySettings {
    /// Checks every value.
    pub fn validate(&self) -> Result<(), SettingsError> {
        if !is_valid_root(&self.root) {
            return Err(SettingsError(format!(
                "delivery root {:?}: use [A-Za-z0-9._-] path components, without '.', '..' or empty ones",
                self.root
            )));
        }
        if self.parallelism == 0 {
            return Err(SettingsError("parallelism must be at least 1".into()));
        }
        if self.timeout.is_zero() {
            return Err(SettingsError("timeout must be positive".into()));
        }
        if self.transport == Transport::Exec && self.agents.is_empty() {
            return Err(SettingsError(
                "the delivery transport exec needs an agent (context-agent-x86_64 or context-agent-aarch64) in the agent directory".into(),
            ));
        }
        Ok(())
    }
}

/// Where one delivery goes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DeliveryTarget {
    /// One sandbox.
    Sandbox(String),
    /// Every ready sandbox of one of the caller's pools.
    Pool(String),
}

/// What a delivery route answers (`400 invalid_request`) for a workload
/// name that breaks its rule.
pub const WORKLOAD_NAME_RULE: &str = "the workload name must be at most 50 lowercase letters, digits and '-', starting and ending with a letter or digit";

/// What a delivery route answers (`400 invalid_request`) for a run id that
/// breaks its rule.
pub const RUN_ID_RULE: &str = concat!("runId must match ", super::script::run_id_pattern!());

/// A delivery request, parsed from the API.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeliverInput {
    /// The caller's run id.
    pub run_id: RunId,
    /// Where to deliver.
    pub target: DeliveryTarget,
    /// How a cache hit is verified.
    pub verify: Verify,
}

/// Delivers frozen revisions into sandboxes. Cheap to clone.
#[derive(Clone)]
pub struct DeliveryService {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for DeliveryService {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeliveryService")
            .field("settings", &self.inner.settings)
            .finish()
    }
}

/// `(owner, workload, run id)`.
type RunKey = (String, String, String);
/// `(sandbox, scope, revision)`.
type FlightKey = (String, String, String);

struct Inner {
    settings: DeliverySettings,
    exec: Arc<dyn SandboxExec>,
    pools: Arc<PoolService>,
    workloads: WorkloadService,
    runs: Arc<dyn RunStore>,
    owner_scope: OwnerScope,
    metrics: DeliveryMetrics,
    budget: InflightBudget,
    /// One exec per (sandbox, scope, revision) at a time.
    flights: KeyedLocks<FlightKey>,
    /// A run's deliveries and releases one at a time.
    run_locks: KeyedLocks<RunKey>,
}

/// Everything a service needs from the rest of the application.
pub struct DeliveryDeps {
    /// Runs scripts in sandboxes.
    pub exec: Arc<dyn SandboxExec>,
    /// Owner-scoped pools (targets).
    pub pools: Arc<PoolService>,
    /// Workloads (the active revision and its bundle).
    pub workloads: WorkloadService,
    /// The run registry.
    pub runs: Arc<dyn RunStore>,
    /// Scopes of owners.
    pub owner_scope: OwnerScope,
}

impl DeliveryService {
    /// A service with `settings` (checked here) over `deps`.
    pub fn new(settings: DeliverySettings, deps: DeliveryDeps) -> Result<Self, SettingsError> {
        settings.validate()?;
        Ok(Self {
            inner: Arc::new(Inner {
                budget: InflightBudget::new(settings.inflight_bytes),
                settings,
                exec: deps.exec,
                pools: deps.pools,
                workloads: deps.workloads,
                runs: deps.runs,
                owner_scope: deps.owner_scope,
                metrics: DeliveryMetrics::default(),
                flights: KeyedLocks::default(),
                run_locks: KeyedLocks::default(),
            }),
        })
    }

    /// The settings in force.
    pub fn settings(&self) -> &DeliverySettings {
        &self.inner.settings
    }

    /// The service's metrics (register them on the process registry).
    pub fn metrics(&self) -> &DeliveryMetrics {
        &self.inner.metrics
    }

    /// Delivers the active revision of the owner's `workload` as run
    /// `input.run_id`. Every value is checked before anything runs; the
    /// sandboxes that succeed are registered under the run even when
    /// others fail ([`DeliveryError::Failed`]).
    ///
    /// Runs in its own task: a caller that goes away cannot leave a run
    /// placed in a sandbox but missing from the registry.
    pub async fn deliver(
        &self,
        owner: &Owner,
        workload: &WorkloadName,
        input: &DeliverInput,
    ) -> Result<Delivered, DeliveryError> {
        let this = self.clone();
        let scope = self.inner.owner_scope.of(owner);
        let (owner, workload, input) = (owner.key(), workload.clone(), input.clone());
        detached(async move { this.deliver_here(&owner, &scope, &workload, &input).await }).await
    }

    /// Delivers for the owner whose record key is `owner` and whose sandbox
    /// folder scope is `scope`.
    async fn deliver_here(
        &self,
        owner: &str,
        scope: &str,
        workload: &WorkloadName,
        input: &DeliverInput,
    ) -> Result<Delivered, DeliveryError> {
        match &input.target {
            DeliveryTarget::Sandbox(s) if !is_dns1123_subdomain(s) => {
                return Err(invalid(
                    "sandbox must be a Kubernetes name: lowercase letters, digits, '-' and '.', at most 253 characters",
                ))
            }
            DeliveryTarget::Pool(p) if !is_pool_name(p) => {
                return Err(invalid(
                    "pool must be a pool name: at most 50 lowercase letters, digits and '-', starting and ending with a letter or digit",
                ))
            }
            _ => {}
        }
        let inner = &self.inner;
        let scope = scope.to_owned();
        let active = inner
            .workloads
            .active_bundle(owner, workload)
            .await
            .map_err(|e| workload_error(workload, e))?;
        let (revision, manifest) = (active.revision, active.manifest);
        let request = DeliverRequest {
            root: inner.settings.root.clone(),
            scope: scope.clone(),
            workload: workload.to_string(),
            run_id: input.run_id.to_string(),
            revision: revision.revision.clone(),
            bundle_digest: revision.bundle_digest.clone(),
            bundle_bytes: revision.bytes,
            inflated_bytes: revision.inflated_bytes,
            entries: revision.entries,
            manifest,
            verify: input.verify,
        };
        // The same script serves every sandbox of the request. The workload
        // name and the run id, the caller's values, hold only valid ones:
        // any refused value is the service's own.
        let script = self
            .render(&request)
            .map_err(|e| DeliveryError::Internal(format!("rendering the deliver script: {e}")))?;
        let run_key = (
            owner.to_owned(),
            workload.to_string(),
            input.run_id.to_string(),
        );
        let _run = inner.run_locks.lock(run_key).await;
        if let Some(existing) = inner.runs.run(owner, workload, &input.run_id).await? {
            if existing.revision != revision.revision {
                return Err(DeliveryError::RunConflict {
                    run: input.run_id.to_string(),
                    revision: existing.revision,
                });
            }
        }
        let members = match &input.target {
            DeliveryTarget::Sandbox(name) => vec![
                targets::sandbox(
                    &inner.pools,
                    inner.settings.shared_selector.as_ref(),
                    &scope,
                    name,
                )
                .await?,
            ],
            DeliveryTarget::Pool(name) => {
                let members = targets::pool(&inner.pools, &scope, name).await?;
                let ready: Vec<Member> = members.iter().filter(|m| m.ready).cloned().collect();
                if ready.is_empty() {
                    return Err(DeliveryError::Failed {
                        failure: DeliveryFailure::NoReadySandbox { pool: name.clone() },
                        outcomes: members.into_iter().map(not_ready).collect(),
                    });
                }
                ready
            }
        };
        let payload = Payload::new(active.source, inner.budget.clone());
        let tried: Vec<Tried> = futures::stream::iter(members)
            .map(|m| self.deliver_one(m, &script, &scope, &revision.revision, &payload))
            .buffered(inner.settings.parallelism)
            .collect()
            .await;
        let (outcomes, failure) = settle(tried);
        let placed: Vec<RunSandbox> = outcomes
            .iter()
            .filter_map(|o| {
                Some(RunSandbox {
                    sandbox: o.sandbox.clone(),
                    pod: o.pod.clone(),
                    root: inner.settings.root.clone(),
                    path: o.path.clone()?,
                })
            })
            .collect();
        if !placed.is_empty() {
            let record = RunRecord {
                owner: owner.to_owned(),
                workload: workload.to_string(),
                run_id: input.run_id.to_string(),
                revision: revision.revision.clone(),
                scope,
                sandboxes: placed,
                created_at_ms: now_ms(),
            };
            match inner.runs.add_to_run(&record).await {
                Ok(_) => {}
                // Checked under the run lock above; only another replica
                // sharing the store could get here.
                Err(StoreError::Conflict) => {
                    return Err(DeliveryError::RunConflict {
                        run: input.run_id.to_string(),
                        revision: revision.revision.clone(),
                    })
                }
                Err(e) => return Err(e.into()),
            }
        }
        match failure {
            None => Ok(Delivered {
                workload: workload.to_string(),
                revision: revision.revision,
                deliveries: outcomes,
            }),
            Some(failure) => Err(DeliveryError::Failed { failure, outcomes }),
        }
    }

    /// Releases the owner's run `run_id` of `workload` in every sandbox it
    /// reached. A sandbox that no longer exists counts as released. On a
    /// failure the run keeps the sandboxes that failed, so a retry finishes
    /// the job. Runs in its own task, like [`DeliveryService::deliver`].
    pub async fn release(
        &self,
        owner: &Owner,
        workload: &WorkloadName,
        run_id: &RunId,
    ) -> Result<(), DeliveryError> {
        let this = self.clone();
        let (owner, workload, run_id) = (owner.key(), workload.to_string(), run_id.to_string());
        detached(async move { this.release_here(&owner, &workload, &run_id).await }).await
    }

    async fn release_here(
        &self,
        owner: &str,
        workload: &str,
        run_id: &str,
    ) -> Result<(), DeliveryError> {
        let inner = &self.inner;
        let run_key = (owner.to_owned(), workload.to_owned(), run_id.to_owned());
        let _run = inner.run_locks.lock(run_key).await;
        let run = inner
            .runs
            .run(owner, workload, run_id)
            .await?
            .ok_or_else(|| DeliveryError::RunNotFound(run_id.to_owned()))?;
        let tried: Vec<Tried> = futures::stream::iter(run.sandboxes.clone())
            .map(|place| self.release_one(&run, place))
            .buffered(inner.settings.parallelism)
            .collect()
            .await;
        let (outcomes, failure) = settle(tried);
        let released: Vec<String> = outcomes
            .iter()
            .filter(|o| o.error.is_none())
            .map(|o| o.sandbox.clone())
            .collect();
        inner
            .runs
            .remove_from_run(owner, workload, run_id, &released)
            .await?;
        match failure {
            None => Ok(()),
            Some(failure) => Err(DeliveryError::Failed { failure, outcomes }),
        }
    }

    /// The owner's live runs of `workload`, by run id. Runs outlive their
    /// workload (so they can still be released); without runs, a missing
    /// workload is [`DeliveryError::WorkloadNotFound`].
    pub async fn list(
        &self,
        owner: &Owner,
        workload: &WorkloadName,
    ) -> Result<Vec<RunView>, DeliveryError> {
        let owner = &owner.key();
        let runs = self.inner.runs.runs_of(owner, workload).await?;
        if runs.is_empty() {
            self.inner
                .workloads
                .get(owner, workload)
                .await
                .map_err(|e| workload_error(workload, e))?;
        }
        Ok(runs
            .into_iter()
            .map(|r| RunView {
                run_id: r.run_id,
                revision: r.revision,
                sandboxes: r
                    .sandboxes
                    .into_iter()
                    .map(|s| RunPlace {
                        sandbox: s.sandbox,
                        pod: s.pod,
                        path: s.path,
                    })
                    .collect(),
            })
            .collect())
    }

    /// The deliver script, behind the agent launcher when agents are
    /// offered.
    fn render(&self, request: &DeliverRequest) -> Result<String, super::ScriptError> {
        let settings = &self.inner.settings;
        if settings.transport == Transport::Script || settings.agents.is_empty() {
            return render_deliver(request);
        }
        let offer_of = |arch: &str| {
            settings
                .agents
                .get(arch)
                .map(|a| (a.sha256.clone(), a.bytes.len() as u64))
        };
        let offer = AgentOffer {
            x86_64: offer_of("x86_64"),
            aarch64: offer_of("aarch64"),
        };
        render_deliver_with_agent(request, &offer)
    }

    async fn deliver_one(
        &self,
        member: Member,
        script: &str,
        scope: &str,
        revision: &str,
        payload: &Payload,
    ) -> Tried {
        let inner = &self.inner;
        let started = Instant::now();
        let mut outcome = SandboxOutcome {
            sandbox: member.name.clone(),
            pod: member.pod.clone(),
            path: None,
            cached: None,
            bytes_sent: 0,
            transport: None,
            duration_ms: 0,
            error: None,
        };
        if !member.ready {
            inner.metrics.delivered("failed", 0, started.elapsed());
            return Tried::failed(outcome, SandboxFailure::NotReady);
        }
        let target = ExecTarget {
            sandbox: member.name.clone(),
            pod: member.pod.clone(),
        };
        let flight = (member.name.clone(), scope.to_owned(), revision.to_owned());
        let _flight = inner.flights.lock(flight).await;
        let run = session::deliver(
            &*inner.exec,
            &target,
            script.to_owned(),
            revision,
            payload,
            Some(&inner.settings.agents),
        );
        let result = tokio::time::timeout(inner.settings.timeout, run).await;
        let took = started.elapsed();
        outcome.duration_ms = took.as_millis() as u64;
        let failure = match result {
            Ok(Ok(placed)) => {
                let kind = if placed.cached { "cached" } else { "sent" };
                inner.metrics.delivered(kind, placed.bytes_sent, took);
                if placed.agent_sent {
                    inner.metrics.agent_injected();
                }
                tracing::info!(
                    sandbox = %member.name,
                    revision,
                    cached = placed.cached,
                    bytes = placed.bytes_sent,
                    transport = ?placed.transport,
                    agent_sent = placed.agent_sent,
                    ms = outcome.duration_ms,
                    "delivered"
                );
                outcome.path = Some(placed.path);
                outcome.cached = Some(placed.cached);
                outcome.bytes_sent = placed.bytes_sent;
                outcome.transport = Some(placed.transport);
                None
            }
            Ok(Err(failure)) => {
                inner.metrics.delivered("failed", 0, took);
                Some(self.failed(&member.name, "delivery", &failure))
            }
            Err(_) => {
                inner.metrics.delivered("failed", 0, took);
                tracing::warn!(sandbox = %member.name, revision, "delivery timed out");
                Some(timed_out("delivery", inner.settings.timeout))
            }
        };
        Tried { outcome, failure }
    }

    async fn release_one(&self, run: &RunRecord, place: RunSandbox) -> Tried {
        let inner = &self.inner;
        let started = Instant::now();
        let mut outcome = SandboxOutcome {
            sandbox: place.sandbox.clone(),
            pod: place.pod.clone(),
            path: None,
            cached: None,
            bytes_sent: 0,
            transport: None,
            duration_ms: 0,
            error: None,
        };
        let request = ReleaseRequest {
            root: place.root.clone(),
            scope: run.scope.clone(),
            workload: run.workload.clone(),
            run_id: run.run_id.clone(),
            retention: inner.settings.retention,
        };
        let script = match render_release(&request) {
            Ok(s) => s,
            Err(e) => {
                tracing::error!(run = %run.run_id, error = %e, "rendering the release script");
                return Tried::failed(outcome, SandboxFailure::RecordUnusable);
            }
        };
        let target = ExecTarget {
            sandbox: place.sandbox.clone(),
            pod: place.pod.clone(),
        };
        // Serialised with deliveries of the same revision into the sandbox.
        let flight = (
            place.sandbox.clone(),
            run.scope.clone(),
            run.revision.clone(),
        );
        let _flight = inner.flights.lock(flight).await;
        let result = tokio::time::timeout(
            inner.settings.timeout,
            session::release(&*inner.exec, &target, script),
        )
        .await;
        outcome.duration_ms = started.elapsed().as_millis() as u64;
        let failure = match result {
            Ok(Ok(_)) => None,
            // The sandbox is gone, and the run's view with it.
            Ok(Err(Failure::Exec(ExecError::NotFound(_)))) => {
                tracing::info!(sandbox = %place.sandbox, run = %run.run_id, "released: the sandbox is gone");
                None
            }
            Ok(Err(failure)) => Some(self.failed(&place.sandbox, "release", &failure)),
            Err(_) => Some(timed_out("release", inner.settings.timeout)),
        };
        inner.metrics.released(failure.is_none());
        Tried { outcome, failure }
    }

    /// Logs a failure with its causes; returns what a client sees.
    fn failed(&self, sandbox: &str, what: &str, failure: &Failure) -> SandboxFailure {
        match failure {
            Failure::Exec(e) => tracing::warn!(sandbox, error = %e, "{what}: exec failed"),
            Failure::Source(
                e @ (WorkloadError::StorageUnavailable(_) | WorkloadError::BundleCorrupt(_)),
            ) => tracing::warn!(sandbox, error = %e, "{what}: object storage"),
            Failure::Source(e) => tracing::error!(sandbox, error = %e, "{what}: bundle unreadable"),
            Failure::Write(e) => tracing::warn!(sandbox, error = %e, "{what}: write failed"),
            Failure::Protocol(e) => tracing::warn!(sandbox, error = %e, "{what}: protocol"),
            Failure::Script { code, reason } => {
                tracing::warn!(sandbox, code, reason, "{what} failed in the sandbox");
            }
        }
        failure.client_failure()
    }
}

/// Runs `work` in its own task, so dropping the caller does not cancel it.
async fn detached<T: Send + 'static>(
    work: impl std::future::Future<Output = Result<T, DeliveryError>> + Send + 'static,
) -> Result<T, DeliveryError> {
    // In the caller's span, so its log lines name the request.
    tokio::spawn(tracing::Instrument::in_current_span(work))
        .await
        .map_err(|e| DeliveryError::Internal(format!("delivery task failed: {e}")))?
}

fn invalid(message: &str) -> DeliveryError {
    DeliveryError::InvalidRequest(message.to_owned())
}

/// A pool member that is not ready, as an outcome.
fn not_ready(m: Member) -> SandboxOutcome {
    SandboxOutcome {
        sandbox: m.name,
        pod: m.pod,
        path: None,
        cached: None,
        bytes_sent: 0,
        transport: None,
        duration_ms: 0,
        error: Some(SandboxFailure::NotReady.to_string()),
    }
}

fn timed_out(what: &'static str, limit: Duration) -> SandboxFailure {
    SandboxFailure::TimedOut { what, limit }
}

/// One sandbox's outcome (its `error` not yet set), and why it failed.
struct Tried {
    outcome: SandboxOutcome,
    failure: Option<SandboxFailure>,
}

impl Tried {
    fn failed(outcome: SandboxOutcome, failure: SandboxFailure) -> Self {
        Self {
            outcome,
            failure: Some(failure),
        }
    }
}

/// The outcomes, each failure rendered as its line; and `None` when every
/// sandbox succeeded, else the first failure with the count.
fn settle(tried: Vec<Tried>) -> (Vec<SandboxOutcome>, Option<DeliveryFailure>) {
    let of = tried.len();
    let failed = tried.iter().filter(|t| t.failure.is_some()).count();
    let mut first = None;
    let outcomes = tried
        .into_iter()
        .map(
            |Tried {
                 mut outcome,
                 failure,
             }| {
                if let Some(failure) = failure {
                    outcome.error = Some(failure.to_string());
                    if first.is_none() {
                        first = Some(DeliveryFailure::Sandboxes {
                            sandbox: outcome.sandbox.clone(),
                            failure,
                            failed,
                            of,
                        });
                    }
                }
                outcome
            },
        )
        .collect();
    (outcomes, first)
}

fn workload_error(name: &str, e: WorkloadError) -> DeliveryError {
    match e {
        WorkloadError::NotFound(_) => DeliveryError::WorkloadNotFound(name.to_owned()),
        WorkloadError::NotReady(why) => DeliveryError::WorkloadNotReady(why),
        WorkloadError::StoreUnavailable(why) => DeliveryError::StoreUnavailable(why),
        other => DeliveryError::Internal(format!("reading workload {name:?}: {other}")),
    }
}
