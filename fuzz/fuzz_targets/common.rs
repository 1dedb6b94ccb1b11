//! Invariants shared by the fuzz targets.

use context_service::bundle::{self, CanonicalOptions, Limits};

/// Small limits so a run spends its time on parsing, not on inflating.
pub fn limits() -> Limits {
    Limits {
        compressed_bytes: 1 << 20,
        inflated_bytes: 8 << 20,
        entries: 500,
        file_bytes: 4 << 20,
        path_bytes: 512,
        depth: 16,
    }
}

/// Runs both faces on `input` and checks the invariants: no panic; inspect
/// and canonicalize agree; an accepted bundle's canonical form is accepted
/// again as a fixed point (same revision, same bytes); the canonical tar
/// lists exactly `entries` members with tar-rs; limits hold.
pub fn check(input: &[u8]) {
    let limits = limits();
    let opts = CanonicalOptions::default();
    let inspected = bundle::inspect(input, &limits);
    let mut out = Vec::new();
    let report = bundle::canonicalize(input, &limits, &opts, &mut out);
    let report = match (inspected, report) {
        (Ok(i), Ok(r)) => {
            assert_eq!(i, r.inspection());
            r
        }
        (Err(a), Err(b)) => {
            assert_eq!(a.code(), b.code());
            assert_eq!(a.entry(), b.entry());
            assert!(a.is_rejection(), "not a rejection: {a}");
            return;
        }
        (a, b) => panic!("faces disagree: {a:?} / {b:?}"),
    };
    assert!(report.input_inflated_bytes <= limits.inflated_bytes);
    assert!(report.input_entries <= limits.entries);
    assert_eq!(report.bundle_bytes, out.len() as u64);

    let mut again = Vec::new();
    let second = bundle::canonicalize(&out[..], &limits, &opts, &mut again)
        .unwrap_or_else(|e| panic!("canonical bundle rejected: {e}"));
    assert_eq!(second.revision, report.revision);
    assert_eq!(again, out, "canonical bundle is not a fixed point");

    let mut tar = Vec::new();
    std::io::Read::read_to_end(&mut flate2::read::GzDecoder::new(&out[..]), &mut tar).unwrap();
    let mut archive = tar::Archive::new(&tar[..]);
    let mut n = 0u64;
    for entry in archive.entries().unwrap() {
        let entry = entry.unwrap();
        let ty = entry.header().entry_type();
        assert!(ty.is_file() || ty.is_dir());
        n += 1;
    }
    assert_eq!(n, report.entries);
}
