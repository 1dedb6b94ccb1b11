//! The bundle engine's threads, counted in `/proc/self/task`. Alone in its
//! test binary so no other test's threads are counted (and its tests take
//! turns).
//!
//! Regression (found by fuzzing with LeakSanitizer): a rejected bundle
//! used to leave a worker thread running detached after the call returned.
//! Every thread of the bundle engine (`bundle-deflate`, `bundle-writer`,
//! `bundle-hash`) must be joined before `canonicalize` returns.

mod common;

use common::{gz, TarBuf};
use std::io::{self, Write};
use std::sync::Mutex;

use context_service::bundle::{self, BundleOut, CanonicalOptions, Limits};

/// Held by each test: they count the whole process's threads.
static ALONE: Mutex<()> = Mutex::new(());

fn threads_named(prefix: &str) -> usize {
    std::fs::read_dir("/proc/self/task")
        .unwrap()
        .filter_map(|t| std::fs::read_to_string(t.unwrap().path().join("comm")).ok())
        .filter(|name| name.trim().starts_with(prefix))
        .count()
}

/// The engine's threads once joined ones have left `/proc/self/task`.
///
/// `join` returns when the kernel clears the thread's tid, a moment before
/// the exiting task leaves the thread group's list: a joined thread can
/// still be counted for microseconds. A thread left running (the
/// regression) is still there after the 200 ms this allows.
fn engine_threads() -> usize {
    let deadline = std::time::Instant::now() + std::time::Duration::from_millis(200);
    loop {
        let n = threads_named("bundle-");
        if n == 0 || std::time::Instant::now() >= deadline {
            return n;
        }
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
}

/// Records the most deflate workers alive while the bundle is written.
#[derive(Default)]
struct Sampling {
    most_deflaters: usize,
}

impl Write for Sampling {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.most_deflaters = self.most_deflaters.max(threads_named("bundle-deflate"));
        Ok(buf.len())
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl BundleOut for Sampling {
    fn restart(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// `deflate_threads` (`--bundle-threads`) is how many deflate workers run:
/// 1 to 4 as asked, more clamped to 4, `0` one per core (at most 4); the
/// bundle's bytes are the same with any of them.
#[test]
fn deflate_workers_follow_the_option() {
    let _alone = ALONE
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    // Level-6 gzip: not the canonical level 1, so the engine deflates.
    let input = gz(&TarBuf::new()
        .file("a", &[1u8; 600_000])
        .file("b", &[2u8; 600_000])
        .finish());
    let cores = std::thread::available_parallelism().map_or(2, std::num::NonZero::get);
    let mut digests = Vec::new();
    for (asked, expected) in [(1, 1), (2, 2), (3, 3), (4, 4), (9, 4), (0, cores.min(4))] {
        let opts = CanonicalOptions {
            deflate_threads: asked,
            ..CanonicalOptions::default()
        };
        // The previous call's workers gone, so only this call's are sampled.
        assert_eq!(engine_threads(), 0);
        let mut out = Sampling::default();
        let report = bundle::canonicalize(&input[..], &Limits::default(), &opts, &mut out)
            .expect("a valid bundle");
        assert_eq!(out.most_deflaters, expected, "deflate_threads {asked}");
        digests.push(report.bundle_digest);
    }
    digests.dedup();
    assert_eq!(digests.len(), 1, "{digests:?}");
}

#[test]
fn no_worker_thread_outlives_a_call() {
    let _alone = ALONE
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    // The fuzz artifact: a gzip header with a truncated FEXTRA field.
    let artifact: &[u8] = &[
        0x1f, 0x8b, 0x08, 0x14, 0x02, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x20, 0xff,
        0xf1, 0xff, 0xff, 0xff, 0x00,
    ];
    // Rejected mid-stream while the engine is busy.
    let midway = gz(&TarBuf::new()
        .file("a", &[1u8; 300_000])
        .file("b", &[2u8; 300_000])
        .file("/abs", b"x")
        .finish());
    // Out of order (speculation abandoned), then accepted.
    let unsorted = gz(&TarBuf::new().file("b", b"1").file("a", b"2").finish());
    for input in [artifact, &midway[..], &unsorted[..]] {
        let _ = bundle::canonicalize(
            input,
            &Limits::default(),
            &CanonicalOptions::default(),
            std::io::sink(),
        );
        assert_eq!(engine_threads(), 0);
        let _ = bundle::inspect(input, &Limits::default());
        assert_eq!(engine_threads(), 0);
    }
}
