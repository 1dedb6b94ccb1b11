//! Context Service: an allocation engine for agent sandboxes and a context
//! gateway that serves frozen, owner-scoped workload revisions.
//!
//! Data flows one way: `api` → `auth` → services (`pool`, `workload`,
//! `delivery`) → `store` / `bundle`. The `sandbox` backends implement the
//! pool domain's port and the delivery exec port (`sandbox → pool`,
//! `sandbox → delivery`); `app` builds them from the settings. Nothing in
//! `bundle` knows about HTTP and nothing in `api` knows about Kubernetes
//! objects.

pub mod api;
pub mod app;
pub mod auth;
pub mod bundle;
pub mod cache;
pub mod cli;
pub mod client;
pub mod clock;
pub mod config;
pub mod delivery;
pub mod fsutil;
pub mod metrics;
pub mod migrate;
pub mod pool;
pub mod sandbox;
pub mod server;
pub mod store;
pub mod telemetry;
pub mod workload;
pub mod zerocopy;
