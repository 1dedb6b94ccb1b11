//! The bundle engine's helper threads, joined before the call that started
//! them returns, whatever the path out of it.
//!
//! A scoped thread that is not joined by hand is only waited for until its
//! closure returns: `std::thread::scope` can return while the thread still
//! runs its thread-local destructors (the mpsc context of a blocking
//! `recv`, say), which LeakSanitizer reported as a leak after `inspect`
//! returned. So every helper is a [`Joined`]: joined explicitly on success
//! and, when dropped on an error path, joined by its `Drop`. Whoever holds
//! one must drop the channel ends its thread waits on first (declare them
//! before it), or that drop would wait forever.
//!
//! [`testing`] holds test-only hooks: jitter in the workers and the writer
//! (the bundle bytes must not depend on timing) and a record of the
//! threads a call started, to check they are gone when it returns.

use std::io;
use std::thread::{Scope, ScopedJoinHandle};

/// A helper thread that is joined, not merely finished, before its handle
/// goes away.
pub(crate) struct Joined<'scope, T>(Option<ScopedJoinHandle<'scope, T>>);

impl<T> Joined<'_, T> {
    /// Waits for the thread to end; `None` if it panicked.
    pub(crate) fn join(mut self) -> Option<T> {
        self.0.take().and_then(|h| h.join().ok())
    }
}

impl<T> Drop for Joined<'_, T> {
    fn drop(&mut self) {
        if let Some(h) = self.0.take() {
            // A panic was already reported on that thread.
            let _ = h.join();
        }
    }
}

/// Starts helper `name` in `s`.
pub(crate) fn spawn<'scope, T, F>(
    s: &'scope Scope<'scope, '_>,
    name: &str,
    f: F,
) -> io::Result<Joined<'scope, T>>
where
    T: Send + 'scope,
    F: FnOnce() -> T + Send + 'scope,
{
    let probe = testing::probe();
    let handle = std::thread::Builder::new()
        .name(name.into())
        .spawn_scoped(s, move || {
            testing::arm(probe);
            f()
        })?;
    Ok(Joined(Some(handle)))
}

#[doc(hidden)]
pub mod testing {
    //! Test-only hooks, off (one relaxed atomic load) unless a test turns
    //! them on. Not part of the API.

    use std::cell::RefCell;
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
    use std::sync::{Arc, Weak};
    use std::time::Duration;

    /// Seed of the jitter; 0 is off.
    static JITTER: AtomicU64 = AtomicU64::new(0);
    /// Draws of the jitter so far (each draw sleeps differently).
    static DRAWS: AtomicU64 = AtomicU64::new(0);
    /// Whether helpers are recorded.
    static TRACKING: AtomicBool = AtomicBool::new(false);
    /// How long a recorded helper waits in its thread-local destructors, in µs.
    static EXIT_DELAY_US: AtomicU64 = AtomicU64::new(0);

    /// A recorded helper: alive until its thread-local state is destroyed.
    pub(super) type Probe = Arc<()>;

    thread_local! {
        /// The helpers this thread started, while tracking.
        static STARTED: RefCell<Vec<Weak<()>>> = const { RefCell::new(Vec::new()) };
        /// On a helper: its probe, dropped with its thread-local state.
        static ARMED: RefCell<Option<Delayed>> = const { RefCell::new(None) };
    }

    /// Holds the probe and waits the exit delay when destroyed, so a
    /// helper that nobody joins is reliably still alive when its caller
    /// returns.
    struct Delayed {
        _probe: Probe,
    }

    impl Drop for Delayed {
        fn drop(&mut self) {
            let us = EXIT_DELAY_US.load(Ordering::Relaxed);
            if us > 0 {
                std::thread::sleep(Duration::from_micros(us));
            }
        }
    }

    /// A probe for a helper about to start, recorded on the calling
    /// thread; `None` unless tracking.
    pub(super) fn probe() -> Option<Probe> {
        if !TRACKING.load(Ordering::Relaxed) {
            return None;
        }
        let probe = Arc::new(());
        STARTED.with(|s| s.borrow_mut().push(Arc::downgrade(&probe)));
        Some(probe)
    }

    /// On the helper, first thing: its thread-local destructors (run last
    /// in, first out) will drop the probe after everything else.
    pub(super) fn arm(probe: Option<Probe>) {
        if let Some(p) = probe {
            ARMED.with(|a| *a.borrow_mut() = Some(Delayed { _probe: p }));
        }
    }

    /// Records the bundle helper threads started from now on by the
    /// calling thread (see [`helpers_alive`]); each waits `exit_delay` in
    /// its thread-local destructors. Process-wide; `None` stops.
    pub fn track_helpers(exit_delay: Option<Duration>) {
        let us = exit_delay.map_or(0, |d| u64::try_from(d.as_micros()).unwrap_or(u64::MAX));
        EXIT_DELAY_US.store(us, Ordering::Relaxed);
        TRACKING.store(exit_delay.is_some(), Ordering::Relaxed);
    }

    /// How many helpers the calling thread started since the last call
    /// still have thread-local state (are not joined); forgets them.
    pub fn helpers_alive() -> usize {
        STARTED.with(|s| {
            let started = std::mem::take(&mut *s.borrow_mut());
            started.iter().filter(|w| w.strong_count() > 0).count()
        })
    }

    /// Makes the deflate workers and the bundle writer sleep a
    /// pseudo-random 0–2 ms (from `seed`) before each item, so pieces
    /// finish in another order and on other workers. `None` stops.
    pub fn set_jitter(seed: Option<u64>) {
        JITTER.store(seed.map_or(0, |s| s | 1), Ordering::Relaxed);
    }

    /// Sleeps if jitter is on.
    pub(crate) fn jitter() {
        let seed = JITTER.load(Ordering::Relaxed);
        if seed == 0 {
            return;
        }
        // splitmix64 of the seed and the draw.
        let mut x = seed
            ^ DRAWS
                .fetch_add(1, Ordering::Relaxed)
                .wrapping_mul(0x9e37_79b9_7f4a_7c15);
        x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        x ^= x >> 31;
        // A third of the draws do not sleep: some items overtake others.
        if x % 3 != 0 {
            std::thread::sleep(Duration::from_micros(x % 2000));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    /// What LeakSanitizer saw: `std::thread::scope` returns once a thread
    /// it did not join has finished its closure, before its thread-local
    /// destructors ran. A [`Joined`] helper is gone when dropped.
    #[test]
    fn a_joined_helper_is_gone_and_a_scoped_one_may_not_be() {
        testing::track_helpers(Some(Duration::from_millis(200)));
        std::thread::scope(|s| {
            let helper = spawn(s, "bundle-test", || 7).expect("spawn");
            drop(helper);
            assert_eq!(testing::helpers_alive(), 0);
            let helper = spawn(s, "bundle-test", || 8).expect("spawn");
            assert_eq!(helper.join(), Some(8));
            assert_eq!(testing::helpers_alive(), 0);
            // Its handle dropped unjoined: left to the scope (the regression).
            let mut helper = spawn(s, "bundle-test", || 9).expect("spawn");
            drop(helper.0.take());
        });
        let alive = testing::helpers_alive();
        testing::track_helpers(None);
        assert_eq!(alive, 1);
    }
}
