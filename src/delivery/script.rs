//! Rendering the deliver and release scripts from their templates, and
//! parsing the lines they print.
//!
//! Every value is checked against a strict character rule before it is
//! interpolated, and then single-quoted, so no value can reach the shell
//! as anything but one literal word.

use serde::{Deserialize, Serialize};

use crate::bundle::TreeManifest;
use crate::workload::names::is_valid_name;

/// The deliver script template (`sh -c`), see the module docs.
const DELIVER_TEMPLATE: &str = include_str!("deliver.sh");

/// The release script template (`sh -c`), see the module docs.
const RELEASE_TEMPLATE: &str = include_str!("release.sh");

/// The launcher put before the deliver script when agents are offered: it
/// injects and runs the agent, or lets the script deliver (module docs).
const LAUNCH_TEMPLATE: &str = include_str!("launch.sh");

/// The default delivery root inside a sandbox.
pub const DEFAULT_ROOT: &str = "/workspace/.context";

/// Largest size or count the scripts accept: shell arithmetic and `test`
/// use signed 64-bit integers, and sums of two such values must fit.
const MAX_SHELL_INT: u64 = 1 << 62;

/// Every `ERROR` code the scripts print, for metrics labels and docs.
/// [`parse_line`] also accepts codes not listed here (any `[a-z_]+`), so
/// an older gateway can read a newer script.
pub const ERROR_CODES: &[&str] = &[
    // A tool the script needs is not on PATH (the reason names it).
    "missing_tool",
    // The root cannot be created, written or locked.
    "bad_root",
    "lock_failed",
    // The run id is already registered with another revision.
    "run_conflict",
    // Fewer bytes than announced arrived on stdin.
    "short_transfer",
    // sha256 of the received bytes is not the bundle digest.
    "digest_mismatch",
    // The bundle inflates past the recorded inflated size.
    "too_large",
    // sha256 of the inflated tar is not the revision.
    "revision_mismatch",
    // The extracted tree has more entries than recorded.
    "too_many_entries",
    // tar extracted fewer entries than recorded.
    "extract_failed",
    // A write failed because the sandbox's disk or quota is full.
    "disk_full",
    // Any other failed write (permissions, I/O errors).
    "write_failed",
    // The script got SIGHUP, SIGINT or SIGTERM.
    "interrupted",
    // The agent was started with arguments it refuses (a gateway bug or
    // a tampered launcher; the script has no such failure).
    "bad_request",
];

/// How thoroughly a cache hit is checked before it is trusted.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum Verify {
    /// Every path, entry kind, file mode and file size against the manifest
    /// recorded at publish. Cheap (no file is read); a same-size edit of a
    /// file's content passes.
    #[default]
    Default,
    /// Also the sha256 of every file: reads the whole tree.
    Full,
}

impl Verify {
    /// The word the script template expects.
    fn as_script_word(self) -> &'static str {
        match self {
            Verify::Default => "default",
            Verify::Full => "full",
        }
    }
}

/// Everything the deliver script needs; the bundle facts are the ones the
/// bundle engine recorded at upload ([`crate::bundle::Report`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeliverRequest {
    /// The delivery root inside the sandbox (see [`is_valid_root`]).
    pub root: String,
    /// The owner's scope: 32 lowercase hex digits (an HMAC of the owner).
    pub scope: String,
    /// The workload's name (the crate's workload-name rule).
    pub workload: String,
    /// The run id (`^[a-z0-9][a-z0-9._-]{0,62}$`).
    pub run_id: String,
    /// The revision: sha256 of the canonical tar, 64 lowercase hex digits.
    pub revision: String,
    /// sha256 of the gzip bundle, 64 lowercase hex digits.
    pub bundle_digest: String,
    /// Size of the gzip bundle: exactly what the gateway sends on a miss.
    pub bundle_bytes: u64,
    /// Size of the canonical tar the bundle inflates to.
    pub inflated_bytes: u64,
    /// Entries (files and directories) of the canonical tar.
    pub entries: u64,
    /// The extracted tree's manifest, as the gateway computed it from the
    /// bundle: cold deliveries check the extracted tree and cache hits
    /// check the cached one against it.
    pub manifest: TreeManifest,
    /// How a cache hit is verified.
    pub verify: Verify,
}

impl DeliverRequest {
    /// The absolute path of the run's read-only view, as the script prints
    /// it in [`ScriptLine::Done`]. Meaningful only for a request that
    /// renders.
    pub fn view_path(&self) -> String {
        format!(
            "{}/runs/{}/{}/{}",
            self.root, self.scope, self.workload, self.run_id
        )
    }
}

/// Everything the release script needs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReleaseRequest {
    /// The delivery root inside the sandbox (see [`is_valid_root`]).
    pub root: String,
    /// The owner's scope: 32 lowercase hex digits.
    pub scope: String,
    /// The workload's name.
    pub workload: String,
    /// The run id to release.
    pub run_id: String,
    /// How many unreferenced revisions to keep per scope (0: remove a
    /// revision as soon as its last run is released).
    pub retention: u32,
}

/// A value that must not reach the shell.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ScriptError {
    /// A field breaks its rule; nothing was rendered. The message names
    /// the field (API spelling) and the rule, never the value.
    #[error("{field} is invalid: {rule}")]
    Invalid {
        /// The field, as the API spells it (`runId`, `root`, ...).
        field: &'static str,
        /// The rule it breaks.
        rule: &'static str,
    },
}

impl ScriptError {
    /// The offending field, as the API spells it.
    pub fn field(&self) -> &'static str {
        match self {
            ScriptError::Invalid { field, .. } => field,
        }
    }
}

/// One line the scripts print on stdout.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ScriptLine {
    /// `RESEND <reason>`, before `NEED`: the sandbox held a cache dir of
    /// the revision that failed its check (the reason says how), so the
    /// bundle is asked for again.
    Resend(String),
    /// `NEED <n>`: send exactly `n` bundle bytes; 0 is a verified cache hit
    /// (send nothing).
    Need(u64),
    /// The deliver script's final line: the run's view is in place.
    Done {
        /// Absolute path of the run's read-only view in the sandbox.
        path: String,
        /// The revision delivered.
        revision: String,
        /// True when no bytes were transferred (the cache dir verified).
        cached: bool,
    },
    /// The release script's final line; false when there was no such run.
    Released(bool),
    /// `AGENT <arch>`: send the gateway's agent for `arch` (exactly its
    /// size), before `NEED`.
    Agent(String),
    /// `TRANSPORT agent|script`: which of the two delivers, before `NEED`.
    Transport(DeliveredBy),
    /// `ERROR <code> <reason>`: the script failed (and exits non-zero).
    Error {
        /// A snake_case code, one of [`ERROR_CODES`] for this version.
        code: String,
        /// A one-line human reason.
        reason: String,
    },
}

/// What delivered into a sandbox: the injected agent or the script.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum DeliveredBy {
    /// `context-agent`, injected once per sandbox.
    Agent,
    /// The POSIX `sh` script.
    Script,
}

/// The agents offered to one delivery: for each architecture, the sha256
/// and size of the binary the gateway sends on `AGENT <arch>` (`None`:
/// that architecture gets the script).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AgentOffer {
    /// `x86_64`: (sha256, bytes).
    pub x86_64: Option<(String, u64)>,
    /// `aarch64`: (sha256, bytes).
    pub aarch64: Option<(String, u64)>,
}

/// A stdout line that is not part of the protocol.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unexpected line from the delivery script: {line:?}")]
pub struct LineError {
    /// The line, shortened to 200 bytes for logs.
    pub line: String,
}

/// The run-id rule as a literal, for `concat!` into messages.
macro_rules! run_id_pattern {
    () => {
        "^[a-z0-9][a-z0-9._-]{0,62}$"
    };
}
pub(crate) use run_id_pattern;

/// The run-id rule as a regular expression: what [`is_valid_run_id`]
/// checks, as the OpenAPI document and the refusals quote it.
pub const RUN_ID_PATTERN: &str = run_id_pattern!();

use super::rules::is_lower_hex;
pub use super::rules::{is_valid_root, is_valid_run_id, is_valid_scope};

crate::workload::names::checked_string! {
    /// A delivery run id: `^[a-z0-9][a-z0-9._-]{0,62}$` (see
    /// [`is_valid_run_id`]).
    pub struct RunId: is_valid_run_id;
}

fn check(ok: bool, field: &'static str, rule: &'static str) -> Result<(), ScriptError> {
    if ok {
        Ok(())
    } else {
        Err(ScriptError::Invalid { field, rule })
    }
}

const ROOT_RULE: &str =
    "must be a path (absolute, or relative to the working directory) of [A-Za-z0-9._-] components, without '.', '..' or empty components";
const SCOPE_RULE: &str = "must be 32 lowercase hex digits";
const WORKLOAD_RULE: &str = "must be a lowercase DNS label of at most 50 characters";
const RUN_ID_RULE: &str = concat!("must match ", run_id_pattern!());
const DIGEST_RULE: &str = "must be 64 lowercase hex digits";
const SIZE_RULE: &str = "must be between 1 and 2^62";
const COUNT_RULE: &str = "must be at most 2^62";

/// The checks both scripts share.
fn check_run(root: &str, scope: &str, workload: &str, run_id: &str) -> Result<(), ScriptError> {
    check(is_valid_root(root), "root", ROOT_RULE)?;
    check(is_valid_scope(scope), "scope", SCOPE_RULE)?;
    check(is_valid_name(workload), "workload", WORKLOAD_RULE)?;
    check(is_valid_run_id(run_id), "runId", RUN_ID_RULE)
}

/// The value as one single-quoted shell word. Validated values never hold
/// a quote; escaping it anyway keeps this function safe on its own.
fn sh_quote(value: &str) -> String {
    format!("'{}'", value.replace('\'', r"'\''"))
}

/// Replaces each `@NAME@` of `template` with the quoted value; every
/// placeholder must be used and none may remain.
fn fill(template: &str, values: &[(&str, String)]) -> String {
    let mut out = template.to_owned();
    for (name, value) in values {
        let placeholder = format!("@{name}@");
        debug_assert!(out.contains(&placeholder), "template lacks {placeholder}");
        out = out.replace(&placeholder, &sh_quote(value));
    }
    debug_assert!(!has_placeholder(&out), "unfilled placeholder in template");
    out
}

/// Whether `s` still holds an `@NAME@` placeholder (`NAME`: `[A-Z_]+`).
fn has_placeholder(s: &str) -> bool {
    s.split('@')
        .skip(1)
        .zip(s.split('@').skip(2))
        .any(|(name, _)| {
            !name.is_empty() && name.bytes().all(|b| b.is_ascii_uppercase() || b == b'_')
        })
}

/// Renders the deliver script for `req`, or refuses a value that breaks
/// its rule (nothing is rendered then).
pub fn render_deliver(req: &DeliverRequest) -> Result<String, ScriptError> {
    let values = deliver_values(req)?;
    Ok(fill(DELIVER_TEMPLATE, &values))
}

/// Renders the launcher and the deliver script after it: the agent of
/// `offer` for the sandbox's architecture delivers when it can run there,
/// the script otherwise (module docs). Refuses what [`render_deliver`]
/// refuses, and digests that are not 64 lowercase hex digits.
pub fn render_deliver_with_agent(
    req: &DeliverRequest,
    offer: &AgentOffer,
) -> Result<String, ScriptError> {
    let mut values = deliver_values(req)?;
    for (arch, sha_key, bytes_key, field) in [
        (
            &offer.x86_64,
            "AGENT_X86_64_SHA",
            "AGENT_X86_64_BYTES",
            "agent.x86_64",
        ),
        (
            &offer.aarch64,
            "AGENT_AARCH64_SHA",
            "AGENT_AARCH64_BYTES",
            "agent.aarch64",
        ),
    ] {
        let (sha, bytes) = match arch {
            Some((sha, bytes)) => {
                check(is_lower_hex(sha, 64), field, DIGEST_RULE)?;
                check((1..=MAX_SHELL_INT).contains(bytes), field, SIZE_RULE)?;
                (sha.clone(), bytes.to_string())
            }
            None => (String::new(), String::new()),
        };
        values.push((sha_key, sha));
        values.push((bytes_key, bytes));
    }
    let template = format!("{LAUNCH_TEMPLATE}{DELIVER_TEMPLATE}");
    Ok(fill(&template, &values))
}

/// Checks `req` and returns the values of the deliver template.
fn deliver_values(req: &DeliverRequest) -> Result<Vec<(&'static str, String)>, ScriptError> {
    check_run(&req.root, &req.scope, &req.workload, &req.run_id)?;
    check(is_lower_hex(&req.revision, 64), "revision", DIGEST_RULE)?;
    check(
        is_lower_hex(&req.bundle_digest, 64),
        "bundleDigest",
        DIGEST_RULE,
    )?;
    check(
        (1..=MAX_SHELL_INT).contains(&req.bundle_bytes),
        "bundleBytes",
        SIZE_RULE,
    )?;
    check(
        (1..=MAX_SHELL_INT).contains(&req.inflated_bytes),
        "inflatedBytes",
        SIZE_RULE,
    )?;
    check(req.entries <= MAX_SHELL_INT, "entries", COUNT_RULE)?;
    let m = &req.manifest;
    for (value, field) in [
        (&m.names, "manifest.names"),
        (&m.modes, "manifest.modes"),
        (&m.content, "manifest.content"),
    ] {
        check(is_lower_hex(value, 64), field, DIGEST_RULE)?;
    }
    Ok(vec![
        ("ROOT", req.root.clone()),
        ("SCOPE", req.scope.clone()),
        ("WORKLOAD", req.workload.clone()),
        ("RUN_ID", req.run_id.clone()),
        ("REVISION", req.revision.clone()),
        ("BUNDLE_DIGEST", req.bundle_digest.clone()),
        ("BUNDLE_BYTES", req.bundle_bytes.to_string()),
        ("INFLATED_BYTES", req.inflated_bytes.to_string()),
        // One byte past the recorded size, so an overrun is visible.
        ("INFLATED_CAP", (req.inflated_bytes + 1).to_string()),
        // The bundle and its tar coexist on disk for a while.
        (
            "MIN_SPACE",
            (req.bundle_bytes + req.inflated_bytes).to_string(),
        ),
        ("ENTRIES", req.entries.to_string()),
        ("VERIFY", req.verify.as_script_word().to_owned()),
        ("NAMES_SHA", m.names.clone()),
        ("MODES_SHA", m.modes.clone()),
        ("CONTENT_SHA", m.content.clone()),
    ])
}

/// Renders the release script for `req`, or refuses a value that breaks
/// its rule.
pub fn render_release(req: &ReleaseRequest) -> Result<String, ScriptError> {
    check_run(&req.root, &req.scope, &req.workload, &req.run_id)?;
    Ok(fill(
        RELEASE_TEMPLATE,
        &[
            ("ROOT", req.root.clone()),
            ("SCOPE", req.scope.clone()),
            ("WORKLOAD", req.workload.clone()),
            ("RUN_ID", req.run_id.clone()),
            ("RETENTION", req.retention.to_string()),
        ],
    ))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct DoneLine {
    path: String,
    revision: String,
    cached: bool,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ReleasedLine {
    released: bool,
}

/// Parses one stdout line of either script (a trailing `\n` or `\r\n` is
/// ignored).
pub fn parse_line(line: &str) -> Result<ScriptLine, LineError> {
    let line = line.trim_end_matches(['\n', '\r']);
    let bad = || LineError {
        line: shorten(line),
    };
    if let Some(n) = line.strip_prefix("NEED ") {
        // Digits only: u64's parser would also take a leading '+'.
        if n.is_empty() || !n.bytes().all(|b| b.is_ascii_digit()) {
            return Err(bad());
        }
        return n.parse().map(ScriptLine::Need).map_err(|_| bad());
    }
    if let Some(reason) = line.strip_prefix("RESEND ") {
        return Ok(ScriptLine::Resend(reason.to_owned()));
    }
    if let Some(arch) = line.strip_prefix("AGENT ") {
        if arch.is_empty() || !arch.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_') {
            return Err(bad());
        }
        return Ok(ScriptLine::Agent(arch.to_owned()));
    }
    match line {
        "TRANSPORT agent" => return Ok(ScriptLine::Transport(DeliveredBy::Agent)),
        "TRANSPORT script" => return Ok(ScriptLine::Transport(DeliveredBy::Script)),
        _ => {}
    }
    if let Some(rest) = line.strip_prefix("ERROR ") {
        let (code, reason) = rest.split_once(' ').unwrap_or((rest, ""));
        if code.is_empty() || !code.bytes().all(|b| b.is_ascii_lowercase() || b == b'_') {
            return Err(bad());
        }
        return Ok(ScriptLine::Error {
            code: code.to_owned(),
            reason: reason.to_owned(),
        });
    }
    if line.starts_with('{') {
        if let Ok(d) = serde_json::from_str::<DoneLine>(line) {
            return Ok(ScriptLine::Done {
                path: d.path,
                revision: d.revision,
                cached: d.cached,
            });
        }
        if let Ok(r) = serde_json::from_str::<ReleasedLine>(line) {
            return Ok(ScriptLine::Released(r.released));
        }
    }
    Err(bad())
}

/// At most 200 bytes of `line`, cut at a character boundary.
fn shorten(line: &str) -> String {
    let mut end = line.len().min(200);
    while !line.is_char_boundary(end) {
        end -= 1;
    }
    line[..end].to_owned()
}

#[cfg(test)]
mod tests;
