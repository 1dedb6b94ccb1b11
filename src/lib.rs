//! Context Service: an allocation engine for agent sandboxes and a context
//! gateway that serves frozen, owner-scoped workload revisions.
//!
//! # Layers
//!
//! Modules use only modules of the layers below their own, never one of
//! their own layer or above, and no two sub-modules of a module use each
//! other (`tests/api/layers.rs` checks both on every `cargo test`). Top
//! first:
//!
//! 1. `cli`: `contextctl`'s commands;
//! 2. `client` (the API's HTTP client, speaking the wire types of `api`
//!    and the domains), `server` (binds, serves, shuts down; the only
//!    reader of `ServeConfig` besides `app`), `migrate`, `telemetry`;
//! 3. `api`: the HTTP handlers;
//! 4. `app`: `AppState`, what every handler shares, built from the settings;
//! 5. `config`: the settings, and their conversion into each component's
//!    own settings (no component knows `ServeConfig`);
//! 6. `sandbox`: the backends, implementing the pool domain's port and the
//!    delivery exec port;
//! 7. `delivery`;
//! 8. `workload`;
//! 9. `pool`, `auth`;
//! 10. `store`, `cache`;
//! 11. `bundle`, `fsutil`, `metrics`, `tls`, `zerocopy`: leaves.
//!
//! Data flows one way: `api` → `auth` → services (`pool`, `workload`,
//! `delivery`) → `store` / `bundle`. Nothing in `bundle` knows about HTTP
//! and nothing in `api` knows about Kubernetes objects.

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
pub mod runtime;
pub mod sandbox;
pub mod server;
pub mod store;
pub mod telemetry;
pub mod tls;
pub mod workload;
pub mod zerocopy;
