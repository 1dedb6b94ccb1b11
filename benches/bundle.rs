//! Throughput of the bundle engine on the two reference inputs:
//! (a) 10,000 × 1 KiB files and (b) 4 × 64 MiB files alternating 1 MiB of
//! random bytes and 1 MiB of repeated text. Reported in bytes of inflated
//! *input* per second, for "inspect only" (validate + revision) and for
//! "inspect + canonical bundle written to a file" (the upload path).
//!
//! Input (b) comes twice: members in canonical order (as `contextctl
//! bundle pack` or `tar --sort=name` write them: the streaming path) and
//! shuffled (the spool-then-sort path).
//!
//! With `BUNDLE_BENCH_DIR` set, the inputs are also written there so
//! `benches/bundle-gnu.sh` can time GNU tar on the same bytes.

use std::fs::File;
use std::io::{Seek, Write};
use std::time::Duration;

use context_service::bundle::{self, CanonicalOptions, Limits};
use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use flate2::write::GzEncoder;
use flate2::Compression;

const KIB: usize = 1024;
const MIB: usize = 1024 * KIB;

/// Deterministic incompressible bytes (xorshift).
fn random_bytes(n: usize, seed: u64) -> Vec<u8> {
    let mut x = seed | 1;
    let mut out = Vec::with_capacity(n);
    while out.len() < n {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        out.extend_from_slice(&x.to_le_bytes());
    }
    out.truncate(n);
    out
}

fn text_bytes(n: usize) -> Vec<u8> {
    let line =
        b"The quick brown fox jumps over the lazy dog; agents read context files. 0123456789\n";
    line.iter().copied().cycle().take(n).collect()
}

/// A gzip tar (level 6, like `tar -czf`) of `files`, in the given order,
/// with explicit directory entries and realistic metadata.
fn archive(files: &[(String, Vec<u8>)]) -> (Vec<u8>, u64) {
    let mut b = tar::Builder::new(Vec::new());
    let mut dirs = std::collections::BTreeSet::new();
    for (path, data) in files {
        if let Some((dir, _)) = path.rsplit_once('/') {
            if dirs.insert(dir.to_owned()) {
                let mut h = tar::Header::new_ustar();
                h.set_entry_type(tar::EntryType::Directory);
                h.set_mode(0o755);
                h.set_mtime(1_700_000_000);
                h.set_size(0);
                b.append_data(&mut h, format!("{dir}/"), &[][..]).unwrap();
            }
        }
        let mut h = tar::Header::new_ustar();
        h.set_mode(0o644);
        h.set_uid(1000);
        h.set_mtime(1_700_000_000);
        h.set_size(data.len() as u64);
        b.append_data(&mut h, path, &data[..]).unwrap();
    }
    let tar = b.into_inner().unwrap();
    let inflated = tar.len() as u64;
    let mut enc = GzEncoder::new(Vec::new(), Compression::new(6));
    enc.write_all(&tar).unwrap();
    (enc.finish().unwrap(), inflated)
}

fn small_files() -> Vec<(String, Vec<u8>)> {
    (0..10_000)
        .map(|i| {
            let mut data = text_bytes(KIB);
            data[..8].copy_from_slice(&random_bytes(8, i + 1));
            // Flat: 10,000 files is exactly the entry limit.
            (format!("f{i:05}.txt"), data)
        })
        .collect()
}

fn large_files() -> Vec<(String, Vec<u8>)> {
    (0..4u64)
        .map(|i| {
            let mut data = Vec::with_capacity(64 * MIB);
            for block in 0..64u64 {
                if block % 2 == 0 {
                    data.extend_from_slice(&random_bytes(MIB, i * 1000 + block + 7));
                } else {
                    data.extend_from_slice(&text_bytes(MIB));
                }
            }
            (format!("data/file{i}.bin"), data)
        })
        .collect()
}

struct Input {
    name: &'static str,
    gz: Vec<u8>,
    inflated: u64,
}

fn inputs() -> Vec<Input> {
    let (a, a_inf) = archive(&small_files());
    let large = large_files();
    let (b, b_inf) = archive(&large);
    let mut shuffled = large;
    shuffled.swap(0, 3);
    shuffled.swap(1, 2);
    let (b_unsorted, b_unsorted_inf) = archive(&shuffled);
    let all = vec![
        Input {
            name: "a_small_files",
            gz: a,
            inflated: a_inf,
        },
        Input {
            name: "b_large_files",
            gz: b,
            inflated: b_inf,
        },
        Input {
            name: "b_large_files_unsorted",
            gz: b_unsorted,
            inflated: b_unsorted_inf,
        },
    ];
    if let Ok(dir) = std::env::var("BUNDLE_BENCH_DIR") {
        for i in &all {
            std::fs::write(format!("{dir}/{}.tar.gz", i.name), &i.gz).unwrap();
            std::fs::write(format!("{dir}/{}.inflated", i.name), i.inflated.to_string()).unwrap();
        }
    }
    all
}

fn bench(c: &mut Criterion) {
    let limits = Limits::default();
    // `BUNDLE_BENCH_GZIP_LEVEL` overrides the canonical gzip level (default 1).
    let opts = CanonicalOptions {
        gzip_level: std::env::var("BUNDLE_BENCH_GZIP_LEVEL")
            .ok()
            .and_then(|l| l.parse().ok())
            .unwrap_or(CanonicalOptions::default().gzip_level),
        ..CanonicalOptions::default()
    };
    let mut out: File = tempfile::tempfile().unwrap();
    for input in inputs() {
        let mut group = c.benchmark_group(input.name);
        group.throughput(Throughput::Bytes(input.inflated));
        group.bench_function(BenchmarkId::from_parameter("inspect"), |b| {
            b.iter(|| bundle::inspect(&input.gz[..], &limits).unwrap());
        });
        group.bench_function(BenchmarkId::from_parameter("canonicalize"), |b| {
            b.iter(|| {
                out.set_len(0).unwrap();
                out.rewind().unwrap();
                bundle::canonicalize(&input.gz[..], &limits, &opts, &mut out).unwrap()
            });
        });
        group.finish();
    }
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .sample_size(10)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(8));
    targets = bench
}
criterion_main!(benches);
