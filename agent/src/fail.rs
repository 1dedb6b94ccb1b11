//! A failed delivery: the script's `ERROR <code> <reason>` line.

use std::io::Write;

/// Why the delivery failed, as the script would say it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Fail {
    /// One of the script's codes (`digest_mismatch`, `disk_full`, …).
    pub(crate) code: &'static str,
    /// One line, no newline.
    pub(crate) reason: String,
}

impl Fail {
    /// A failure with `code` and `reason`.
    pub(crate) fn new(code: &'static str, reason: impl Into<String>) -> Self {
        Self {
            code,
            reason: reason.into().replace('\n', " "),
        }
    }

    /// Prints the `ERROR` line on stdout and a log line on stderr.
    pub(crate) fn report(&self) {
        let mut out = std::io::stdout().lock();
        let _ = writeln!(out, "ERROR {} {}", self.code, self.reason);
        let _ = out.flush();
        eprintln!("context delivery: {}: {}", self.code, self.reason);
    }
}

/// A write that failed while doing `what`: `disk_full` when the disk or
/// quota is full (or nearly: some filesystems say only "I/O error"), else
/// `write_failed`.
pub(crate) fn io_failure(e: &std::io::Error, what: &str, free: Option<u64>) -> Fail {
    eprintln!("context delivery: {what}: {e}");
    let full = matches!(e.raw_os_error(), Some(libc::ENOSPC) | Some(libc::EDQUOT))
        || free.is_some_and(|f| f < 1 << 20);
    if full {
        Fail::new("disk_full", format!("no space left on device while {what}"))
    } else {
        Fail::new("write_failed", format!("{what} failed"))
    }
}
