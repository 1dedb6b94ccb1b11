//! `contextctl workload create|upload|activate|get|ls|download|rm|deliver|release|deliveries|pull-secret`.

use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::Context as _;
use indicatif::{ProgressBar, ProgressStyle};

use super::{print_doc, values, About as _, CallFailed, ConnectionArgs, OutputFormat};
use crate::bundle::{self, CanonicalOptions, Limits};
use crate::client::deliveries::DeliverBody;
use crate::client::{Client, ClientError};
use crate::delivery::{RunId, RunView, SandboxOutcome, Verify};
use crate::workload::names::CONTEXT_TYPES;
use crate::workload::WorkloadView;

/// `contextctl workload ...`.
#[derive(Debug, clap::Args)]
#[command(after_help = "\
Examples:
  contextctl workload create docs && contextctl workload upload docs ./src
  contextctl workload activate docs && contextctl workload get docs")]
pub struct WorkloadArgs {
    #[command(subcommand)]
    command: WorkloadCommand,
}

#[derive(Debug, clap::Subcommand)]
enum WorkloadCommand {
    /// Create a workload (prints its name; `--output json` also shows the upload grant).
    #[command(after_help = "\
Examples:
  contextctl workload create docs
  contextctl workload create --type knowledge -o json   # generated name, upload grant")]
    Create {
        /// Name: lowercase letters, digits and '-', at most 50 [default: wl-<8 hex>].
        #[arg(value_parser = values::workload_name)]
        name: Option<String>,
        /// Context type [default: workspace].
        #[arg(long = "type", short = 't', value_name = "TYPE", value_parser = CONTEXT_TYPES)]
        kind: Option<String>,
    },
    /// Upload a directory (packed here) or a bundle file; prints the revision.
    #[command(after_help = "\
Examples:
  contextctl workload upload docs ./src
  contextctl workload upload docs workload.tar.gz -o json")]
    Upload {
        /// The workload.
        name: String,
        /// A directory, or a gzip-compressed tar.
        path: PathBuf,
    },
    /// Freeze a revision [default: the last uploaded one].
    #[command(after_help = "\
Examples:
  contextctl workload activate docs")]
    Activate {
        /// The workload.
        name: String,
        /// The revision (64 hex digits).
        #[arg(value_parser = values::revision)]
        revision: Option<String>,
    },
    /// Show a workload.
    #[command(after_help = "\
Examples:
  contextctl workload get docs
  contextctl workload get docs -o yaml")]
    Get {
        /// The workload.
        name: String,
    },
    /// List your workloads.
    #[command(
        alias = "list",
        after_help = "\
Examples:
  contextctl workload ls
  contextctl workload ls -o wide      # full revisions, digests, file counts
  contextctl workload ls -o name      # workload/docs, one a line"
    )]
    Ls,
    /// Download the frozen revision, verifying its digests while writing.
    #[command(after_help = "\
Examples:
  contextctl workload download docs -f docs.tar.gz")]
    Download {
        /// The workload.
        name: String,
        /// The revision [default: the active one].
        #[arg(long, value_parser = values::revision)]
        revision: Option<String>,
        /// Output file [default: <name>-<revision prefix>.tar.gz].
        #[arg(long = "file", short = 'f')]
        file: Option<PathBuf>,
    },
    /// Delete a workload and its bundles.
    #[command(
        alias = "delete",
        after_help = "\
Examples:
  contextctl workload rm docs"
    )]
    Rm {
        /// The workload.
        name: String,
    },
    /// Deliver the active revision into a sandbox, or into every ready
    /// sandbox of one of your pools, as a run.
    #[command(
        group(clap::ArgGroup::new("target").required(true).args(["sandbox", "pool"])),
        after_help = "\
Examples:
  contextctl workload deliver docs --sandbox sandbox-team-0 --run build-1
  contextctl workload deliver docs --pool team --run build-2 --verify full -o wide"
    )]
    Deliver {
        /// The workload.
        name: String,
        /// The sandbox (this or --pool).
        #[arg(long)]
        sandbox: Option<String>,
        /// The pool: every ready sandbox of it (this or --sandbox).
        #[arg(long)]
        pool: Option<String>,
        /// The run id: 1 to 63 lowercase letters, digits, '.', '_' or '-',
        /// starting with a letter or digit.
        #[arg(long, value_parser = values::run_id)]
        run: RunId,
        /// How a revision already in the sandbox is verified.
        #[arg(long, value_enum)]
        verify: Option<VerifyArg>,
    },
    /// Release a run in every sandbox it reached.
    #[command(after_help = "\
Examples:
  contextctl workload release docs --run build-1")]
    Release {
        /// The workload.
        name: String,
        /// The run id.
        #[arg(long, value_parser = values::run_id)]
        run: RunId,
    },
    /// Print a kubernetes.io/dockerconfigjson Secret with a pull-only
    /// registry credential for this one workload (OCI pull API, /v2).
    #[command(after_help = "\
Examples:
  contextctl workload pull-secret docs | kubectl apply -f -
  contextctl workload pull-secret docs --ttl 7d --registry cs.example.com -n team
  contextctl workload pull-secret docs --docker-config > ~/.docker/config.json")]
    PullSecret {
        /// The workload.
        name: String,
        /// Pin the credential to this revision (the active one).
        #[arg(long, value_parser = values::revision)]
        revision: Option<String>,
        /// Lifetime of the credential, at most 30 days.
        #[arg(long, default_value = "24h", value_parser = humantime::parse_duration)]
        ttl: std::time::Duration,
        /// The registry host[:port] as nodes reach it [default: the service URL's].
        #[arg(long)]
        registry: Option<String>,
        /// Name of the Secret [default: <workload>-pull].
        #[arg(long)]
        secret_name: Option<String>,
        /// Namespace of the Secret.
        #[arg(long, short = 'n')]
        namespace: Option<String>,
        /// Print only the docker config.json (for crane, oras, docker).
        #[arg(long)]
        docker_config: bool,
    },
    /// List the live runs of a workload and where they are.
    #[command(after_help = "\
Examples:
  contextctl workload deliveries docs
  contextctl workload deliveries docs -o name   # run/build-1, one a line")]
    Deliveries {
        /// The workload.
        name: String,
    },
}

/// `--verify` of `workload deliver`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum VerifyArg {
    /// Paths, kinds, modes and sizes (no file is read).
    Default,
    /// Also the sha256 of every file.
    Full,
}

impl From<VerifyArg> for Verify {
    fn from(v: VerifyArg) -> Self {
        match v {
            VerifyArg::Default => Verify::Default,
            VerifyArg::Full => Verify::Full,
        }
    }
}

/// Runs `contextctl workload`.
pub async fn run(
    args: WorkloadArgs,
    conn: &ConnectionArgs,
    output: OutputFormat,
) -> anyhow::Result<ExitCode> {
    if output == OutputFormat::Name {
        match &args.command {
            WorkloadCommand::Upload { .. } => return Err(output.unsupported("workload upload")),
            WorkloadCommand::Download { .. } => return Err(output.unsupported("workload download")),
            _ => {}
        }
    }
    let client = conn.settings().client()?;
    match args.command {
        WorkloadCommand::Create { name, kind } => {
            let view = client
                .create_workload(name.as_deref(), kind.as_deref())
                .await
                .about(|| match &name {
                    Some(name) => workload_what(name),
                    None => "a new workload".to_owned(),
                })?;
            match output {
                OutputFormat::Json | OutputFormat::Yaml => print_doc(&view, output)?,
                OutputFormat::Name => println!("workload/{}", view.name),
                OutputFormat::Text | OutputFormat::Wide => println!("{}", view.name),
            }
        }
        WorkloadCommand::Upload { name, path } => upload(&client, &name, &path, output).await?,
        WorkloadCommand::Activate { name, revision } => {
            let revision = match revision {
                Some(r) => r,
                None => client
                    .workload(&name)
                    .await
                    .about(|| workload_what(&name))?
                    .candidate_revision
                    .with_context(|| {
                        format!("workload {name} has no uploaded revision waiting; upload first or name a revision")
                    })?,
            };
            let view = client
                .activate_workload(&name, &revision)
                .await
                .about(|| workload_what(&name))?;
            match output {
                OutputFormat::Json | OutputFormat::Yaml => print_doc(&view, output)?,
                OutputFormat::Name => println!("workload/{}", view.name),
                OutputFormat::Text | OutputFormat::Wide => {
                    println!("{} {} {}", view.name, view.status, revision);
                }
            }
        }
        WorkloadCommand::Get { name } => {
            let view = client
                .workload(&name)
                .await
                .about(|| workload_what(&name))?;
            match output {
                OutputFormat::Json | OutputFormat::Yaml => print_doc(&view, output)?,
                OutputFormat::Name => println!("workload/{}", view.name),
                // The columns of `ls` (`ls -o wide`), then the rest.
                OutputFormat::Text => {
                    print_table(std::slice::from_ref(&view));
                    print_details(&view);
                }
                OutputFormat::Wide => {
                    print_wide_table(std::slice::from_ref(&view));
                    print_details(&view);
                }
            }
        }
        WorkloadCommand::Ls => {
            let list = client.workloads().await.about(|| "workloads".to_owned())?;
            match output {
                OutputFormat::Json | OutputFormat::Yaml => print_doc(&list, output)?,
                OutputFormat::Name => list.iter().for_each(|v| println!("workload/{}", v.name)),
                OutputFormat::Text => print_table(&list),
                OutputFormat::Wide => print_wide_table(&list),
            }
        }
        WorkloadCommand::Download {
            name,
            revision,
            file,
        } => {
            let revision = match revision {
                Some(r) => r,
                None => client
                    .workload(&name)
                    .await
                    .about(|| workload_what(&name))?
                    .revision
                    .with_context(|| {
                        format!("workload {name} is not active yet; activate a revision first")
                    })?,
            };
            let out = file.unwrap_or_else(|| {
                PathBuf::from(format!(
                    "{name}-{}.tar.gz",
                    &revision[..revision.len().min(12)]
                ))
            });
            let bar = progress_bar(output, None);
            let report = client
                .download_bundle(&name, &revision, &out, |done, total| {
                    if let Some(t) = total {
                        bar.set_length(t);
                    }
                    bar.set_position(done);
                })
                .await;
            bar.finish_and_clear();
            let report = report.about(|| workload_what(&name))?;
            match output {
                OutputFormat::Json | OutputFormat::Yaml => print_doc(&report, output)?,
                // Refused before the download started.
                OutputFormat::Text | OutputFormat::Wide | OutputFormat::Name => println!(
                    "{} ({} bytes, sha256:{} verified)",
                    report.path.display(),
                    report.bytes,
                    report.bundle_digest
                ),
            }
        }
        WorkloadCommand::Rm { name } => {
            client
                .delete_workload(&name)
                .await
                .about(|| workload_what(&name))?;
            match output {
                OutputFormat::Json | OutputFormat::Yaml => {
                    print_doc(&serde_json::json!({"name": name, "deleted": true}), output)?;
                }
                OutputFormat::Name => println!("workload/{name}"),
                OutputFormat::Text | OutputFormat::Wide => println!("deleted {name}"),
            }
        }
        WorkloadCommand::Deliver {
            name,
            sandbox,
            pool,
            run,
            verify,
        } => {
            let body = DeliverBody {
                run_id: run.to_string(),
                sandbox,
                pool,
                verify: verify.map(Verify::from),
            };
            match client.deliver(&name, &body).await {
                Ok(delivered) => {
                    show_outcomes(&delivered, &delivered.deliveries, &run, output)?;
                }
                Err(ClientError::DeliveryFailed { body }) => {
                    // Every sandbox's outcome on stdout; the reason on stderr.
                    show_outcomes(&body, &body.deliveries, &run, output)?;
                    let error = ClientError::DeliveryFailed { body };
                    return Err(CallFailed::new(run_what(&name, &run), error).into());
                }
                Err(e) => return Err(CallFailed::new(run_what(&name, &run), e).into()),
            }
        }
        WorkloadCommand::Release { name, run } => {
            client
                .release(&name, &run)
                .await
                .about(|| run_what(&name, &run))?;
            match output {
                OutputFormat::Json | OutputFormat::Yaml => {
                    print_doc(&serde_json::json!({"runId": run, "released": true}), output)?;
                }
                OutputFormat::Name => println!("run/{run}"),
                OutputFormat::Text | OutputFormat::Wide => println!("released {run}"),
            }
        }
        WorkloadCommand::PullSecret {
            name,
            revision,
            ttl,
            registry,
            secret_name,
            namespace,
            docker_config,
        } => {
            let args = super::pull_secret::PullSecretArgs {
                name,
                revision,
                ttl,
                registry,
                secret_name,
                namespace,
                docker_config,
            };
            super::pull_secret::run(&client, args, output).await?;
        }
        WorkloadCommand::Deliveries { name } => {
            let runs = client
                .deliveries(&name)
                .await
                .about(|| workload_what(&name))?;
            match output {
                OutputFormat::Json | OutputFormat::Yaml => {
                    print_doc(&serde_json::json!({ "deliveries": runs }), output)?;
                }
                OutputFormat::Name => runs.iter().for_each(|r| println!("run/{}", r.run_id)),
                OutputFormat::Text => print_runs(&runs, false),
                OutputFormat::Wide => print_runs(&runs, true),
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// `workload "<name>"`: what a failed workload call names.
fn workload_what(name: &str) -> String {
    format!("workload {name:?}")
}

/// `run "<run>" of workload "<name>"`: what a failed delivery or release
/// names.
fn run_what(name: &str, run: &str) -> String {
    format!("run {run:?} of workload {name:?}")
}

/// A delivery's result (`doc`, the whole response) in `output`: one line
/// per sandbox as text, `run/<run>` as a name.
fn show_outcomes(
    doc: &impl serde::Serialize,
    outcomes: &[SandboxOutcome],
    run: &str,
    output: OutputFormat,
) -> anyhow::Result<()> {
    match output {
        OutputFormat::Json | OutputFormat::Yaml => print_doc(doc, output)?,
        OutputFormat::Name => println!("run/{run}"),
        OutputFormat::Text => print_outcomes(outcomes, false),
        OutputFormat::Wide => print_outcomes(outcomes, true),
    }
    Ok(())
}

/// One line per sandbox: what happened there; `wide` adds the pod.
fn print_outcomes(outcomes: &[SandboxOutcome], wide: bool) {
    let pod_head = if wide {
        format!("{:<40} ", "POD")
    } else {
        String::new()
    };
    println!(
        "{:<40} {pod_head}{:<7} {:>12} {:>8}  PATH / ERROR",
        "SANDBOX", "RESULT", "BYTES", "MS"
    );
    for o in outcomes {
        let (result, detail) = match (&o.error, o.cached, &o.path) {
            (Some(e), _, _) => ("failed", e.clone()),
            (None, Some(true), Some(p)) => ("cached", p.clone()),
            (None, _, p) => ("sent", p.clone().unwrap_or_default()),
        };
        let pod = if wide {
            format!("{:<40} ", o.pod.as_deref().unwrap_or("-"))
        } else {
            String::new()
        };
        println!(
            "{:<40} {pod}{:<7} {:>12} {:>8}  {detail}",
            o.sandbox, result, o.bytes_sent, o.duration_ms
        );
    }
}

/// One line per run and sandbox; `wide` shows the whole revision and the
/// pod.
fn print_runs(runs: &[RunView], wide: bool) {
    if wide {
        println!(
            "{:<24} {:<64} {:<40} {:<40} PATH",
            "RUN", "REVISION", "SANDBOX", "POD"
        );
    } else {
        println!("{:<24} {:<14} {:<40} PATH", "RUN", "REVISION", "SANDBOX");
    }
    for r in runs {
        for s in &r.sandboxes {
            if wide {
                let pod = s.pod.as_deref().unwrap_or("-");
                println!(
                    "{:<24} {:<64} {:<40} {:<40} {}",
                    r.run_id, r.revision, s.sandbox, pod, s.path
                );
            } else {
                let rev = &r.revision[..r.revision.len().min(12)];
                println!("{:<24} {:<14} {:<40} {}", r.run_id, rev, s.sandbox, s.path);
            }
        }
    }
}

/// A byte progress bar on stderr, hidden unless stderr is a terminal and
/// the output is text.
fn progress_bar(output: OutputFormat, len: Option<u64>) -> ProgressBar {
    if output.is_document() || !std::io::stderr().is_terminal() {
        return ProgressBar::hidden();
    }
    let bar = ProgressBar::new(len.unwrap_or(0));
    if let Ok(style) =
        ProgressStyle::with_template("{bar:30} {bytes}/{total_bytes} {bytes_per_sec} eta {eta}")
    {
        bar.set_style(style);
    }
    bar
}

async fn upload(
    client: &Client,
    name: &str,
    path: &Path,
    output: OutputFormat,
) -> anyhow::Result<()> {
    let meta = std::fs::metadata(path).with_context(|| format!("{}", path.display()))?;
    // A directory is packed into the canonical bundle first, so the upload
    // can show its size and be retried from the same bytes.
    let packed;
    let file: &Path = if meta.is_dir() {
        let temp = tempfile::Builder::new()
            .prefix(".contextctl-pack-")
            .suffix(".tar.gz")
            .tempfile()
            .context("creating a temp file for the bundle")?;
        let dir = path.to_owned();
        let writer = temp
            .as_file()
            .try_clone()
            .context("opening the temp bundle")?;
        tokio::task::spawn_blocking(move || {
            bundle::pack_dir(
                &dir,
                &Limits::default(),
                &CanonicalOptions::default(),
                std::io::BufWriter::new(writer),
            )
        })
        .await
        .context("packing task failed")?
        .map_err(|e| anyhow::anyhow!("packing {}: {e}", path.display()))?;
        packed = temp;
        packed.path()
    } else {
        path
    };
    let len = std::fs::metadata(file)
        .with_context(|| format!("{}", file.display()))?
        .len();
    let bar = progress_bar(output, Some(len));
    let shown = bar.clone();
    let result = client
        .upload_bundle_file(name, file, move |sent| shown.set_position(sent))
        .await;
    bar.finish_and_clear();
    let rev = result.about(|| workload_what(name))?;
    if output.is_document() {
        print_doc(&rev, output)?;
    } else {
        // `name` was refused before the upload started.
        println!("{}", rev.revision);
    }
    Ok(())
}

/// `workload get`'s lines under the columns of `ls`: whole revisions,
/// the digest, counts, the failure and the times.
fn print_details(v: &WorkloadView) {
    let mut rows: Vec<(&str, String)> = Vec::new();
    if let Some(r) = &v.revision {
        rows.push(("revision", r.clone()));
    }
    if let Some(c) = &v.candidate_revision {
        rows.push(("candidate", c.clone()));
    }
    if let Some(d) = &v.bundle_digest {
        rows.push(("bundleDigest", d.clone()));
    }
    if let Some(f) = v.files {
        rows.push(("files", f.to_string()));
    }
    if let Some(r) = &v.reason {
        rows.push(("reason", r.clone()));
    }
    rows.push(("created", v.created_at.clone()));
    rows.push(("updated", v.updated_at.clone()));
    for (k, val) in rows {
        println!("  {k:<13}{val}");
    }
}

fn print_table(list: &[WorkloadView]) {
    println!(
        "{:<30} {:<10} {:<20} {:<14} {:>12}",
        "NAME", "TYPE", "STATUS", "REVISION", "BYTES"
    );
    for v in list {
        let rev = v
            .revision
            .as_deref()
            .or(v.candidate_revision.as_deref())
            .map(|r| r[..r.len().min(12)].to_owned())
            .unwrap_or_else(|| "-".into());
        let bytes = v.bytes.map(|b| b.to_string()).unwrap_or_else(|| "-".into());
        println!(
            "{:<30} {:<10} {:<20} {:<14} {:>12}",
            v.name, v.kind, v.status, rev, bytes
        );
    }
}

/// `ls -o wide`: whole revisions and digests, file counts and update times.
fn print_wide_table(list: &[WorkloadView]) {
    println!(
        "{:<30} {:<10} {:<20} {:<64} {:<71} {:>8} {:>12} UPDATED",
        "NAME", "TYPE", "STATUS", "REVISION", "BUNDLE DIGEST", "FILES", "BYTES"
    );
    let dash = |o: Option<String>| o.unwrap_or_else(|| "-".into());
    for v in list {
        let rev = v.revision.clone().or_else(|| v.candidate_revision.clone());
        println!(
            "{:<30} {:<10} {:<20} {:<64} {:<71} {:>8} {:>12} {}",
            v.name,
            v.kind,
            v.status,
            dash(rev),
            dash(v.bundle_digest.clone()),
            dash(v.files.map(|f| f.to_string())),
            dash(v.bytes.map(|b| b.to_string())),
            v.updated_at
        );
    }
}
