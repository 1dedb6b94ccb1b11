//! Per-key async locks: one holder per key at a time, entries dropped when
//! nobody holds or waits for them.
//!
//! Deliveries of one revision into one sandbox for one scope take the lock
//! of that key, so concurrent runs make one transfer and then hit the
//! sandbox's cache (single-flight); a run's deliver and release take the
//! lock of the run.

use std::collections::HashMap;
use std::hash::Hash;
use std::sync::{Arc, Mutex};

use tokio::sync::{Mutex as AsyncMutex, OwnedMutexGuard};

/// A map of async locks by key.
#[derive(Debug)]
pub(super) struct KeyedLocks<K: Hash + Eq + Clone> {
    locks: Arc<Mutex<HashMap<K, Arc<AsyncMutex<()>>>>>,
}

impl<K: Hash + Eq + Clone> Default for KeyedLocks<K> {
    fn default() -> Self {
        Self {
            locks: Arc::default(),
        }
    }
}

/// Holds the lock of one key; releasing it forgets the key when nobody
/// else waits for it.
pub(super) struct KeyGuard<K: Hash + Eq + Clone> {
    guard: Option<OwnedMutexGuard<()>>,
    key: K,
    locks: Arc<Mutex<HashMap<K, Arc<AsyncMutex<()>>>>>,
}

impl<K: Hash + Eq + Clone> KeyedLocks<K> {
    /// Waits for the lock of `key`.
    pub(super) async fn lock(&self, key: K) -> KeyGuard<K> {
        let lock = {
            let mut map = self
                .locks
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            map.entry(key.clone()).or_default().clone()
        };
        KeyGuard {
            guard: Some(lock.lock_owned().await),
            key,
            locks: self.locks.clone(),
        }
    }

    /// How many keys are tracked (held or waited for).
    #[cfg(test)]
    pub(super) fn len(&self) -> usize {
        self.locks
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .len()
    }
}

impl<K: Hash + Eq + Clone> Drop for KeyGuard<K> {
    fn drop(&mut self) {
        self.guard.take();
        let mut map = self
            .locks
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        // Only the map holds it: nobody waits, so forget the key.
        if map
            .get(&self.key)
            .is_some_and(|l| Arc::strong_count(l) == 1)
        {
            map.remove(&self.key);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::Duration;

    use super::*;

    #[tokio::test]
    async fn one_holder_per_key_and_keys_are_forgotten() {
        let locks = Arc::new(KeyedLocks::<&'static str>::default());
        let inside = Arc::new(AtomicUsize::new(0));
        let most = Arc::new(AtomicUsize::new(0));
        let mut tasks = Vec::new();
        for _ in 0..8 {
            let (locks, inside, most) = (locks.clone(), inside.clone(), most.clone());
            tasks.push(tokio::spawn(async move {
                let _g = locks.lock("k").await;
                let now = inside.fetch_add(1, Ordering::SeqCst) + 1;
                most.fetch_max(now, Ordering::SeqCst);
                tokio::time::sleep(Duration::from_millis(5)).await;
                inside.fetch_sub(1, Ordering::SeqCst);
            }));
        }
        // Another key is never held up by "k".
        let other = locks.lock("other").await;
        drop(other);
        for t in tasks {
            t.await.unwrap();
        }
        assert_eq!(most.load(Ordering::SeqCst), 1);
        assert_eq!(locks.len(), 0);
    }
}
