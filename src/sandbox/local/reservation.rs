//! Reservations: a short lock checks conflicts and claims every name a
//! mutation will touch, so that mutations of different pools run
//! concurrently without holding it.

use std::collections::HashSet;
use std::sync::{MutexGuard, PoisonError};
use std::time::Duration;

use crate::pool::model::{AccessMode, PoolSpec, Strategy};
use crate::pool::{names, BackendError};

use super::plan::Plan;
use super::records::visible_to;
use super::Inner;

/// Names claimed by mutations in flight, so that they run without a lock.
#[derive(Debug, Default)]
pub(super) struct Reservations {
    /// Pools being created or deleted.
    pub(super) pools: HashSet<String>,
    /// Objects being created ([`volume_key`], [`sandbox_key`], [`claim_key`]).
    pub(super) objects: HashSet<String>,
}

/// Releases its reservations when dropped, on every path out.
pub(super) struct Reserved<'a> {
    inner: &'a Inner,
    pool: Option<String>,
    objects: Vec<String>,
}

impl Drop for Reserved<'_> {
    fn drop(&mut self) {
        let mut reservations = self.inner.reservations();
        if let Some(pool) = &self.pool {
            reservations.pools.remove(pool);
        }
        for object in &self.objects {
            reservations.objects.remove(object);
        }
    }
}

/// Reservation key of volume `name` in namespace `ns`.
fn volume_key(ns: &str, name: &str) -> String {
    format!("volume/{ns}/{name}")
}

/// Reservation key of sandbox `name` (service namespace).
fn sandbox_key(name: &str) -> String {
    format!("sandbox/{name}")
}

/// Reservation key of sandbox claim `name` (service namespace).
fn claim_key(name: &str) -> String {
    format!("claim/{name}")
}

/// Reservation keys of every object `plan` creates (pools live in `ns`).
fn plan_keys(plan: &Plan, ns: &str) -> Vec<String> {
    let volumes = plan.volumes.iter().map(|v| volume_key(ns, v));
    let sandboxes = plan
        .sandboxes
        .iter()
        .chain(&plan.warm_sandboxes)
        .map(|s| sandbox_key(s));
    let claims = plan.claims.iter().map(|c| claim_key(c));
    volumes.chain(sandboxes).chain(claims).collect()
}

impl Inner {
    /// The reservations, under the short lock.
    pub(super) fn reservations(&self) -> MutexGuard<'_, Reservations> {
        // The reservations stay consistent even if a holder panicked: every
        // change is a single insert or remove.
        self.lock.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Under the short lock: checks the strategy's references and conflicts,
    /// then reserves the pool name and every object name of the plan, so
    /// creation itself runs without the lock.
    pub(super) fn reserve_for_create(
        &self,
        spec: &PoolSpec,
    ) -> Result<(Plan, Reserved<'_>), BackendError> {
        let mut reservations = self.reservations();
        // Upstream checks the claim or warm pool before creating anything.
        match &spec.strategy {
            Strategy::Existing { claim_name, .. } => {
                let volume = self
                    .read_volume(&self.namespace, claim_name)?
                    .filter(|v| visible_to(&v.meta, &spec.owner_scope))
                    .ok_or_else(|| {
                        BackendError::Invalid(format!("workspace claim {claim_name:?} not found"))
                    })?;
                if spec.replicas > 1 && volume.access_mode != AccessMode::ReadWriteMany {
                    return Err(BackendError::Invalid(format!(
                        "workspace claim {claim_name:?} must support ReadWriteMany for multiple sandboxes"
                    )));
                }
            }
            Strategy::Warm { pool } => {
                if !self.warm_pools.contains(pool) {
                    return Err(BackendError::Invalid(format!(
                        "warm pool {pool:?} not found"
                    )));
                }
            }
            Strategy::Dedicated { .. } | Strategy::Shared { .. } => {}
        }
        let mut plan = Plan::of(spec);
        if reservations.pools.contains(&spec.name) || self.conflicts(spec, &plan, &reservations) {
            return Err(BackendError::AlreadyExists);
        }
        if let Strategy::Warm { pool } = &spec.strategy {
            for _ in 0..spec.replicas {
                let name = self.fresh_warm_sandbox_name(pool, &reservations, &plan);
                plan.warm_sandboxes.push(name);
            }
        }
        let keys = plan_keys(&plan, &self.namespace);
        reservations.pools.insert(spec.name.clone());
        reservations.objects.extend(keys.iter().cloned());
        Ok((
            plan,
            Reserved {
                inner: self,
                pool: Some(spec.name.clone()),
                objects: keys,
            },
        ))
    }

    /// Reserves pool `name` for a deletion, waiting while it is being
    /// created or deleted.
    pub(super) fn reserve_pool(&self, name: &str) -> Reserved<'_> {
        loop {
            if self.reservations().pools.insert(name.to_owned()) {
                return Reserved {
                    inner: self,
                    pool: Some(name.to_owned()),
                    objects: Vec::new(),
                };
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// Reserves volume `name` in `ns` for its creation;
    /// [`BackendError::AlreadyExists`] when it exists or is being made.
    pub(super) fn reserve_new_volume(
        &self,
        ns: &str,
        name: &str,
    ) -> Result<Reserved<'_>, BackendError> {
        let key = volume_key(ns, name);
        let mut reservations = self.reservations();
        if reservations.objects.contains(&key) || self.read_volume(ns, name)?.is_some() {
            return Err(BackendError::AlreadyExists);
        }
        reservations.objects.insert(key.clone());
        Ok(Reserved {
            inner: self,
            pool: None,
            objects: vec![key],
        })
    }

    /// Reserves volume `name` in `ns` for a deletion, waiting while another
    /// mutation holds it.
    pub(super) fn reserve_volume(&self, ns: &str, name: &str) -> Reserved<'_> {
        let key = volume_key(ns, name);
        loop {
            if self.reservations().objects.insert(key.clone()) {
                return Reserved {
                    inner: self,
                    pool: None,
                    objects: vec![key],
                };
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// Whether the pool name, or any object the plan would create, is taken
    /// (on disk or by a creation in flight).
    pub(super) fn conflicts(
        &self,
        spec: &PoolSpec,
        plan: &Plan,
        reservations: &Reservations,
    ) -> bool {
        if self.record_path(&spec.name).exists() {
            return true;
        }
        if plan_keys(plan, &self.namespace)
            .iter()
            .any(|k| reservations.objects.contains(k))
        {
            return true;
        }
        // Index 0 of every strategy catches a pool of another strategy
        // under the same name; the full plan catches any other collision.
        let name = spec.name.as_str();
        let volumes = [
            names::shared_workspace(name),
            names::dedicated_workspace(name, 0),
        ];
        plan.volumes
            .iter()
            .chain(&volumes)
            .any(|v| self.volume_dir(&self.namespace, v).exists())
            || plan
                .sandboxes
                .iter()
                .chain([&names::sandbox(name, 0)])
                .any(|s| self.sandbox_dir(s).exists())
            || plan
                .claims
                .iter()
                .chain([&names::claim(name, 0)])
                .any(|c| self.claim_path(c).exists())
    }

    /// A name for a sandbox adopted from warm pool `pool`, which upstream
    /// names `<pool>-<random>`; unused on disk and by creations in flight.
    pub(super) fn fresh_warm_sandbox_name(
        &self,
        pool: &str,
        reservations: &Reservations,
        plan: &Plan,
    ) -> String {
        use rand::Rng as _;
        const ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
        let mut rng = rand::rng();
        loop {
            let suffix: String = (0..5)
                .map(|_| char::from(ALPHABET[rng.random_range(0..ALPHABET.len())]))
                .collect();
            let name = format!("{pool}-{suffix}");
            if !self.sandbox_dir(&name).exists()
                && !reservations.objects.contains(&sandbox_key(&name))
                && !plan.warm_sandboxes.contains(&name)
            {
                return name;
            }
        }
    }
}
