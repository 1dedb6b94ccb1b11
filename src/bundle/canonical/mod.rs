//! The canonical archive and the streaming inspector that produces it:
//! [`canonicalize`] (and [`inspect`], the same run without output) makes
//! one pass from the upload to the canonical bundle, with bounded memory;
//! the `writer` submodule writes the deterministic tar and its gzip.
//!
//! The input chain is `R` → compressed counter → gzip decoder → inflated
//! counter → tar walker, all on the calling thread. Accepted file contents
//! go to an unnamed, LZ4-compressed spool file. While members arrive in canonical order
//! (as `contextctl bundle pack` and `tar --sort=name` write them) the
//! canonical tar is also produced *speculatively* on the fly and handed to
//! a sink thread (hash or gzip), so the two cores overlap inflate and
//! deflate. The first out-of-order member abandons the speculation; the
//! canonical archive is then emitted from the spool in sorted order at the
//! end. Either way the bytes are identical.

pub(crate) mod writer;

use std::fs::File;
use std::io::{self, BufReader, Read, Seek, SeekFrom, Write};
use std::path::Path;
use std::rc::Rc;

use flate2::bufread::GzDecoder;

use writer::{
    gzip, hex, spawn_sink, AppendError, CanonicalTar, Chunked, HashingWriter, Sink, SinkJob,
    TarTap, CHUNK,
};

use super::budget::{Charge, Charged};
use super::context_layout;
use super::error::BundleError;
use super::limits::{CanonicalOptions, Limits};
use super::path::CanonPath;
use super::reader::{
    ensure_no_trailing, trip, CompressedCounter, InflateCounter, MemberKind, TarWalker, Trap,
};
use super::report::{Inspection, Report};
use super::spool::{RangeReader, Spool, SpoolFile};
use super::tree::{FileNode, Node, Tree};

/// Validates a gzip-compressed tar and computes its revision, without
/// writing a canonical gzip (so there is no bundle digest; use
/// [`canonicalize`] for that). File contents are spooled to an unnamed
/// temporary file unless the members arrive in canonical order.
pub fn inspect<R: Read>(input: R, limits: &Limits) -> Result<Inspection, BundleError> {
    Ok(run::<R, io::Sink>(input, limits, None, None, &Charge::default())?.inspection())
}

/// The upload path: validates while streaming and writes the canonical
/// gzip bundle to `out`. On error, `out` may hold a partial bundle; the
/// caller discards it. Temporary files are charged to
/// `opts.temp_budget`; a run it cannot hold fails with
/// [`BundleError::TempSpaceExhausted`].
pub fn canonicalize<R: Read, W: Write>(
    input: R,
    limits: &Limits,
    opts: &CanonicalOptions,
    out: W,
) -> Result<Report, BundleError> {
    let charge = Charge::new(opts.temp_budget.as_ref());
    let outcome = run(
        input,
        limits,
        Some((opts.gzip_level, out)),
        opts.temp_dir.as_deref(),
        &charge,
    )
    // Whatever the refusal surfaced as (a spool write, a stopped sink),
    // the cause is the budget.
    .map_err(|e| match charge.refused() {
        Some(limit) => BundleError::TempSpaceExhausted { limit },
        None => e,
    })?;
    let (digest, bundle_bytes) = outcome.bundle.ok_or_else(|| BundleError::Internal {
        detail: "canonical bundle was not produced".into(),
    })?;
    Ok(Report {
        inspection: outcome.inspection(),
        bundle_digest: hex(&digest),
        bundle_bytes,
    })
}

/// Async face of [`canonicalize`]: reads from an `AsyncRead` on tokio's
/// blocking pool (through `SyncIoBridge`). Must be called inside a tokio
/// runtime.
pub async fn canonicalize_async<R: tokio::io::AsyncRead + Unpin + Send + 'static>(
    input: R,
    limits: Limits,
    opts: CanonicalOptions,
    out: File,
) -> Result<Report, BundleError> {
    let bridge = tokio_util::io::SyncIoBridge::new(input);
    tokio::task::spawn_blocking(move || canonicalize(bridge, &limits, &opts, out))
        .await
        .map_err(|e| BundleError::Internal {
            detail: format!("bundle task failed: {e}"),
        })?
}

pub(crate) fn storage(source: io::Error) -> BundleError {
    BundleError::Storage { source }
}

/// What one run produced.
struct Outcome {
    revision: [u8; 32],
    tar_bytes: u64,
    entries: u64,
    files: u64,
    dirs: u64,
    compressed: u64,
    inflated: u64,
    members: u64,
    bundle: Option<([u8; 32], u64)>,
}

impl Outcome {
    fn inspection(&self) -> Inspection {
        Inspection {
            revision: hex(&self.revision),
            files: self.files,
            dirs: self.dirs,
            entries: self.entries,
            inflated_bytes: self.tar_bytes,
            compressed_bytes: self.compressed,
            input_inflated_bytes: self.inflated,
            input_entries: self.members,
        }
    }
}

/// The speculative canonical stream (see the module docs). Field order
/// matters: `tar` (which holds the channel) drops before `sink` waits for
/// its thread.
struct Speculation {
    tar: CanonicalTar<TarTap<io::Sink>>,
    sink: Sink,
    last: Option<CanonPath>,
}

impl Speculation {
    fn start(
        gzip_level: Option<u32>,
        temp_dir: Option<&Path>,
        charge: &Charge,
    ) -> Result<Self, BundleError> {
        let job = match gzip_level {
            Some(level) => SinkJob {
                hash: false,
                gzip: Some((level, Charged::new(temp_file(temp_dir)?, charge.clone()))),
            },
            None => SinkJob {
                hash: true,
                gzip: None,
            },
        };
        let (chan, sink) = spawn_sink(job).map_err(storage)?;
        // With gzip on the sink thread, hash here to balance the two cores.
        let tap = TarTap::new(gzip_level.is_some(), Some(chan), None);
        Ok(Self {
            tar: CanonicalTar::new(tap),
            sink,
            last: None,
        })
    }

    /// Drops the speculative output; the sink thread winds down.
    fn abandon(self) {
        let Speculation { tar, sink, .. } = self;
        drop(tar);
        drop(sink);
    }
}

fn temp_file(dir: Option<&Path>) -> Result<File, BundleError> {
    match dir {
        Some(d) => tempfile::tempfile_in(d),
        None => tempfile::tempfile(),
    }
    .map_err(storage)
}

/// Copies a member's data into the spool as the canonical writer reads it.
struct Tee<'a, R> {
    data: R,
    spool: &'a mut Spool,
    trap: &'a Trap,
}

impl<R: Read> Read for Tee<'_, R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.data.read(buf)?;
        self.spool
            .append(&buf[..n])
            .map_err(|e| trip(self.trap, storage(e)))?;
        Ok(n)
    }
}

fn check_entries(entries: u64, limits: &Limits, entry: &str) -> Result<(), BundleError> {
    if entries > limits.entries {
        return Err(BundleError::TooManyEntries {
            limit: limits.entries,
            entry: entry.to_owned(),
        });
    }
    Ok(())
}

fn run<R: Read, W: Write>(
    input: R,
    limits: &Limits,
    gz_out: Option<(u32, W)>,
    temp_dir: Option<&Path>,
    charge: &Charge,
) -> Result<Outcome, BundleError> {
    let trap: Trap = Rc::default();
    let compressed = CompressedCounter::new(input, limits.compressed_bytes, trap.clone());
    let decoder = GzDecoder::new(BufReader::with_capacity(CHUNK, compressed));
    let inflated = BufReader::with_capacity(
        CHUNK,
        InflateCounter::new(decoder, limits.inflated_bytes, trap.clone()),
    );
    let mut walker = TarWalker::new(inflated, limits, trap.clone());
    let mut spool = Spool::new(temp_dir, charge.clone()).map_err(storage)?;
    let level = gz_out.as_ref().map(|(level, _)| *level);
    let mut spec = Some(Speculation::start(level, temp_dir, charge)?);
    let mut tree = Tree::default();
    let mut entries = 0u64;
    let mut root_seen = false;
    let mut members = 0u64;
    let mut buf = vec![0u8; CHUNK];

    while let Some(member) = walker.next_member()? {
        members += 1;
        let shown = member
            .path
            .as_ref()
            .map_or_else(|| member.name.clone(), |p| p.as_str().to_owned());
        // The archive root (`./`) is implicit in the canonical tree; it
        // counts once, like every other distinct path.
        let Some(path) = member.path else {
            if !root_seen {
                root_seen = true;
                entries += 1;
                check_entries(entries, limits, &shown)?;
            }
            continue;
        };
        let created = match member.kind {
            MemberKind::Dir => tree.add_dir(path.clone())?,
            MemberKind::File { exec } => tree.add_file(
                path.clone(),
                FileNode {
                    size: member.size,
                    exec,
                    offset: spool.len(),
                },
            )?,
        };
        // Each distinct path counts once: an explicit directory that arrives
        // after the files that implied it creates nothing new.
        entries += created.len() as u64;
        check_entries(entries, limits, &shown)?;

        let out_of_order = match (&spec, created.first()) {
            (Some(s), Some(first)) => s.last.as_ref().is_some_and(|last| first <= last),
            _ => false,
        };
        if out_of_order {
            if let Some(s) = spec.take() {
                s.abandon();
            }
        }
        let Some(s) = spec.as_mut() else {
            if member.kind != MemberKind::Dir {
                copy_to_spool(&mut walker, &mut spool, &mut buf)?;
            }
            continue;
        };
        let dirs = match member.kind {
            MemberKind::Dir => &created[..],
            MemberKind::File { .. } => &created[..created.len().saturating_sub(1)],
        };
        for dir in dirs {
            s.tar.append_dir(dir.as_str()).map_err(storage)?;
        }
        if let MemberKind::File { exec } = member.kind {
            let tee = Tee {
                data: walker.data(),
                spool: &mut spool,
                trap: &trap,
            };
            let res = s.tar.append_file(path.as_str(), member.size, exec, tee);
            match res {
                Ok(()) => {}
                Err(AppendError::Read(e)) => return Err(walker.cause(e)),
                Err(AppendError::Write(e)) => return Err(storage(e)),
            }
        }
        if let Some(last) = created.last() {
            s.last = Some(last.clone());
        }
    }

    // The tar ended cleanly; the gzip member must end here too.
    let counter = walker.into_inner().into_inner();
    let inflated_bytes = counter.count();
    let mut gz_in = counter.into_inner().into_inner();
    ensure_no_trailing(&mut gz_in, &trap)?;
    let compressed_bytes = gz_in.get_ref().count();

    let spool = spool.finish().map_err(storage)?;
    let mut open = |_: &str, f: &FileNode| -> Result<Box<dyn Read + '_>, BundleError> {
        Ok(Box::new(RangeReader::new(&spool, f.offset, f.size)))
    };
    context_layout::verify(&tree, &mut open, &|_, e| storage(e))?;

    let (revision, tar_bytes, canonical_entries, bundle) = match spec {
        Some(s) => finish_speculation(s, gz_out)?,
        None => emit_from_spool(&tree, &spool, gz_out)?,
    };
    Ok(Outcome {
        revision,
        tar_bytes,
        entries: canonical_entries,
        files: tree.files(),
        dirs: tree.dirs(),
        compressed: compressed_bytes,
        inflated: inflated_bytes,
        members,
        bundle,
    })
}

type Emitted = ([u8; 32], u64, u64, Option<([u8; 32], u64)>);

fn copy_to_spool<R: Read>(
    walker: &mut TarWalker<R>,
    spool: &mut Spool,
    buf: &mut [u8],
) -> Result<(), BundleError> {
    loop {
        let n = match walker.data().read(buf) {
            Ok(0) => return Ok(()),
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(walker.cause(e)),
        };
        spool.append(&buf[..n]).map_err(storage)?;
    }
}

fn missing(what: &str) -> BundleError {
    BundleError::Internal {
        detail: format!("{what} was not computed"),
    }
}

/// Completes the speculative stream: the archive is already canonical.
fn finish_speculation<W: Write>(
    s: Speculation,
    gz_out: Option<(u32, W)>,
) -> Result<Emitted, BundleError> {
    let entries = s.tar.entries();
    let tap = s.tar.finish().map_err(storage)?;
    let (here, tar_bytes, _) = tap.finish().map_err(storage)?;
    let output = s.sink.join().map_err(storage)?;
    let revision = here
        .or(output.tar_digest)
        .ok_or_else(|| missing("revision"))?;
    let bundle = match (gz_out, output.gz) {
        (Some((_, mut out)), Some((mut file, digest, bytes))) => {
            file.seek(SeekFrom::Start(0)).map_err(storage)?;
            io::copy(&mut BufReader::with_capacity(CHUNK, file), &mut out).map_err(storage)?;
            out.flush().map_err(storage)?;
            Some((digest, bytes))
        }
        (None, _) => None,
        (Some(_), None) => return Err(missing("canonical gzip")),
    };
    Ok((revision, tar_bytes, entries, bundle))
}

/// Emits the canonical archive from the tree and the spool.
fn emit_from_spool<W: Write>(
    tree: &Tree,
    spool: &SpoolFile,
    gz_out: Option<(u32, W)>,
) -> Result<Emitted, BundleError> {
    let mut open = |_: &str, f: &FileNode| -> Result<Box<dyn Read + '_>, BundleError> {
        Ok(Box::new(RangeReader::new(spool, f.offset, f.size)))
    };
    emit_tree(tree, &mut open, &|_, e| storage(e), gz_out)
}

/// Emits the canonical archive of `tree`, reading file contents through
/// `open`: the tar is hashed on a sink thread while this thread gzips it
/// into `gz_out` (if any).
pub(crate) fn emit_tree<'a, W: Write>(
    tree: &Tree,
    open: &mut context_layout::Opener<'a>,
    read_err: &dyn Fn(&str, io::Error) -> BundleError,
    gz_out: Option<(u32, W)>,
) -> Result<Emitted, BundleError> {
    let (chan, sink) = spawn_sink(SinkJob {
        hash: true,
        gzip: None,
    })
    .map_err(storage)?;
    let local = gz_out.map(|(level, out)| Chunked::new(gzip(HashingWriter::new(out), level)));
    let mut tar = CanonicalTar::new(TarTap::new(false, Some(chan), local));
    for (path, node) in tree.iter() {
        match node {
            Node::Dir { .. } => tar.append_dir(path.as_str()).map_err(storage)?,
            Node::File(f) => {
                let data = open(path.as_str(), f)?;
                tar.append_file(path.as_str(), f.size, f.exec, data)
                    .map_err(|e| match e {
                        AppendError::Read(e) => read_err(path.as_str(), e),
                        AppendError::Write(e) => storage(e),
                    })?;
            }
        }
    }
    let entries = tar.entries();
    let tap = tar.finish().map_err(storage)?;
    let (_, tar_bytes, local) = tap.finish().map_err(storage)?;
    let output = sink.join().map_err(storage)?;
    let revision = output.tar_digest.ok_or_else(|| missing("revision"))?;
    let bundle = match local {
        Some(chunked) => {
            let enc = chunked.finish().map_err(storage)?;
            let (mut out, digest, bytes) = enc.finish().map_err(storage)?.finish();
            out.flush().map_err(storage)?;
            Some((digest, bytes))
        }
        None => None,
    };
    Ok((revision, tar_bytes, entries, bundle))
}
