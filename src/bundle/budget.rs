//! The temporary-disk budget: one byte count shared by every run of the
//! bundle engine that writes temporary files (the spool and the
//! speculative gzip), so concurrent uploads together never hold more than
//! the budget on disk. A run that would exceed it fails with
//! [`super::BundleError::TempSpaceExhausted`]; what it held is given back
//! when the run ends, whatever its outcome.

use std::io::{self, Write};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

/// A byte budget for temporary files, shared by clones.
#[derive(Clone)]
pub struct TempBudget {
    inner: Arc<Shared>,
}

struct Shared {
    limit: u64,
    used: AtomicU64,
    peak: AtomicU64,
}

impl std::fmt::Debug for TempBudget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "TempBudget({}/{} bytes)", self.used(), self.inner.limit)
    }
}

/// Two handles are equal when they share one budget.
impl PartialEq for TempBudget {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.inner, &other.inner)
    }
}

impl Eq for TempBudget {}

impl TempBudget {
    /// A budget of `limit` bytes.
    pub fn new(limit: u64) -> Self {
        Self {
            inner: Arc::new(Shared {
                limit,
                used: AtomicU64::new(0),
                peak: AtomicU64::new(0),
            }),
        }
    }

    /// The limit in bytes.
    pub fn limit(&self) -> u64 {
        self.inner.limit
    }

    /// Bytes held now by running calls.
    pub fn used(&self) -> u64 {
        self.inner.used.load(Ordering::Acquire)
    }

    /// The most bytes ever held at once.
    pub fn peak(&self) -> u64 {
        self.inner.peak.load(Ordering::Acquire)
    }

    /// Takes `n` bytes, or nothing when that would pass the limit.
    fn take(&self, n: u64) -> bool {
        let s = &self.inner;
        let mut current = s.used.load(Ordering::Acquire);
        loop {
            let Some(next) = current.checked_add(n).filter(|next| *next <= s.limit) else {
                return false;
            };
            match s
                .used
                .compare_exchange_weak(current, next, Ordering::AcqRel, Ordering::Acquire)
            {
                Ok(_) => {
                    s.peak.fetch_max(next, Ordering::AcqRel);
                    return true;
                }
                Err(seen) => current = seen,
            }
        }
    }

    fn give_back(&self, n: u64) {
        self.inner.used.fetch_sub(n, Ordering::AcqRel);
    }
}

/// One run's share of a budget (or no budget at all): what it took, given
/// back on drop, and whether it ever hit the limit.
#[derive(Clone, Default)]
pub(crate) struct Charge {
    inner: Option<Arc<RunShare>>,
}

struct RunShare {
    budget: TempBudget,
    held: AtomicU64,
    refused: AtomicBool,
}

impl Drop for RunShare {
    fn drop(&mut self) {
        self.budget.give_back(*self.held.get_mut());
    }
}

impl Charge {
    /// A charge against `budget`, or an unlimited one.
    pub(crate) fn new(budget: Option<&TempBudget>) -> Self {
        Self {
            inner: budget.map(|b| {
                Arc::new(RunShare {
                    budget: b.clone(),
                    held: AtomicU64::new(0),
                    refused: AtomicBool::new(false),
                })
            }),
        }
    }

    /// Accounts for `n` more bytes on disk, or fails (and remembers it).
    pub(crate) fn reserve(&self, n: usize) -> io::Result<()> {
        let Some(share) = &self.inner else {
            return Ok(());
        };
        let n = n as u64;
        if share.budget.take(n) {
            share.held.fetch_add(n, Ordering::AcqRel);
            Ok(())
        } else {
            share.refused.store(true, Ordering::Release);
            Err(io::Error::other(format!(
                "the temporary space budget of {} bytes is used up",
                share.budget.limit()
            )))
        }
    }

    /// The budget's limit, when the run was refused space.
    pub(crate) fn refused(&self) -> Option<u64> {
        self.inner
            .as_ref()
            .filter(|s| s.refused.load(Ordering::Acquire))
            .map(|s| s.budget.limit())
    }
}

/// A writer whose every byte is charged before it is written.
pub(crate) struct Charged<W> {
    inner: W,
    charge: Charge,
}

impl<W> Charged<W> {
    pub(crate) fn new(inner: W, charge: Charge) -> Self {
        Self { inner, charge }
    }

    pub(crate) fn into_inner(self) -> W {
        self.inner
    }
}

impl<W: Write> Write for Charged<W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.charge.reserve(buf.len())?;
        // A short write keeps the rest charged until the run ends; the
        // file may still grow to that size.
        self.inner.write(buf)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn runs_share_the_budget_and_give_back_on_drop() {
        let budget = TempBudget::new(100);
        let a = Charge::new(Some(&budget));
        let b = Charge::new(Some(&budget));
        a.reserve(60).unwrap();
        assert!(b.reserve(50).is_err());
        assert_eq!(b.refused(), Some(100));
        assert_eq!(a.refused(), None);
        b.reserve(40).unwrap();
        assert_eq!(budget.used(), 100);
        drop(a);
        assert_eq!(budget.used(), 40);
        drop(b);
        assert_eq!((budget.used(), budget.peak()), (0, 100));
        let unlimited = Charge::new(None);
        unlimited.reserve(usize::MAX).unwrap();
        assert_eq!(unlimited.refused(), None);
    }

    #[test]
    fn charged_writer_refuses_past_the_budget() {
        let budget = TempBudget::new(10);
        let mut w = Charged::new(Vec::new(), Charge::new(Some(&budget)));
        w.write_all(b"0123456789").unwrap();
        assert!(w.write_all(b"x").is_err());
        assert_eq!(w.into_inner(), b"0123456789");
    }
}
