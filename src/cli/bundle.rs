//! `contextctl bundle inspect|pack`: offline validation and packing, with
//! the same rules and the same revision the service computes.

use std::fs::File;
use std::io;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use crate::bundle::{self, BundleError, CanonicalOptions, Limits, Report};

use super::{OutputFormat, EXIT_FAILURE};

/// `contextctl bundle ...` subcommands.
#[derive(Debug, clap::Subcommand)]
pub enum BundleCommand {
    /// Validate a bundle file (gzip-compressed tar) or a directory and print
    /// its revision and bundle digest. Exits 1 if the service would reject it.
    #[command(after_help = "\
Examples:
  contextctl bundle inspect workload.tar.gz
  contextctl bundle inspect ./my-workload -o json   # rejections too, as {error, message, entry}")]
    Inspect {
        /// A `.tar.gz`/`.context` file, or a directory.
        path: PathBuf,
        /// gzip level of the canonical bundle (the bundleDigest depends on it).
        #[arg(long, default_value_t = CanonicalOptions::default().gzip_level)]
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
        BundleCommand::Inspect { path, gzip_level } => inspect(&path, &limits, gzip_level),
        BundleCommand::Pack {
            dir,
            file,
            gzip_level,
        } => pack(&dir, &file, &limits, gzip_level),
    };
    match result {
        Ok(report) => {
            print_report(&report, output);
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

fn inspect(path: &Path, limits: &Limits, gzip_level: u32) -> Result<Report, BundleError> {
    let io_err = |source: io::Error| BundleError::Io {
        source,
        entry: None,
    };
    let opts = options(gzip_level);
    if path.metadata().map_err(io_err)?.is_dir() {
        return bundle::pack_dir(path, limits, &opts, io::sink());
    }
    let file = File::open(path).map_err(io_err)?;
    // No BufReader: the inspector buffers its input itself.
    bundle::canonicalize(file, limits, &opts, io::sink())
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

fn print_report(report: &Report, output: OutputFormat) {
    match output {
        OutputFormat::Json => match serde_json::to_string(report) {
            Ok(json) => println!("{json}"),
            Err(e) => eprintln!("contextctl: {e}"),
        },
        OutputFormat::Yaml => {
            if let Err(e) = super::print_doc(report, output) {
                eprintln!("contextctl: {e}");
            }
        }
        // `run` refuses `name` before doing anything.
        OutputFormat::Text | OutputFormat::Wide | OutputFormat::Name => {
            println!("revision       {}", report.revision);
            println!("bundleDigest   {}", report.bundle_digest);
            println!("files          {}", report.files);
            println!("dirs           {}", report.dirs);
            println!("entries        {}", report.entries);
            println!("inflatedBytes  {}", report.inflated_bytes);
            println!("bundleBytes    {}", report.bundle_bytes);
            println!("bundleEncoding {}", report.bundle_encoding);
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
