//! A ~1,030:1 gzip bomb stops at the inflated limit, and memory stays flat
//! while ~1.3 GiB inflates: a counting global allocator in this test
//! binary (which holds only this test) records the peak heap.

mod common;

use std::alloc::{GlobalAlloc, Layout, System};
use std::io::{self, Write};
use std::sync::atomic::{AtomicUsize, Ordering};

use common::raw_header;
use context_service::bundle::{self, CanonicalOptions, Limits};
use flate2::write::GzEncoder;
use flate2::Compression;

struct Counting;

static CURRENT: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);

fn record_alloc(size: usize) {
    let now = CURRENT.fetch_add(size, Ordering::Relaxed) + size;
    PEAK.fetch_max(now, Ordering::Relaxed);
}

// SAFETY: delegates every call to the system allocator unchanged; only
// counts sizes on the side.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let p = unsafe { System.alloc(layout) };
        if !p.is_null() {
            record_alloc(layout.size());
        }
        p
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        unsafe { System.dealloc(ptr, layout) };
        CURRENT.fetch_sub(layout.size(), Ordering::Relaxed);
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let p = unsafe { System.realloc(ptr, layout, new_size) };
        if !p.is_null() {
            CURRENT.fetch_sub(layout.size(), Ordering::Relaxed);
            record_alloc(new_size);
        }
        p
    }
}

#[global_allocator]
static ALLOC: Counting = Counting;

const MIB: usize = 1024 * 1024;

/// Five 250 MiB files of zeros, the end-of-archive marker, then 80 MiB of
/// zero "padding": 1,330 MiB of tar in ~1.3 MB of gzip. Every header claim
/// fits the 1,280 MiB limit, so only the streaming byte counter can stop it.
fn bomb() -> (Vec<u8>, u64) {
    let mut enc = GzEncoder::new(Vec::new(), Compression::best());
    let zeros = vec![0u8; MIB];
    let mut total = 0u64;
    for i in 0..5 {
        let h = raw_header(format!("f{i}").as_bytes(), b'0', 250 * MIB as u64);
        enc.write_all(h.as_bytes()).unwrap();
        for _ in 0..250 {
            enc.write_all(&zeros).unwrap();
        }
        total += 512 + 250 * MIB as u64;
    }
    for _ in 0..80 {
        enc.write_all(&zeros).unwrap();
    }
    total += 80 * MIB as u64;
    (enc.finish().unwrap(), total)
}

#[test]
fn gzip_bomb_stops_at_the_inflated_limit_with_flat_memory() {
    let (bomb, inflated) = bomb();
    let ratio = inflated as f64 / bomb.len() as f64;
    assert!(ratio > 1000.0, "bomb ratio only {ratio:.0}:1");
    let limits = Limits::default();
    assert!(inflated > limits.inflated_bytes);

    let baseline = CURRENT.load(Ordering::Relaxed);
    PEAK.store(baseline, Ordering::Relaxed);
    let err = bundle::inspect(&bomb[..], &limits).unwrap_err();
    let inspect_peak = PEAK.load(Ordering::Relaxed) - baseline;
    assert_eq!(err.code(), "inflated_too_large", "{err}");
    assert!(err.is_too_large());

    let baseline = CURRENT.load(Ordering::Relaxed);
    PEAK.store(baseline, Ordering::Relaxed);
    let err = bundle::canonicalize(&bomb[..], &limits, &CanonicalOptions::default(), io::sink())
        .unwrap_err();
    let canonical_peak = PEAK.load(Ordering::Relaxed) - baseline;
    assert_eq!(err.code(), "inflated_too_large", "{err}");

    eprintln!(
        "bomb {} bytes -> {} inflated ({ratio:.0}:1); peak heap: inspect {} KiB, canonicalize {} KiB",
        bomb.len(),
        inflated,
        inspect_peak / 1024,
        canonical_peak / 1024
    );
    // Buffers are a handful of 256 KiB chunks plus zlib state: a few MiB,
    // against 1.25 GiB inflated. Canonicalising also holds each deflate
    // worker's output room, a whole deflate bound of its piece (so that a
    // piece is one deflate call and its bytes never depend on the room:
    // format pgzip2), hence the larger allowance.
    assert!(inspect_peak < 8 * MIB, "inspect peak {inspect_peak} bytes");
    assert!(
        canonical_peak < 12 * MIB,
        "canonicalize peak {canonical_peak} bytes"
    );
}
