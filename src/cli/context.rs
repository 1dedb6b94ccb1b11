//! `contextctl context create|get|ls|rm`: named contexts.

use std::process::ExitCode;

use super::{print_doc, values, About as _, ConnectionArgs, OutputFormat};
use crate::pool::view::{ContextVolume, ContextVolumeStorage, CreateContextVolume};

/// `contextctl context ...`.
#[derive(Debug, clap::Args)]
#[command(after_help = "\
Examples:
  contextctl context create docs --type knowledge -s 5Gi --shared
  contextctl context ls -o wide")]
pub struct ContextArgs {
    #[command(subcommand)]
    command: ContextCommand,
}

#[derive(Debug, clap::Subcommand)]
enum ContextCommand {
    /// Create a named context: a volume `context-NAME` in NAMESPACE.
    #[command(after_help = "\
Examples:
  contextctl context create docs --type knowledge -s 5Gi --shared
  contextctl create readers -n 3 --claim context-docs --read-only")]
    Create {
        /// Context name (lowercase, at most 50 characters).
        #[arg(value_parser = values::pool_name)]
        name: String,
        /// Namespace.
        #[arg(long, default_value = "default", value_parser = values::namespace)]
        namespace: String,
        /// workspace, memory, knowledge or artifacts.
        #[arg(
            long = "type",
            value_name = "TYPE",
            default_value = "workspace",
            value_parser = ["workspace", "memory", "knowledge", "artifacts"]
        )]
        context_type: String,
        /// Size, a Kubernetes quantity.
        #[arg(short = 's', long, default_value = "1Gi", value_parser = values::size)]
        size: String,
        /// ReadWriteMany instead of ReadWriteOnce (needed to mount it in
        /// several sandboxes).
        #[arg(long)]
        shared: bool,
        /// StorageClass [default: $CS_STORAGE_CLASS].
        #[arg(short = 'c', long = "storage-class")]
        storage_class: Option<String>,
    },
    /// Show a named context.
    #[command(after_help = "\
Examples:
  contextctl context get docs
  contextctl context get docs --namespace team-a -o json")]
    Get {
        /// Context name.
        name: String,
        /// Namespace.
        #[arg(long, default_value = "default", value_parser = values::namespace)]
        namespace: String,
    },
    /// List your named contexts in a namespace.
    #[command(after_help = "\
Examples:
  contextctl context ls
  contextctl context ls -o name        # context/docs, one a line")]
    Ls {
        /// Namespace.
        #[arg(long, default_value = "default", value_parser = values::namespace)]
        namespace: String,
    },
    /// Delete a named context (succeeds when there is none).
    #[command(after_help = "\
Examples:
  contextctl context rm docs")]
    Rm {
        /// Context name.
        name: String,
        /// Namespace.
        #[arg(long, default_value = "default", value_parser = values::namespace)]
        namespace: String,
    },
}

/// `context "<namespace>/<name>"`: what a failed context call names.
fn context_what(namespace: &str, name: &str) -> String {
    format!("context \"{namespace}/{name}\"")
}

fn line(c: &ContextVolume) -> String {
    format!(
        "{}/{}: {}, {}, {} {}, claim {}",
        c.namespace,
        c.name,
        c.status,
        c.context_type,
        c.storage.size,
        match c.storage.access_mode.as_str() {
            "ReadWriteMany" => "RWX",
            "ReadWriteOnce" => "RWO",
            other => other,
        },
        c.attachment.claim_name
    )
}

/// Prints one context as `output` asks.
fn show(c: &ContextVolume, output: OutputFormat) -> anyhow::Result<()> {
    match output {
        OutputFormat::Json | OutputFormat::Yaml => print_doc(c, output)?,
        OutputFormat::Name => println!("context/{}", c.name),
        OutputFormat::Text | OutputFormat::Wide => println!("{}", line(c)),
    }
    Ok(())
}

/// Runs `contextctl context`.
pub async fn run(
    args: ContextArgs,
    conn: &ConnectionArgs,
    output: OutputFormat,
) -> anyhow::Result<ExitCode> {
    let client = conn.settings().client()?;
    match args.command {
        ContextCommand::Create {
            name,
            namespace,
            context_type,
            size,
            shared,
            storage_class,
        } => {
            let storage_class = storage_class
                .or_else(|| std::env::var(super::pool::STORAGE_CLASS_ENV).ok())
                .filter(|c| !c.is_empty());
            let req = CreateContextVolume {
                name,
                namespace,
                context_type,
                storage: ContextVolumeStorage {
                    backend: "pvc".to_owned(),
                    size,
                    access_mode: if shared {
                        "ReadWriteMany"
                    } else {
                        "ReadWriteOnce"
                    }
                    .to_owned(),
                    storage_class,
                },
            };
            let what = context_what(&req.namespace, &req.name);
            let created = client.create_volume(&req).await.about(|| what)?;
            show(&created, output)?;
        }
        ContextCommand::Get { name, namespace } => {
            let c = client
                .get_volume(&namespace, &name)
                .await
                .about(|| context_what(&namespace, &name))?;
            show(&c, output)?;
        }
        ContextCommand::Ls { namespace } => {
            let list = client
                .list_volumes(&namespace)
                .await
                .about(|| format!("contexts in namespace {namespace:?}"))?;
            match output {
                OutputFormat::Json | OutputFormat::Yaml => print_doc(&list, output)?,
                OutputFormat::Name => list
                    .items
                    .iter()
                    .for_each(|c| println!("context/{}", c.name)),
                OutputFormat::Text | OutputFormat::Wide => {
                    list.items.iter().for_each(|c| println!("{}", line(c)));
                }
            }
        }
        ContextCommand::Rm { name, namespace } => {
            client
                .delete_volume(&namespace, &name)
                .await
                .about(|| context_what(&namespace, &name))?;
            match output {
                OutputFormat::Json | OutputFormat::Yaml => print_doc(
                    &serde_json::json!({ "deleted": format!("{namespace}/{name}") }),
                    output,
                )?,
                OutputFormat::Name => println!("context/{name}"),
                OutputFormat::Text | OutputFormat::Wide => println!("deleted {namespace}/{name}"),
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}
