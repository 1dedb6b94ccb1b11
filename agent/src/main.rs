//! `context-agent`: the in-sandbox half of a delivery (DESIGN §6), a fast
//! replacement for the deliver script (`src/delivery/deliver.sh`) that
//! speaks the same protocol and keeps the same layout, so the two
//! interoperate on one sandbox.
//!
//! `context-agent probe` prints `context-agent <version>` and exits 0 (the
//! launcher checks that the agent can run here at all: a `noexec` root or a
//! foreign architecture fail this, and the script takes over).
//!
//! `context-agent deliver key=value…` delivers one revision: the values
//! are the ones the gateway renders into the script (see [`args`]), each
//! checked again here by the same rules (`src/delivery/rules.rs`). On
//! stdout it prints `NEED <n>`, then `{"path":…,"revision":…,"cached":…}`
//! or `ERROR <code> <reason>` with the script's codes and reasons; stderr
//! is for logs. One pass over the bundle bytes: the sha256 of what is
//! received, the inflate, the sha256 of the tar and the extraction with
//! final modes all happen as the bytes arrive; nothing is published before
//! both digests and the tree's manifest matched.

mod args;
mod deliver;
mod fail;
mod fsops;
mod receive;
#[allow(dead_code, unreachable_pub)]
#[path = "../../src/delivery/rules.rs"]
mod rules;
mod scan;
mod tar;

use std::io::Write;
use std::process::ExitCode;

/// Printed by `probe`: the launcher only checks that the agent runs.
const VERSION_LINE: &str = concat!("context-agent ", env!("CARGO_PKG_VERSION"));

fn main() -> ExitCode {
    let argv: Vec<String> = std::env::args().skip(1).collect();
    match argv.first().map(String::as_str) {
        Some("probe") if argv.len() == 1 => {
            println!("{VERSION_LINE}");
            ExitCode::SUCCESS
        }
        Some("deliver") => {
            on_signals_say_interrupted();
            let result = args::parse(&argv[1..]).and_then(|req| deliver::run(&req));
            match result {
                Ok(line) => {
                    let mut out = std::io::stdout().lock();
                    // Nothing useful is left to do when stdout is gone.
                    let _ = writeln!(out, "{line}");
                    let _ = out.flush();
                    ExitCode::SUCCESS
                }
                Err(f) => {
                    f.report();
                    ExitCode::FAILURE
                }
            }
        }
        _ => {
            eprintln!("usage: context-agent probe | context-agent deliver key=value...");
            ExitCode::from(2)
        }
    }
}

/// The script's `trap`: on SIGHUP, SIGINT or SIGTERM print `ERROR
/// interrupted …` and exit; the staging dir left behind is removed by the
/// next delivery (under the lock), as after SIGKILL.
fn on_signals_say_interrupted() {
    extern "C" fn interrupted(_: libc::c_int) {
        const OUT: &[u8] = b"ERROR interrupted delivery interrupted by a signal\n";
        const ERR: &[u8] = b"context delivery: interrupted: delivery interrupted by a signal\n";
        // SAFETY: write(2) and _exit(2) are async-signal-safe.
        unsafe {
            libc::write(1, OUT.as_ptr().cast(), OUT.len());
            libc::write(2, ERR.as_ptr().cast(), ERR.len());
            libc::_exit(1);
        }
    }
    let handler: extern "C" fn(libc::c_int) = interrupted;
    for sig in [libc::SIGHUP, libc::SIGINT, libc::SIGTERM] {
        // SAFETY: installs a handler that only calls async-signal-safe
        // functions.
        unsafe {
            libc::signal(sig, handler as libc::sighandler_t);
        }
    }
}
