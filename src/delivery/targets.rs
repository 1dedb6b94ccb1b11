//! Which sandboxes an owner may deliver into: a sandbox of a pool the same
//! owner allocated, or one the operator's shared-sandbox selector matches.
//! Anything else is answered exactly like a missing sandbox.

use crate::pool::{LabelSelector, Member, PoolError, PoolPhase, PoolService};

use super::error::DeliveryError;

fn internal(e: PoolError) -> DeliveryError {
    DeliveryError::Internal(format!("resolving the delivery target: {e:?}"))
}

/// The sandbox `name` as `owner_scope` may target it.
pub(super) async fn sandbox(
    pools: &PoolService,
    shared: Option<&LabelSelector>,
    owner_scope: &str,
    name: &str,
) -> Result<Member, DeliveryError> {
    let own = pools.list(owner_scope).await.map_err(internal)?;
    for pool in own {
        let suspended = pool.phase == PoolPhase::Suspended;
        if let Some(m) = pool.members.into_iter().find(|m| m.name == name) {
            if suspended {
                return Err(suspended_error(&format!(
                    "sandbox {name:?} is suspended (pool {:?})",
                    pool.name
                )));
            }
            return Ok(m);
        }
    }
    if let Some(selector) = shared {
        let matched = pools
            .backend()
            .list_sandboxes(selector)
            .await
            .map_err(|e| {
                DeliveryError::Internal(format!("listing shared sandboxes ({selector}): {e}"))
            })?;
        if let Some(m) = matched.into_iter().find(|m| m.name == name) {
            return Ok(m);
        }
    }
    Err(DeliveryError::SandboxNotFound(name.to_owned()))
}

/// A suspended target, with what to do about it.
fn suspended_error(what: &str) -> DeliveryError {
    DeliveryError::SandboxSuspended(format!("{what}; resume the pool first"))
}

/// Every member of the owner's pool `name` (ready or not, in index order).
pub(super) async fn pool(
    pools: &PoolService,
    owner_scope: &str,
    name: &str,
) -> Result<Vec<Member>, DeliveryError> {
    match pools.get(name, owner_scope).await {
        Ok(status) if status.phase == PoolPhase::Suspended => Err(suspended_error(&format!(
            "sandbox pool {name:?} is suspended"
        ))),
        Ok(status) => Ok(status.members),
        Err(PoolError::NotFound(_)) => Err(DeliveryError::PoolNotFound(name.to_owned())),
        Err(e) => Err(internal(e)),
    }
}
