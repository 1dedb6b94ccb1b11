//! Per-owner quotas that concurrent creates cannot pass together.
//!
//! What an owner holds is what the backend lists plus the creates still in
//! flight (reserved here, by object key, so an object both listed and in
//! flight counts once). One owner's check-and-reserve steps are serialised
//! by a lock (owners share one of [`OWNER_LOCKS`]); the backend calls
//! themselves run concurrently. A reservation is released under the same
//! lock once its create has finished, so a check never misses an object
//! that is neither listed yet nor reserved any more.

use std::collections::hash_map::DefaultHasher;
use std::collections::HashMap;
use std::future::Future;
use std::hash::{Hash, Hasher};
use std::sync::{Arc, Mutex, MutexGuard};

/// Owners share one of this many locks.
pub(super) const OWNER_LOCKS: usize = 64;

/// Reservations of one kind of object (pools or contexts).
#[derive(Debug)]
pub(super) struct QuotaGate {
    locks: Box<[Arc<tokio::sync::Mutex<()>>]>,
    /// owner → object key → amount, for creates in flight.
    pending: Mutex<HashMap<String, HashMap<String, u64>>>,
}

/// A create in flight, counted for its owner until released.
#[derive(Debug)]
pub(super) struct Reservation {
    gate: Arc<QuotaGate>,
    owner: String,
    key: String,
}

impl QuotaGate {
    pub(super) fn new() -> Self {
        Self {
            locks: (0..OWNER_LOCKS).map(|_| Arc::default()).collect(),
            pending: Mutex::new(HashMap::new()),
        }
    }

    fn lock_of(&self, owner: &str) -> Arc<tokio::sync::Mutex<()>> {
        let mut h = DefaultHasher::new();
        owner.hash(&mut h);
        self.locks[(h.finish() % OWNER_LOCKS as u64) as usize].clone()
    }

    fn pending(&self) -> MutexGuard<'_, HashMap<String, HashMap<String, u64>>> {
        // Plain counters: still consistent after a panic elsewhere.
        self.pending
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Reserves `amount` under `key` for `owner` when what the owner holds
    /// (`listed`: its objects as `(key, amount)`, plus its creates in
    /// flight) leaves room under `quota`. `Err(held)` otherwise.
    pub(super) async fn reserve<E, F>(
        self: &Arc<Self>,
        owner: &str,
        key: &str,
        amount: u64,
        quota: u64,
        listed: F,
    ) -> Result<Result<Reservation, u64>, E>
    where
        F: Future<Output = Result<Vec<(String, u64)>, E>>,
    {
        let lock = self.lock_of(owner);
        let _serial = lock.lock().await;
        let listed = listed.await?;
        let mut pending = self.pending();
        let mine = pending.entry(owner.to_owned()).or_default();
        let held: u64 = listed
            .iter()
            .filter(|(k, _)| !mine.contains_key(k))
            .map(|(_, n)| *n)
            .chain(mine.values().copied())
            .sum();
        if held.saturating_add(amount) > quota {
            if mine.is_empty() {
                pending.remove(owner);
            }
            return Ok(Err(held));
        }
        // A second create of the same key fails in the backend; count the
        // larger of the two meanwhile.
        let slot = mine.entry(key.to_owned()).or_default();
        *slot = (*slot).max(amount);
        Ok(Ok(Reservation {
            gate: self.clone(),
            owner: owner.to_owned(),
            key: key.to_owned(),
        }))
    }
}

impl Reservation {
    /// Releases the reservation once its create has finished (the object
    /// is listed now, or was never made).
    pub(super) async fn release(self) {
        let lock = self.gate.lock_of(&self.owner);
        let _serial = lock.lock().await;
        let mut pending = self.gate.pending();
        if let Some(mine) = pending.get_mut(&self.owner) {
            mine.remove(&self.key);
            if mine.is_empty() {
                pending.remove(&self.owner);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    type Listed = Result<Vec<(String, u64)>, ()>;

    fn listed(items: &[(&str, u64)]) -> impl Future<Output = Listed> {
        let items = items.iter().map(|(k, n)| (k.to_string(), *n)).collect();
        async move { Ok(items) }
    }

    #[tokio::test]
    async fn in_flight_creates_count_once_until_released() {
        let gate = Arc::new(QuotaGate::new());
        let a = gate.reserve("o", "a", 6, 10, listed(&[])).await;
        let a = a.unwrap().unwrap();
        // "a" is in flight: 6 held, 5 more do not fit.
        let b = gate.reserve("o", "b", 5, 10, listed(&[])).await;
        assert_eq!(b.unwrap().unwrap_err(), 6);
        // Listed and in flight at once: counted once.
        let c = gate.reserve("o", "c", 4, 10, listed(&[("a", 6)])).await;
        let c = c.unwrap().unwrap();
        // Another owner has its own quota.
        assert!(gate
            .reserve("p", "x", 10, 10, listed(&[]))
            .await
            .unwrap()
            .is_ok());
        a.release().await;
        c.release().await;
        let d = gate
            .reserve("o", "d", 1, 10, listed(&[("a", 6), ("c", 4)]))
            .await;
        assert_eq!(d.unwrap().unwrap_err(), 10);
        assert!(gate.pending().get("o").is_none());
        // The lister's error is passed on.
        let failed: Result<_, &str> = gate
            .reserve("o", "e", 1, 10, async { Err("backend down") })
            .await;
        assert_eq!(failed.unwrap_err(), "backend down");
    }
}
