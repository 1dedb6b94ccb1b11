//! The one pass over the bundle bytes: a reader thread takes exactly
//! `size` bytes from stdin (never waiting for EOF: some exec transports
//! never close it) and hashes them; the main thread inflates them (at most
//! `inflated + 1` bytes, so an overrun is visible), hashes the tar and
//! extracts it into the staging tree with final modes, as the bytes arrive.
//!
//! Extraction runs on bytes whose digests are not known yet, so it trusts
//! nothing (see [`crate::tar`]); a failure stops the writing but not the
//! receiving and hashing, so the verdicts come in the script's order: a
//! short transfer, then the bundle digest, then the size, then the
//! revision, and only then what went wrong in the tree.

use std::collections::HashSet;
use std::fs::{self, OpenOptions};
use std::io::{self, Read, Write};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::thread;

use sha2::{Digest, Sha256};

use crate::args::Request;
use crate::fail::{io_failure, Fail};
use crate::scan::hex;
use crate::tar::{Member, TarError, TarReader};

/// Size of the pieces handed from the reader thread.
const CHUNK: usize = 1 << 20;

/// Pieces in flight between the threads.
const QUEUE: usize = 8;

/// What the receiving thread saw.
struct Received {
    bytes: u64,
    sha: String,
    error: Option<io::Error>,
}

/// Reads up to `size` bytes of stdin in pieces, hashing them, and sends
/// them on while someone listens.
fn receive(size: u64, tx: mpsc::SyncSender<Vec<u8>>) -> Received {
    let mut stdin = io::stdin().lock();
    let mut h = Sha256::new();
    let mut got = 0u64;
    let mut listening = true;
    let mut error = None;
    let mut scratch = vec![0u8; CHUNK];
    while got < size {
        let want = (size - got).min(CHUNK as u64) as usize;
        let n = match stdin.read(&mut scratch[..want]) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => {
                error = Some(e);
                break;
            }
        };
        let piece = &scratch[..n];
        h.update(piece);
        got += n as u64;
        if listening && tx.send(piece.to_vec()).is_err() {
            // The inflater stopped (bad bytes, the cap): keep receiving,
            // so every byte is still hashed and the digest has the say.
            listening = false;
        }
    }
    Received {
        bytes: got,
        sha: hex(&h.finalize()),
        error,
    }
}

/// The receiving end as a `Read`.
struct Pieces {
    rx: mpsc::Receiver<Vec<u8>>,
    cur: Vec<u8>,
    at: usize,
}

impl Read for Pieces {
    fn read(&mut self, out: &mut [u8]) -> io::Result<usize> {
        while self.at == self.cur.len() {
            match self.rx.recv() {
                Ok(v) => {
                    self.cur = v;
                    self.at = 0;
                }
                Err(_) => return Ok(0),
            }
        }
        let n = out.len().min(self.cur.len() - self.at);
        out[..n].copy_from_slice(&self.cur[self.at..self.at + n]);
        self.at += n;
        Ok(n)
    }
}

/// What the inflating thread saw: the tar's size (at most the cap) and
/// its sha256.
struct Inflated {
    bytes: u64,
    sha: String,
}

/// Inflates `pieces` (at most `cap` bytes), hashing the tar, and sends it
/// on in pieces while someone listens; stops at the end of the gzip
/// stream, at the cap, or at bytes that are not gzip. Dropping `pieces`
/// at the end lets the receiving thread drain what is left.
fn inflate(pieces: Pieces, cap: u64, tx: mpsc::SyncSender<Vec<u8>>) -> Inflated {
    let mut tar = flate2::read::MultiGzDecoder::new(pieces).take(cap);
    let mut sha = Sha256::new();
    let mut bytes = 0u64;
    let mut listening = true;
    let mut scratch = vec![0u8; CHUNK];
    loop {
        // What one read gives, sent at once: the extraction follows the
        // bytes as they arrive.
        let n = match tar.read(&mut scratch) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => {
                // The digests decide what was wrong; this is a log.
                eprintln!("context delivery: inflating: {e}");
                break;
            }
        };
        let piece = &scratch[..n];
        sha.update(piece);
        bytes += n as u64;
        if listening && tx.send(piece.to_vec()).is_err() {
            // The extraction stopped: keep inflating, so an overrun or
            // trailing bytes still change the digest.
            listening = false;
        }
    }
    Inflated {
        bytes,
        sha: hex(&sha.finalize()),
    }
}

/// What the extraction did.
enum Extract {
    /// Every member written; the count of entries.
    Done(u64),
    /// Stopped with this failure (reported after the digests).
    Failed(Fail),
}

/// Receives, verifies and extracts the bundle into `tree` (which exists,
/// empty). Returns the directories made (to make read-only later) when
/// every check passed.
pub(crate) fn receive_and_extract(req: &Request, tree: &Path) -> Result<Vec<PathBuf>, Fail> {
    // Three stages on their own threads: receive and hash the bundle;
    // inflate and hash the tar; extract (here).
    let (tx, rx) = mpsc::sync_channel::<Vec<u8>>(QUEUE);
    let size = req.size;
    let reader = thread::spawn(move || receive(size, tx));
    let bundle = Pieces {
        rx,
        cur: Vec::new(),
        at: 0,
    };
    let (tar_tx, tar_rx) = mpsc::sync_channel::<Vec<u8>>(QUEUE);
    let cap = req.inflated + 1;
    let inflater = thread::spawn(move || inflate(bundle, cap, tar_tx));
    let tar_pieces = Pieces {
        rx: tar_rx,
        cur: Vec::new(),
        at: 0,
    };
    let mut tar = TarReader::new(io::BufReader::with_capacity(CHUNK, tar_pieces));
    let mut dirs = Vec::new();
    let outcome = extract(&mut tar, req, tree, &mut dirs);
    // Stop listening: the inflater hashes the rest on its own.
    drop(tar);
    let lost = || Fail::new("write_failed", "receiving the bundle failed");
    let inflated = inflater.join().map_err(|_| lost())?;
    let (tar_bytes, tar_sha) = (inflated.bytes, inflated.sha);
    let received = reader.join().map_err(|_| lost())?;
    if let Some(e) = &received.error {
        return Err(io_failure(e, "receiving the bundle", None));
    }
    if received.bytes != req.size {
        return Err(Fail::new(
            "short_transfer",
            format!("received {} of {} bundle bytes", received.bytes, req.size),
        ));
    }
    if received.sha != req.digest {
        return Err(Fail::new(
            "digest_mismatch",
            "sha256 of the received bytes is not the bundle digest",
        ));
    }
    if tar_bytes > req.inflated {
        return Err(Fail::new(
            "too_large",
            format!(
                "the bundle inflates to more than the recorded {} bytes",
                req.inflated
            ),
        ));
    }
    if tar_sha != req.revision {
        return Err(Fail::new(
            "revision_mismatch",
            "sha256 of the inflated bundle is not the revision",
        ));
    }
    match outcome {
        Extract::Done(n) if n < req.entries => Err(Fail::new(
            "extract_failed",
            format!("extracted {n} of {} entries", req.entries),
        )),
        Extract::Done(_) => Ok(dirs),
        Extract::Failed(f) => Err(f),
    }
}

/// Extracts every member; after the first failure only counts (entries
/// past the recorded number) or stops.
fn extract<R: Read>(
    tar: &mut TarReader<R>,
    req: &Request,
    tree: &Path,
    dirs: &mut Vec<PathBuf>,
) -> Extract {
    let mut seen: HashSet<String> = HashSet::new();
    let mut count = 0u64;
    let mut failed: Option<Fail> = None;
    let mut buf = vec![0u8; 256 * 1024];
    let free = || crate::fsops::free_bytes(tree);
    loop {
        let member = match tar.next() {
            Ok(Some(m)) => m,
            Ok(None) => break,
            Err(TarError::Io(e)) => {
                eprintln!("context delivery: reading the archive: {e}");
                return Extract::Failed(failed.unwrap_or_else(|| {
                    Fail::new(
                        "extract_failed",
                        "the archive ends early or cannot be inflated",
                    )
                }));
            }
            Err(TarError::NotCanonical(why)) => {
                return Extract::Failed(failed.unwrap_or_else(|| {
                    Fail::new(
                        "extract_failed",
                        format!("the bundle is not canonical: {why}"),
                    )
                }));
            }
        };
        count += 1;
        if count > req.entries && failed.is_none() {
            failed = Some(Fail::new("too_many_entries", String::new()));
        }
        let path = match &member {
            Member::Dir(p) | Member::File { path: p, .. } => p.clone(),
        };
        if failed.is_none() {
            let parent_ok = match path.rsplit_once('/') {
                Some((parent, _)) => seen.contains(parent),
                None => true,
            };
            if !parent_ok || seen.contains(&path) {
                failed = Some(Fail::new(
                    "extract_failed",
                    format!("the bundle is not canonical: {path:?} is repeated or comes before its directory"),
                ));
            }
        }
        let target = tree.join(&path);
        match member {
            Member::Dir(_) => {
                if failed.is_none() {
                    match fs::DirBuilder::new().mode(0o755).create(&target) {
                        Ok(()) => dirs.push(target),
                        Err(e) => failed = Some(io_failure(&e, "extracting the bundle", free())),
                    }
                    seen.insert(path);
                }
            }
            Member::File { mode, size, .. } => {
                let mut file = None;
                if failed.is_none() {
                    // Final modes at once: read-only, executable kept.
                    match OpenOptions::new()
                        .write(true)
                        .create_new(true)
                        .mode(mode & 0o555)
                        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
                        .open(&target)
                    {
                        Ok(f) => file = Some(f),
                        Err(e) => failed = Some(io_failure(&e, "extracting the bundle", free())),
                    }
                    seen.insert(path);
                }
                let written = tar.data(size, &mut buf, |piece| match file.as_mut() {
                    Some(f) => f.write_all(piece),
                    None => Ok(()),
                });
                match written {
                    Ok(None) => {}
                    Ok(Some(e)) => {
                        if failed.is_none() {
                            failed = Some(io_failure(&e, "extracting the bundle", free()));
                        }
                        file = None;
                    }
                    Err(_) => {
                        return Extract::Failed(failed.unwrap_or_else(|| {
                            Fail::new(
                                "extract_failed",
                                "the archive ends early or cannot be inflated",
                            )
                        }))
                    }
                }
                drop(file);
            }
        }
    }
    match failed {
        Some(f) if f.code == "too_many_entries" => Extract::Failed(Fail::new(
            "too_many_entries",
            format!(
                "the bundle has {count} entries, more than the recorded {}",
                req.entries
            ),
        )),
        Some(f) => Extract::Failed(f),
        None => Extract::Done(count),
    }
}
