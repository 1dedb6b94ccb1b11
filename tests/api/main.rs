//! The integration tests in one binary (one link of kube, axum and redb
//! instead of one per file): the HTTP API over a real server, `contextctl`
//! run as the built binary, the bundle engine's rules and properties, the
//! delivery scripts under dash and busybox (`delivery_script`) and the blob
//! store against a real S3 server (`object_blobs`, skipped without one).
//! Run one part with `cargo test --test api pools::`.
//!
//! Not here: `bundle_bomb` (a counting global allocator) and
//! `bundle_threads` (counts the process's threads) must be alone in their
//! process, and so must `migrate` and `object_storage_outage` (each points
//! the process's `AWS_*` variables at a private S3 server); the Kubernetes
//! end-to-end targets need the `e2e` feature.

#[path = "../common/mod.rs"]
mod common;

mod bundle_pack_async;
mod bundle_props;
mod bundle_rules;
mod bundle_store;
mod compat_auth;
mod compat_delete;
mod compat_json;
mod compat_mux;
mod compat_quantity;
mod compat_support;
mod compat_trusted;
mod contextctl_bundle;
mod contextctl_conventions;
mod contextctl_pools;
mod contextctl_workload;
mod contexts;
mod deliveries;
mod delivery_script;
mod deploy_files;
mod dockerfile;
mod fd_pressure;
mod first_hour;
mod hardening;
mod hs256_secret;
mod layers;
mod monitoring;
mod object_blobs;
mod object_storage;
mod openapi;
mod owner_scope_key;
mod owners;
mod pool_lifetime;
mod pools;
mod quotas;
mod readme_examples;
mod registry;
mod replicas;
mod scale_out;
mod service;
mod shutdown;
mod store_conformance;
mod token_policy;
mod trusted_flow;
mod trusted_support;
mod upload_limits;
mod workloads;
mod workloads_auth;
mod workloads_recovery;
