//! The integration tests in one binary (one link of kube, axum and redb
//! instead of one per file): the HTTP API over a real server, `contextctl`
//! run as the built binary, and the bundle engine's rules and properties.
//! Run one part with `cargo test --test api pools::`.
//!
//! Not here: `bundle_bomb` (a counting global allocator) and
//! `bundle_threads` (counts the process's threads) must be alone in their
//! process; the Kubernetes end-to-end targets need the `e2e` feature.

#[path = "../common/mod.rs"]
mod common;

mod bundle_pack_async;
mod bundle_props;
mod bundle_rules;
mod contextctl_bundle;
mod contextctl_conventions;
mod contextctl_pools;
mod contextctl_workload;
mod contexts;
mod deploy_files;
mod dockerfile;
mod monitoring;
mod pools;
mod readme_examples;
mod service;
mod workloads;
mod workloads_auth;
mod workloads_recovery;
