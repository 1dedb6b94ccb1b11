//! The physical limits beside the bundle figures of `benches/bundle-gnu.sh`:
//! what one core does on the same bytes with nothing else in the way.
//!
//! For each gzip file named on the command line, prints one JSON line with
//! the MB/s (10^6 bytes of *inflated* input per second, median of `RUNS`,
//! default 5) of:
//! * `inflate`: zlib-rs (through flate2) inflating the whole file to nowhere;
//! * `sha256`: sha256 of the inflated bytes, already in memory;
//! * `loopback`: copying the inflated bytes through a 127.0.0.1 TCP socket
//!   (a writer thread and a reading thread that discards).
//!
//! Run: `cargo bench --bench bundle -- FILE.tar.gz...` (plain `main`, no
//! harness: these are single numbers, not a statistical study).

use std::io::{self, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::time::Instant;

use flate2::bufread::GzDecoder;
use sha2::{Digest, Sha256};

/// Seconds of `f`, median of `runs`.
fn median_secs(runs: usize, mut f: impl FnMut() -> io::Result<()>) -> io::Result<f64> {
    let mut secs = Vec::with_capacity(runs);
    for _ in 0..runs {
        let t = Instant::now();
        f()?;
        secs.push(t.elapsed().as_secs_f64());
    }
    secs.sort_by(f64::total_cmp);
    Ok(secs[secs.len() / 2])
}

fn inflate(gz: &[u8], out: &mut Vec<u8>) -> io::Result<()> {
    out.clear();
    GzDecoder::new(gz).read_to_end(out)?;
    Ok(())
}

fn loopback(data: &[u8]) -> io::Result<()> {
    let listener = TcpListener::bind("127.0.0.1:0")?;
    let addr = listener.local_addr()?;
    std::thread::scope(|s| {
        let reader = s.spawn(move || -> io::Result<u64> {
            let (mut conn, _) = listener.accept()?;
            io::copy(&mut conn, &mut io::sink())
        });
        let mut conn = TcpStream::connect(addr)?;
        for chunk in data.chunks(256 * 1024) {
            conn.write_all(chunk)?;
        }
        drop(conn);
        let got = reader
            .join()
            .map_err(|_| io::Error::other("reader panicked"))??;
        if got != data.len() as u64 {
            return Err(io::Error::other("loopback copy came up short"));
        }
        Ok(())
    })
}

fn main() -> io::Result<()> {
    let runs: usize = std::env::var("RUNS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(5);
    // `cargo bench` passes `--bench`; everything else is a file.
    for path in std::env::args().skip(1).filter(|a| !a.starts_with("--")) {
        let gz = std::fs::read(&path)?;
        let mut tar = Vec::new();
        inflate(&gz, &mut tar)?;
        let mb = tar.len() as f64 / 1e6;
        let mut scratch = Vec::with_capacity(tar.len());
        let t_inflate = median_secs(runs, || inflate(&gz, &mut scratch))?;
        let t_sha = median_secs(runs, || {
            std::hint::black_box(Sha256::digest(&tar));
            Ok(())
        })?;
        let t_loop = median_secs(runs, || loopback(&tar))?;
        println!(
            "{{\"file\":{:?},\"inflatedMB\":{mb:.1},\"inflate\":{:.0},\"sha256\":{:.0},\"loopback\":{:.0}}}",
            path,
            mb / t_inflate,
            mb / t_sha,
            mb / t_loop
        );
    }
    Ok(())
}
