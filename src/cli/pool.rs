//! `contextctl create|get|wait|rm|ls`: sandbox pools.

use std::process::ExitCode;
use std::time::{Duration, Instant};

use super::{print_doc, values, About as _, CallFailed, ConnectionArgs, OutputFormat, UsageError};
use crate::client::ClientError;
use crate::pool::view::{CreatePool, CreateWorkspace, Pool};

/// `pool "<name>"`: what a failed pool call names.
fn pool_what(name: &str) -> String {
    format!("pool {name:?}")
}

/// Environment variable with the default StorageClass of `create -c`.
pub const STORAGE_CLASS_ENV: &str = "CS_STORAGE_CLASS";

/// `contextctl create NAME`.
#[derive(Debug, clap::Args)]
#[command(after_help = "\
Strategies (exactly one):
  dedicated (default)  one ReadWriteOnce workspace per sandbox
  --shared             one ReadWriteMany workspace shared by every sandbox
  --claim PVC          an existing volume, with --read-only or --read-write
  --warm-pool POOL     sandboxes claimed from a SandboxWarmPool (no workspace flags)

Examples:
  contextctl create review                       # 1 sandbox, 1Gi RWO workspace
  contextctl create review -n 3 -s 5Gi -c fast   # 3 sandboxes, one 5Gi volume each
  contextctl create team --shared -n 4           # 4 sandboxes sharing one 1Gi volume
  contextctl create solo --shared                # 1 sandbox on a shareable volume
  contextctl create readers -n 3 --claim context-docs --read-only
  contextctl create fast --warm-pool research-agents -n 3
  contextctl create scratch --ttl 2h             # deleted by the service after 2 hours
  contextctl wait team && contextctl get team")]
pub struct CreateArgs {
    /// Pool name (lowercase, at most 50 characters).
    #[arg(value_parser = values::pool_name)]
    pub name: String,
    /// Number of sandboxes (1 to 100).
    #[arg(short = 'n', long = "replicas", default_value_t = 1, value_parser = values::replicas)]
    pub replicas: i64,
    /// Workspace size, a Kubernetes quantity [default: 1Gi].
    #[arg(short = 's', long = "size", value_parser = values::size)]
    pub size: Option<String>,
    /// StorageClass of the workspace [default: $CS_STORAGE_CLASS].
    #[arg(short = 'c', long = "storage-class")]
    pub storage_class: Option<String>,
    /// One ReadWriteMany workspace shared by every sandbox.
    #[arg(long)]
    pub shared: bool,
    /// Mount this existing volume (PVC) instead of creating one.
    #[arg(long, value_name = "PVC", value_parser = values::object_name)]
    pub claim: Option<String>,
    /// Mount the --claim volume read-only.
    #[arg(long)]
    pub read_only: bool,
    /// Mount the --claim volume read-write.
    #[arg(long)]
    pub read_write: bool,
    /// Claim the sandboxes from this SandboxWarmPool.
    #[arg(long, value_name = "POOL", value_parser = values::object_name)]
    pub warm_pool: Option<String>,
    /// Lifetime of the pool, e.g. `2h` or `30m`; the service deletes it
    /// then. Default: until deleted.
    #[arg(long, value_name = "DURATION", value_parser = values::pool_ttl)]
    pub ttl: Option<String>,
    /// Same as `--output json` (upstream compatibility).
    #[arg(long, hide = true)]
    pub json: bool,
}

impl CreateArgs {
    /// The request these flags describe, or why they do not fit together
    /// (a [`UsageError`]).
    pub fn request(&self) -> anyhow::Result<CreatePool> {
        let given = [
            ("shared", self.shared),
            ("claim", self.claim.is_some()),
            ("read-only", self.read_only),
            ("read-write", self.read_write),
            ("size", self.size.is_some()),
            ("storage-class", self.storage_class.is_some()),
        ];
        let mut req = CreatePool {
            name: self.name.clone(),
            replicas: self.replicas,
            // Checked by the service, whose bounds are configurable.
            ttl: self.ttl.clone(),
            ..CreatePool::default()
        };
        if let Some(pool) = &self.warm_pool {
            if let Some((flag, _)) = given.iter().find(|(_, set)| *set) {
                return Err(
                    UsageError(format!("--warm-pool cannot be combined with --{flag}")).into(),
                );
            }
            req.warm_pool_ref = Some(pool.clone());
            return Ok(req);
        }
        if let Some(claim) = &self.claim {
            if self.read_only == self.read_write {
                return Err(UsageError(
                    "--claim requires exactly one of --read-only or --read-write".to_owned(),
                )
                .into());
            }
            // Upstream ignores these silently; saying so is kinder.
            if let Some((flag, _)) = given[..1].iter().chain(&given[4..]).find(|(_, set)| *set) {
                return Err(UsageError(format!("--claim cannot be combined with --{flag}")).into());
            }
            req.workspace = CreateWorkspace {
                claim_name: Some(claim.clone()),
                read_only: Some(self.read_only),
                ..CreateWorkspace::default()
            };
            return Ok(req);
        }
        if self.read_only || self.read_write {
            return Err(
                UsageError("--read-only and --read-write require --claim".to_owned()).into(),
            );
        }
        let storage_class = self
            .storage_class
            .clone()
            .or_else(|| std::env::var(STORAGE_CLASS_ENV).ok())
            .filter(|c| !c.is_empty());
        req.workspace = CreateWorkspace {
            size: Some(self.size.clone().unwrap_or_else(|| "1Gi".to_owned())),
            access_mode: Some(
                if self.shared {
                    "ReadWriteMany"
                } else {
                    "ReadWriteOnce"
                }
                .to_owned(),
            ),
            storage_class,
            ..CreateWorkspace::default()
        };
        Ok(req)
    }
}

/// `contextctl get NAME`.
#[derive(Debug, clap::Args)]
#[command(after_help = "\
Examples:
  contextctl get team             # the pool and its sandboxes
  contextctl get team -o yaml     # also json; -o name prints pool/team")]
pub struct GetArgs {
    /// Pool name.
    pub name: String,
    /// Same as `--output json` (upstream compatibility).
    #[arg(long, hide = true)]
    pub json: bool,
}

/// `contextctl wait NAME`.
#[derive(Debug, clap::Args)]
#[command(after_help = "\
Examples:
  contextctl wait team --timeout 5m && contextctl get team")]
pub struct WaitArgs {
    /// Pool name.
    pub name: String,
    /// Give up after this long, e.g. `30s`, `2m`.
    #[arg(short = 't', long, default_value = "2m", value_parser = humantime::parse_duration)]
    pub timeout: Duration,
}

/// `contextctl suspend NAME` and `contextctl resume NAME`.
#[derive(Debug, clap::Args)]
#[command(after_help = "\
Examples:
  contextctl suspend team         # pods stop; volumes, names and files stay
  contextctl resume team && contextctl wait team")]
pub struct SuspendArgs {
    /// Pool name.
    pub name: String,
}

/// `contextctl rm NAME`.
#[derive(Debug, clap::Args)]
#[command(after_help = "\
Examples:
  contextctl rm team              # also succeeds when there is no pool team")]
pub struct RmArgs {
    /// Pool name.
    pub name: String,
}

fn format_of(output: OutputFormat, json: bool) -> OutputFormat {
    if json {
        OutputFormat::Json
    } else {
        output
    }
}

/// `<name>: <status> (<ready>/<replicas> ready), <summary>, selector <selector>`.
pub fn summary_line(pool: &Pool) -> String {
    let summary = match &pool.warm_pool_ref {
        Some(r) => format!("warm pool {r}"),
        None => {
            let mode = match pool.workspace.access_mode.as_str() {
                "ReadWriteMany" => "RWX",
                "ReadWriteOnce" => "RWO",
                other => other,
            };
            match &pool.workspace.claim_name {
                Some(claim) => format!(
                    "claim {claim} {}",
                    if pool.workspace.read_only == Some(true) {
                        "read-only"
                    } else {
                        "read-write"
                    }
                ),
                None => format!("{} {mode}", pool.workspace.size),
            }
        }
    };
    format!(
        "{}: {} ({}/{} ready), {summary}, selector {}",
        pool.name, pool.status, pool.ready_replicas, pool.replicas, pool.sandbox_selector
    )
}

/// `pool/<name>`, as `--output name` prints a pool.
fn pool_ref(name: &str) -> String {
    format!("pool/{name}")
}

fn print_pool(pool: &Pool, output: OutputFormat, members: bool) -> anyhow::Result<()> {
    match output {
        OutputFormat::Json | OutputFormat::Yaml => print_doc(pool, output)?,
        OutputFormat::Name => println!("{}", pool_ref(&pool.name)),
        OutputFormat::Text | OutputFormat::Wide => {
            println!("{}", summary_line(pool));
            if let (Some(reason), message) = (&pool.reason, &pool.message) {
                println!("  {reason}: {}", message.as_deref().unwrap_or(""));
            }
            if let Some(at) = &pool.expires_at {
                println!("  expires at {at}");
            }
            if members {
                for s in &pool.sandboxes {
                    println!(
                        "  {}  pod={}  {}",
                        s.name,
                        s.pod.as_deref().unwrap_or("-"),
                        if s.ready { "ready" } else { "not-ready" }
                    );
                }
            }
        }
    }
    Ok(())
}

/// Runs `contextctl create`.
pub async fn create(
    args: CreateArgs,
    conn: &ConnectionArgs,
    output: OutputFormat,
) -> anyhow::Result<ExitCode> {
    let req = args.request()?;
    let client = conn.settings().client()?;
    let pool = client
        .create_pool(&req)
        .await
        .about(|| pool_what(&req.name))?;
    print_pool(&pool, format_of(output, args.json), false)?;
    Ok(ExitCode::SUCCESS)
}

/// Runs `contextctl get`.
pub async fn get(
    args: GetArgs,
    conn: &ConnectionArgs,
    output: OutputFormat,
) -> anyhow::Result<ExitCode> {
    let client = conn.settings().client()?;
    let pool = client
        .get_pool(&args.name)
        .await
        .about(|| pool_what(&args.name))?;
    print_pool(&pool, format_of(output, args.json), true)?;
    Ok(ExitCode::SUCCESS)
}

/// Runs `contextctl ls`.
pub async fn ls(conn: &ConnectionArgs, output: OutputFormat) -> anyhow::Result<ExitCode> {
    let client = conn.settings().client()?;
    let list = client.list_pools().await.about(|| "pools".to_owned())?;
    match output {
        OutputFormat::Json | OutputFormat::Yaml => print_doc(&list, output)?,
        OutputFormat::Name => list
            .items
            .iter()
            .for_each(|p| println!("{}", pool_ref(&p.name))),
        OutputFormat::Text => list
            .items
            .iter()
            .for_each(|p| println!("{}", summary_line(p))),
        // Wide: each pool as `get` shows it, sandboxes included.
        OutputFormat::Wide => {
            for pool in &list.items {
                print_pool(pool, output, true)?;
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// Runs `contextctl rm`.
pub async fn rm(
    args: RmArgs,
    conn: &ConnectionArgs,
    output: OutputFormat,
) -> anyhow::Result<ExitCode> {
    let client = conn.settings().client()?;
    // A missing pool fails (exit 1, `contextctl: pool "team": 404 Not
    // Found: sandbox pool not found (not_found)`).
    client
        .delete_pool(&args.name)
        .await
        .about(|| pool_what(&args.name))?;
    match output {
        OutputFormat::Json | OutputFormat::Yaml => {
            print_doc(&serde_json::json!({ "deleted": args.name }), output)?;
        }
        OutputFormat::Name => println!("{}", pool_ref(&args.name)),
        OutputFormat::Text | OutputFormat::Wide => println!("deleted {}", args.name),
    }
    Ok(ExitCode::SUCCESS)
}

/// Runs `contextctl suspend` (`true`) or `contextctl resume` (`false`).
pub async fn set_suspended(
    args: SuspendArgs,
    conn: &ConnectionArgs,
    output: OutputFormat,
    suspend: bool,
) -> anyhow::Result<ExitCode> {
    let client = conn.settings().client()?;
    let pool = if suspend {
        client.suspend_pool(&args.name).await
    } else {
        client.resume_pool(&args.name).await
    }
    .about(|| pool_what(&args.name))?;
    print_pool(&pool, output, false)?;
    Ok(ExitCode::SUCCESS)
}

/// Longest single long-poll; shorter than any proxy's idle timeout.
const POLL: Duration = Duration::from_secs(30);

/// Runs `contextctl wait`: long-polls the service until the pool is ready
/// (exit 0), failed or gone (exit 1), or the timeout passes (exit 1).
/// Transient failures (network, 5xx) are retried until the deadline.
pub async fn wait(
    args: WaitArgs,
    conn: &ConnectionArgs,
    output: OutputFormat,
) -> anyhow::Result<ExitCode> {
    let client = conn.settings().client()?;
    let deadline = Instant::now() + args.timeout;
    let mut last_line = String::new();
    let mut last_pool: Option<Pool> = None;
    loop {
        let remaining = deadline.saturating_duration_since(Instant::now());
        if remaining.is_zero() {
            if let (true, Some(pool)) = (output.is_document(), &last_pool) {
                print_doc(pool, output)?;
            }
            anyhow::bail!("timed out waiting for {}", args.name);
        }
        match client.wait_pool(&args.name, remaining.min(POLL)).await {
            Ok(pool) => {
                let line = format!(
                    "{}: {} ({}/{} ready)",
                    pool.name, pool.status, pool.ready_replicas, pool.replicas
                );
                let text = matches!(output, OutputFormat::Text | OutputFormat::Wide);
                if text && line != last_line {
                    println!("{line}");
                    last_line = line;
                }
                match pool.status.as_str() {
                    "ready" => {
                        match output {
                            OutputFormat::Json | OutputFormat::Yaml => print_doc(&pool, output)?,
                            OutputFormat::Name => println!("{}", pool_ref(&pool.name)),
                            OutputFormat::Text | OutputFormat::Wide => {}
                        }
                        return Ok(ExitCode::SUCCESS);
                    }
                    // It will not become ready by itself.
                    "suspended" => {
                        if output.is_document() {
                            print_doc(&pool, output)?;
                        }
                        anyhow::bail!(
                            "{} is suspended; resume it first (contextctl resume {})",
                            pool.name,
                            pool.name
                        );
                    }
                    "failed" => {
                        if output.is_document() {
                            print_doc(&pool, output)?;
                        }
                        anyhow::bail!(
                            "{} failed: {}: {}",
                            pool.name,
                            pool.reason.as_deref().unwrap_or("unknown"),
                            pool.message.as_deref().unwrap_or("no detail")
                        );
                    }
                    _ => last_pool = Some(pool),
                }
            }
            Err(e) if is_transient(&e) => {
                tracing::debug!(error = %e, "retrying");
                let pause =
                    Duration::from_secs(1).min(deadline.saturating_duration_since(Instant::now()));
                tokio::time::sleep(pause).await;
            }
            Err(e) => return Err(CallFailed::new(pool_what(&args.name), e).into()),
        }
    }
}

fn is_transient(err: &ClientError) -> bool {
    match err {
        ClientError::Transport { .. } => true,
        ClientError::Api { status, .. } => status.is_server_error(),
        _ => false,
    }
}
