//! The byte budget of a replica's disk copy of object storage.
//!
//! With object storage the local blobs are only copies, so they must not
//! grow with the bucket: [`LocalCopies`] keeps their sizes in
//! least-recently-used order and names the copies to drop once a new one
//! puts the total over the budget. It only does the accounting; the
//! [`BlobStore`](super::BlobStore) that owns it removes the files.
//!
//! The copy just added or used is never the one dropped, so a bundle larger
//! than the whole budget still reaches disk (alone) and can be served.

use std::sync::{Mutex, MutexGuard, PoisonError};

use lru::LruCache;

/// Sizes of the local copies, least recently used first out.
#[derive(Debug)]
pub(super) struct LocalCopies {
    budget: u64,
    state: Mutex<State>,
}

#[derive(Debug)]
struct State {
    lru: LruCache<String, u64>,
    bytes: u64,
}

impl LocalCopies {
    /// An empty account with room for `budget` bytes.
    pub(super) fn new(budget: u64) -> Self {
        Self {
            budget,
            state: Mutex::new(State {
                lru: LruCache::unbounded(),
                bytes: 0,
            }),
        }
    }

    fn state(&self) -> MutexGuard<'_, State> {
        // The state is two counters kept consistent under the lock: a
        // panic elsewhere cannot leave it half-updated.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The budget in bytes.
    pub(super) fn budget(&self) -> u64 {
        self.budget
    }

    /// Bytes of the copies on record.
    pub(super) fn bytes(&self) -> u64 {
        self.state().bytes
    }

    /// Records the copy `digest` of `size` bytes as the most recently used
    /// (again, if it was on record).
    pub(super) fn add(&self, digest: &str, size: u64) {
        let mut state = self.state();
        if let Some(old) = state.lru.put(digest.to_owned(), size) {
            state.bytes -= old;
        }
        state.bytes += size;
    }

    /// Marks the copy `digest` as just used; `false` when it is not on record.
    pub(super) fn touch(&self, digest: &str) -> bool {
        self.state().lru.get(digest).is_some()
    }

    /// Forgets the copy `digest` (its file was removed).
    pub(super) fn forget(&self, digest: &str) {
        let mut state = self.state();
        if let Some(size) = state.lru.pop(digest) {
            state.bytes -= size;
        }
    }

    /// The least recently used copies to drop so that the rest fit the
    /// budget, taken off the record; never the most recently used one.
    pub(super) fn over_budget(&self) -> Vec<String> {
        let mut state = self.state();
        let mut drop = Vec::new();
        while state.bytes > self.budget && state.lru.len() > 1 {
            let Some((digest, size)) = state.lru.pop_lru() else {
                break;
            };
            state.bytes -= size;
            drop.push(digest);
        }
        drop
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_least_recently_used_copies_go_first_until_the_rest_fit() {
        let copies = LocalCopies::new(100);
        copies.add("a", 40);
        copies.add("b", 40);
        assert!(copies.over_budget().is_empty());
        // `a` used again: `b` is now the oldest.
        assert!(copies.touch("a"));
        copies.add("c", 40);
        assert_eq!(copies.over_budget(), vec!["b".to_owned()]);
        assert_eq!(copies.bytes(), 80);
        copies.add("d", 90);
        assert_eq!(copies.over_budget(), vec!["a".to_owned(), "c".to_owned()]);
        assert_eq!(copies.bytes(), 90);
    }

    #[test]
    fn a_copy_larger_than_the_budget_stays_alone() {
        let copies = LocalCopies::new(10);
        copies.add("small", 5);
        copies.add("huge", 50);
        assert_eq!(copies.over_budget(), vec!["small".to_owned()]);
        assert!(copies.over_budget().is_empty());
        assert_eq!(copies.bytes(), 50);
    }

    #[test]
    fn re_adding_and_forgetting_keep_the_total_exact() {
        let copies = LocalCopies::new(100);
        copies.add("a", 30);
        copies.add("a", 30);
        assert_eq!(copies.bytes(), 30);
        copies.forget("a");
        copies.forget("never-added");
        assert_eq!(copies.bytes(), 0);
        assert!(!copies.touch("a"));
    }
}
