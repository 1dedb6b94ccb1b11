//! Delivery of frozen workload revisions into running sandboxes over exec:
//! the in-sandbox POSIX `sh` scripts, their renderer and the parser of what
//! they print (DESIGN §6). Knows nothing about HTTP or Kubernetes; the
//! gateway runs the rendered text as `sh -c <script>` in the sandbox.
//!
//! # Protocol (one exec per delivery)
//!
//! The gateway renders [`render_deliver`], runs it with the bundle bytes
//! *available* on stdin, and reads stdout line by line while it writes:
//!
//! 0. When the sandbox holds a cache dir of the revision that fails its
//!    check (a file changed, added or removed), the script first prints
//!    `RESEND <reason>` ([`ScriptLine::Resend`]); the gateway logs it.
//! 1. The script prints `NEED <n>` (or `ERROR …`, e.g. `disk_full` when the
//!    filesystem cannot hold the bundle and its tar, before any byte is
//!    sent). On a verified cache hit
//!    `n` is 0 and the script never reads stdin; otherwise the gateway
//!    writes exactly `n` bytes (the whole bundle) and must not rely on
//!    closing stdin: the script reads exactly `n` bytes with `head -c`,
//!    because some exec transports (kwok) never deliver EOF.
//! 2. The script prints one final line: the JSON object
//!    `{"path":"…","revision":"…","cached":true|false}` ([`ScriptLine::Done`])
//!    and exits 0, or `ERROR <code> <reason>` ([`ScriptLine::Error`]) and
//!    exits non-zero. stderr is for logs only.
//!
//! With agents offered ([`render_deliver_with_agent`]) the command is the
//! launcher (`launch.sh`) followed by the same script. Before `NEED` it may
//! print `AGENT <arch>` ([`ScriptLine::Agent`]): the gateway then writes
//! exactly that agent's bytes (it knows their sha256 and size; the launcher
//! checks the digest before `chmod 0555` and keeps the agent at
//! `<root>/bin/<sha256>/context-agent`). It then prints `TRANSPORT agent`
//! and execs the agent (`agent/`), which speaks steps 1–2 itself, or
//! `TRANSPORT script` and lets the script run (unknown arch, a damaged or
//! unrunnable agent, a `noexec` root). Each outcome reports which.
//!
//! [`render_release`] prints `{"released":true|false}` or `ERROR …`.
//! [`parse_line`] turns any of these lines into a [`ScriptLine`].
//!
//! # Layout under the root (default [`DEFAULT_ROOT`])
//!
//! ```text
//! .lock                                  flock(1) target; every step runs under it
//! cache/<scope>-<revision>/tree/…        the published read-only tree
//! cache/.staging.<pid>/                  a delivery in progress (removed on failure, or by
//!                                        the next run if the shell was killed)
//! cache/.staging.<pid>.scan.*            a scan's digests while it runs (likewise)
//! refs/<scope>-<revision>/<workload>/<runId>   one empty file per run: the reference
//! runs/<scope>/<workload>/<runId>        the run's view: symlink ../../../cache/<key>/tree
//! idle/<scope>/<seq>-<revision>          unreferenced revisions kept by retention, oldest first
//! idle/.seq                              the counter that orders them
//! bin/<sha256>/context-agent             the injected agent (0555)
//! bin/.incoming.<pid>                    an agent being received
//! ```
//!
//! The scope is part of every path, so two owners delivering the same
//! revision, or picking the same run id, never share a directory. The
//! read-only bits are advisory when all tasks share one uid.
//!
//! # Verification
//!
//! A cold delivery checks the sha256 of the received bytes against the
//! bundle digest, inflates at most `inflatedBytes + 1` bytes, and checks
//! the sha256 of the inflated tar against the revision *before* `tar`
//! parses a byte of it (the end-to-end pin: the archive is then exactly the
//! canonical one the service counted, so its entry count and sizes are
//! known). The extracted tree is then scanned against the revision's tree
//! manifest ([`crate::bundle::TreeManifest`], computed by the gateway from
//! the bundle at activation and passed in the script, never read from the
//! sandbox): every path, kind, file mode and size, without reading a file
//! again. A cache hit is scanned against the same manifest: by default
//! paths, kinds, modes and sizes ([`Verify::Default`]; a same-size edit
//! passes), with [`Verify::Full`] also the sha256 of every file. A dir that
//! fails is removed and delivered again.
//!
//! # Tools the scripts need
//!
//! `sh`, `head`, `sha256sum`, `gzip`, `tar`, `flock`, `mkdir`, `mv`, `rm`,
//! `chmod`, plus two more that exist in both GNU coreutils and busybox:
//! `stat` (`-c '%f %s'`: file sizes and modes for the manifest and the
//! received byte count, since POSIX sh cannot learn a file's size without
//! reading it; `-f -c '%a %S'`: free space, for the early `disk_full` and
//! because busybox may report a full disk only as "I/O error") and `ln`
//! (`-s`: the run's view), and `tee` (in both too): it keeps the received
//! bytes while feeding them to `gzip`, and the tar while feeding it to
//! `sha256sum`, so receiving, both hashes and the inflate overlap instead
//! of each re-reading a file (the inflate of bytes not yet verified is
//! bounded by the cap; `tar` still waits for both digests). The deliver
//! script checks for all of them first and fails with `missing_tool`. GNU `tar`
//! is detected at run time (`--no-same-owner --no-same-permissions`); any
//! other `tar` (busybox) gets `-o --no-same-permissions`.
//!
//! # Modules
//!
//! - [`port`]: [`SandboxExec`], the exec port the sandbox backends implement;
//! - [`agent`]: the agents the gateway ships and the transport setting;
//! - [`rules`]: the value and member-name rules, shared with the agent;
//! - `script`: the scripts, their renderer and the line parser (above);
//! - [`service`]: [`DeliveryService`]: validation, targets (`targets`),
//!   single-flight per sandbox, scope and revision (`flight`), the bundle
//!   bytes under the in-flight budget (`payload`), the exec protocol
//!   (`session`) and the run registry (`crate::store::RunStore`);
//! - [`error`], [`view`], [`metrics`]: failures, wire shapes, metrics.

pub mod agent;
pub mod error;
mod flight;
pub mod metrics;
mod payload;
pub mod port;
pub mod rules;
mod script;
pub mod service;
mod session;
mod targets;
pub mod view;

pub use agent::{Agent, AgentError, AgentSet, Transport};
pub use error::{DeliveryError, DeliveryFailure, SandboxFailure};
pub use metrics::DeliveryMetrics;
pub use port::{ExecError, ExecSession, ExecTarget, SandboxExec};
pub use script::{
    is_valid_root, is_valid_run_id, is_valid_scope, parse_line, render_deliver,
    render_deliver_with_agent, render_release, AgentOffer, DeliverRequest, DeliveredBy, LineError,
    ReleaseRequest, RunId, ScriptError, ScriptLine, Verify, DEFAULT_ROOT, ERROR_CODES,
    RUN_ID_PATTERN,
};
pub use service::{
    DeliverInput, DeliveryDeps, DeliveryService, DeliverySettings, DeliveryTarget, SettingsError,
    RUN_ID_RULE, WORKLOAD_NAME_RULE,
};
pub use view::{Delivered, FailedBody, RunList, RunPlace, RunView, SandboxOutcome};
