//! Context Service: an allocation engine for agent sandboxes and a context
//! gateway that serves frozen, owner-scoped workload revisions.
//!
//! Data flows one way: `api` → `auth` → services (`pool`, `workload`) →
//! `backend` / `store` / `bundle`. Nothing in `bundle` knows about HTTP and
//! nothing in `api` knows about Kubernetes objects.

pub mod api;
pub mod app;
pub mod auth;
pub mod backend;
pub mod bundle;
pub mod cache;
pub mod cli;
pub mod client;
pub mod config;
pub mod delivery;
pub mod error;
pub mod fsutil;
pub mod metrics;
pub mod pool;
pub mod server;
pub mod store;
pub mod telemetry;
pub mod workload;
