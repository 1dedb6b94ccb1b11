//! Whether each watch cache is really watching, for `/readyz`.
//!
//! kube-runtime's watcher retries a watch that cannot start forever and
//! keeps serving what its first list found: without the `watch` grant (a
//! `403`), pool status silently freezes at start-up. So each reflector
//! records its outcomes here, and readiness probes every kind that is
//! failing or has not shown a working watch yet with the two requests the
//! reflector needs (a one-item list and a watch start, with its own label
//! selector). A replica whose caches cannot follow the cluster is taken out
//! of service, with the kind and the API server's answer in the log.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use futures::future::{BoxFuture, FutureExt};
use kube::api::{ListParams, WatchParams};
use kube::{Api, Resource};
use serde::de::DeserializeOwned;

/// How long one probe may take: readiness answers within a kubelet probe's
/// usual timeout.
const PROBE_TIMEOUT: Duration = Duration::from_secs(5);

/// Lists one object and starts a watch (closed at once) as the reflector does.
type Probe = Box<dyn Fn() -> BoxFuture<'static, Result<(), kube::Error>> + Send + Sync>;

/// The health of every reflector of a set of caches.
#[derive(Clone, Default)]
pub(super) struct WatchHealth {
    kinds: Vec<Arc<KindHealth>>,
}

/// One reflector's health.
pub(super) struct KindHealth {
    /// What the reflector caches, e.g. `pods`.
    kind: String,
    state: Mutex<State>,
    probe: Probe,
}

#[derive(Debug, Clone)]
struct State {
    /// The last word on this reflector's watch.
    health: Health,
    /// Failures seen so far: a probe that began before the latest failure
    /// must not clear it.
    failures: u64,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Health {
    /// No watch event and no probe yet: a started watch is silent.
    Unproven,
    /// A watch event arrived, or a probe's watch started.
    Watching,
    /// The last outcome was this error.
    Failing(String),
}

/// A watch cache that cannot follow the cluster.
#[derive(Debug, thiserror::Error)]
#[error("the {kind} watch cannot run: {error}")]
pub(super) struct WatchUnhealthy {
    /// The kind, e.g. `pods`.
    pub(super) kind: String,
    /// The API server's answer (or the probe's timeout).
    pub(super) error: String,
}

impl KindHealth {
    /// Health of a reflector over `api` with `selector`, unproven.
    pub(super) fn new<K>(api: Api<K>, selector: Option<String>) -> Arc<Self>
    where
        K: Resource + Clone + DeserializeOwned + std::fmt::Debug + Send + Sync + 'static,
        K::DynamicType: Default,
    {
        let kind = K::plural(&K::DynamicType::default()).to_string();
        let probe: Probe = Box::new(move || {
            let api = api.clone();
            let selector = selector.clone();
            async move {
                let mut list = ListParams::default().limit(1);
                let mut watch = WatchParams::default().timeout(1);
                if let Some(selector) = &selector {
                    list = list.labels(selector);
                    watch = watch.labels(selector);
                }
                let listed = api.list_metadata(&list).await?;
                let version = listed.metadata.resource_version.unwrap_or_default();
                // The answer's status is all a probe needs; dropping the
                // stream closes the watch.
                drop(api.watch_metadata(&watch, &version).await?);
                Ok(())
            }
            .boxed()
        });
        Arc::new(Self {
            kind,
            state: Mutex::new(State {
                health: Health::Unproven,
                failures: 0,
            }),
            probe,
        })
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        // The state is two plain fields: still consistent after a panic.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// A watch event arrived: the watch runs.
    pub(super) fn watching(&self) {
        self.state().health = Health::Watching;
    }

    /// The reflector's list or watch failed with `error`.
    pub(super) fn failed(&self, error: &dyn std::fmt::Display) {
        let mut state = self.state();
        state.health = Health::Failing(error.to_string());
        state.failures += 1;
    }

    /// `Ok` when the watch is known to run or a probe shows it can.
    async fn check(&self) -> Result<(), WatchUnhealthy> {
        let (health, failures) = {
            let state = self.state();
            (state.health.clone(), state.failures)
        };
        if health == Health::Watching {
            return Ok(());
        }
        let unhealthy = |error: String| WatchUnhealthy {
            kind: self.kind.clone(),
            error,
        };
        match tokio::time::timeout(PROBE_TIMEOUT, (self.probe)()).await {
            Ok(Ok(())) => {
                let mut state = self.state();
                if state.failures == failures {
                    state.health = Health::Watching;
                }
                Ok(())
            }
            Ok(Err(error)) => Err(unhealthy(error.to_string())),
            Err(_elapsed) => Err(unhealthy(format!(
                "no answer to a list and watch within {PROBE_TIMEOUT:?}"
            ))),
        }
    }
}

impl WatchHealth {
    /// Adds a reflector's health.
    pub(super) fn push(&mut self, kind: Arc<KindHealth>) {
        self.kinds.push(kind);
    }

    /// `Ok` when every reflector's watch runs (probing the unproven and
    /// failing ones, concurrently); else the first kind that cannot.
    pub(super) async fn check(&self) -> Result<(), WatchUnhealthy> {
        let checks = self.kinds.iter().map(|kind| kind.check());
        futures::future::join_all(checks)
            .await
            .into_iter()
            .collect()
    }
}
