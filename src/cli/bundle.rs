//! `contextctl bundle inspect|pack`: offline validation and packing, with
//! the same rules and the same revision the service computes.

use std::fs::File;
use std::io;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use crate::bundle::{self, BundleError, CanonicalOptions, Inspection, Limits, Report};

use super::{OutputFormat, EXIT_FAILURE};

/// `contextctl bundle ...` subcommands.
#[derive(Debug, clap::Subcommand)]
pub enum BundleCommand {
    /// Validate a bundle file (gzip-compressed tar) or a directory and print
    /// its revision, files, dirs, entries and inflated size. Exits 1 if the
    /// service would reject it.
    #[command(after_help = "\
Examples:
  contextctl bundle inspect workload.tar.gz
  contextctl bundle inspect ./my-workload -o json   # rejections too, as {error, message, entry}
  contextctl bundle inspect workload.tar.gz --bundle-digest   # also what the service would store")]
    Inspect {
        /// A `.tar.gz`/`.context` file, or a directory.
        path: PathBuf,
        /// Also make the bundle the service would store for this input and
        /// print its bundleDigest, bundleBytes and bundleEncoding (slower: it
        /// compresses, unless the file already is the canonical bundle).
        #[arg(long)]
        bundle_digest: bool,
        /// gzip level of the canonical bundle (the bundleDigest of a
        /// recompressed bundle depends on it).
        #[arg(long, default_value_t = CanonicalOptions::default().gzip_level, requires = "bundle_digest")]
        gzip_level: u32,
    },
    /// Pack a directory into the canonical bundle.
    #[command(after_help = "\
Examples:
  contextctl bundle pack ./my-workload -f workload.tar.gz
  contextctl bundle pack ./my-workload -f workload.tar.gz -o json   # the report as JSON")]
    Pack {
        /// The directory to pack.
        dir: PathBuf,
        /// Where to write the bundle (written atomically: nothing is left
        /// behind on failure).
        #[arg(short = 'f', long = "file", alias = "out", value_name = "FILE")]
        file: PathBuf,
        /// gzip level of the canonical bundle.
        #[arg(long, default_value_t = CanonicalOptions::default().gzip_level)]
        gzip_level: u32,
    },
}

/// Runs a `bundle` subcommand.
pub fn run(cmd: BundleCommand, output: OutputFormat) -> ExitCode {
    if output == OutputFormat::Name {
        return super::fail(&output.unsupported("bundle"));
    }
    let limits = Limits::default();
    let result = match cmd {
        BundleCommand::Inspect {
            path,
            bundle_digest,
            gzip_level,
        } => inspect(&path, &limits, bundle_digest.then_some(gzip_level)),
        BundleCommand::Pack {
            dir,
            file,
            gzip_level,
        } => pack(&dir, &file, &limits, gzip_level).map(Printed::Report),
    };
    match result {
        Ok(printed) => {
            print_report(&printed, output);
            ExitCode::SUCCESS
        }
        Err(err) => {
            print_error(&err, output);
            ExitCode::from(EXIT_FAILURE)
        }
    }
}

fn options(gzip_level: u32) -> CanonicalOptions {
    CanonicalOptions {
        gzip_level,
        ..CanonicalOptions::default()
    }
}

/// What a `bundle` command prints (as JSON: the one flat object of either).
#[derive(serde::Serialize)]
#[serde(untagged)]
enum Printed {
    /// The inspection with the bundle's digest, size and encoding.
    Report(Report),
    /// The inspection alone (`inspect` without `--bundle-digest`).
    Inspection(Inspection),
}

/// Inspects a bundle file or a directory; with `bundle_level` (from
/// `--bundle-digest`) also makes the bundle the service would store, at
/// that gzip level. Without it a file is only inflated, checked and hashed
/// (a directory is packed either way: its tar is made to be hashed).
fn inspect(
    path: &Path,
    limits: &Limits,
    bundle_level: Option<u32>,
) -> Result<Printed, BundleError> {
    let io_err = |source: io::Error| BundleError::Io {
        source,
        entry: None,
    };
    let opts = options(bundle_level.unwrap_or(CanonicalOptions::default().gzip_level));
    if path.metadata().map_err(io_err)?.is_dir() {
        let report = bundle::pack_dir(path, limits, &opts, io::sink())?;
        return Ok(match bundle_level {
            Some(_) => Printed::Report(report),
            None => Printed::Inspection(report.inspection),
        });
    }
    // No BufReader: the inspector buffers its input itself.
    let file = File::open(path).map_err(io_err)?;
    Ok(match bundle_level {
        Some(_) => Printed::Report(bundle::canonicalize(file, limits, &opts, io::sink())?),
        None => Printed::Inspection(bundle::inspect(file, limits)?),
    })
}

fn pack(dir: &Path, out: &Path, limits: &Limits, gzip_level: u32) -> Result<Report, BundleError> {
    let storage = |source: io::Error| BundleError::Storage { source };
    let parent = match out.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    let tmp = tempfile::NamedTempFile::new_in(parent).map_err(storage)?;
    let report = bundle::pack_dir(
        dir,
        limits,
        &options(gzip_level),
        io::BufWriter::new(tmp.as_file()),
    )?;
    tmp.persist(out).map_err(|e| storage(e.error))?;
    Ok(report)
}

fn print_report(printed: &Printed, output: OutputFormat) {
    match output {
        OutputFormat::Json => match serde_json::to_string(printed) {
            Ok(json) => println!("{json}"),
            Err(e) => eprintln!("contextctl: {e}"),
        },
        OutputFormat::Yaml => {
            if let Err(e) = super::print_doc(printed, output) {
                eprintln!("contextctl: {e}");
            }
        }
        // `run` refuses `name` before doing anything.
        OutputFormat::Text | OutputFormat::Wide | OutputFormat::Name => {
            let (inspection, bundle) = match printed {
                Printed::Report(r) => (&r.inspection, Some(r)),
                Printed::Inspection(i) => (i, None),
            };
            println!("revision       {}", inspection.revision);
            if let Some(r) = bundle {
                println!("bundleDigest   {}", r.bundle_digest);
            }
            println!("files          {}", inspection.files);
            println!("dirs           {}", inspection.dirs);
            println!("entries        {}", inspection.entries);
            println!("inflatedBytes  {}", inspection.inflated_bytes);
            if let Some(r) = bundle {
                println!("bundleBytes    {}", r.bundle_bytes);
                println!("bundleEncoding {}", r.bundle_encoding);
            }
        }
    }
}

fn print_error(err: &BundleError, output: OutputFormat) {
    let doc = serde_json::json!({
        "error": err.code(),
        "message": err.to_string(),
        "entry": err.entry(),
    });
    match output {
        OutputFormat::Json => println!("{doc}"),
        OutputFormat::Yaml => {
            if let Err(e) = super::print_doc(&doc, output) {
                eprintln!("contextctl: {e}");
            }
        }
        OutputFormat::Text | OutputFormat::Wide | OutputFormat::Name => {
            eprintln!("contextctl: {} ({})", err, err.code());
        }
    }
}
