//! The canonical archive and the streaming inspector that produces it:
//! [`canonicalize`] (and [`inspect`], the same run without output) makes
//! one pass from the upload to the canonical bundle, with bounded memory.
//!
//! The input chain is `R` → compressed counter → gzip decoder → inflated
//! counter → tar walker, on the calling thread but for the decoder, which
//! runs on a helper thread (`inflate`) so that parsing does not wait for
//! it. Accepted file contents go to an unnamed, LZ4-compressed spool file.
//! While members arrive in canonical order (as
//! `contextctl bundle pack` and `tar --sort=name` write them) the
//! canonical tar is also produced *speculatively* on the fly; the first
//! out-of-order member abandons the speculation and the canonical archive
//! is emitted from the spool in sorted order at the end. Either way the
//! bytes are identical.
//!
//! The stored bundle is the upload itself when its inflated stream *is*
//! the canonical tar (what `contextctl` sends; see `compare`), else the
//! canonical gzip (`pgzip`), compressed by one worker per core while the
//! calling thread parses, another thread hashes the revision
//! and another writes the bundle (`engine`, `pipeline`). Large files are
//! compressed as they arrive even when out of order.

mod compare;
mod engine;
mod pgzip;
mod pipeline;
pub(crate) mod writer;

use std::cell::RefCell;
use std::collections::HashSet;
use std::fs::File;
use std::io::{self, Read};
use std::path::Path;
use std::rc::Rc;
use std::thread::Scope;

pub use engine::BundleOut;

use engine::{start_hasher, Dest, Engine, Forward, PieceBuf, Written};
use pipeline::{is_big, Bundle, Pipeline, RawTap, Shared};
use writer::{hex, AppendError, CanonicalTar};

use super::budget::Charge;
use super::context_layout;
use super::counters::{trip, CompressedCounter, InflateCounter, Trap};
use super::error::BundleError;
use super::inflate::ParallelGz;
use super::limits::{CanonicalOptions, Limits};
use super::path::{canonical_cmp, CanonPath};
use super::reader::{MemberKind, TarWalker};
use super::report::{Inspection, Report};
use super::spool::{RangeReader, Spool};
use super::threads::Joined;
use super::tree::{created_by, FileNode, Node, Tree};
use compare::{Comparator, Side};
use pgzip::PIECE;

/// The encoding name of a bundle stored as uploaded.
pub const AS_UPLOADED: &str = "as-uploaded";

/// The encoding name of a canonical gzip written at `level` by this
/// build: the bundleDigest of a recompressed bundle depends on it.
pub fn encoding(level: u32) -> String {
    pgzip::encoding(level)
}

/// Validates a gzip-compressed tar and computes its revision, without
/// writing a bundle (so there is no bundle digest; use [`canonicalize`]
/// for that). File contents are spooled to an unnamed temporary file.
pub fn inspect<R: Read>(input: R, limits: &Limits) -> Result<Inspection, BundleError> {
    Ok(run::<R, io::Sink>(input, limits, None, 0, None, &Charge::default())?.inspection())
}

/// The upload path: validates while streaming and writes the bundle to
/// `out`: the upload's own bytes when they already are the canonical
/// bundle, else the canonical gzip. On error, `out` may hold a partial
/// bundle; the caller discards it. Temporary files are charged to
/// `opts.temp_budget`; a run it cannot hold fails with
/// [`BundleError::TempSpaceExhausted`].
pub fn canonicalize<R: Read, W: BundleOut>(
    input: R,
    limits: &Limits,
    opts: &CanonicalOptions,
    mut out: W,
) -> Result<Report, BundleError> {
    let charge = Charge::new(opts.temp_budget.as_ref());
    let outcome = run(
        input,
        limits,
        Some((opts.gzip_level, &mut out)),
        opts.deflate_threads,
        opts.temp_dir.as_deref(),
        &charge,
    )
    // Whatever the refusal surfaced as (a spool write, a stopped writer),
    // the cause is the budget.
    .map_err(|e| match charge.refused() {
        Some(limit) => BundleError::TempSpaceExhausted { limit },
        None => e,
    })?;
    let inspection = outcome.inspection();
    let (written, encoding) = outcome.bundle.ok_or_else(|| missing("bundle"))?;
    Ok(Report {
        inspection,
        bundle_digest: hex(&written.digest),
        bundle_bytes: written.bytes,
        bundle_encoding: encoding,
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

fn missing(what: &str) -> BundleError {
    BundleError::Internal {
        detail: format!("{what} was not produced"),
    }
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
    bundle: Option<(Written, String)>,
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

/// The speculative canonical stream (see the module docs).
struct Speculation<'scope> {
    /// Holds the hasher's sender: dropped before `hash` is joined.
    tar: CanonicalTar,
    hash: Joined<'scope, [u8; 32]>,
    last: Option<CanonPath>,
}

impl Speculation<'_> {
    /// Drops the speculative stream; returns the large files it packed.
    fn abandon(mut self) -> HashSet<u64> {
        self.tar.pipeline().abandon()
    }
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

/// Refuses a run past the entry limit, naming the walker's current member
/// (its name is made only then).
fn check_entries<R: Read>(
    entries: u64,
    limits: &Limits,
    walker: &TarWalker<R>,
) -> Result<(), BundleError> {
    if entries > limits.entries {
        return Err(BundleError::TooManyEntries {
            limit: limits.entries,
            entry: walker.current_entry().unwrap_or_default(),
        });
    }
    Ok(())
}

fn run<R: Read, W: BundleOut>(
    input: R,
    limits: &Limits,
    out: Option<(u32, &mut W)>,
    threads: usize,
    temp_dir: Option<&Path>,
    charge: &Charge,
) -> Result<Outcome, BundleError> {
    let level = out.as_ref().map_or(0, |(level, _)| *level);
    std::thread::scope(|s| {
        let engine = match out {
            Some((level, out)) => Some(
                Engine::start(s, out, level, threads, temp_dir, charge.clone()).map_err(storage)?,
            ),
            None => None,
        };
        // The dispatcher is declared last so that it drops first (the
        // engine's threads end only once it is closed).
        let (engine, dispatch) = match engine {
            Some((d, e)) => (Some(e), Some(Shared::new(d))),
            None => (None, None),
        };
        let result = walk(s, input, limits, dispatch.as_ref(), temp_dir, charge);
        // Closing the dispatcher lets the workers and the writer finish.
        if let Some(d) = &dispatch {
            d.close();
        }
        let written = engine.map(Engine::join);
        let (mut outcome, kind) = result?;
        outcome.bundle = match (written, kind) {
            (Some(w), Bundle::AsUploaded) => Some((w.map_err(storage)?, AS_UPLOADED.to_owned())),
            (Some(w), Bundle::Recompressed) => Some((w.map_err(storage)?, encoding(level))),
            (None, _) => None,
            (Some(_), _) => return Err(missing("bundle")),
        };
        Ok(outcome)
    })
}

/// The input side of [`run`]: walks the upload, spools contents, speculates,
/// and emits the canonical archive.
fn walk<'scope, R: Read>(
    s: &'scope Scope<'scope, '_>,
    input: R,
    limits: &Limits,
    dispatch: Option<&Shared>,
    temp_dir: Option<&Path>,
    charge: &Charge,
) -> Result<(Outcome, Bundle), BundleError> {
    let trap: Trap = Rc::default();
    let compare = dispatch.map(|_| Rc::new(RefCell::new(Comparator::default())));
    let raw = dispatch.map(|d| Rc::new(RefCell::new(RawTap::new(d.clone()))));
    let mut compressed = CompressedCounter::new(input, limits.compressed_bytes, trap.clone());
    if let Some(raw) = &raw {
        let raw = raw.clone();
        compressed = compressed.with_tap(Box::new(move |b| raw.borrow_mut().feed(b)));
    }
    let decoder = ParallelGz::start(s, compressed).map_err(storage)?;
    let inflater = decoder.helper();
    let mut counter = InflateCounter::new(decoder, limits.inflated_bytes, trap.clone());
    if let Some(c) = &compare {
        let c = c.clone();
        counter = counter.with_tap(Box::new(move |b| {
            c.borrow_mut().feed(Side::Input, b);
            Ok(())
        }));
    }
    // No buffer between: the helper's chunks already are one.
    let mut walker = TarWalker::new(counter, limits, trap.clone());
    let mut spool = Spool::new(temp_dir, charge.clone()).map_err(storage)?;

    let (tx, hash) = start_hasher(s).map_err(storage)?;
    let pipeline = match (dispatch, &compare, &raw) {
        (Some(d), Some(c), Some(r)) => Pipeline::matching(tx, d.clone(), c.clone(), r.clone()),
        _ => Pipeline::hash_only(tx),
    };
    let mut spec = Some(Speculation {
        tar: CanonicalTar::new(pipeline),
        hash,
        last: None,
    });
    // Large files whose compressed pieces are in the packed spool.
    let mut packed: HashSet<u64> = HashSet::new();
    let mut tree = Tree::default();
    let mut entries = 0u64;
    let mut root_seen = false;
    let mut members = 0u64;

    while let Some(member) = walker.next_member()? {
        members += 1;
        // The archive root (`./`) is implicit in the canonical tree; it
        // counts once, like every other distinct path.
        let Some(path) = member.path else {
            if !root_seen {
                root_seen = true;
                entries += 1;
                check_entries(entries, limits, &walker)?;
            }
            continue;
        };
        let key = spool.len();
        // The tree takes the path; speculation still needs it afterwards.
        let kept = spec.is_some().then(|| path.clone());
        let created = match member.kind {
            MemberKind::Dir => tree.add_dir(path)?,
            MemberKind::File { exec } => tree.add_file(
                path,
                FileNode {
                    size: member.size,
                    exec,
                    offset: key,
                },
            )?,
        };
        // Each distinct path counts once: an explicit directory that arrives
        // after the files that implied it creates nothing new.
        entries += created as u64;
        check_entries(entries, limits, &walker)?;

        let last = spec.as_ref().and_then(|s| s.last.as_ref());
        let out_of_order = last.zip(kept.as_ref()).is_some_and(|(last, path)| {
            created_by(path, created)
                .next()
                .is_some_and(|first| canonical_cmp(first, last.as_str()).is_le())
        });
        if out_of_order {
            if let Some(s) = spec.take() {
                packed.extend(s.abandon());
            }
            // Without a bundle to compress, the rest of the walk is this
            // thread and the inflate helper alone: keep them apart.
            if dispatch.is_none() {
                inflater.keep_off_my_cpu();
            }
        }
        let (Some(s), Some(path)) = (spec.as_mut(), kept) else {
            match (member.kind, dispatch) {
                (MemberKind::File { .. }, Some(d)) if is_big(member.size) => {
                    pack_member(&mut walker, &mut spool, d, key, member.size)?;
                    packed.insert(key);
                }
                (MemberKind::File { .. }, _) => copy_to_spool(&mut walker, &mut spool)?,
                (MemberKind::Dir, _) => {}
            }
            continue;
        };
        // The new nodes in canonical order; a new file is the last one.
        let dirs = match member.kind {
            MemberKind::Dir => created,
            MemberKind::File { .. } => created.saturating_sub(1),
        };
        for dir in created_by(&path, created).take(dirs) {
            s.tar.append_dir(dir).map_err(storage)?;
        }
        if let MemberKind::File { exec } = member.kind {
            let tee = Tee {
                data: walker.data(),
                spool: &mut spool,
                trap: &trap,
            };
            let res = s
                .tar
                .append_file(path.as_str(), member.size, exec, tee, key, false);
            match res {
                Ok(()) => {}
                Err(AppendError::Read(e)) => return Err(walker.cause(e)),
                Err(AppendError::Write(e)) => return Err(storage(e)),
            }
        }
        if created > 0 {
            s.last = Some(path);
        }
        // The upload differed from the canonical tar too late to compress
        // from the start: emit from the spool instead.
        if s.tar.pipeline().lost() {
            if let Some(s) = spec.take() {
                packed.extend(s.abandon());
            }
        }
    }

    // The tar ended cleanly; the gzip member must end here too.
    let counter = walker.into_inner();
    let inflated_bytes = counter.count();
    let compressed_bytes = counter.into_inner().finish(&trap)?.count();

    let spool = spool.finish().map_err(storage)?;
    let mut open = |_: &str, f: &FileNode| -> Result<Box<dyn Read + '_>, BundleError> {
        Ok(Box::new(RangeReader::new(&spool, f.offset, f.size)))
    };
    context_layout::verify(&tree, &mut open, &|_, e| storage(e))?;

    let speculated = match spec {
        Some(s) => finish_speculation(s)?,
        None => None,
    };
    let (files, dirs) = (tree.files(), tree.dirs());
    let emitted = match speculated {
        Some(e) => e,
        None => {
            // A bundle speculation gave up may have packed more files.
            emit_tree(s, tree, &mut open, &|_, e| storage(e), dispatch, &packed)?
        }
    };
    drop(raw);
    Ok((
        Outcome {
            revision: emitted.revision,
            tar_bytes: emitted.tar_bytes,
            entries: emitted.entries,
            files,
            dirs,
            compressed: compressed_bytes,
            inflated: inflated_bytes,
            members,
            bundle: None,
        },
        emitted.bundle,
    ))
}

/// What emitting one canonical tar produced.
pub(crate) struct Emitted {
    pub revision: [u8; 32],
    pub tar_bytes: u64,
    pub entries: u64,
    pub bundle: Bundle,
}

fn copy_to_spool<R: Read>(walker: &mut TarWalker<R>, spool: &mut Spool) -> Result<(), BundleError> {
    loop {
        // Straight into the spool's block: no copy in between.
        let n = match walker.data().read(spool.spare()) {
            Ok(0) => return Ok(()),
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(walker.cause(e)),
        };
        spool.commit(n).map_err(storage)?;
    }
}

/// Spools a large file's data and compresses it at once into the packed
/// spool, in the same pieces the canonical stream would cut.
fn pack_member<R: Read>(
    walker: &mut TarWalker<R>,
    spool: &mut Spool,
    dispatch: &Shared,
    key: u64,
    size: u64,
) -> Result<(), BundleError> {
    let mut prev = None;
    let mut left = size;
    while left > 0 {
        let want = usize::try_from(left).unwrap_or(usize::MAX).min(PIECE);
        let mut piece = PieceBuf::empty();
        let read = walker.data().take(want as u64).read_to_end(&mut piece);
        match read {
            Ok(n) if n == want => {}
            Ok(_) => return Err(BundleError::TruncatedTar { entry: None }),
            Err(e) => return Err(walker.cause(e)),
        }
        spool.append(&piece).map_err(storage)?;
        let piece = PieceBuf::share(piece);
        dispatch
            .with(|d| d.piece(piece.clone(), prev.take(), Dest::Pack(key)))
            .map_err(storage)?;
        prev = Some(piece);
        left -= want as u64;
    }
    Ok(())
}

/// Completes the speculative stream: the archive is already canonical.
/// `None` when its bundle was lost (emit again from the spool).
fn finish_speculation(s: Speculation<'_>) -> Result<Option<Emitted>, BundleError> {
    let Speculation { tar, hash, .. } = s;
    let entries = tar.entries();
    let mut pipeline = tar.finish().map_err(storage)?;
    let tar_bytes = pipeline.bytes();
    let bundle = pipeline.finish().map_err(storage)?;
    let revision = hash.join().ok_or_else(|| missing("revision"))?;
    if bundle == Bundle::Lost {
        return Ok(None);
    }
    Ok(Some(Emitted {
        revision,
        tar_bytes,
        entries,
        bundle,
    }))
}

/// Emits the canonical archive of `tree`, reading file contents through
/// `open`: hashed on one thread, compressed into a new bundle through
/// `dispatch` (if any). Large files in `packed` are copied, already
/// compressed, from the packed spool. The tree is freed as it is emitted.
pub(crate) fn emit_tree<'a, 'scope>(
    s: &'scope Scope<'scope, '_>,
    tree: Tree,
    open: &mut context_layout::Opener<'a>,
    read_err: &dyn Fn(&str, io::Error) -> BundleError,
    dispatch: Option<&Shared>,
    packed: &HashSet<u64>,
) -> Result<Emitted, BundleError> {
    let (tx, hash) = start_hasher(s).map_err(storage)?;
    let pipeline = match dispatch {
        Some(d) => Pipeline::deflating(tx, d.clone()).map_err(storage)?,
        None => Pipeline::hash_only(tx),
    };
    let mut tar = CanonicalTar::new(pipeline);
    for (path, node) in tree.into_nodes() {
        match node {
            Node::Dir { .. } => tar.append_dir(path.as_str()).map_err(storage)?,
            Node::File(f) => {
                let data = open(path.as_str(), &f)?;
                let prepacked = packed.contains(&f.offset) && is_big(f.size);
                tar.append_file(path.as_str(), f.size, f.exec, data, f.offset, prepacked)
                    .map_err(|e| match e {
                        AppendError::Read(e) => read_err(path.as_str(), e),
                        AppendError::Write(e) => storage(e),
                    })?;
            }
        }
    }
    let entries = tar.entries();
    let mut pipeline = tar.finish().map_err(storage)?;
    let tar_bytes = pipeline.bytes();
    let bundle = pipeline.finish().map_err(storage)?;
    drop(pipeline);
    let revision = hash.join().ok_or_else(|| missing("revision"))?;
    Ok(Emitted {
        revision,
        tar_bytes,
        entries,
        bundle,
    })
}

/// Emits `tree` as a canonical bundle at `level` with `threads` deflate
/// workers into `out`, in order (the directory packer).
pub(crate) fn pack_tree<'a, W: io::Write + Send>(
    tree: Tree,
    open: &mut context_layout::Opener<'a>,
    read_err: &dyn Fn(&str, io::Error) -> BundleError,
    level: u32,
    threads: usize,
    out: W,
) -> Result<(Emitted, Written), BundleError> {
    let mut out = Forward::new(out);
    std::thread::scope(|s| {
        // The packer spools nothing (emit_tree packs no file ahead).
        let (d, engine) =
            Engine::start(s, &mut out, level, threads, None, Charge::default()).map_err(storage)?;
        let dispatch = Shared::new(d);
        let emitted = emit_tree(s, tree, open, read_err, Some(&dispatch), &HashSet::new());
        dispatch.close();
        let written = engine.join();
        let emitted = emitted?;
        Ok((emitted, written.map_err(storage)?))
    })
}
