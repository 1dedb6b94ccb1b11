//! Regression (found by fuzzing with LeakSanitizer): a rejected bundle
//! used to leave a worker thread running detached after the call returned.
//! Every thread of the bundle engine (`bundle-deflate`, `bundle-writer`,
//! `bundle-hash`) must be joined before `canonicalize` returns. Alone in its
//! test binary so no other test's threads are counted.

mod common;

use common::{gz, TarBuf};
use context_service::bundle::{self, CanonicalOptions, Limits};

fn engine_threads() -> usize {
    std::fs::read_dir("/proc/self/task")
        .unwrap()
        .filter_map(|t| std::fs::read_to_string(t.unwrap().path().join("comm")).ok())
        .filter(|name| name.trim().starts_with("bundle-"))
        .count()
}

#[test]
fn no_worker_thread_outlives_a_call() {
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
