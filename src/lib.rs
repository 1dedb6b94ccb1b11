//! Context Service: an allocation engine for agent sandboxes and a context
//! gateway that serves frozen, owner-scoped workload revisions.
//!
//! Data flows one way: `api` → `auth` → services (`pool`, `workload`) →
//! `backend` / `store` / `bundle`. Nothing in `bundle` knows about HTTP and
//! nothing in `api` knows about Kubernetes objects.

pub mod bundle;
pub mod cli;
