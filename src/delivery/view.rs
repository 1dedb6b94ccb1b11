//! The JSON shapes of deliveries on the wire, shared by the server and the
//! client.

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// What happened in one sandbox.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct SandboxOutcome {
    /// The sandbox.
    pub sandbox: String,
    /// Its pod (`null` on the local backend).
    pub pod: Option<String>,
    /// The run's read-only view in the sandbox, on success.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path: Option<String>,
    /// Whether the revision was already there (no bytes sent), on success.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cached: Option<bool>,
    /// Bundle bytes written to the sandbox.
    pub bytes_sent: u64,
    /// What delivered, on success: `agent` (the injected `context-agent`)
    /// or `script` (the POSIX `sh` fallback).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub transport: Option<super::DeliveredBy>,
    /// How long this sandbox took, including waiting for a concurrent
    /// delivery of the same revision.
    pub duration_ms: u64,
    /// Why it failed: one line, e.g. `disk_full: no space left on device …`
    /// (rendered from a [`super::SandboxFailure`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// The answer to a delivery (`201`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct Delivered {
    /// The workload.
    pub workload: String,
    /// The revision delivered (the workload's active one).
    pub revision: String,
    /// One entry per sandbox.
    pub deliveries: Vec<SandboxOutcome>,
}

/// Where a run lives in one sandbox.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct RunPlace {
    /// The sandbox.
    pub sandbox: String,
    /// Its pod at delivery time.
    pub pod: Option<String>,
    /// The run's read-only view.
    pub path: String,
}

/// A live run.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct RunView {
    /// The caller's run id.
    pub run_id: String,
    /// The revision delivered.
    pub revision: String,
    /// Every sandbox the run reached.
    pub sandboxes: Vec<RunPlace>,
}

/// The answer to a listing.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct RunList {
    /// The live runs, by run id.
    pub deliveries: Vec<RunView>,
}

/// The body of a `502 delivery_failed` answer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct FailedBody {
    /// Always `delivery_failed`.
    pub error: String,
    /// The first failure's one-line reason.
    pub message: String,
    /// Every sandbox's outcome.
    pub deliveries: Vec<SandboxOutcome>,
}
